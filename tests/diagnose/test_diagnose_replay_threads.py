"""Replay across host threads on a hand-built host-bound trace (answer worked by hand): a blocking 10 ms
pageable copy at the start of each step must be priced ~10 ms per step, also when the backward runs on
another thread (the autograd thread) whose start waits for the main thread."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.replay import build_graph, replay  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

P = 30_000.0  # step period, µs
COPY_US = 10_000.0


def _two_thread_trace(path: Path, steps: int = 5) -> Path:
    # step T (main thread 1): cudaMemcpyAsync [T, T+10000) blocks on "Pageable -> Device" [T+10, T+9995);
    # forward: 5 ops of 900 us each launching a 50-us kernel, at T+10000 + 1000 i; then main idles in
    # backward(). Thread 2 (autograd): 10 ops of 900 us at T+15100 + 1000 i, each launching a 50-us kernel.
    # Main: optimizer op [T+25500, T+30000) launching one kernel. The GPU is idle ~98%: host-bound.
    b = TraceBuilder()

    def op(tid: int, ts: float, dur: float, kernel: str):
        b.cpu("aten::op", ts, dur, tid=tid)
        b.launch(kernel, ts + 10, ts + 20, 50)
        b.events[-2]["tid"] = tid  # the launch call runs on the op's thread

    for s in range(steps):
        T = s * P
        b.step(s, T, P)
        b.launch("Memcpy HtoD (Pageable -> Device)", T, T + 10, COPY_US - 15, cat="gpu_memcpy", launch_dur=COPY_US,
                 runtime="cudaMemcpyAsync", bytes=64 << 20)
        for i in range(5):
            op(1, T + COPY_US + 1000 * i, 900, "fwd_gemm")
        for i in range(10):
            op(2, T + 15_100 + 1000 * i, 900, "bwd_gemm")
        op(1, T + 25_500, 4_500, "optimizer")
    return b.write(path)


def test_baseline_replay_reproduces_two_threads(tmp_path):
    t = next(iter(load_trace(_two_thread_trace(tmp_path / "t.json.gz")).values()))
    w = analysis_window(t)
    g = build_graph(t, w)
    r = replay(g)
    np.testing.assert_allclose(r.start, g.start, atol=1e-6)
    # the autograd thread's first call in the window waits for the main thread (host_dep)
    assert (g.host_dep[g.is_host] >= 0).sum() >= 1


def test_blocking_copy_priced_per_step_across_threads(tmp_path):
    # unblocked, each copy call costs the typical call (4 us) instead of 10000 us: every step, both threads
    # included, starts 9996 us earlier -> gain = steps in window x 9996 us (the window ends at its last
    # call, before the last step's end, so the share is a little above 9996 / 30000).
    d = diagnose(_two_thread_trace(tmp_path / "t.json.gz"))
    f = next(x for x in d.findings if x.kind == "pageable_copy")
    n = len(f.steps)
    assert n >= 2
    assert 100 * 9996 / P <= f.gain_alone_pct <= 100 * 9996 / (P - 4_500)
    assert f.gain_us == pytest.approx(n * 9996, rel=0.01)
