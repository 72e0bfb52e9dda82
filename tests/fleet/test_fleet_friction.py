"""Issue 14 friction in `gate` and `fleet`: unknown names and out-of-range numbers are one line, exit 2."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from trainperf.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "src/trainperf/fleet/examples"
BASE = str(EXAMPLES / "baseline_step_times.txt")
SERIES = ["--csv", str(EXAMPLES / "step_times.csv"), "--column", "step_time_s"]


def _run(*argv):
    """Run the CLI in-process; return (exit code, stdout, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), [ln for ln in err.getvalue().splitlines() if ln.strip()]


def _one_line(argv, *needles):
    code, _, err = _run(*argv)
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), (argv, code, err)
    for n in needles:
        assert n in err[0], (n, err[0])
    return err[0]


@pytest.fixture()
def fleet_csv(tmp_path):
    f = tmp_path / "fleet.csv"
    f.write_text("period,host,step_time_s\n" + "".join(
        f"{t},node{h},{1.0 + (0.3 if t >= 3 and h == 1 else 0.0)}\n" for t in range(5) for h in range(3)))
    return str(f)


def test_unknown_metric_is_refused_listing_the_known_ones(fleet_csv):
    _one_line(["gate", "--baseline", BASE, "--candidate", BASE, "--metric", "bogus"], "'bogus'", "step_time",
              "tokens_per_s")
    _one_line(["fleet", "changes", *SERIES, "--metric", "bogus"], "'bogus'", "step_time", "goodput")
    loc = ["fleet", "localize", "--csv", fleet_csv, "--time-col", "period", "--measure", "step_time_s", "--at", "3"]
    _one_line([*loc, "--metric", "bogus"], "'bogus'", "mfu")
    _one_line([*loc, "--attrs", "rack"], "'rack'", "host")  # an unknown column: the columns listed
    _one_line(["fleet", "changes", "--csv", SERIES[1], "--column", "nope"], "'nope'", "step_time_s")
    # the known names still work
    assert _run("gate", "--baseline", BASE, "--candidate", BASE, "--metric", "tokens_per_s")[0] == 0
    assert _run("fleet", "changes", *SERIES, "--metric", "mfu", "--json")[0] == 0


@pytest.mark.parametrize("value", ["0", "1", "2", "-0.5"])
def test_gate_alpha_range(value):
    _one_line(["gate", "--baseline", BASE, "--candidate", BASE, "--alpha", value], "--alpha")


def test_fleet_changes_min_effect_range():
    _one_line(["fleet", "changes", *SERIES, "--min-effect", "-1"], "--min-effect")
    assert _run("fleet", "changes", *SERIES, "--min-effect", "0", "--json")[0] == 0


def _option(path, name):
    from trainperf.cli import click_command

    cmd = click_command()
    for part in path:
        cmd = cmd.commands[part]
    return next(p for p in cmd.params if name in p.opts)


def test_ranges_are_declared_so_help_shows_them():
    assert (_option(("gate",), "--alpha").min, _option(("gate",), "--alpha").max) == (0.0, 1.0)
    assert _option(("fleet", "changes"), "--min-effect").min == 0.0


def test_fleet_tree_filters_by_code_version_apart_from_trainperf_version(tmp_path):
    from trainperf.store import RunRecord, StepSample, write_run

    store = str(tmp_path / "store")
    write_run(RunRecord(run_id="r1", job="j", host="h", started_at=1.79e9, git_sha="a1b2c3", gpu_model="H100",
                        world_size=1, samples=[StepSample(step=s, step_time_s=1.0) for s in range(3)]), store)
    _one_line(["fleet", "tree", "--store", store, "--code-version", "zz"], "no training runs matching version 'zz'")
    _one_line(["fleet", "tree", "--store", store, "--version", "a1b2"], "--version")  # no longer the filter


