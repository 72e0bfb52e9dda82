"""gc_stall: Python's garbage collector pausing the loop inside the profiled steps.

References: two real CPU profiles of the same training loop (tests/data/gc, torch 2.13, with_stack and
record_python_gc_info), automatic collection on and the fix (gc.freeze() after the start-up, collection off); the
collections' share summed from the raw JSON; the loop's unprofiled steps timed both ways by the script that made
them; a hand-built GPU trace whose replayed gain is worked by hand; and a real run of the reference trainer calling
gc.collect() every step (--fault gc-collect).
"""

import gzip
import json
import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "gc"


def _raw(name: str) -> list[dict]:
    return json.loads(gzip.decompress((DATA / name).read_bytes()))["traceEvents"]


def _steps(raw: list[dict]) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("name", "").startswith("ProfilerStep#"))


def test_a_real_loop_paused_by_full_collections_is_found_at_their_share_of_the_window():
    raw = _raw("gc_on.json.gz")
    steps = _steps(raw)
    lo, hi = steps[0][0], steps[-2][1]  # HTA's window: the last step (cut by the profiler's stop) left out
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("name") == "Python GC" and lo <= e["ts"] < hi]
    gc_us = sum(e - s for s, e in spans)  # one thread, collections do not nest: the sum is the union
    f = {x.kind: x for x in diagnose(DATA / "gc_on.json.gz").findings}["gc_stall"]
    m = f.evidence["metrics"]
    assert m["gc_time"]["value"] == pytest.approx(gc_us, rel=1e-3)
    assert m["collections"]["value"] == len(spans)
    assert m["longest_collection"]["value"] == pytest.approx(max(e - s for s, e in spans), rel=1e-3)
    assert f.gain_pct == pytest.approx(100 * gc_us / (hi - lo), abs=0.1)  # host only: the share is the bound
    # the steps that pay it: those whose collections take at least half their mean per step (the two full ones)
    per_step = [sum(e - s for s, e in spans if a <= s < b) for a, b in steps[:-1]]
    paying = sum(us >= 0.5 * sum(per_step) / len(per_step) for us in per_step)
    assert m["steps_collecting"]["value"] == paying == 2
    # the same loop unprofiled (make_traces.py, interleaved): 12.1 ms a step with automatic collection, 2.6 ms with
    # the fix, 79 % less; the bound read from the trace is of that order, and the finding comes first
    assert 70 < f.gain_pct < 95 and f.severity == "high"
    assert diagnose(DATA / "gc_on.json.gz").findings[0].kind == "gc_stall"
    # automatic collections, not the program's gc.collect() calls: the collector's schedule is the fix named
    assert "gc_collect_calls" not in m and "gc.freeze()" in f.recommendation


def test_the_fixed_twin_has_no_collection_and_no_gc_finding():
    assert not any(e.get("name") == "Python GC" for e in _raw("gc_off.json.gz"))
    assert "gc_stall" not in {x.kind for x in diagnose(DATA / "gc_off.json.gz").findings}


def _gpu_loop(tmp_path, collect_in_steps: tuple[int, ...], G: float = 2_000.0, P: float = 10_000.0,
              young_us: float = 0.0) -> Path:
    # a step of P us: 10 ops at T + g + 1000 i (900 us of host time each) launching a 50-us kernel, after a
    # collection of g = G - 1 us at the step's start in the steps listed (g = 0 in the others); young_us: a short
    # collection of the young generation inside each op's host time of every step besides
    b = TraceBuilder()
    T = 0.0
    for s in range(3):
        g = G if s in collect_in_steps else 0.0
        b.step(s, T, P + g)
        if g:
            b.cpu("Python GC", T + 1, g - 1, cat="python_function")
        if young_us:
            b.cpu("Python GC", T + g + 500, young_us, cat="python_function")
        for i in range(10):
            b.cpu("aten::mm", T + g + 1000 * i, 900)
            b.launch("ampere_sgemm_128x64_tn", T + g + 1000 * i + 10, T + g + 1000 * i + 20, 50)
        T += P + g
    return b.write(tmp_path / "gc.json.gz")


def test_collections_on_a_gpu_trace_are_priced_by_replay(tmp_path):
    # a collection in every step: the replayed window runs from step 0's start to step 1's end, 2 (P + G) = 24000 us;
    # without the collections (G - 1 us each) every op starts that much earlier in each step: gain 2 (G - 1) = 3998 us,
    # 16.7 % of the window, priced first in the order of fixes (a wait removed, measured)
    G, P = 2_000.0, 10_000.0
    d = diagnose(_gpu_loop(tmp_path, (0, 1, 2), G, P))
    f = {x.kind: x for x in d.findings}["gc_stall"]
    assert f.fix_order == 1
    assert f.gain_us == pytest.approx(2 * (G - 1), abs=2)
    assert f.gain_pct == pytest.approx(100 * 2 * (G - 1) / (2 * (P + G)), abs=0.05)
    assert f.evidence["metrics"]["steps_collecting"]["value"] == 2 and f.severity == "high"


