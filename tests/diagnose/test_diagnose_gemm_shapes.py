"""misaligned_gemm on hand-built H100 traces (answers worked by hand): GPT-2's vocabulary of 50,257 in the output
layer, its GEMM at a third of the rate of the step's aligned GEMMs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import end_gpu_bound_step, queued_ops, queued_steps, recorded_shapes, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.gemm_shapes import GemmCall, misaligned_stride  # noqa: E402
from trainperf.diagnose.roofline import OpShape, op_cost  # noqa: E402

BF16 = "c10::BFloat16"
P, STEPS = 4200.0, 5
SQUARE_US = 229.0   # 2 x 4096^3 FLOPs = 1.374e11 in 229 us: 600 TFLOP/s
SQUARE_FLOPS = 2.0 * 4096 ** 3


def _trace(folder: Path, vocab: int = 50257, head_us: float = 3162.0, shapes: bool = True, m: int = 8192,
           head_strides: list | None = None, beside: bool = False) -> Path:
    # each 4200-us step: 4 aten::mm [4096, 4096] x [4096, 4096] (229 us each), then the output layer's aten::linear
    # x [m, 768], weight [vocab, 768] (head_us; its "Input Strides" head_strides when given), launched 10 us apart
    # from T and queued back to back from T+10; a cudaDeviceSynchronize from T+60 returns 5 us after the last kernel;
    # Python until 1 us before the next step. beside: an elementwise kernel on stream 8 through the head's whole run
    square = recorded_shapes([[4096, 4096], [4096, 4096]], BF16, shapes)
    head = recorded_shapes([[m, 768], [vocab, 768], []], BF16, shapes, head_strides)
    ops = [("aten::mm", square, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", SQUARE_US)] * 4 + \
        [("aten::linear", head, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_align1", head_us)]
    if not beside:
        return queued_steps(folder, ops, steps=STEPS, step_us=P)
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        end = queued_ops(b, T, ops, T + 10.0)
        b.cpu("aten::add", T + 50.0, 8.0)
        b.launch("void at::native::vectorized_elementwise_kernel<4>", T + 52.0, end - head_us, head_us, stream=8)
        end_gpu_bound_step(b, T, P, end, sync_at=60.0)
    return write_trace(b, folder)


def _find(d):
    return next((f for f in d.findings if f.kind == "misaligned_gemm"), None)


def test_the_vocabulary_of_gpt2_is_a_misaligned_gemm_priced_at_the_aligned_rate(tmp_path):
    # n = 50257 is no multiple of 8 bf16 elements: the head's GEMM, 2 x 8192 x 768 x 50257 = 6.324e11 FLOPs in
    # 3162 us (200 TFLOP/s), runs at a third of the square GEMMs' 600 TFLOP/s (the reference: the trace's aligned,
    # compute-bound GEMMs). At their rate it takes 1054 us: each step 2108 us shorter, the sync and the Python after
    # it following, 2108 / 4200 = 50.2 % of the window (4 steps)
    f = _find(diagnose(_trace(tmp_path)))
    assert f is not None and f.severity == "high"
    m = f.evidence["metrics"]
    head_flops = 2.0 * 8192 * 768 * 50257
    assert m["their_rate"]["value"] == pytest.approx(head_flops / 3162e-6 / 1e12, rel=1e-3)
    assert m["reference_rate"]["value"] == pytest.approx(SQUARE_FLOPS / SQUARE_US / 1e6, rel=1e-3)
    assert m["reference_from_the_trace"]["value"] == 1.0
    factor = (SQUARE_FLOPS / SQUARE_US) / (head_flops / 3162.0)  # 3.00
    assert m["speedup"]["value"] == pytest.approx(factor, rel=1e-3)
    saved = 3162.0 - 3162.0 / factor
    assert f.gain_alone_pct == pytest.approx(100.0 * saved / P, abs=0.05)
    assert f.evidence["events"][0]["name"] == "aten::linear m=8192 k=768 n=50257 bf16 (4 calls, 12.6 ms)"
    assert f.evidence["events"][0]["dur_us"] == pytest.approx(3162.0)
    assert "50,304" in f.recommendation


def test_padded_or_fast_or_memory_bound_gemms_are_not_misaligned(tmp_path):
    # padded to 50,304 (a multiple of 64): aligned, whatever its speed
    for name, kw in (("padded", {"vocab": 50304}),
                     # misaligned but at the aligned rate (the library padded it itself): 6.324e11 / 600 TFLOP/s
                     ("fast", {"head_us": 1054.0}),
                     # decode: m = 1 row, 2 x 768 x 50257 FLOPs over 77 MB: 1 FLOP per byte, under H100's ridge
                     ("gemv", {"m": 1, "head_us": 40.0}),
                     # no recorded shapes: nothing to read k and n from
                     ("no_shapes", {"shapes": False}),
                     # slow and misaligned, but beside another stream's kernel all through: its time is not its speed
                     ("beside", {"beside": True}),
                     # padded, its strides recorded: a contiguous weight, rows of 768
                     ("contiguous", {"vocab": 50304, "head_strides": [[768, 1], [768, 1], []]})):
        (tmp_path / name).mkdir()
        assert _find(diagnose(_trace(tmp_path / name, **kw))) is None, name


def test_a_weight_viewed_in_a_wider_tensor_is_misaligned_by_its_row_stride(tmp_path):
    # the padded head (k = 768, n = 50304: aligned shapes) whose weight is a [50304, 768] slice of a [50304, 769]
    # tensor (strides [769, 1]): cuBLAS reads rows 769 elements apart, no multiple of 8; at the slow 3162 us it is
    # misaligned_gemm, named by its stride, priced as test_the_vocabulary_of_gpt2's: 3162 x (1 - 1 / factor) a step
    f = _find(diagnose(_trace(tmp_path, vocab=50304, head_strides=[[768, 1], [769, 1], []])))
    assert f is not None and f.severity == "high"
    assert f.evidence["events"][0]["name"].startswith("aten::linear m=8192 k=768 n=50304 row stride 769 bf16")
    factor = (SQUARE_FLOPS / SQUARE_US) / (2.0 * 8192 * 768 * 50304 / 3162.0)
    assert f.gain_alone_pct == pytest.approx(100.0 * 3162.0 * (1 - 1 / factor) / P, abs=0.05)


def test_row_strides_set_the_alignment_of_the_matrix_operands():
    def stride(name, dims, strides, elem_bytes=2):
        return misaligned_stride(OpShape(name, dims, [], [], strides), elem_bytes)

    assert stride("aten::mm", [[4096, 4096], [4096, 4096]], [[4096, 1], [1, 4096]]) == 0  # contiguous, transposed
    assert stride("aten::mm", [[4096, 4096], [4096, 4096]], [[4096, 1], [1, 4097]]) == 4097  # a transposed slice
    assert stride("aten::mm", [[4096, 4096], [4096, 4096]], [[4096, 1], [1, 4100]], elem_bytes=1) == 4100  # fp8: 16
    assert stride("aten::mm", [[4096, 4096], [4096, 4096]], []) == 0  # not recorded
    # addmm's bias is no operand; a broadcast (0) or single-row dimension has no row to align
    assert stride("aten::addmm", [[8192, 4096], [8192, 4096], [4096, 4096]], [[0, 1], [4096, 1], [4096, 1]]) == 0
    assert stride("aten::addmm", [[4096], [8192, 4096], [4096, 4096]], [[1], [4097, 1], [4096, 1]]) == 4097
    assert stride("aten::mm", [[1, 4096], [4096, 4096]], [[4097, 1], [4096, 1]]) == 0
    # a batched operand's batch stride counts; one with no unit stride is copied before the GEMM, not judged
    assert stride("aten::bmm", [[8, 128, 64], [8, 64, 128]], [[8195, 64, 1], [8192, 128, 1]]) == 8195
    assert stride("aten::bmm", [[8, 128, 64], [8, 64, 128]], [[8192, 64, 1], [8192, 2, 130]]) == 0


def test_alignment_is_counted_in_bytes():
    call = dict(row=0, name="aten::mm", m=7, flops=1.0, bytes=1.0, precision="bf16", kernels=(), time_us=1.0)
    assert GemmCall(k=4096, n=50304, elem_bytes=2, **call).aligned  # 8 bf16 elements = 16 bytes
    assert not GemmCall(k=4096, n=50257, elem_bytes=2, **call).aligned
    assert not GemmCall(k=4100, n=4096, elem_bytes=2, **call).aligned  # k matters as n does; m (7) does not
    assert not GemmCall(k=4104, n=4096, elem_bytes=1, **call).aligned  # fp8: 16 elements
    assert GemmCall(k=4112, n=4096, elem_bytes=1, **call).aligned


def test_gemm_dimensions_from_the_recorded_shapes():
    # addmm(bias, a, b): the bias is no operand, whatever its shape; linear's weight is [n, k]; m counts every row
    def mkn(name, dims):
        c = op_cost(name, dims, ["c10::BFloat16" if d else "" for d in dims])
        return c.mkn if c else None

    assert mkn("aten::addmm", [[50257], [8192, 768], [768, 50257], [], []]) == (8192, 768, 50257)
    assert mkn("aten::linear", [[4, 2048, 768], [50257, 768], []]) == (8192, 768, 50257)
    assert mkn("aten::bmm", [[32, 128, 64], [32, 64, 128]]) == (4096, 64, 128)
    assert mkn("aten::matmul", [[32, 128, 64], [64, 10]]) == (4096, 64, 10)  # broadcast over the batch
    assert mkn("aten::matmul", [[768], [768, 10]]) == (1, 768, 10)  # a vector times a matrix: one row
    assert mkn("aten::mm", [[8, 768], [769, 10]]) is None  # k does not match
    assert op_cost("aten::add", [[8, 768], [8, 768]], ["c10::BFloat16"] * 2).mkn is None  # not a GEMM
