"""Where the driver frees are made names the allocator's fix (diagnose/allocator.py), on hand-built traces: 3 steps of
12 operators, each allocating through cudaMalloc, and 12 cudaFree calls a step made (a) one inside each operator, as
tensors die with the caching allocator off; (b) back to back after the operators, outside any, as
torch.cuda.empty_cache() hands the cache back; (c) back to back inside one allocating operator, then a cudaMalloc in
it, as a failed cudaMalloc releases the cache and retries."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.allocator import ALLOCATOR_OFF, CACHE_EMPTIED, MEMORY_PRESSURE, allocator_pattern  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

STEPS, OPS = 4, 12  # the last step is left out of the window: 3 analysed
GIB = 1 << 30


def _trace(tmp_path: Path, where: str, kernels: bool = False, reserved: int | None = None,
           training: bool = False) -> Path:
    """The trace of case `where` ("none": no frees, the allocations alone); kernels: each operator also launches a
    10-us kernel (a GPU trace); reserved: allocator samples (profile_memory=True) on a 16-GiB device, 10 then 12 GiB
    allocated a step, `reserved` bytes reserved; training: an optimizer step ends each step (else the loop reads
    forward-only: ATen ops, no backward node, no optimizer)."""
    b = TraceBuilder()
    if reserved is not None:
        b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
    for s in range(STEPS):
        T = 1000.0 * s
        b.step(s, T, 1000)
        if training:
            b.cpu("Optimizer.step#AdamW.step", T + 900, 50, cat="user_annotation")
        if reserved is not None:
            b.memory(T + 100, 10 * GIB, reserved)
            b.memory(T + 600, 12 * GIB, reserved)
        for i in range(OPS):
            at = T + 50.0 * i
            b.cpu("aten::empty", at, 40)
            b.cpu("cudaMalloc", at + 5, 10, cat="cuda_runtime")
            if kernels:
                b.launch("ampere_sgemm_128x64_tn", at + 30, at + 35, 10)
            if where == "inside":
                b.cpu("cudaFree", at + 20, 10, cat="cuda_runtime")
        for i in range(OPS):
            if where == "outside":
                b.cpu("cudaFree", T + 700 + 10.0 * i, 8, cat="cuda_runtime")
        if where == "pressure":  # a cudaMalloc failed: the cache handed back, then the allocation retried
            b.cpu("aten::empty_strided", T + 700, 200)
            for i in range(OPS):
                b.cpu("cudaFree", T + 705 + 10.0 * i, 8, cat="cuda_runtime")
            b.cpu("cudaMalloc", T + 830, 10, cat="cuda_runtime")
    return b.write(tmp_path / f"{where}.json.gz")


@pytest.mark.parametrize("where, kind, outside, stretches, retry, mallocs", [
    ("inside", ALLOCATOR_OFF, 0.0, 12.0, 0.0, OPS),            # one stretch per operator: each tensor's own free
    ("outside", CACHE_EMPTIED, 1.0, 1.0, 0.0, OPS),            # one stretch a step, outside every operator
    ("pressure", MEMORY_PRESSURE, 0.0, 1.0, 1.0, OPS + 1),     # one stretch inside an operator, then its retry
])
def test_where_the_frees_are_made(tmp_path, where, kind, outside, stretches, retry, mallocs):
    t = read_kineto(_trace(tmp_path, where))
    w = analysis_window(t)
    p = allocator_pattern(t, w, len(w.steps))
    assert len(w.steps) == STEPS - 1 and p.frees == OPS * (STEPS - 1) and p.mallocs == mallocs * (STEPS - 1)
    assert p.frees_outside == pytest.approx(outside) and p.mallocs_inside == pytest.approx(1.0)
    assert p.stretches_per_step == pytest.approx(stretches) and p.frees_before_retry == pytest.approx(retry)
    assert p.kind == kind


@pytest.mark.parametrize("where, says", [("inside", "the caching allocator is off"),
                                         ("outside", "torch.cuda.empty_cache()"),
                                         ("pressure", "runs out of device memory")])
def test_allocator_stall_names_the_fix_of_its_pattern(tmp_path, where, says):
    path = _trace(tmp_path, where, kernels=True)
    found = next(f for f in diagnose(path).findings if f.kind == "allocator_stall")
    assert says in found.recommendation


@pytest.mark.parametrize("reserved, training, says", [
    (13 * GIB, True, "13.00 GiB reserved of the device's 16.00 GiB (10.00 GiB kept between steps)): the cache cannot "
                     "grow"),                                                           # 13 of 14 usable: near full
    (13 * GIB, False, "KV cache"),                          # a forward-only loop: a serving engine's cache squeezes it
    (12 * GIB + (1 << 28), True, "the caching allocator")])  # 12.25 of 14: under 90 %, the general advice
def test_the_allocator_at_the_devices_edge(tmp_path, reserved, training, says):
    """Allocations alone (no pattern in the frees) with the allocator's samples: the device's edge is named where the
    reserved peak is within 90 % of the usable memory (16 GiB less the runtime's 2: 14), the general advice else."""
    path = _trace(tmp_path, "none", kernels=True, reserved=reserved, training=training)
    found = next(f for f in diagnose(path).findings if f.kind == "allocator_stall")
    assert says in found.recommendation
    share = found.evidence["metrics"]["peak_reserved_of_usable_memory"]["value"]
    assert share == pytest.approx(100 * reserved / (14 * GIB), abs=1e-3)