def test_a_collection_in_one_step_of_the_window_has_no_known_rate(tmp_path):
    # one collection in the two analysed steps: what it costs the run depends on how often it comes, which a window
    # holding one does not say: priced over the window, and said to be of unknown rate
    d = diagnose(_gpu_loop(tmp_path, (1,)))
    f = {x.kind: x for x in d.findings}["gc_stall"]
    assert f.evidence["metrics"]["steps_collecting"]["value"] == 1
    assert "seen in 1 of 2 steps" in f.what_if
    # the same with short collections in every step besides: the one long collection still has no known rate
    (tmp_path / "young").mkdir()
    f = {x.kind: x for x in diagnose(_gpu_loop(tmp_path / "young", (1,), young_us=20.0)).findings}["gc_stall"]
    assert f.evidence["metrics"]["steps_collecting"]["value"] == 1 and "seen in 1 of 2 steps" in f.what_if


def test_diff_puts_the_collections_in_their_own_bucket():
    # the fix as the base, automatic collection as the candidate: the collections' time per step (from the raw JSON)
    # is the change's largest bucket, named as such
    from trainperf.diagnose.diff import diff

    raw = _raw("gc_on.json.gz")
    steps = _steps(raw)
    per_step = [sum(e["dur"] for e in raw if e.get("name") == "Python GC" and s <= e["ts"] < t) for s, t in steps]
    d = diff(DATA / "gc_off.json.gz", DATA / "gc_on.json.gz")
    delta = {n: c - b for n, b, c in d.decomposition}
    assert max(delta, key=delta.get) == "host: gc"
    assert delta["host: gc"] == pytest.approx(sum(per_step) / len(per_step), rel=0.02)
    assert "host: gc" in d.headline()


def test_diagnose_names_the_calls_of_a_real_run_with_the_fault(tmp_path):
    # a real run's traces (torch >= 2.9 records the collections with --profile-modules): the trainer's own gc.collect()
    # call (--fault gc-collect, every step) is the cause named, at its line
    from trainperf.train.trainer import TrainConfig, train

    out = tmp_path / "run"
    train(TrainConfig(model="tiny", steps=6, out=str(out), progress=False, record=False, peak_tflops=1.0,
                      synthetic=True, faults=["gc-collect"], profile_steps="2:5", profile_modules=True))
    f = diagnose(out / "traces").findings[0]
    assert f.kind == "gc_stall"
    m = f.evidence["metrics"]
    assert m["in_gc_collect_calls"]["value"] == pytest.approx(100.0, abs=1.0)
    assert m["gc_collect_calls"]["value"] == len(f.steps) == 3  # one a step in the window (steps 2-4; 5 is cut)
    assert "trainer.py" in f.recommendation and "gc.collect() itself" in f.recommendation


def test_a_librarys_collect_call_names_the_user_frame_and_the_library_function(tmp_path):
    # hand-built: each step's user frame calls a library cleanup (Accelerate's release_memory), which calls
    # gc.collect(); the user's own frame alone would hide who collects, the library's alone where it is called from
    b = TraceBuilder()
    for s in range(3):
        T = 10_000.0 * s
        b.step(s, T, 10_000)
        b.cpu("train.py(42): train_step", T + 10, 9_000, cat="python_function")
        b.cpu("site-packages/accelerate/utils/memory.py(70): release_memory", T + 20, 5_000, cat="python_function")
        b.cpu("<built-in function collect>", T + 30, 4_000, cat="python_function")
        b.cpu("Python GC", T + 40, 3_900, cat="python_function")
        b.cpu("aten::mm", T + 6_000, 2_000)
    f = {x.kind: x for x in diagnose(b.write(tmp_path / "lib.json.gz")).findings}["gc_stall"]
    assert f.evidence["metrics"]["gc_collect_calls"]["value"] == 2  # the window's complete steps: 0 and 1
    assert ("most at train.py(42): train_step > site-packages/accelerate/utils/memory.py(70): release_memory"
            in f.recommendation)


def test_a_run_whose_monitor_measured_collections_the_traces_lack_says_so(tmp_path):
    # a real run collecting every step, profiled without --profile-modules: no Python GC span in its traces, and the
    # run's own metrics.jsonl measured the pauses in the profiled steps (its mean there, ms, worked from the file);
    # with the collections recorded, no such note
    from trainperf.train.trainer import TrainConfig, train

    def run(out, modules):
        train(TrainConfig(model="tiny", steps=6, out=str(out), progress=False, record=False, peak_tflops=1.0,
                          synthetic=True, faults=["gc-collect"], profile_steps="2:5", profile_modules=modules))
        return diagnose(out / "traces")

    d = run(tmp_path / "plain", False)
    recs = [json.loads(line) for line in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    pauses = [r["gc_pause_s"] * 1e3 for r in recs if 2 <= r["step"] <= 5]
    (note,) = [n for n in d.notes if "garbage collector pausing its profiled steps" in n]
    assert f"{sum(pauses) / len(pauses):.2f} ms a step" in note and "--profile-modules" in note
    assert "gc_stall" not in {f.kind for f in d.findings}
    assert not any("garbage collector pausing" in n for n in run(tmp_path / "modules", True).notes)
