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


def _trace(tmp_path: Path, where: str, kernels: bool = False) -> Path:
    """The trace of case `where`; kernels: each operator also launches a 10-us kernel (a GPU trace)."""
    b = TraceBuilder()
    for s in range(STEPS):
        T = 1000.0 * s
        b.step(s, T, 1000)
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
