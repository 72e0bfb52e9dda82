"""The usual op dispatch per kernel launch is measured on the launches themselves, so runtime calls that are not
launches (a device query, an allocation, a read) do not move it (issue 9: injected hipMemcpyWithStream reads and
hipMalloc calls moved HTA's MI250 estimate from 27.5 to 5 us, and small_kernels' gain with it).

Hand-built host-bound trace, answer worked by hand: each 3000-us step runs 2000 us of Python, then 10 ops
(aten::add), each 50 us of CPU dispatch and a 10-us cudaLaunchKernel, then Python until the next step. In the
"with calls" twin each op also makes two calls that launch nothing, cudaGetDevice and cudaMalloc (2 us each), so
its dispatch reads 20 us of CPU, a call, 15 us, a call, 15 us, then the launch: still 50 us of CPU work per launch.
Both twins: dispatch 50 us, each launch costs the host 50 + 10 = 60 us (what a CUDA graph removes).
The median gap before every runtime call read 50 us in the plain twin and 15 us with the calls.
"""

from pathlib import Path

import numpy as np
import pytest
from host_bound import host_bound_trace

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.replay import build_graph, dispatch_taken
from trainperf.diagnose.window import analysis_window
from trainperf.trace.load import load_trace


def _trace(path: Path, calls: bool) -> Path:
    return host_bound_trace(path / ("calls.json.gz" if calls else "plain.json.gz"), calls=calls)


def _graph(path: Path):
    t = next(iter(load_trace(path).values()))
    return build_graph(t, analysis_window(t))


@pytest.mark.parametrize("calls", [False, True])
def test_dispatch_is_measured_between_launches(tmp_path, calls):
    g = _graph(_trace(tmp_path, calls))
    assert g.dispatch_us == pytest.approx(50.0)
    # every node of a stretch names the launch that ends it; the launch names itself
    launches = np.flatnonzero(g.kernel_launch)
    assert (g.launch_group[launches] == launches).all()


def test_launch_cost_does_not_move_with_calls_that_launch_nothing(tmp_path):
    plain = diagnose(_trace(tmp_path, False))
    with_calls = diagnose(_trace(tmp_path, True))
    for d in (plain, with_calls):
        m = next(x for x in d.findings if x.kind == "launch_bound").evidence["metrics"]
        assert m["per_launch_cost"]["value"] == pytest.approx(60.0)


def test_dispatch_is_taken_from_the_stretch_latest_first(tmp_path):
    # with the calls, the 50 us of a launch's dispatch sit in three gaps (20, 15, 15 us, oldest first): graphing
    # the launch takes all three; with dispatch_us 25 it would take the last 15 us and 10 of the middle gap
    g = _graph(_trace(tmp_path, True))
    cpu = g.cpu_work_us
    launch = int(np.flatnonzero(g.kernel_launch)[3])  # a launch after another launch in the same step
    stretch = np.flatnonzero(g.launch_group == launch)
    stretch = stretch[np.argsort(g.start[stretch])]
    assert cpu[stretch] == pytest.approx([20.0, 15.0, 15.0])
    assert dispatch_taken(g, cpu, g.kernel_launch)[stretch] == pytest.approx([20.0, 15.0, 15.0])
    g.dispatch_us = 25.0
    assert dispatch_taken(g, cpu, g.kernel_launch)[stretch] == pytest.approx([0.0, 10.0, 15.0])


def test_python_between_ops_is_not_dispatch(tmp_path):
    # each launch's op (aten::add: 50 us of dispatch, then the 10-us call) follows 100 us of other host work outside
    # the launching op: fusing the op removes its dispatch, not that Python, so the usual dispatch stays 50 us
    # (the CPU time since the previous launch is 150 us)
    g = _graph(host_bound_trace(tmp_path / "py.json.gz", other_op_us=100.0, python_us=1000.0))
    assert g.dispatch_us == pytest.approx(50.0)
