"""compare's table says which statistic each number is (issue 13): steady-step counts, the final
loss's window, MFU against one peak, no unexplained blank cells, a traces folder named as such."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainperf.compare import compare_runs
from trainperf.compare.perf import compare_perf, steady_slice
from trainperf.compare.report import numerics_rows, perf_rows
from trainperf.compare.runs import RunData
from trainperf.errors import TrainperfError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compare import SAME, _curve, _folder, _run  # noqa: E402


def _with_peak(run: RunData, tokens_per_s_per_flop: float, peak: float, host="h", device="cpu") -> RunData:
    """Set MFU the way the monitor does: achieved FLOP/s (tokens/s x FLOP per token) / the run's own peak."""
    run.mfu = run.tokens_per_s * tokens_per_s_per_flop / peak
    run.peak_flops, run.host, run.device = peak, host, device
    return run


def test_step_counts_and_statistics_are_named_in_the_table():
    rng = np.random.default_rng(1)
    st = np.r_[[0.5, 0.3, 0.25], 0.1 * (1 + rng.normal(0, 0.01, 40))]  # warm-up then steady
    a, b = _run(st, name="a"), _run(st * 0.9, name="b")
    p = compare_perf([a], [b])
    rows = {r[0]: r for r in perf_rows(compare_runs([a], [b]))}
    sl = steady_slice(st)
    n_steady = len(range(*sl.indices(len(st))))
    assert rows["steady steps used (of all)"][1] == f"{n_steady} of {len(st)}"
    assert "step time (ms), mean of steady steps" in rows
    assert float(rows["step time (ms), mean of steady steps"][1]) == round(1e3 * st[sl].mean(), 2)
    assert "tokens/s, total over steady steps" in rows and "MFU, median of steady steps" in rows
    assert p.steady_steps == (n_steady, n_steady)


def test_mfu_against_one_peak_changes_as_the_speed_does():
    """Same device, two start-up measurements of its peak (9.52 and 13.1 GFLOP/s): B is 5% faster;
    each against its own peak its MFU reads 24% lower, against one peak 5% higher."""
    rng = np.random.default_rng(2)
    st = 0.1 * (1 + rng.normal(0, 0.005, 60))
    flop_per_token = 3e6
    a = _with_peak(_run(st, name="a"), flop_per_token, 9.52e9)
    b = _with_peak(_run(st / 1.05, name="b"), flop_per_token, 13.1e9)
    p = compare_perf([a], [b])
    speed = p.throughput.b / p.throughput.a - 1
    assert abs(speed - 0.05) < 0.01
    assert abs(p.mfu[1] / p.mfu[0] - 1 - speed) < 0.01  # the MFU change is the speed change
    by_hand = np.median(b.tokens_per_s[1:]) * flop_per_token / 13.1e9  # B against the higher peak
    assert abs(p.mfu[1] / by_hand - 1) < 0.02
    assert p.mfu_peak_flops == (13.1e9, 13.1e9) and p.mfu_comparable
    assert "9.52 vs 13.1 GFLOP/s" in p.mfu_note


def test_mfu_on_different_devices_is_marked_not_comparable():
    st = np.full(30, 0.1)
    a = _with_peak(_run(st, name="a"), 3e6, 9.52e9, host="h1")
    b = _with_peak(_run(st, name="b"), 3e6, 13.1e9, host="h2")
    c = compare_runs([a], [b])
    assert not c.perf.mfu_comparable and "MFU not comparable: peaks differ 9.52 vs 13.1 GFLOP/s" in c.perf.mfu_note
    mfu_row = next(r for r in perf_rows(c) if r[0].startswith("MFU"))
    assert mfu_row[3] == "- (peaks differ)"


def test_final_loss_names_its_window_and_cells_are_formatted_alike():
    rng = np.random.default_rng(3)
    loss = _curve(rng, 60)
    gn = 1 + rng.normal(0, 0.01, 60)
    a = _run(np.full(60, 0.1), loss=loss, grad_norm=gn, name="a")
    b = _run(np.full(60, 0.1), loss=loss + 0.001, grad_norm=gn * 1.01, name="b")
    rows = numerics_rows(compare_runs([a], [b]))
    final = next(r for r in rows if r[0].startswith("final training loss"))
    assert final[0] == "final training loss, mean of last 6 steps"  # max(5, 10% of 60)
    assert final[1].startswith(f"{loss[-6:].mean():.4f}")  # not the last step's loss
    grad = next(r for r in rows if r[0].startswith("grad norm"))
    assert grad[1] == "1.000" and len(grad[2].split(".")[1]) == 3
    assert all(cell.strip() for r in rows for cell in r)  # no blank cell


