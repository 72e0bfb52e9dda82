"""The one step finder (trace.annotate.step_rows): t.step, the analysis window, the replay's anchors and the
CPU-only straggler's per-step waits all take their steps from the stepping thread's ProfilerStep#N spans.

Reference: a hand-built trace (kineto_builder) whose steps are known by construction: 3 steps of 100 µs on
thread 1 at 1000, 1100, 1200 µs, and a user's own `ProfilerStep#7` record function on thread 2 at 1050-1070 µs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from trainperf.trace.annotate import step_rows, step_spans
from trainperf.trace.events import KERNEL
from trainperf.trace.load import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kineto_builder import TraceBuilder  # noqa: E402


def _two_thread_trace(tmp_path: Path):
    b = TraceBuilder()
    for k in range(3):
        b.step(k, 1000 + 100 * k, 100)
    b.cpu("ProfilerStep#7", 1050, 20, cat="user_annotation", tid=2)
    b.cpu("aten::copy_", 1055, 5, tid=2)               # inside step 0 by time, inside the stray span too
    b.launch("gemm", 1080, 1085, 10)                    # launched in step 0, after the stray span ended
    b.launch("gemm", 1150, 1160, 10)                    # step 1
    return next(iter(load_trace(b.write(tmp_path / "t.json.gz")).values()))


def test_steps_are_the_stepping_threads(tmp_path):
    t = _two_thread_trace(tmp_path)
    rows, ignored = step_rows(t)
    assert [t.names[int(n)] for n in t.name[rows]] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert ignored.size == 1 and t.tid[ignored[0]] == 2
    steps, start, end = step_spans(t)
    assert list(steps) == [0, 1, 2]
    assert list(start // 1000) == [1000, 1100, 1200] and list((end - start) // 1000) == [100, 100, 100]


def test_step_of_every_event_reads_the_stepping_threads_spans(tmp_path):
    """The kernel launched at 1080 µs is in step 0 (1000-1100 µs); with the stray span taken for a step it was
    in none (the last span starting before it, #7, ended at 1070). The op at 1055 µs on thread 2 is in step 0."""
    t = _two_thread_trace(tmp_path)
    kern = np.flatnonzero(t.kind == KERNEL)
    assert list(t.step[kern[np.argsort(t.ts_ns[kern])]]) == [0, 1]
    copy = np.flatnonzero(t.name == t.names.index("aten::copy_"))
    assert list(t.step[copy]) == [0]
