"""Where the driver frees are made names the allocator's fix (diagnose/allocator.py), on hand-built traces: 3 steps of
12 operators, each allocating through cudaMalloc, and 12 cudaFree calls a step made (a) one inside each operator, as
tensors die with the caching allocator off; (b) back to back after the operators, outside any, as
torch.cuda.empty_cache() hands the cache back; (c) back to back inside one allocating operator, as a failed cudaMalloc
releases the cache before retrying."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.allocator import ALLOCATOR_OFF, CACHE_EMPTIED, allocator_pattern  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

STEPS, OPS = 4, 12  # the last step is left out of the window: 3 analysed


def _trace(tmp_path: Path, where: str) -> Path:
    b = TraceBuilder()
    for s in range(STEPS):
        T = 1000.0 * s
        b.step(s, T, 1000)
        for i in range(OPS):
            at = T + 50.0 * i
            b.cpu("aten::empty", at, 40)
            b.cpu("cudaMalloc", at + 5, 10, cat="cuda_runtime")
            if where == "inside":
                b.cpu("cudaFree", at + 20, 10, cat="cuda_runtime")
        for i in range(OPS):
            if where == "outside":
                b.cpu("cudaFree", T + 700 + 10.0 * i, 8, cat="cuda_runtime")
        if where == "pressure":
            b.cpu("aten::empty_strided", T + 700, 200)
            for i in range(OPS):
                b.cpu("cudaFree", T + 705 + 10.0 * i, 8, cat="cuda_runtime")
    return b.write(tmp_path / f"{where}.json.gz")


@pytest.mark.parametrize("where, kind, outside, stretches", [
    ("inside", ALLOCATOR_OFF, 0.0, 12.0),   # one stretch per operator: each tensor's own free
    ("outside", CACHE_EMPTIED, 1.0, 1.0),   # one stretch a step, outside every operator
    ("pressure", "", 0.0, 1.0),             # one stretch a step inside an operator: neither
])
def test_where_the_frees_are_made(tmp_path, where, kind, outside, stretches):
    t = read_kineto(_trace(tmp_path, where))
    w = analysis_window(t)
    p = allocator_pattern(t, w, len(w.steps))
    assert len(w.steps) == STEPS - 1 and p.frees == OPS * (STEPS - 1) and p.mallocs == OPS * (STEPS - 1)
    assert p.frees_outside == pytest.approx(outside) and p.mallocs_inside == pytest.approx(1.0)
    assert p.stretches_per_step == pytest.approx(stretches) and p.kind == kind
