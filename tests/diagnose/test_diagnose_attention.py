"""unfused_attention (diagnose/attention.py): attention written out of separate operators.

Real profiles (tests/data/attention, torch 2.13 CPU, record_shapes): the same 2-block model with attention written
out (eager), with SDPA forced to its math path (math) and with SDPA's fused CPU kernel (sdpa); a tiny Hugging Face
LlamaForCausalLM with transformers' own eager attention (hf_eager). A hand-built H100
trace prices the finding against a hand-worked fused-kernel time."""

import gzip
import json
import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.attention import attention_regions
from trainperf.trace import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import backward_node, end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "attention"
HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"


def _raw_attention_softmaxes(path: Path, name: str) -> int:
    """From the raw JSON: softmax ops of a 4-D input inside the analysed ProfilerSteps (every step but the last,
    which the profiler's stop cuts), counted independently of the loader."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name", "").startswith("ProfilerStep#"))[:-1]
    return sum(1 for e in ev if e.get("name") == name and e.get("cat") == "cpu_op"
               and len(e["args"]["Input Dims"][0]) == 4 and any(a <= e["ts"] < b for a, b in steps))


def _finding(d, kind="unfused_attention"):
    return next((x for x in d.findings if x.kind == kind), None)


def test_written_out_attention_is_found_and_the_router_softmax_is_not():
    # eager.json.gz: per block, q @ k^T * scale, masked_fill, softmax over [2, 4, 64, 64], dropout, @ v; then a
    # router softmax over [128, 4] (2-D, no value product): one region per block per analysed step
    p = DATA / "eager.json.gz"
    x = _finding(diagnose(p))
    assert x is not None and x.severity == "low" and not x.priced  # host only: evidence, no price
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == _raw_attention_softmaxes(p, "aten::softmax") == 4
    assert m["in_sdpa_math_fallback"]["value"] == 0
    assert "[2, 4, 64, 64]" in x.evidence["events"][0]["name"]
    regions = attention_regions(next(iter(load_trace(p).values())))
    assert {r.flops for r in regions} == {4.0 * 2 * 4 * 64 * 64 * 16}  # 4·B·H·S·S·D


def test_hugging_faces_eager_attention_is_found():
    # transformers 4.57's eager_attention_forward in a 2-layer LlamaForCausalLM (attn_implementation="eager"):
    # matmul(q, k^T) * scaling, + the causal mask, softmax in fp32 and back, dropout, matmul(., v): one region per
    # layer per analysed step, each a [4, 4, 64, 64] softmax with its products' shapes chained (4·B·H·S·S·D FLOPs)
    p = DATA / "hf_eager.json.gz"
    x = _finding(diagnose(p))
    assert x is not None and x.evidence["metrics"]["regions"]["value"] == _raw_attention_softmaxes(
        p, "aten::softmax") == 4
    regions = attention_regions(next(iter(load_trace(p).values())))
    assert {r.flops for r in regions} == {4.0 * 4 * 4 * 64 * 64 * 16}


def test_sdpa_math_fallback_is_named_and_the_fused_kernel_is_not_flagged():
    p = DATA / "math.json.gz"
    x = _finding(diagnose(p))
    assert x is not None
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == m["in_sdpa_math_fallback"]["value"] == _raw_attention_softmaxes(
        p, "aten::_safe_softmax") == 4
    assert any("math path" in n for n in x.notes)
    assert _finding(diagnose(DATA / "sdpa.json.gz")) is None  # aten::_scaled_dot_product_flash_attention_for_cpu


@pytest.mark.skipif(not (HTA / "trace_filter").exists(), reason="HTA traces not present")
def test_a_softmax_whose_neighbour_matmul_multiplies_something_else_is_not_attention():
    # HTA trace_filter: fb::convex_sum runs softmax over [2, 1], then mm [2048, 2] x [2, 1]
    for t in load_trace(HTA / "trace_filter").values():
        assert attention_regions(t) == []


B, H, S, D = 4, 16, 2048, 128
GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn"
ELEM = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16>>"
P, STEPS = 13700.0, 4  # the device's 13,540 us from +50 us, the synchronize, ~100 us of Python


def _h100_trace(folder: Path, *, shapes: bool = True, einsum: bool = False, gemm: str = GEMM,
                softmax_us: tuple = (600.0, 900.0), gelu_us: float = 0.0, step_us: float = P) -> Path:
    """STEPS steps of P us on an H100. The host launches everything in the first ~200 us (forward on thread 1,
    the autograd nodes on thread 2), the kernels run back to back from +50 us, a synchronize waits for them, then
    Python runs to the step's end. Per step: a 3000-us linear GEMM, the attention region (QK 400, scale 300,
    softmax 600, PV 400 us), a router softmax over [8192, 8] and its mm (20 + 20 us), the backward of the region
    (PV 2 x 400, softmax 900, scale 300, QK 2 x 400) and of the linear (2 x 3000). einsum: the two products as
    aten::einsum (their tensors in a TensorList: no dtype recorded); gemm: every GEMM kernel's name; softmax_us: the
    attention softmax's forward and backward kernels; gelu_us: a GELU over [8192, 8192] after the linear (0: none);
    step_us: the step."""
    b = TraceBuilder()
    bf = "c10::BFloat16"
    fwd = [("aten::linear", [[8192, 2048], [2048, 2048]], GEMM, 3000.0),
           ("aten::matmul", [[B, H, S, D], [B, H, D, S]], GEMM, 400.0),
           ("aten::mul", [[B, H, S, S], []], ELEM, 300.0),
           ("aten::softmax", [[B, H, S, S], [], []], "cunn_SoftMaxForward", softmax_us[0]),
           ("aten::matmul", [[B, H, S, S], [B, H, S, D]], GEMM, 400.0),
           ("aten::softmax", [[8192, 8], [], []], "cunn_SoftMaxForward", 20.0),
           ("aten::mm", [[8192, 8], [8, 8]], GEMM, 20.0)] + \
        ([("aten::gelu", [[8192, 8192], []], ELEM, gelu_us)] if gelu_us else [])
    bwd = [("BmmBackward0", 14, [(GEMM, 400.0), (GEMM, 400.0)]),
           ("SoftmaxBackward0", 13, [("cunn_SoftMaxBackward", softmax_us[1])]),
           ("MulBackward0", 12, [(ELEM, 300.0)]), ("BmmBackward0", 11, [(GEMM, 400.0), (GEMM, 400.0)]),
           ("AddmmBackward0", 10, [(GEMM, 3000.0), (GEMM, 3000.0)])]
    for s in range(STEPS):
        T = s * step_us
        b.step(s, T, step_us)
        at = T + 50.0
        for i, (name, dims, kernel, us) in enumerate(fwd):
            kernel = gemm if kernel == GEMM else kernel
            args = {"Input Dims": dims, "Input type": [bf if d else "" for d in dims]} if shapes else {}
            if einsum and name == "aten::matmul":
                name, args = "aten::einsum", {"Input Dims": [[], dims, []], "Input type": ["", "TensorList", ""]}
            b.cpu(name, T + 10.0 * i, 8.0, **{"Sequence number": 100 * s + 10 + i, "Fwd thread id": 0, **args})
            b.launch(kernel, T + 10.0 * i + 2.0, at, us)
            at += us
        for j, (node, seq, kernels) in enumerate(bwd):
            at = backward_node(b, node, T + 100.0 + 20.0 * j, 100 * s + seq,
                               [(gemm if k == GEMM else k, us) for k, us in kernels], at)
        end_gpu_bound_step(b, T, step_us, at)
    return write_trace(b, folder)


def test_unfused_attention_priced_at_the_catalogs_flash_rate(tmp_path):
    # fused kernel per step: forward 4·B·H·S·S·D = 1.374e11 FLOPs, backward 2.5x: 4.810e11 FLOPs at H100's SDPA
    # flash rate min(attn_eff 0.452, fa2_eff 0.34) x 989.4 TFLOP/s = 336.4 TFLOP/s -> 1429.98 us against the
    # region's 1700 + 2800 = 4500 us of kernels: 3.147x, 3070.0 us saved per step on a GPU-bound step
    d = diagnose(_h100_trace(tmp_path))
    x = _finding(d)
    assert x is not None and d.findings[0] is x and x.priced and not x.gain_is_upper_bound
    fused = 4.0 * B * H * S * S * D * 3.5 / (989.4e12 * 0.34) * 1e6
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == STEPS - 1
    assert m["fused_kernel_estimate"]["value"] == pytest.approx(fused * (STEPS - 1), rel=1e-3)
    assert m["attention_kernel_time"]["value"] == pytest.approx(4500.0 * (STEPS - 1), rel=1e-6)
    assert x.gain_us / (STEPS - 1) == pytest.approx(4500.0 - fused, rel=0.01)
    assert x.severity == "high" and x.confidence == "high"


def test_without_sequence_numbers_the_backward_is_linked_by_name(tmp_path):
    # the same trace with no operator ids (an exporter that drops "Sequence number"): each SoftmaxBackward0 (as many
    # as regions: the router's softmax has no backward here) with the BmmBackward0 before and after it on its thread
    # is the region's backward, so the price is the one worked above (before: the forward's 1700 us alone, priced
    # against a forward-only fused kernel)
    path = _h100_trace(tmp_path)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("Sequence number", None)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    x = _finding(diagnose(path))
    fused = 4.0 * B * H * S * S * D * 3.5 / (989.4e12 * 0.34) * 1e6
    m = x.evidence["metrics"]
    assert m["backward_in_trace"]["value"] == 1
    assert m["attention_kernel_time"]["value"] == pytest.approx(4500.0 * (STEPS - 1), rel=1e-6)
    assert x.gain_us / (STEPS - 1) == pytest.approx(4500.0 - fused, rel=0.01)


def test_without_shapes_the_pattern_alone_finds_it_at_an_upper_bound(tmp_path):
    # no recorded shapes: the operator pattern alone, and the fused kernel taken to cost the region's matmul
    # kernels (forward QK + PV 800, backward 1600: 2400 of the 4500 us), an upper bound at low confidence: 2100 us
    # saved per step. The router's softmax has the PV matmul before it, but aten::mm (another product) comes
    # before the next step's first batched product after it: one region per step, as with shapes
    d = diagnose(_h100_trace(tmp_path, shapes=False))
    x = _finding(d)
    assert x is not None and x.gain_is_upper_bound and x.confidence == "low"
    assert any("record_shapes" in n for n in x.notes)
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == STEPS - 1
    assert m["fused_kernel_estimate"]["value"] == pytest.approx(2400.0 * (STEPS - 1), rel=1e-6)
    assert x.gain_us / (STEPS - 1) == pytest.approx(2100.0, rel=0.01)


def _cpu_ops(tmp_path, ops) -> Path:
    """A one-step CPU trace of the given (name, Input Dims) ops, 10 us apart, each 8 us."""
    b = TraceBuilder()
    b.step(0, 0.0, 1000.0)
    b.step(1, 1000.0, 1000.0)
    for i, (name, dims) in enumerate(ops):
        b.cpu(name, 10.0 + 10.0 * i, 8.0, **{"Input Dims": dims, "Input type": ["float"] * len(dims)})
    return b.write(tmp_path / "t.json.gz")


def test_einsum_attention_in_another_layout_chains_by_element_counts(tmp_path):
    # q, k, v as [B, S, H, D] = [2, 128, 4, 32] through einsum (the equation's dims first, then the tensor list):
    # scores [2, 4, 128, 128]; V's head dim 16 (Dv != D, as in MLA): forward FLOPs 2·8·128·128·(32 + 16)
    q = [2, 128, 4, 32]
    ops = [("aten::einsum", [[], [q, q]]), ("aten::mul", [[2, 4, 128, 128], []]),
           ("aten::softmax", [[2, 4, 128, 128], [], []]), ("aten::einsum", [[], [[2, 4, 128, 128], [2, 128, 4, 16]]])]
    t = next(iter(load_trace(_cpu_ops(tmp_path, ops)).values()))
    (r,) = attention_regions(t)
    assert r.flops == 2.0 * 8 * 128 * 128 * (32 + 16)


def test_a_value_product_of_other_sizes_is_not_attention(tmp_path):
    # the softmax's neighbour product takes a [2, 4, 64, 128] tensor: not the [2, 4, 128, 128] scores
    ops = [("aten::matmul", [[2, 4, 128, 32], [2, 4, 32, 128]]), ("aten::softmax", [[2, 4, 128, 128], [], []]),
           ("aten::matmul", [[2, 4, 64, 128], [2, 4, 128, 32]])]
    assert attention_regions(next(iter(load_trace(_cpu_ops(tmp_path, ops)).values()))) == []


def test_einsum_products_take_the_gemm_kernels_precision(tmp_path):
    # the same region through einsum (no dtype recorded): with bf16 GEMM kernels the fused kernel is priced at the
    # bf16 peak as with matmul (1430 us per step); with fp32 sgemm kernels at the fp32 peak (66.9 TFLOP/s x 0.34:
    # 21,147 us per step, slower than the 4,500-us region), so no fused-kernel gain and no finding
    x = _finding(diagnose(_h100_trace(tmp_path, einsum=True)))
    fused = 4.0 * B * H * S * S * D * 3.5 / (989.4e12 * 0.34) * 1e6
    assert x is not None and x.evidence["metrics"]["fused_kernel_estimate"]["value"] == pytest.approx(
        fused * (STEPS - 1), rel=1e-3)
    (tmp_path / "fp32").mkdir()
    fp32 = _h100_trace(tmp_path / "fp32", einsum=True, gemm="sm90_xmma_gemm_f32f32_f32f32_f32_nn")
    assert _finding(diagnose(fp32)) is None


def test_the_named_fusion_is_priced_before_the_category_wide_one(tmp_path):
    # softmax kernels of 3000 / 4000 us and a 6000-us GELU outside attention: elementwise + reduction kernels are
    # 53 % of the 25,040-us busy step, so memory_bound_unfused (every such kernel at the HBM peak) fires, with a
    # larger gain alone than the fused attention kernel's. The named fusion is priced first (findings.BROADER_FIX):
    # it keeps its own 4100 + 5900 - 1430 us saved per step, and the category-wide fix gets what it adds (the
    # GELU). Before, the category-wide fix came first by its gain alone and left it 2471 us per step
    d = diagnose(_h100_trace(tmp_path, softmax_us=(3000.0, 4000.0), gelu_us=6000.0, step_us=25300.0))
    x = _finding(d)
    m = next(f for f in d.findings if f.kind == "memory_bound_unfused")
    assert m.gain_alone_pct > x.gain_alone_pct and x.fix_order < m.fix_order
    fused = 4.0 * B * H * S * S * D * 3.5 / (989.4e12 * 0.34) * 1e6
    assert x.gain_us / (STEPS - 1) == pytest.approx(10000.0 - fused, rel=0.01)