def _run_folder(path: Path, step_times) -> None:
    """A run folder as `trainperf train` writes it (metrics.jsonl, events.jsonl, run.json)."""
    import json

    path.mkdir(parents=True)
    t, lines = 1000.0, []
    for i, s in enumerate(step_times, 1):
        t += s
        lines.append(json.dumps({"step": i, "attempt": 0, "loss": 4.0 / i ** 0.5, "step_time_s": s, "tokens": 256,
                                 "tokens_per_s": 256 / s, "mfu": 0.3, "mem_peak_bytes": 1e9, "t_end": t}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "events.jsonl").write_text(json.dumps({"kind": "attempt_start", "attempt": 0, "t": 999.0}) + "\n")
    (path / "run.json").write_text(json.dumps({"world_size": 1}))
    (path / "traces").mkdir()
    (path / "traces" / "rank0.json").write_text("{}")


def test_gate_on_run_folders(tmp_path):
    import json

    from trainperf.fleet.gate import load_samples

    # 4 warm-up steps at 1.0 s, then 40 steady steps of 0.10 s (+-1%): the steady steps are the samples
    steady = [0.10 * (1 + 0.01 * ((i % 3) - 1)) for i in range(40)]
    _run_folder(tmp_path / "a", [1.0] * 4 + steady)
    _run_folder(tmp_path / "b", [1.0] * 4 + [0.8 * s for s in steady])
    assert sorted(load_samples(str(tmp_path / "a")).values()) == pytest.approx(sorted(steady))
    assert load_samples(str(tmp_path / "a"), "tokens_per_s").values() == pytest.approx([256 / s for s in steady])
    code, out, err = _run("gate", "--baseline", str(tmp_path / "a"), "--candidate", str(tmp_path / "b"), "--json")
    res = json.loads(out)
    assert code == 0 and res["verdict"] == "improvement" and res["n_baseline"] == 40, err
    assert res["effect"] == pytest.approx(-0.2, abs=0.005)  # 0.8x the step time, hand-built
    # a folder that is not a run: its traces/, or the folder above the runs
    for wrong in (tmp_path / "a" / "traces", tmp_path):
        _one_line(["gate", "--baseline", str(wrong), "--candidate", str(tmp_path / "b")],
                  "did you mean the run folder", "run id")
    _one_line(["gate", "--baseline", str(tmp_path / "a"), "--candidate", str(tmp_path / "b"), "--metric",
               "data_wait_s"], "no values of 'data_wait_s'")  # the run records no data wait


def test_localize_explains_its_two_shares(fleet_csv):
    code, out, err = _run("fleet", "localize", "--csv", fleet_csv, "--time-col", "period", "--measure", "step_time_s",
                          "--at", "3")
    assert code == 0, err
    text = " ".join(out.split())
    assert "signed share" in text and "over 100% (or negative) when other leaves moved the other way" in text


def test_changes_html_path_checked_before_reading_the_series(tmp_path, unusable_outputs):
    """Issue 14 defect 1: `fleet changes --html` into a folder or below a file is one line, not a traceback."""
    from typer.testing import CliRunner

    from trainperf.cli import app
    from trainperf.errors import TrainperfError

    for bad in unusable_outputs("c.html"):
        res = CliRunner().invoke(app, ["fleet", "changes", "--csv", str(tmp_path / "missing.csv"), "--column", "x",
                                       "--html", str(bad)])
        assert isinstance(res.exception, TrainperfError), res.output
        assert str(res.exception).startswith("--html ") and "\n" not in str(res.exception)


@pytest.mark.parametrize("cmd", [["fleet", "changes", "--column", "step_time_s"],
                                 ["fleet", "localize", "--time-col", "step", "--measure", "step_time_s", "--at", "3"]])
def test_json_lines_given_as_csv_is_named_not_read_as_columns(tmp_path, cmd):
    # a run's metrics.jsonl has the same number of commas on each line, so a CSV reader takes its first
    # record for the header and the second for a row; the user is told what the file is and what to give
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(f'{{"step": {i}, "step_time_s": 0.5}}\n' for i in range(1, 9)))
    line = _one_line([*cmd[:2], "--csv", str(f), *cmd[2:]], f"{f}: not a CSV (looks like JSON lines)", "--store")
    assert '"step"' not in line  # no JSON record shown as if it were column names


def test_changes_opens_with_the_answer_and_keeps_the_method_under_verbose(monkeypatch):
    import json

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run("fleet", "changes", *SERIES)
    lines = out.splitlines()
    # the example's one change is the +6% step at row 80 (test_fleet_cli checks the index)
    assert code == 0 and lines[0] == "1 change point in 150 points", lines[:2]
    assert lines[1].startswith("method: Pettitt rank CUSUM") and "--verbose" in lines[1] and len(lines[1]) <= 80
    code, js, _ = _run("fleet", "changes", *SERIES, "--json")
    full = json.loads(js)["test"]
    assert len(full) > 80 and full not in out  # the long text is not in the default output ...
    code, verbose, _ = _run("fleet", "changes", *SERIES, "--verbose")
    assert verbose.splitlines()[0] == lines[0] and " ".join(verbose.split()).count(" ".join(full.split())) == 1


def test_fleet_tree_fits_80_columns_without_cutting_a_figure(tmp_path, monkeypatch):
    from rich.cells import cell_len

    from trainperf.fleet.tree import fleet_tree
    from trainperf.fleet.tree_synth import TreeFleet
    from trainperf.report.fleet_tree import node_text
    from trainperf.store import write_run

    store = str(tmp_path / "store")
    for r in TreeFleet().records():  # its slow host gives the long "below plan (...)" line with GPU-h, $ and %
        write_run(r, store)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run("fleet", "tree", "--store", store, "--explain")
    assert code == 0 and max(cell_len(ln) for ln in out.splitlines()) <= 80
    flat = " ".join(w for w in out.split() if w not in "│├──└")  # the text, wrapped lines joined
    for n in fleet_tree(store).root.walk():  # every node's whole line is there, its share last
        assert " ".join(node_text(n).split()) in flat, node_text(n)
