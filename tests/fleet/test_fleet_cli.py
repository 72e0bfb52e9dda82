"""`trainperf fleet changes|localize` and `trainperf runs list|show|query` end to end (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainperf.fleet.synth import synthetic_fleet
from trainperf.store import write_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from chart_checks import assert_charts  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "src/trainperf/fleet/examples"
RS = Path(__file__).resolve().parents[2] / "../shared/data/rca/rs"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trainperf.cli", *args], capture_output=True, text=True, timeout=180)


def _one_line_error(r):
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_changes_on_csv(tmp_path):
    html = tmp_path / "changes.html"
    r = _cli("fleet", "changes", "--csv", str(EXAMPLES / "step_times.csv"), "--column", "step_time_s", "--json",
             "--html", str(html))
    assert r.returncode == 0, r.stderr
    assert_charts(html.read_text())
    assert "+6." in html.read_text()
    out = json.loads(r.stdout)
    # the example has a +6% shift at row 80 and a single 40% outlier at row 30 (not a change)
    assert out["change_points"] == [80]
    assert 0.05 < out["changes"][0]["rel_change"] < 0.07
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n2,oops\n")
    _one_line_error(_cli("fleet", "changes", "--csv", str(bad), "--column", "y"))
    _one_line_error(_cli("fleet", "changes", "--csv", str(bad), "--column", "z"))
    (tmp_path / "empty.csv").write_text("x\n")
    _one_line_error(_cli("fleet", "changes", "--csv", str(tmp_path / "empty.csv"), "--column", "x"))


def test_store_commands_on_a_synthetic_fleet(tmp_path):
    store = str(tmp_path / "store")
    fleet = synthetic_fleet(n_periods=40, n_hosts=6, causes=("bad_host",), bad_host_at=20, steps_per_run=3)
    for rec in fleet.records:
        write_run(rec, store)
    host = fleet.truth["bad_host"]["attrs"]["host"]
    job = next(r.job for r in fleet.records if r.host == host)
    # change points over the store: the bad host's series of this job (one value per run, time order)
    r = _cli("fleet", "changes", "--store", store, "--job", job, "--host", host, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["change_points"] == [20] and out["run_ids"] == [f"synth-0020-{host}"]
    # localisation over the store: runs before --at are the history
    at = str(fleet.records[0].started_at + 20 * 3600)
    r = _cli("fleet", "localize", "--store", store, "--at", at, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["root_causes"] == [{"host": host}]
    # runs list / show / query
    r = _cli("runs", "list", "--store", store, "--job", job, "--limit", "5", "--json")
    rows = json.loads(r.stdout)
    assert len(rows) == 5 and {x["job"] for x in rows} == {job}
    r = _cli("runs", "show", rows[0]["run_id"], "--store", store, "--json")
    assert json.loads(r.stdout)["run_id"] == rows[0]["run_id"]
    r = _cli("runs", "query", "SELECT count(*) AS n FROM steps", "--store", store, "--json")
    assert json.loads(r.stdout) == [{"n": 40 * 6 * 3}]
    _one_line_error(_cli("runs", "query", "SELECT nope FROM runs", "--store", store))
    _one_line_error(_cli("runs", "show", "missing-run", "--store", store))
    _one_line_error(_cli("runs", "list", "--store", str(EXAMPLES)))  # a folder that is not a store
    _one_line_error(_cli("runs", "list", "--store", "postgresql://nobody:x@127.0.0.1:1/none"))


def test_localize_cli_on_a_robustspot_incident():
    if not RS.is_dir():
        pytest.skip(f"{RS} absent (shared data folder)")
    import yaml

    inc = next(i for i in yaml.safe_load((RS / "anomaly.yaml").read_text()) if i["data"] == "case19_1005_121873726")
    r = _cli("fleet", "localize", "--csv", str(RS / f"{inc['data']}.csv"), "--time-col", "min", "--measure", "value",
             "--per", "cnt", "--at", str(inc["timestamp"]), "--json")
    assert r.returncode == 0, r.stderr
    # the labelled root cause of this incident (anomaly.yaml): bitrate=500
    assert json.loads(r.stdout)["root_causes"] == [{k: str(v) for k, v in inc["cause"].items()}]
