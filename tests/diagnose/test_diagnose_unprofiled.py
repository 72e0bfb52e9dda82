"""The profiler's overhead taken off the host from the step time measured without it (diagnose/unprofiled.py):
the calibration worked by hand on a built trace, and on real H200 traces each priced gain moves toward the gain
the fix measured."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.unprofiled import host_calibration  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

GEMM = "ampere_bf16_s16816gemm_bf16_128x128_tn"
H200 = Path(__file__).resolve().parents[1] / "data" / "h200_faults"


def _host_bound(path: Path) -> Path:
    """Four 300-us steps, each three aten::mm ops of 100 us: 90 us of host work, then a 10-us launch call of a 20-us
    kernel that starts 15 us after the call: the host sets the period, 300 us a step."""
    b = TraceBuilder()
    for s in range(4):
        T = 300.0 * s
        b.step(s, T, 300)
        for i in range(3):
            at = T + 90 + 100 * i
            b.cpu("aten::mm", at - 90, 100)
            b.launch(GEMM, at, at + 15, 20, launch_dur=10)
    return b.write(path)


def _facts(path: Path):
    t = next(iter(load_trace(path).values()))
    return collect_facts(t, analysis_window(t))


def test_the_host_is_calibrated_to_the_unprofiled_step_by_hand(tmp_path):
    # all of a step's host time is its own work (3 x (90 + 10) us): a 150-us unprofiled step is that work 2x faster
    # (the kernels, 20 us each 15 us after their call, never bind)
    f = _facts(_host_bound(tmp_path / "h.json.gz"))
    c = host_calibration(f, 150.0)
    assert c.profiled_period_us == pytest.approx(300.0)
    assert c.factor == pytest.approx(2.0, rel=1e-3)
    assert "2.00x faster" in c.note


def test_no_calibration_where_the_profiler_cannot_explain_the_step(tmp_path):
    f = _facts(_host_bound(tmp_path / "h.json.gz"))
    slower = host_calibration(f, 400.0)  # the unprofiled step is longer: nothing to take off
    assert slower.factor == 1.0 and not slower.changes and "not slower" in slower.note
    # 30 us a step: under what even an 8x faster host replays (300 / 8 = 37.5 us): not the profiler's overhead
    floor = host_calibration(f, 30.0)
    assert floor.factor == 1.0 and "not the profiler's" in floor.note


def _labels(case: str) -> dict:
    return json.loads((H200 / case / "labels.json").read_text())


def _gain(case: str, unprofiled: bool) -> float:
    labels = _labels(case)
    d = diagnose(H200 / case / "traces", unprofiled_step_ms=labels["faulty_step_ms"] if unprofiled else None)
    return next(x.gain_pct for x in d.findings if x.kind == labels["kind"])


@pytest.mark.parametrize("case", ["launch_bound-high-h200", "host_sync-high-h200", "allocator_stall-high-h200"])
def test_priced_on_the_unprofiled_host_a_host_bound_gain_comes_nearer_its_measured_fix(case):
    # measured: 21.9 / 55.6 / 78.0 %; priced on the profiled host 17.6 / 29.3 / 56.3 %, on the calibrated 25.4 /
    # 47.5 / 70.3 %
    truth = _labels(case)["true_gain_pct"]
    assert abs(_gain(case, True) - truth) < abs(_gain(case, False) - truth)


@pytest.mark.parametrize("case", ["fp32_matmul-high-h200", "pageable_copy-high-h200", "healthy-h200-gpu_bound"])
def test_a_step_the_host_does_not_set_is_left_as_profiled(case):
    # GPU-bound (fp32, healthy: the host runs ahead) or set by a wait (the pageable copy): no calibration applies
    labels = _labels(case)
    base = diagnose(H200 / case / "traces")
    cal = diagnose(H200 / case / "traces", unprofiled_step_ms=labels["faulty_step_ms"])
    assert [(x.kind, x.gain_pct) for x in cal.findings] == [(x.kind, x.gain_pct) for x in base.findings]
    assert any("nothing is taken off" in n or "no profiler overhead" in n for n in cal.notes)


def test_a_trainperf_runs_own_step_time_is_used_by_default(tmp_path):
    # <run>/traces/rank0.step0-3.json and <run>/metrics.jsonl: steps 0-3 profiled (step -1 warming up), the monitor's
    # first two records left out; steps 4-9 ran at 150 us (one at 900: a median, not a mean) -> factor 2 as by hand
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    _host_bound(run / "traces" / "rank0.step0-3.json")
    times = {s: 300e-6 for s in range(4)} | {s: 150e-6 for s in range(4, 10)} | {7: 900e-6}
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "step_time_s": t}) + "\n"
                                               for s, t in sorted(times.items())))
    d = diagnose(run / "traces")
    note = next(n for n in d.notes if "profiler's overhead taken off" in n)
    assert "2.00x faster" in note and "0.15 ms: the run's median over 6 steps" in note
    # an explicit step time wins over the run's
    assert not any("the run's median" in n for n in diagnose(run / "traces", unprofiled_step_ms=0.3).notes)


PROFILER_NOTE = "the profiler's own cost"


def test_without_an_unprofiled_step_a_host_paced_window_says_what_the_profiler_may_cost(tmp_path):
    # the built loop: 3 ops a 300-us step on the host, 3 x 20 us of GPU work: at 4 us an op the profiler's cost is
    # 12 us, 4 % of the step: no note. The H200 launch-bound loop records 1030 ops a 11.57-ms host step: ~4.12 ms,
    # 36 %: its host findings carry the note at medium confidence; measured without the profiler the step was 5.42 ms
    d = diagnose(_host_bound(tmp_path / "h.json.gz"))
    assert not any(PROFILER_NOTE in n for x in d.findings for n in x.notes)
    d = diagnose(H200 / "launch_bound-high-h200" / "traces")
    lb = next(x for x in d.findings if x.kind == "launch_bound")
    note = next(n for n in lb.notes if PROFILER_NOTE in n)
    assert "1030 ops a step" in note and "~4.12 ms of it (36 %)" in note and lb.confidence == "medium"
    # given the unprofiled step, the host is calibrated to it and the note goes; a GPU-paced loop never has it
    d = diagnose(H200 / "launch_bound-high-h200" / "traces", unprofiled_step_ms=_labels("launch_bound-high-h200")[
        "faulty_step_ms"])
    assert not any(PROFILER_NOTE in n for x in d.findings for n in x.notes)
    d = diagnose(H200 / "healthy-h200-gpu_bound" / "traces")
    assert not any(PROFILER_NOTE in n for x in d.findings for n in x.notes)


def test_a_host_step_the_profiler_alone_could_explain_lowers_the_host_findings_to_low(tmp_path):
    # four 1000-us steps of 150 recorded ops (6.5 us each, one every 6.6 us), every 30th launching a 100-us kernel:
    # the GPU is busy 500 us a step. At 4 us an op the profiler costs 600 us of the 1000: without it the host's
    # ~400 us could be under the GPU's 500, so what reads host-bound may be the profiler's own cost
    b = TraceBuilder()
    for s in range(4):
        T = 1000.0 * s
        b.step(s, T, 1000)
        for i in range(150):
            at = T + 6.6 * i
            b.cpu("aten::add", at, 6.5)
            if i % 30 == 0:
                b.launch(GEMM, at + 1, at + 6, 100, launch_dur=4)
    d = diagnose(b.write(tmp_path / "p.json.gz"))
    note = next(n for n in d.notes if PROFILER_NOTE in n)
    assert "150 ops a step" in note and "~0.60 ms of it (60 %)" in note and "may be the profiler's own" in note
    host = [x for x in d.findings if x.kind in ("launch_bound", "host_work", "idle_gpu", "small_kernels")]
    assert host and all(x.confidence == "low" for x in host)
