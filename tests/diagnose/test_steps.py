"""The step finder (diagnose/steps.py) on the step markers real traces carry.

References: hand-worked times of small traces built in the format PyTorch's profiler writes
(tests/trace/kineto_builder.py), and, on HTA's real traces, the raw Kineto JSON read by the
corpus's own reader (trainperf.corpus.kineto: plain json, independent of trainperf.trace and diagnose).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from trainperf.corpus import kineto as K
from trainperf.diagnose.steps import step_times
from trainperf.diagnose.window import analysis_window, find_step_markers
from trainperf.trace.load import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

HTA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"
needs_hta = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/data/traces/hta not present")

STEP_US, LAG_US, KERNEL_US = 100.0, 150.0, 25.0


def _modern(tmp_path: Path, host: bool = True, gpu: bool = True, cat: str = "user_annotation") -> Path:
    """4 steps of 100 µs, each launching 2 kernels of 25 µs that start 150 µs after the step (the GPU runs
    behind the host); the device copy of ProfilerStep#N spans the step's kernels, as Kineto writes it."""
    b = TraceBuilder()
    for k in range(4):
        t0 = 1000 + STEP_US * k
        if host:
            b.cpu(f"ProfilerStep#{k}", t0, STEP_US, cat=cat)
        starts = [t0 + LAG_US + 30 * j for j in range(2)]
        for j, s in enumerate(starts):
            b.launch(f"gemm_{j}", t0 + 10 + 30 * j, s, KERNEL_US)
        if gpu:
            b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{k}", "pid": 0,
                             "tid": 7, "ts": starts[0], "dur": starts[-1] + KERNEL_US - starts[0],
                             "args": {"External id": 5 + k}})
    return b.write(tmp_path / "t.json.gz")


def _table(path: Path):
    return next(iter(load_trace(path).values()))


def test_device_copies_of_profiler_step_are_markers_not_steps(tmp_path):
    t = _table(_modern(tmp_path))
    m = find_step_markers(t)
    assert m.count == 4 and list(m.numbers) == [0, 1, 2, 3]
    assert m.device_rows.size == 4 and not np.isin(m.device_rows, m.host_rows).any()
    st = step_times(t, analysis_window(t, include_last_step=True), m)
    assert [s.host_us for s in st] == [STEP_US] * 4
    assert [s.device_busy_us for s in st] == [2 * KERNEL_US] * 4          # two 25-µs kernels
    assert [s.gpu_lag_us for s in st] == [LAG_US] * 4                     # found through the launches
    assert [s.gpu_end_us - s.gpu_start_us for s in st] == [30 + KERNEL_US] * 4


def test_profiler_step_as_cpu_op_the_pre_2_0_schema(tmp_path):
    m = find_step_markers(_table(_modern(tmp_path, gpu=False, cat="cpu_op")))
    assert m.count == 4 and m.note == ""


def test_steps_come_from_the_thread_that_calls_prof_step(tmp_path):
    b = TraceBuilder()
    for k in range(3):
        b.step(k, 1000 + 100 * k, 100)
    b.cpu("ProfilerStep#7", 1050, 20, cat="user_annotation", tid=2)  # a span of that name on another thread
    t = _table(b.write(tmp_path / "t.json.gz"))
    m = find_step_markers(t)
    assert list(m.numbers) == [0, 1, 2] and m.ignored_rows.size == 1
    assert [s.start_us for s in step_times(t, analysis_window(t), m)] == [1000.0, 1100.0, 1200.0]


def test_device_markers_only_say_so_and_give_no_steps(tmp_path):
    t = _table(_modern(tmp_path, host=False))
    m = find_step_markers(t)
    assert m.count == 0 and m.device_rows.size == 4
    assert "only on the GPU timeline" in m.note and "prof.step()" in m.note
    assert step_times(t, analysis_window(t), m) == []


def test_no_profiler_step_is_said_never_guessed(tmp_path):
    b = TraceBuilder()
    for k in range(3):
        b.cpu("Optimizer.step#SGD.step", 1000 + 100 * k, 10, cat="user_annotation")
        b.launch("sgd_kernel", 1001 + 100 * k, 1020 + 100 * k, 5)
    t = _table(b.write(tmp_path / "t.json.gz"))
    m = find_step_markers(t)
    assert m.count == 0 and step_times(t, analysis_window(t), m) == []
    assert m.note.startswith("no ProfilerStep#N spans") and "3 Optimizer.step annotations" in m.note


