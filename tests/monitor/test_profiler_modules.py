"""StepProfiler(record_modules=True) writes the nn.Module spans `diagnose --modules` needs; off by default.

Reference: the model's own module tree (named_modules), which the trace's module paths must reproduce."""

import torch
from torch import nn

from trainperf.diagnose.modules import module_breakdown
from trainperf.monitor.profiler import StepProfiler
from trainperf.trace.kineto import read_kineto


def _trace(tmp_path, record_modules: bool):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    prof = StepProfiler(tmp_path, (2, 3), rank=0, record_modules=record_modules)
    with prof:
        for _ in range(3):
            model(x).sum().backward()
            prof.step()
    return module_breakdown(read_kineto(prof.path), by="instance")


def test_record_modules_writes_the_module_spans(tmp_path):
    b = _trace(tmp_path / "on", True)
    # nn.Sequential > Linear, ReLU, Linear; the profiler numbers instances per class: Linear_0, Linear_1
    paths = {r.path for r in b.rows if r.depth}
    assert paths == {"Sequential_0", "Sequential_0/Linear_0", "Sequential_0/ReLU_0", "Sequential_0/Linear_1"}
    assert b.steps == 2 and all(r.calls_per_step == 1 for r in b.rows if r.depth)


def test_modules_are_off_by_default(tmp_path):
    b = _trace(tmp_path / "off", False)
    assert not [r for r in b.rows if r.depth] and any("with_stack=True" in n for n in b.notes)
