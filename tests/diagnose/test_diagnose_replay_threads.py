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
from trainperf.diagnose.replay import Change, build_graph, replay, spans_time_us  # noqa: E402
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
    # included, starts 9996 us earlier -> gain = steps in window x 9996 us (the window ends with the last
    # analysed step, so the share is 9996 / 30000, a little above where a thread's last call closes it).
    d = diagnose(_two_thread_trace(tmp_path / "t.json.gz"))
    f = next(x for x in d.findings if x.kind == "pageable_copy")
    n = len(f.steps)
    assert n >= 2
    assert 100 * 9996 / P <= f.gain_alone_pct <= 100 * 9996 / (P - 4_500)
    assert f.gain_us == pytest.approx(n * 9996, rel=0.01)


def _watchdog_trace(path: Path, steps: int = 4) -> Path:
    # step T (main thread 1, P = 30 ms): a 10 ms DataLoader span [T, T+10000), then 20 ops of 900 us at
    # T+10000 + 1000 i, each launching a 50-us kernel (host-bound). A watchdog thread (tid 9) polls with
    # cudaEventQuery (1 us) at T+5000, inside each DataLoader wait, and launches nothing.
    b = TraceBuilder()
    for s in range(steps):
        T = s * P
        b.step(s, T, P)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", T, COPY_US, cat="user_annotation")
        for i in range(20):
            b.cpu("aten::op", T + COPY_US + 1000 * i, 900)
            b.launch("gemm", T + COPY_US + 1000 * i + 10, T + COPY_US + 1000 * i + 20, 50)
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventQuery", "pid": 10, "tid": 9,
                         "ts": T + 5000, "dur": 1, "args": {}})
    return b.write(path)


def test_polling_thread_does_not_hold_the_replayed_window(tmp_path):
    # the window holds steps 0-2 (the last is left out, as HTA does); removing the DataLoader wait moves every
    # step 10000 us earlier: gain 3 x 10000 us by hand. The watchdog's polls waited for nothing; kept in the graph,
    # each kept its observed delay after the last call before it (inside a DataLoader wait) and held the replayed
    # window's end back (gain 10000 us instead).
    t = next(iter(load_trace(_watchdog_trace(tmp_path / "t.json.gz")).values()))
    w = analysis_window(t)
    g = build_graph(t, w)
    assert not np.isin(t.tid[g.rows[g.is_host]], [9]).any()
    base = replay(g)
    np.testing.assert_allclose(base.start, g.start, atol=1e-6)
    # the window ends where step 2 ends (its host thread's; its last kernel ended at 2 P + 10000 + 19070 before)
    assert base.makespan_us == pytest.approx(3 * P)
    assert base.makespan_us - replay(g, Change("remove_data_wait")).makespan_us == pytest.approx(3 * COPY_US, abs=1)


def test_a_cpu_op_profiler_step_is_not_an_op(tmp_path):
    # PyTorch < 2.0 records ProfilerStep#N as a cpu_op: the same two-thread trace with its steps so recorded must
    # give the same waits, dispatch and gains (as a user_annotation the step is no op of the thread: its main
    # thread's idle time inside backward() is a wait for the autograd thread, not work)
    import gzip
    import json

    path = _two_thread_trace(tmp_path / "new.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            e["cat"] = "cpu_op"
    old = tmp_path / "old.json.gz"
    old.write_bytes(gzip.compress(json.dumps(doc).encode()))
    graphs = []
    for p in (path, old):
        t = next(iter(load_trace(p).values()))
        graphs.append(build_graph(t, analysis_window(t)))
    a, b = graphs
    assert a.gap_idle.sum() > 0
    np.testing.assert_allclose(b.gap_idle, a.gap_idle)
    assert b.dispatch_us == a.dispatch_us
    fa, fb = (next(x for x in diagnose(p).findings if x.kind == "pageable_copy") for p in (path, old))
    assert fb.gain_us == pytest.approx(fa.gain_us)


def test_another_threads_data_loader_wait_is_not_in_this_threads_gap(tmp_path):
    # steps and a 300-us DataLoader wait [T, T+300) on thread 1, which launches nothing; thread 2 runs 5 ops of
    # 40 us at T+320 + 50 k, each launching a 30-us kernel. Thread 2's gap across a step boundary (2534 -> 3330,
    # say) holds thread 1's wait; counted as thread 2's data loading beside its own idle time, the replay of the
    # trace unchanged ran each such gap 264 us long (its CPU work clipped at zero) and ended 792 us late
    b = TraceBuilder()
    for s in range(5):
        T = s * 1000.0
        b.step(s, T, 1000)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", T, 300, cat="user_annotation")
        for k in range(5):
            b.cpu("aten::mm", T + 320 + 50 * k, 40, tid=2)
            b.launch("ampere_sgemm_128x64_tn", T + 330 + 50 * k, T + 340 + 50 * k, 30, tid=2)
    t = next(iter(load_trace(b.write(tmp_path / "t.json.gz")).values()))
    g = build_graph(t, analysis_window(t))
    base = replay(g)
    np.testing.assert_allclose(base.start, g.start, atol=1e-6)
    assert base.makespan_us == pytest.approx(4000.0)  # steps 0-3


def test_removed_spans_time_counts_each_threads_overlaps_once():
    # thread 1: [0, 10) and [5, 20) overlap -> 20 us; thread 2: [5, 20) is another thread's time -> 15 us; the
    # piece [30, 31) on thread 1 adds 1: 36 us, where a plain sum would give 10 + 15 + 15 + 1 = 41
    spans = [(1, 0.0, 10.0), (1, 5.0, 20.0), (2, 5.0, 20.0), (1, 30.0, 31.0)]
    assert spans_time_us(spans) == pytest.approx(36.0)
    assert spans_time_us([]) == 0.0
