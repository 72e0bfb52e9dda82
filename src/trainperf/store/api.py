"""The store's API: write_run, read_runs, get_run, query, over Parquet (default) or PostgreSQL.

The store location is the ``store`` argument, else env ``TRAINPERF_STORE``, else ``.trainperf``
in the current folder. A ``postgresql://`` URL selects the PostgreSQL backend.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.store.record import RunRecord


def resolve_store(store: str | os.PathLike | None = None) -> str:
    """Return the store location: the argument, else $TRAINPERF_STORE, else ``.trainperf``."""
    return str(store or os.environ.get("TRAINPERF_STORE") or ".trainperf")


def is_postgres(store: str) -> bool:
    """True when ``store`` is a PostgreSQL connection URL."""
    return store.startswith(("postgresql://", "postgres://"))


def write_run(record: RunRecord, store: str | None = None) -> str:
    """Write one run record; return where it went (a Parquet file path, or ``<url>#<run_id>``).

    Parquet: one file per run, written to a temp name then renamed, under
    ``<store>/runs/date=YYYY-MM-DD/job=NAME/``. PostgreSQL: one transaction.
    """
    if not isinstance(record, RunRecord):
        raise TypeError(f"write_run expects a RunRecord, got {type(record).__name__}")
    where = resolve_store(store)
    if is_postgres(where):
        from trainperf.store import postgres

        postgres.write_run_pg(record, where)
        return f"{postgres.redact(where)}#{record.run_id}"
    from trainperf.store.parquet import write_run_parquet

    return write_run_parquet(record, Path(where))


def query(sql: str, store: str | None = None, params: list | None = None):
    """Run ``sql`` over the views ``runs``, ``steps``, ``kernels``; return a pyarrow.Table.

    ``runs``: one row per run; ``steps``: one row per step sample; ``kernels``: one row per
    kernel result (step and kernel rows carry run context: job, host, versions, config hash).
    ``params``: values for ``?`` placeholders in ``sql`` (never format values into SQL text).
    """
    where = resolve_store(store)
    if is_postgres(where):
        from trainperf.store import postgres

        return postgres.query_pg(sql, where, params)
    from trainperf.store.parquet import connect

    def run(validate: bool):
        con = connect(Path(where), validate=validate)
        try:
            rel = con.sql(sql, params=params) if params else con.sql(sql)
            if rel is None:  # a statement that returns no rows
                import pyarrow as pa

                return pa.table({})
            return rel.to_arrow_table()
        finally:
            con.close()

    return _with_retry(run)


def _with_retry(run):
    """Call run(validate=False); on a DuckDB error, once more with every file checked first.

    Files are opened lazily, so a corrupt one only shows when a query reaches it; the retry skips
    it with a warning naming it. A second failure is the query's own fault: one line.
    """
    import duckdb

    try:
        return run(False)
    except duckdb.Error:
        pass
    try:
        return run(True)
    except duckdb.Error as e:
        raise TrainperfError(f"query failed: {str(e).splitlines()[0]}") from None


def read_runs(store: str | None = None, job: str | None = None, run_ids: list[str] | None = None,
              since: float | None = None) -> list[RunRecord]:
    """Return the run records (with samples and kernels) matching the filters, oldest first.

    ``job``: exact job name; ``run_ids``: keep only these; ``since``: unix seconds, started at or after.
    """
    where = resolve_store(store)
    if is_postgres(where):
        from trainperf.store import postgres

        return postgres.read_runs_pg(where, job=job, run_ids=run_ids, since=since)
    from trainperf.store.parquet import connect, read_records

    cond, params = run_filter(job, run_ids, since, mark="?", member="list_contains(?, run_id)")

    def run(validate: bool):
        con = connect(Path(where), validate=validate)
        try:
            return read_records(con, cond, params)
        finally:
            con.close()

    return _with_retry(run)


def run_filter(job: str | None, run_ids: list[str] | None, since: float | None, mark: str,
               member: str) -> tuple[str, list]:
    """Return (``" WHERE ..."`` or ``""``, its parameters) for read_runs' filters on the runs table.

    ``mark``: the backend's placeholder; ``member``: its SQL testing ``run_id`` against a list parameter.
    """
    conds, params = [], []
    if job is not None:
        conds.append(f"job = {mark}")
        params.append(job)
    if run_ids is not None:
        conds.append(member)
        params.append(list(run_ids))
    if since is not None:
        conds.append(f"started_at >= {mark}")
        params.append(float(since))
    return (" WHERE " + " AND ".join(conds)) if conds else "", params


def get_run(run_id: str, store: str | None = None) -> RunRecord:
    """Return the run ``run_id``; raise TrainperfError when the store has no such run."""
    runs = read_runs(store, run_ids=[run_id])
    if not runs:
        raise TrainperfError(f"store {resolve_store(store)}: no run with id {run_id!r}")
    return runs[0]
