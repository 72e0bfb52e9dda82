"""A run record's peak FLOP/s and its source: stored, read back, and older records (written before
the fields existed) still read, with their peak said to be unknown."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainperf.store import RunRecord, StepSample, query, read_runs, write_run
from trainperf.store.parquet import record_table
from trainperf.store.record import PEAK_UNKNOWN, mfu_against, mfu_text

NEW = ("peak_flops", "peak_source")


def _record(run_id: str, started_at: float, **kw) -> RunRecord:
    return RunRecord(run_id=run_id, job="j", host="h", started_at=started_at, mfu=0.31, step_time_s=0.1,
                     samples=[StepSample(step=s, step_time_s=0.1, tokens_per_s=100.0, mfu=0.31) for s in range(1, 4)],
                     **kw)


def _write_old(rec: RunRecord, store) -> str:
    """Write ``rec`` as a file of the schema before peaks were stored: the same table less NEW columns."""
    path = write_run(rec, str(store))
    table = record_table(rec).drop_columns(list(NEW))
    with pq.ParquetWriter(path, table.schema) as w:  # one row group per record kind, as write_run does
        w.write_table(table.slice(0, 1))
        w.write_table(table.slice(1, len(rec.samples)))
    assert not set(NEW) & set(pq.read_schema(path).names)
    return path


def test_peak_round_trips(tmp_path):
    rec = _record("new", 1.79e9, peak_flops=9.52e9, peak_source="measured: the best of 12 fp32 1024^3 matmuls")
    write_run(rec, str(tmp_path))
    assert read_runs(str(tmp_path)) == [rec]
    assert query("SELECT peak_flops, peak_source FROM runs", str(tmp_path)).to_pylist() == [
        {"peak_flops": 9.52e9, "peak_source": rec.peak_source}]


@pytest.mark.parametrize("old_first", [True, False])
def test_older_records_read_beside_newer_ones_with_peak_unknown(tmp_path, old_first):
    """DuckDB binds the columns of the first file: an older file first, or after a newer one, both read
    (the older one's peak as NULL), in a Parquet store holding both schemas."""
    t_old, t_new = (1.70e9, 1.79e9) if old_first else (1.79e9, 1.70e9)  # files sort by date partition
    old = _record("old", t_old)
    _write_old(old, tmp_path)
    new = _record("new", t_new, peak_flops=9.52e9, peak_source="catalog H100 SXM (bf16)")
    write_run(new, str(tmp_path))
    got = {r.run_id: r for r in read_runs(str(tmp_path))}
    assert got["old"].peak_flops is None and got["old"].peak_source == "" and got["old"].samples == old.samples
    assert got["new"] == new
    rows = query("SELECT run_id, peak_flops FROM runs ORDER BY run_id", str(tmp_path)).to_pylist()
    assert rows == [{"run_id": "new", "peak_flops": 9.52e9}, {"run_id": "old", "peak_flops": None}]
    assert query("SELECT count(*) AS n FROM steps", str(tmp_path)).to_pylist() == [{"n": 6}]


def test_runs_show_says_what_the_mfu_is_of(tmp_path):
    from trainperf.cli import app

    _write_old(_record("old-run-0001", 1.70e9), tmp_path)
    write_run(_record("new-run-0001", 1.79e9, peak_flops=9.52e9, peak_source="measured: best of 12"), str(tmp_path))
    out = {}
    for rid in ("old-run-0001", "new-run-0001"):
        res = CliRunner().invoke(app, ["runs", "show", rid, "--store", str(tmp_path)])
        assert res.exit_code == 0, res.output
        out[rid] = re.sub(r"\s+", " ", res.output)
    assert f"mfu: 31.0%, {PEAK_UNKNOWN}" in out["old-run-0001"]
    assert "mfu: 31.0% of 9.52 GFLOP/s, measured: best of 12" in out["new-run-0001"]
    assert "peak_flops" not in out["new-run-0001"]  # said once, in the MFU line


def test_mfu_against_another_peak_by_hand():
    """MFU 0.20 of 10 GFLOP/s is 2 GFLOP/s achieved: 0.25 of 8 GFLOP/s; unknown peaks leave it as recorded."""
    assert mfu_against(0.20, 10e9, 8e9) == pytest.approx(0.25)
    assert mfu_against(0.20, None, 8e9) == 0.20 and mfu_against(0.20, 10e9, None) == 0.20
    assert mfu_against(None, 10e9, 8e9) is None
    np.testing.assert_allclose(mfu_against(np.array([0.1, 0.2]), 10e9, 5e9), [0.2, 0.4])
    assert mfu_text(None, 1e12) == "-" and mfu_text(0.5, 989e12, "catalog H100 SXM (bf16)") == \
        "50.0% of 989 TFLOP/s, catalog H100 SXM (bf16)"


def test_postgres_adds_the_columns_an_older_table_lacks():
    """The DDL run before every read and write adds each record column a table of an older schema
    lacks (PostgreSQL's ADD COLUMN IF NOT EXISTS); checked against a live server in test_store_postgres."""
    from trainperf.store.postgres import _ddl

    ddl = _ddl()
    assert 'ALTER TABLE runs ADD COLUMN IF NOT EXISTS "peak_flops" DOUBLE PRECISION' in ddl
    assert 'ALTER TABLE runs ADD COLUMN IF NOT EXISTS "peak_source" TEXT' in ddl
    assert not any("steps" in s and "peak_flops" in s for s in ddl)  # a run-level field: runs table only


def test_migrate_rewrites_older_files_in_the_current_schema(tmp_path):
    """`runs migrate`: the older file gains the new columns (NULL), keeps its rows and row groups (run,
    steps: 2), reads back the same record; a second run rewrites nothing."""
    import warnings

    from trainperf.cli import app
    from trainperf.store.parquet import FILE_COLUMNS, OlderSchemaWarning, older_files

    old = _record("old", 1.70e9)
    path = _write_old(old, tmp_path)
    write_run(_record("new", 1.79e9, peak_flops=1e12, peak_source="catalog"), str(tmp_path))
    with pytest.warns(OlderSchemaWarning):  # the older file comes first: read by column name, said once
        before = {r.run_id: r for r in read_runs(str(tmp_path))}
    assert [p.name for p in older_files(tmp_path)] == ["old.parquet"]
    res = CliRunner().invoke(app, ["runs", "migrate", "--store", str(tmp_path)])
    assert res.exit_code == 0 and "1 run file(s) rewritten" in res.output
    assert pq.read_schema(path).names == list(FILE_COLUMNS) and pq.ParquetFile(path).num_row_groups == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", OlderSchemaWarning)  # migrated: no longer read by column name
        assert {r.run_id: r for r in read_runs(str(tmp_path))} == before and not older_files(tmp_path)
    again = CliRunner().invoke(app, ["runs", "migrate", "--store", str(tmp_path)])
    assert "already has the current schema" in again.output


def test_a_store_of_older_files_only_reads_and_says_to_migrate(tmp_path):
    """Every file older (a store from before the upgrade): the new columns no file has read as NULL, and
    a warning names the store and `trainperf runs migrate`."""
    import warnings

    from trainperf.store.parquet import OlderSchemaWarning

    for i in range(2):
        _write_old(_record(f"old{i}", 1.70e9 + i), tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = query("SELECT run_id, peak_flops, peak_source FROM runs ORDER BY run_id", str(tmp_path)).to_pylist()
    assert rows == [{"run_id": f"old{i}", "peak_flops": None, "peak_source": None} for i in range(2)]
    assert [r.peak_flops for r in read_runs(str(tmp_path))] == [None, None]
    said = [str(w.message) for w in caught if issubclass(w.category, OlderSchemaWarning)]
    assert said and str(tmp_path) in said[0] and "trainperf runs migrate" in said[0]
