"""`trainperf runs list|show|query` as a person reads them (issue 14): whole run ids at 80 columns,
times as ISO dates, nested config readable, --limit ranges."""

import pytest
import typer
from typer.testing import CliRunner

from trainperf.store import RunRecord, StepSample, write_run
from trainperf.store.cli import register, show_lines

# 1_790_000_000 s = 20717 days + 51_200 s after 1970-01-01: 2026-09-21, 14:13:20 UTC (by hand)
STARTED_AT, STARTED_ISO = 1.79e9, "2026-09-21T14:13:20Z"
IDS = ("20260921T141320-0a1b2c3d", "20260921T141321-4e5f6a7b")


@pytest.fixture()
def app():
    a = typer.Typer()

    @a.callback()
    def _root() -> None:
        pass

    register(a)
    return a


@pytest.fixture()
def store(tmp_path):
    for i, run_id in enumerate(IDS):
        config = {"steps": 50, "comparable": {"model": {"n_layers": 4}, "seed": 0},
                  "summary": {"mfu": 0.179134, "hfu": 0.2, "mem_peak_bytes": 598167552},
                  "eval": [[s, 4.0 - s / 100] for s in range(5, 55, 5)]}
        write_run(RunRecord(run_id=run_id, job="a-rather-long-job-name", host="node0.cluster.example.org",
                            started_at=STARTED_AT + i, step_time_s=0.125, mem_peak_bytes=3 * 2.0**30, config=config,
                            goodput=0.0277466,
                            samples=[StepSample(step=s, step_time_s=0.1 + s / 100) for s in range(4)]), str(tmp_path))
    return str(tmp_path)


def test_list_keeps_whole_run_ids_at_80_columns(app, store):
    res = CliRunner().invoke(app, ["runs", "list", "--store", store], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    for run_id in IDS:  # on one line, uncut: the id `runs show` and `gate` take
        assert any(run_id in line for line in res.output.splitlines()), res.output
    assert "2026-09-21 14:13" in res.output and "…" not in res.output


def test_show_prints_iso_times_and_nested_config(app, store):
    res = CliRunner().invoke(app, ["runs", "show", IDS[0], "--store", store], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert f"started_at: {STARTED_ISO}" in lines  # no raw epoch beside it (issue 14)
    assert "goodput: 2.77%" in lines  # a percentage, as the terminal and report show it, not 0.0277466
    # the run summary kept in the config: the same units (an int byte count too)
    assert "    mfu: 17.9%" in lines and "    hfu: 20%" in lines, lines
    assert "    mem_peak_bytes: 5.98168e+08 (0.557 GiB)" in lines, lines
    assert "config:" in lines and "  comparable:" in lines and "    model:" in lines and "      n_layers: 4" in lines
    assert "{'" not in res.output  # no Python dict repr
    assert "mem_peak_bytes: 3.22123e+09 (3 GiB)" in lines
    assert any(line.startswith("  eval: [[5, 3.95], [10, 3.9], [15, 3.85], ..., [50, 3.5]] (10 items)")
               for line in lines), lines


def test_show_lines_leaves_out_empty_fields():
    assert show_lines({"a": "", "b": None, "c": {}, "d": 1, "e": {"f": True}}) == ["d: 1", "e:", "  f: True"]


@pytest.mark.parametrize("verb, value", [("list", "0"), ("list", "-3"), ("query", "0")])
def test_limit_has_a_range(app, store, verb, value):
    args = ["runs", verb, *(["SELECT 1"] if verb == "query" else []), "--store", store, "--limit", value]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--limit" in res.output, res.output


def test_list_limit_counts_rows(app, store):
    res = CliRunner().invoke(app, ["runs", "list", "--store", store, "--limit", "1"], env={"COLUMNS": "120"})
    assert res.exit_code == 0 and IDS[1] in res.output and IDS[0] not in res.output, res.output


def test_show_takes_a_unique_start_of_a_run_id(app, store):
    res = CliRunner().invoke(app, ["runs", "show", IDS[1][:20] + "…", "--store", store])
    assert res.exit_code == 0 and f"run_id: {IDS[1]}" in res.output, res.output
    res = CliRunner().invoke(app, ["runs", "show", "20260921T1413", "--store", store])  # both runs begin so
    assert "starts 2 runs" in str(res.exception) and IDS[0] in str(res.exception), res.output
    for wrong in ("2026", "20260921T1413_%", "zz-no-such-run"):  # too short; wildcards are literal; none
        res = CliRunner().invoke(app, ["runs", "show", wrong, "--store", store])
        assert "no run with id" in str(res.exception), (wrong, res.output)


def test_show_gives_one_median_and_rounded_lists(app, tmp_path):
    """The demo's `runs show` printed step_time_s 4.61975 (after warm-up) and 'step time median 4.743 s'
    (every step) for one run, and rank entries with 16 digits; `runs list` printed 4.98934."""
    samples = [StepSample(step=s, step_time_s=t) for s, t in enumerate([9.0, 1.0, 2.0, 3.0], start=1)]
    write_run(RunRecord(run_id=IDS[0], job="train", started_at=STARTED_AT, step_time_s=2.0, samples=samples,
                        config={"summary": {"ranks": [{"busy_s": 4.618711640000129, "rank": 0}]}}), str(tmp_path))
    res = CliRunner().invoke(app, ["runs", "show", IDS[0], "--store", str(tmp_path)], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    assert "median" not in res.output.split("step_time_s: 2")[1]  # the record's median is the only one
    # linear percentiles of 1, 2, 3, 9 by hand: p10 at 0.3 of the way from 1 to 2, p90 at 0.7 from 3 to 9
    assert "steps: 4 stored, step time p10 1.3 s, p90 7.2 s" in res.output
    assert '"busy_s": 4.61871' in res.output and "4.618711640000129" not in res.output
    write_run(RunRecord(run_id=IDS[1], job="train", started_at=STARTED_AT, step_time_s=4.989339), str(tmp_path))
    res = CliRunner().invoke(app, ["runs", "list", "--store", str(tmp_path)], env={"COLUMNS": "100"})
    assert " 4.989 " in res.output and "4.98934" not in res.output
