"""StepProfiler(record_modules=True) writes the nn.Module spans `diagnose --modules` needs, and Python's garbage
collections (`gc_stall`); off by default.

Reference: the model's own module tree (named_modules), which the trace's module paths must reproduce."""

import gc
import json

import torch
from torch import nn

from trainperf.diagnose.modules import module_breakdown
from trainperf.monitor.profiler import StepProfiler
from trainperf.trace.kineto import read_kineto


def _profile(tmp_path, record_modules: bool) -> StepProfiler:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    prof = StepProfiler(tmp_path, (2, 3), rank=0, record_modules=record_modules)
    with prof:
        for _ in range(3):
            model(x).sum().backward()
            gc.collect()  # one collection a step
            prof.step()
    return prof


def _trace(tmp_path, record_modules: bool):
    return module_breakdown(read_kineto(_profile(tmp_path, record_modules).path), by="instance")


def test_record_modules_writes_the_module_spans(tmp_path):
    b = _trace(tmp_path / "on", True)
    # nn.Sequential > Linear, ReLU, Linear; the profiler numbers instances per class: Linear_0, Linear_1
    paths = {r.path for r in b.rows if r.depth}
    assert paths == {"Sequential_0", "Sequential_0/Linear_0", "Sequential_0/ReLU_0", "Sequential_0/Linear_1"}
    assert b.steps == 2 and all(r.calls_per_step == 1 for r in b.rows if r.depth)


def test_record_modules_records_the_garbage_collections_too(tmp_path):
    # torch 2.9+ records each collection as a "Python GC" span beside the frames (diagnose's gc_stall reads them):
    # one gc.collect() a recorded step at least; none without the Python frames
    def collections(record_modules):
        path = _profile(tmp_path / str(record_modules), record_modules).path
        return sum(e.get("name") == "Python GC" for e in json.loads(path.read_text())["traceEvents"])
    assert collections(True) >= 2 and collections(False) == 0


def test_modules_are_off_by_default(tmp_path):
    b = _trace(tmp_path / "off", False)
    assert not [r for r in b.rows if r.depth] and any("with_stack=True" in n for n in b.notes)
