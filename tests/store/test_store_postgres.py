"""Run store on a real PostgreSQL server: the same records as the Parquet store, parameterised.

The server is started by .ci/services.sh at postgresql://trainperf:trainperf@127.0.0.1:5432/trainperf
(override with TRAINPERF_TEST_PG). Without a server the tests skip, except under CI=true where
they fail: CI must exercise the fleet backend.
"""

from __future__ import annotations

import os
import uuid

import pytest

from trainperf.errors import TrainperfError
from trainperf.store import KernelResult, RunRecord, StepSample, get_run, query, read_runs, write_run

DSN = os.environ.get("TRAINPERF_TEST_PG", "postgresql://trainperf:trainperf@127.0.0.1:5432/trainperf")


@pytest.fixture(scope="module")
def pg():
    import psycopg

    try:
        con = psycopg.connect(DSN, connect_timeout=3)
    except psycopg.OperationalError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but PostgreSQL at {DSN} is unreachable: {e}")
        pytest.skip(f"no PostgreSQL at {DSN} (run .ci/services.sh to start one)")
    # a private schema per test session keeps runs isolated; search_path via the URL options
    schema = f"t_{uuid.uuid4().hex[:10]}"
    con.autocommit = True
    con.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{DSN}?options=-csearch_path%3D{schema}"
    yield url
    con.execute(f'DROP SCHEMA "{schema}" CASCADE')
    con.close()


def _record(i, job="llama-8b"):
    return RunRecord(run_id=f"pg-{i}-{uuid.uuid4().hex[:6]}", job=job, host=f"node{i}", nccl="2.21.5",
                     layout="tp=2,zero=3", config={"i": i}, started_at=1.79e9 + i, step_time_s=1.0 + i,
                     samples=[StepSample(step=s, step_time_s=1.0 + s) for s in range(4)],
                     kernels=[KernelResult("softmax", "eager", "8x8", "fp32", "fwd", 0.5)])


def test_same_records_as_parquet(pg, tmp_path):
    recs = [_record(i) for i in range(3)] + [_record(9, job="o'brien; DROP TABLE runs; --")]
    for r in recs:
        write_run(r, pg)
        write_run(r, str(tmp_path))
    assert read_runs(pg) == read_runs(str(tmp_path)) == recs
    assert get_run(recs[-1].run_id, pg) == recs[-1]  # the hostile job name went in as a parameter
    assert read_runs(pg, job="o'brien; DROP TABLE runs; --") == [recs[-1]]
    sql = "SELECT job, count(*) AS n, sum(step_time_s) AS s FROM steps GROUP BY job ORDER BY job"
    assert query(sql, pg).to_pylist() == query(sql, str(tmp_path)).to_pylist()
    assert query("SELECT run_id FROM runs WHERE host = ?", pg, ["node1"]).to_pylist() == [{"run_id": recs[1].run_id}]
    assert read_runs(pg, host="node2", since=1.79e9 + 2) == read_runs(str(tmp_path), host="node2") == [recs[2]]
    bare = read_runs(pg, host="node2", samples=False)
    assert bare == read_runs(str(tmp_path), host="node2", samples=False) and bare[0].samples == bare[0].kernels == []


def test_duplicate_and_unreachable(pg):
    r = _record(5)
    write_run(r, pg)
    with pytest.raises(TrainperfError, match="already exists"):
        write_run(r, pg)
    assert len(read_runs(pg, run_ids=[r.run_id])) == 1  # the failed write left nothing half-written
    with pytest.raises(TrainperfError, match="unreachable"):
        write_run(_record(6), "postgresql://trainperf:x@127.0.0.1:1/none")