def test_a_traces_folder_gets_one_line_pointing_to_diff(tmp_path):
    from trainperf.cli import app

    rng = np.random.default_rng(4)
    _folder(tmp_path / "run", list(np.full(20, 0.1)), list(_curve(rng, 20)))
    traces = tmp_path / "run" / "traces"
    traces.mkdir()
    (traces / "rank0.step5-6.json").write_text(json.dumps({"traceEvents": []}))
    res = CliRunner().invoke(app, ["compare", str(traces), str(tmp_path / "run")])
    assert isinstance(res.exception, TrainperfError)
    msg = str(res.exception)
    assert "\n" not in msg and "compare takes run folders (or store run ids)" in msg and "trainperf diff" in msg
    other = tmp_path / "kineto"  # trace files under any name
    other.mkdir()
    (other / "host_1.123.pt.trace.json").write_text("{}")
    try:
        compare_runs(str(other), str(tmp_path / "run"))
        raise AssertionError("a traces folder was read as a run")
    except TrainperfError as e:
        assert "trainperf diff" in str(e)


def test_a_traces_folder_is_what_diff_reads_as_traces(tmp_path):
    """Reference: trace.load.trace_files, what `trainperf diff` reads: a folder of files ending in one of
    TRACE_SUFFIXES (a JAX .xplane.pb too) holds traces; a run folder's own .json files (run.json,
    summary.json, run_record.json) do not make it one."""
    from trainperf.compare.runs import _holds_traces
    from trainperf.trace.load import trace_files

    jax = tmp_path / "jax"
    (jax / "plugins").mkdir(parents=True)
    (jax / "plugins" / "host0.xplane.pb").write_bytes(b"")
    kineto = tmp_path / "kineto"
    kineto.mkdir()
    (kineto / "worker0.1700000000.pt.trace.json.gz").write_bytes(b"")
    broken_run = tmp_path / "run"  # a run folder whose metrics.jsonl is missing: not traces
    broken_run.mkdir()
    for name in ("run.json", "summary.json", "run_record.json"):
        (broken_run / name).write_text("{}")
    assert _holds_traces(jax) and _holds_traces(kineto) and trace_files(kineto)
    assert not _holds_traces(broken_run)
    with pytest.raises(TrainperfError, match="not a run folder|no step records"):
        compare_runs(str(broken_run), str(broken_run))


def test_stored_runs_mfu_against_one_peak_and_an_older_record_says_peak_unknown(tmp_path):
    """Store records carry their peak: two runs of one host measured 9.52 and 13.1 GFLOP/s, the same
    speed: against one peak (the higher) their MFUs agree, by hand 0.30 x 9.52 / 13.1 = 0.218. A record
    written before peaks were stored (peak None) beside a known one: MFU not comparable, said so."""
    from trainperf.store import RunRecord, StepSample, write_run
    from trainperf.store.record import PEAK_UNKNOWN

    store = str(tmp_path / "store")
    st = 0.1 * (1 + 0.001 * (-1.0) ** np.arange(40))
    for rid, peak, mfu in (("lo", 9.52e9, 0.30), ("hi", 13.1e9, 0.30 * 9.52 / 13.1), ("old", None, 0.30)):
        write_run(RunRecord(run_id=rid, job="j", host="h", gpu_model="cpu", started_at=1.79e9, peak_flops=peak,
                            peak_source="measured" if peak else "",
                            samples=[StepSample(i + 1, float(s), tokens_per_s=256 / float(s), mfu=mfu)
                                     for i, s in enumerate(st)]), store)
    c = compare_runs("lo", "hi", store=store)
    assert c.perf.mfu_peak_flops == (13.1e9, 13.1e9) and c.perf.mfu_comparable
    assert c.perf.mfu == (pytest.approx(0.30 * 9.52 / 13.1), pytest.approx(0.30 * 9.52 / 13.1))
    old = compare_runs("old", "hi", store=store)
    assert not old.perf.mfu_comparable and f"old: {PEAK_UNKNOWN}" in old.perf.mfu_note
    assert next(r for r in perf_rows(old) if r[0].startswith("MFU"))[3] == "- (a peak unknown)"
