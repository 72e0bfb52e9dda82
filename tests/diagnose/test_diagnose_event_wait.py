"""A collective on its own stream waits for the gradients it reduces (an event wait): the replay must link it
to the kernel it waited for, so that computation made faster moves it earlier.

Hand-built trace (answer worked by hand): every 10 ms step launches a 4 ms GEMM on stream 7 at T+100 (it starts
at T+110) and a 500-µs all-reduce on stream 9 at T+200; the all-reduce starts `gap` µs after the GEMM ends (the
device's event-wait latency), and the host synchronizes until it ends. With computation 2x faster the GEMM ends
2,000 µs sooner; a linked all-reduce starts `gap` µs after that, and every later step with it. Left unlinked, its observed
delay after its launch is kept fixed and it does not move.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.replay import EVENT_WAIT_US, Change, build_graph, replay  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

P, GEMM_US, REDUCE_US, STEPS = 10_000.0, 4_000.0, 500.0, 4


def _graph(path: Path, gap_us: float):
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.launch("sm80_xmma_gemm_f16f16_f16f32", T + 100, T + 110, GEMM_US)
        reduce_start = T + 110 + GEMM_US + gap_us
        b.launch("ncclKernel_AllReduce_RING_LL_Sum_float", T + 200, reduce_start, REDUCE_US, stream=9)
        b.cpu("cudaDeviceSynchronize", T + 300, reduce_start + REDUCE_US + 5 - (T + 300), cat="cuda_runtime")
    t = next(iter(load_trace(b.write(path / "t.json.gz")).values()))
    return t, build_graph(t, analysis_window(t))


def _nodes(t, g, prefix: str) -> np.ndarray:
    return np.array([i for i in np.flatnonzero(~g.is_host) if t.names[t.name[g.rows[i]]].startswith(prefix)])


@pytest.mark.parametrize("gap_us", [3.0, 8.0, 15.0])
def test_a_collective_starting_within_the_event_wait_latency_waits_for_the_gemm(tmp_path, gap_us):
    t, g = _graph(tmp_path, gap_us)
    gemms, reduces = _nodes(t, g, "sm80"), _nodes(t, g, "ncclKernel")
    assert reduces.size >= 3
    np.testing.assert_array_equal(g.dep[reduces], gemms[:reduces.size])
    np.testing.assert_allclose(g.lag[reduces], gap_us)  # the wait's own latency stays
    before, after = replay(g), replay(g, Change("compute_speedup", factor=2.0))
    # each all-reduce starts gap µs after its GEMM's new end; the host waits for it, so each step starts
    # 2,000 µs sooner than the one before did: step k's all-reduce moves by 2,000 (k + 1) µs
    np.testing.assert_allclose(after.start[reduces], after.end[gemms[:reduces.size]] + gap_us)
    moved = (GEMM_US / 2) * np.arange(1, reduces.size + 1)
    np.testing.assert_allclose(before.start[reduces] - after.start[reduces], moved, atol=1e-6)


def test_an_end_longer_ago_than_the_event_wait_latency_is_not_a_dependency(tmp_path):
    # 50 µs after the GEMM's end: at the chance rate of an unrelated end (benchmarks/measure_event_waits.py)
    gap_us = 50.0
    assert gap_us > EVENT_WAIT_US
    t, g = _graph(tmp_path, gap_us)
    reduces = _nodes(t, g, "ncclKernel")
    assert (g.dep[reduces] == -1).all()
    after = replay(g, Change("compute_speedup", factor=2.0))
    np.testing.assert_allclose(after.start[reduces], g.start[reduces])  # its observed delay is kept: it stays