def test_fleet_tree_is_the_same_over_either_backend(pg, tmp_path):
    # the tree sums steps in SQL through Store.query: the same statement must mean the same in both
    from trainperf.fleet.tree import fleet_tree
    from trainperf.fleet.tree_synth import TreeFleet

    for r in TreeFleet(n_steps=20, data_stall={}, jobs=("tree-a", "tree-b")).records():
        write_run(r, pg)
        write_run(r, str(tmp_path))
    def rounded(x):  # sums may add in another order: equal to 12 significant digits
        if isinstance(x, float):
            return float(f"{x:.12g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        return [rounded(v) for v in x] if isinstance(x, list) else x

    a, b = (rounded(fleet_tree(s, job="tree-a").to_dict()) for s in (pg, str(tmp_path)))
    assert a["allocated_gpu_h"] > 0 and a == b


def test_a_table_of_an_older_schema_gains_the_new_columns(pg):
    """A runs table created before peak_flops/peak_source existed: its rows read with the peak unknown
    (None), and a new record writes and reads its peak (the DDL adds the missing columns)."""
    import psycopg

    from trainperf.store.postgres import PG_RUN_COLUMNS, _columns

    old_schema = f"old_{uuid.uuid4().hex[:8]}"
    url = pg.replace(pg.split("search_path%3D")[1], old_schema)
    with psycopg.connect(DSN, autocommit=True) as con:
        con.execute(f'CREATE SCHEMA "{old_schema}"')
        cols = [c for c in PG_RUN_COLUMNS if c not in ("peak_flops", "peak_source")]
        con.execute(f'CREATE TABLE "{old_schema}".runs ({_columns(cols)})')
        con.execute(f'INSERT INTO "{old_schema}".runs (run_id, job, kind, started_at, world_size, config_json) '
                    "VALUES ('old', 'j', 'train', 1.0, 1, '{}')")
    try:
        new = RunRecord(run_id="new", job="j", started_at=2.0, mfu=0.3, peak_flops=9.52e9, peak_source="measured")
        write_run(new, url)
        got = {r.run_id: r for r in read_runs(url)}
        assert got["old"].peak_flops is None and got["old"].peak_source == ""
        assert (got["new"].peak_flops, got["new"].peak_source) == (9.52e9, "measured")
    finally:
        with psycopg.connect(DSN, autocommit=True) as con:
            con.execute(f'DROP SCHEMA "{old_schema}" CASCADE')


def test_the_schema_is_created_once_per_version(pg, monkeypatch):
    """A connect to a store that holds this client's schema version sends one schema statement (the
    version SELECT), not the ~90 DDL statements; a client whose DDL differs (a column added to the
    records) is a new version: its DDL runs once and the new column exists. Reference: the statements
    counted at psycopg's cursor."""
    import psycopg

    from trainperf.store import postgres

    schema = f"ver_{uuid.uuid4().hex[:8]}"
    url = pg.replace(pg.split("search_path%3D")[1], schema)
    with psycopg.connect(DSN, autocommit=True) as con:
        con.execute(f'CREATE SCHEMA "{schema}"')
    sent = []
    real = psycopg.Cursor.execute

    def counting(self, query, *a, **k):
        sent.append(str(query))
        return real(self, query, *a, **k)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    try:
        write_run(_record(1), url)  # a new store: the DDL runs
        assert len(sent) > len(postgres._ddl())
        sent.clear()
        assert len(read_runs(url, samples=False)) == 1
        assert len(sent) == 2 and postgres.SCHEMA_TABLE in sent[0]  # the version check, then the read
        sent.clear()
        ddl, v1 = postgres._ddl(), postgres.schema_version()
        monkeypatch.setattr(postgres, "_ddl", lambda: ddl + ["ALTER TABLE runs ADD COLUMN IF NOT EXISTS extra_col TEXT"])
        assert query("SELECT count(extra_col) AS n FROM runs", url).to_pylist() == [{"n": 0}]
        assert len(sent) > len(ddl)  # the new version's DDL ran
        sent.clear()
        query("SELECT 1 AS one", url)
        assert len(sent) == 2
        v2 = postgres.schema_version()
        with psycopg.connect(url) as con:
            versions = {r[0] for r in con.execute(f"SELECT version FROM {postgres.SCHEMA_TABLE}")}
        assert v1 != v2 and versions == {v1, v2}
    finally:
        monkeypatch.undo()
        with psycopg.connect(DSN, autocommit=True) as con:
            con.execute(f'DROP SCHEMA "{schema}" CASCADE')