@needs_hta
def test_real_trace_without_profiler_step_with_gpu_user_annotation():
    """HTA's with_gpu_user_annotation: a Quadro GP100 training loop with optimizer annotations on host and
    GPU but no ProfilerStep: no steps, and the note counts the loop's Optimizer.step spans (raw JSON)."""
    path = HTA / "with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    events = K.read_events(path)["traceEvents"]
    n_opt = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#"))
    assert K.steps(events) == [] and n_opt == 5
    m = find_step_markers(_table(path))
    assert m.count == 0 and f"{n_opt} Optimizer.step annotations" in m.note


@needs_hta
@pytest.mark.parametrize("rel", ["amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                 "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"])
def test_real_traces_steps_match_the_raw_json(rel):
    """Host steps = the raw JSON's host ProfilerStep spans (number, start, length); each step's GPU start = the
    first device op launched inside it (launch times from the raw JSON). The MI250 trace also holds a device
    copy of ProfilerStep#1 (gpu_user_annotation), which must not count as a step."""
    events = K.read_events(HTA / rel)["traceEvents"]
    ref = K.steps(events)
    t = _table(HTA / rel)
    st = step_times(t, analysis_window(t, include_last_step=True))
    assert [s.step for s in st] == [r.number for r in ref]
    assert np.allclose([s.start_us for s in st], [r.ts for r in ref], atol=1e-3)
    assert np.allclose([s.host_us for s in st], [r.end - r.ts for r in ref], atol=1e-3)
    launch = K.launch_times(events)
    ops = [(launch[c], float(e["ts"])) for e in events if K.is_gpu_op(e) and (c := K.correlation(e)) in launch]
    for s, r in zip(st, ref):
        starts = [ts for lt, ts in ops if r.ts <= lt < r.end]
        if starts:
            assert s.gpu_start_us == pytest.approx(min(starts), abs=1.0)  # HTA rounds float-µs starts up
        else:
            assert s.gpu_start_us != s.gpu_start_us  # nan: the step launched nothing
    gpu_copies = sum(1 for e in events if e.get("cat") == "gpu_user_annotation" and "ProfilerStep" in e["name"])
    assert find_step_markers(t).device_rows.size == gpu_copies


def test_replay_anchors_and_host_waits_use_the_same_steps(tmp_path):
    """The replay's anchors (first and last step of the window) and the CPU-only straggler's per-step waits take
    the steps of the stepping thread: 3 steps of 100 µs, the window leaves out the last (#2), so the anchors are
    #0 and #1, and a `ProfilerStep#7` span on another thread is neither an anchor nor a step."""
    from trainperf.diagnose.crossrank import host_step_waits
    from trainperf.diagnose.replay import step_anchor_rows

    b = TraceBuilder()
    for k in range(3):
        b.step(k, 1000 + 100 * k, 100)
    b.cpu("ProfilerStep#7", 1050, 20, cat="user_annotation", tid=2)
    b.cpu("ProfilerStep#8", 1150, 20, cat="user_annotation", tid=2)
    t = _table(b.write(tmp_path / "t.json.gz"))
    w = analysis_window(t)
    first, last = step_anchor_rows(t, w)
    assert [t.names[int(t.name[r])] for r in np.r_[first, last]] == ["ProfilerStep#0", "ProfilerStep#1"]
    assert sorted(host_step_waits(t, w.keep)) == [0, 1]
    assert {k: v[0] for k, v in host_step_waits(t).items()} == {0: 100.0, 1: 100.0, 2: 100.0}


def test_step_runs_are_the_profiling_cycles():
    from trainperf.diagnose.window import one_profiling_cycle, step_runs

    assert step_runs(np.array([0, 1, 2, 10, 11, 12])) == [(0, 2), (10, 12)]
    assert step_runs(np.array([5, 6, 7])) == [(5, 7)] and one_profiling_cycle(np.array([5, 6, 7])) == (None, "")
    # the longest stretch; of equal ones the latest
    assert one_profiling_cycle(np.array([0, 1, 2, 3, 10, 11]))[0] == (0, 3)
    assert one_profiling_cycle(np.array([0, 1, 2, 10, 11, 12]))[0] == (10, 12)


def _two_cycles(path: Path) -> Path:
    """torch.profiler.schedule(wait=.., warmup=.., active=3, repeat=2) into one trace: steps 0-2 and 10-12 of 2000 us
    (each: eight 240-us GEMMs launched at its start and run back to back from T+20, the GPU busy until T+1940), and
    nothing recorded for steps 3-9 (14 ms)."""
    b = TraceBuilder()
    for s in (0, 1, 2, 10, 11, 12):
        T = 2000.0 * s
        b.step(s, T, 2000)
        for i in range(8):
            b.cpu("aten::mm", T + 10 + 20 * i, 15)
            b.launch("ampere_bf16_s16816gemm_bf16_128x128_tn", T + 12 + 20 * i, T + 20 + 240 * i, 240)
    return b.write(path)


def test_one_profiling_cycle_is_analysed(tmp_path):
    # across both cycles the window held 14 ms that nothing recorded, read as host work worth 59.9 % of it (medium).
    # One cycle: steps 10-12, the last left out as in any trace; the window is the device span of steps 10-11, from
    # the first GEMM (20000 + 20) to the last one's end (22000 + 20 + 8 x 240): 3920 us. Chosen with --step-window
    # 0:2 (every step kept): 20 .. 4000 + 20 + 1920 = 5920 us
    from trainperf.diagnose.api import diagnose

    d = diagnose(_two_cycles(tmp_path / "c.json.gz"))
    assert any("2 profiling cycles" in n and "steps 10-12 are analysed" in n for n in d.notes)
    assert d.ranks[0].window_us == pytest.approx(3920.0)
    assert not any(f.severity in ("high", "medium") for f in d.findings)
    # --step-window still chooses
    d = diagnose(tmp_path / "c.json.gz", steps="0:2")
    assert not any("profiling cycles" in n for n in d.notes) and d.ranks[0].window_us == pytest.approx(5920.0)


def test_cycles_of_steps_without_length_do_not_refuse_the_trace(tmp_path):
    # the step spans damaged (negative durations: no event inside any of them) and their numbers in two stretches: the
    # automatic choice of a cycle holds nothing, so the whole trace is analysed with a note (it was an error naming
    # steps the user never asked for); --step-window, the user's own choice, still refuses such steps
    from trainperf.diagnose.api import diagnose
    from trainperf.errors import TrainperfError

    b = TraceBuilder()
    for s in (0, 1, 2, 10, 11, 12):
        T = 2000.0 * s
        b.step(s, T + 2000, -2000)
        for i in range(8):
            b.cpu("aten::mm", T + 10 + 20 * i, 15)
            b.launch("ampere_bf16_s16816gemm_bf16_128x128_tn", T + 12 + 20 * i, T + 20 + 240 * i, 240)
    path = b.write(tmp_path / "c.json.gz")
    d = diagnose(path)
    assert any("hold no event" in n and "the whole trace is analysed" in n for n in d.notes)
    with pytest.raises(TrainperfError, match="no events in steps 0:2"):
        diagnose(path, steps="0:2")


def test_each_rank_keeps_its_own_cycle(tmp_path):
    # rank 0 holds two cycles, rank 1 one (its schedule differs): each rank analyses its own, no rank is cut to steps
    # it does not have
    from trainperf.diagnose.api import diagnose

    job = tmp_path / "job"
    job.mkdir()
    for rank, steps in ((0, (0, 1, 2, 10, 11, 12)), (1, (20, 21, 22))):
        b = TraceBuilder(rank=rank, world_size=2)
        for s in steps:
            b.step(s, 2000.0 * s, 2000)
            b.launch("ampere_bf16_s16816gemm_bf16_128x128_tn", 2000.0 * s + 12, 2000.0 * s + 20, 1900)
        b.write(job / f"rank{rank}.json.gz")
    d = diagnose(job)
    assert [n for n in d.notes if "profiling cycles" in n] and {r.rank for r in d.ranks} == {0, 1}
