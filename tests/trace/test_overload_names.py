"""Operators named with their overload ("aten::add.Tensor": PyTorch's capture_overload_names) read as a default
profile names them ("aten::add"), so that every rule and price finds them.

Reference: two real CPU profiles of the same step made here, one with
experimental_config=_ExperimentalConfig(capture_overload_names=True), one without."""

import pytest
import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

from trainperf.diagnose.roofline import roofline
from trainperf.trace.events import CPU_OP
from trainperf.trace.kineto import OVERLOADED_OP_RE, read_kineto


def _profile(path, overloads: bool):
    x = torch.randn(64, 64, requires_grad=True)
    config = {"experimental_config": _ExperimentalConfig(capture_overload_names=True)} if overloads else {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **config) as p:
        y = torch.softmax((x @ x).add(x).mul(2.0), dim=-1).sum(dim=0)
        y.sum().backward()
    p.export_chrome_trace(str(path))
    return path


def _ops(t) -> list[str]:
    return sorted(t.names[i] for i in t.name[t.kind == CPU_OP])


def test_overloads_are_dropped_from_operator_names(tmp_path):
    raw = _profile(tmp_path / "overloads.json", True).read_text()
    if '"aten::add.Tensor"' not in raw:  # this torch does not write them: nothing to check
        pytest.skip("capture_overload_names wrote no overloads")
    named, plain = read_kineto(tmp_path / "overloads.json"), read_kineto(_profile(tmp_path / "plain.json", False))
    assert _ops(named) == _ops(plain)
    assert not any(OVERLOADED_OP_RE.match(n) for n in _ops(named))
    # the roofline prices the same operators with the same counts (the elementwise ones were unpriced before)
    key = lambda rows: sorted((r.op, r.count) for r in rows)  # noqa: E731
    assert key(roofline(named)) == key(roofline(plain)) and any(r.op == "aten::add" for r in roofline(named))


def test_the_pattern_takes_operators_only():
    assert OVERLOADED_OP_RE.match("aten::sum.dim_IntList").group(1) == "aten::sum"
    for name in ("aten::add", "Optimizer.step#AdamW.step", "void at::native::vectorized_elementwise_kernel<4>",
                 "c10d::allreduce_", "torch/nn/modules/module.py(1751): _call_impl", "nccl:all_reduce",
                 "at::native::foo.bar::baz"):
        assert not OVERLOADED_OP_RE.match(name), name
