"""recompute_overhead (diagnose/recompute.py): the forward re-run inside the backward (activation checkpointing).

Real profiles (tests/data/recompute, torch 2.13 CPU): a 2-block residual MLP without checkpointing, with reentrant
and with non-reentrant torch.utils.checkpoint. A hand-built GPU trace prices the selective fix by hand."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.recompute import recomputed_ops
from trainperf.diagnose.window import analysis_window
from trainperf.trace import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import backward_node, end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "recompute"


def _finding(d):
    return next((x for x in d.findings if x.kind == "recompute_overhead"), None)


@pytest.mark.parametrize("name, per_block", [("reentrant", 5), ("non_reentrant", 4)])
def test_recomputed_forward_ops_are_found_in_real_profiles(name, per_block):
    # 2 analysed steps x 2 blocks. A block's forward is layer_norm, linear, gelu, linear and the residual add; the
    # reentrant checkpoint re-runs all 5, the non-reentrant one stops once the saved tensors the backward asks for
    # are back (torch's early stop): the residual add's output is not one of them, so 4
    t = next(iter(load_trace(DATA / f"{name}.json.gz").values()))
    ops = recomputed_ops(t, analysis_window(t).keep)
    assert ops.size == 2 * 2 * per_block
    assert [t.name_of(int(r)) for r in ops[:4]] == ["aten::layer_norm", "aten::linear", "aten::gelu", "aten::linear"]
    x = _finding(diagnose(DATA / f"{name}.json.gz"))
    assert x is not None and not x.priced and x.evidence["metrics"]["recomputed_ops"]["value"] == ops.size


def test_no_checkpointing_no_finding():
    t = next(iter(load_trace(DATA / "none.json.gz").values()))
    assert recomputed_ops(t, analysis_window(t).keep).size == 0
    assert _finding(diagnose(DATA / "none.json.gz")) is None


GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn"
ELEM = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluFunctor<c10::BFloat16>>"
P, STEPS = 9100.0, 4  # the device's 8,900 us from +50 us, the synchronize, ~140 us of Python


def _checkpointed_trace(folder: Path, reserved_gib: int | None = None) -> Path:
    """STEPS steps: forward linear (GEMM 2000 us) and gelu (300) on thread 1; on thread 2 a reentrant checkpoint's
    backward node re-runs them (forward ops: sequence numbers, Fwd thread id 0; 2000 + 300 us), then the gelu's
    and the linear's backward nodes (their ops carry Fwd thread id 1: 300, 2 x 2000 us). reserved_gib: allocator
    samples, 30 GiB kept and 40 at the peak, reserved_gib reserved (the device: the H100 80GB write_trace names,
    without its capacity: the catalog's 80 GiB)."""
    b = TraceBuilder()
    for s in range(STEPS):
        T, q = s * P, 100 * s
        b.step(s, T, P)
        if reserved_gib is not None:
            b.memory(T + 20, 30 << 30, reserved_gib << 30)
            b.memory(T + 3000, 40 << 30, reserved_gib << 30)
        at = T + 50.0
        for i, (name, kernel, us) in enumerate([("aten::linear", GEMM, 2000.0), ("aten::gelu", ELEM, 300.0)]):
            b.cpu(name, T + 10.0 * i, 8.0, **{"Sequence number": q + 10 + i, "Fwd thread id": 0})
            b.launch(kernel, T + 10.0 * i + 2.0, at, us)
            at += us
        b.cpu("autograd::engine::evaluate_function: CheckpointFunctionBackward", T + 100.0, 80.0, tid=2,
              **{"Sequence number": q + 12})
        for i, (name, kernel, us) in enumerate([("aten::linear", GEMM, 2000.0), ("aten::gelu", ELEM, 300.0)]):
            b.cpu(name, T + 102.0 + 10.0 * i, 8.0, tid=2, **{"Sequence number": q + 20 + i, "Fwd thread id": 0})
            b.launch(kernel, T + 104.0 + 10.0 * i, at, us, tid=2, launch_dur=3.0)
            at += us
        gelu, mm = (ELEM, 300.0, "aten::gelu_backward"), (GEMM, 2000.0, "aten::mm")
        for j, (node, kernels) in enumerate([("GeluBackward0", [gelu]), ("AddmmBackward0", [mm, mm])]):
            at = backward_node(b, node, T + 125.0 + 25.0 * j, q + 21 - j, kernels, at, dur=20.0, spacing=6.0)
        end_gpu_bound_step(b, T, P, at)
    return write_trace(b, folder)


def test_selective_recompute_priced_as_the_recomputed_gemms(tmp_path):
    # per step the backward re-runs 2000 + 300 us of kernels (25.3 % of the 9100-us step); keeping the GEMM's
    # output saves its 2000 us on a GPU-bound step: an upper bound (memory), so 22 % rates medium, not high
    d = diagnose(_checkpointed_trace(tmp_path))
    x = _finding(d)
    assert x is not None and x.priced and x.gain_is_upper_bound and x.severity == "medium"
    m = x.evidence["metrics"]
    n = STEPS - 1
    assert m["recomputed_ops"]["value"] == 2 * n
    assert m["recompute_kernel_time"]["value"] == pytest.approx(2300.0 * n, rel=1e-6)
    assert m["recomputed_gemm_attention_time"]["value"] == pytest.approx(2000.0 * n, rel=1e-6)
    assert x.gain_us / n == pytest.approx(2000.0, rel=0.01)
    assert any("reentrant" in note for note in x.notes)


@pytest.mark.parametrize("reserved, says", [(44, "34.00 GiB free at the peak"), (75, "no headroom")])
def test_the_headroom_recompute_trades_is_read_from_the_samples(tmp_path, reserved, says):
    # the catalog's H100: 80 GiB less its 2-GiB runtime reserve = 78 usable; 44 reserved: 34 free; 75 reserved is
    # within 90 % of 78 (70.2): no headroom
    x = _finding(diagnose(_checkpointed_trace(tmp_path, reserved)))
    assert x is not None and says in x.recommendation


def test_a_double_backward_is_not_recompute():
    # a gradient penalty (create_graph=True): the first backward's formula ops run as forward ops inside its nodes
    # (132 ops with a sequence number and Fwd thread id 0 in the trace, forward included). They repeat no product the
    # forward ran: what matches a forward op is views of the weights (aten::t) and the residual gradient's add
    p = DATA / "double_backward.json.gz"
    t = next(iter(load_trace(p).values()))
    names = {t.name_of(int(r)) for r in recomputed_ops(t, analysis_window(t).keep)}
    assert names <= {"aten::t", "aten::add"}
    assert _finding(diagnose(p)) is None
