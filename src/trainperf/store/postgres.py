"""PostgreSQL backend: the same run records in tables ``runs``, ``steps`` and ``kernels``.

Every statement that carries a value is parameterised (psycopg placeholders or COPY rows);
no value is ever formatted into SQL text. A run is written in one transaction, so readers
see all of it or none of it.
"""

from __future__ import annotations

import re

from trainperf.errors import TrainperfError
from trainperf.store.parquet import _CONTEXT, _KERNEL_FIELDS, _STEP_FIELDS, RUN_COLUMNS, record_row, run_date
from trainperf.store.record import RunRecord

_RUN_TYPES = {"started_at": "DOUBLE PRECISION", "world_size": "BIGINT", "tp": "BIGINT", "pp": "BIGINT",
              "dp": "BIGINT", "cp": "BIGINT", "zero": "BIGINT", "mbs": "BIGINT", "step_time_s": "DOUBLE PRECISION",
              "tokens_per_s": "DOUBLE PRECISION", "mfu": "DOUBLE PRECISION", "mem_peak_bytes": "DOUBLE PRECISION",
              "goodput": "DOUBLE PRECISION", "n_samples": "BIGINT", "n_kernels": "BIGINT"}
PG_RUN_COLUMNS = ["run_id", "job", "date"] + RUN_COLUMNS[1:] + ["n_samples", "n_kernels"]
_CTX_COLUMNS = [c for c in _CONTEXT]


def _coltype(c: str) -> str:
    return _RUN_TYPES.get(c, "TEXT")


def _ddl() -> list[str]:
    runs = ", ".join(f'"{c}" {_coltype(c)}' + (" PRIMARY KEY" if c == "run_id" else "") for c in PG_RUN_COLUMNS)
    ctx = ", ".join(f'"{c}" {_coltype(c)}' for c in _CTX_COLUMNS)
    steps = ", ".join(['"step" BIGINT'] + [f'"{c}" DOUBLE PRECISION' for c in _STEP_FIELDS[1:]])
    kern = ", ".join([f'"{c}" TEXT' for c in _KERNEL_FIELDS[:5]] + [f'"{c}" DOUBLE PRECISION' for c in _KERNEL_FIELDS[5:]])
    return [f"CREATE TABLE IF NOT EXISTS runs ({runs})",
            f"CREATE TABLE IF NOT EXISTS steps ({ctx}, {steps})",
            f"CREATE TABLE IF NOT EXISTS kernels ({ctx}, {kern})",
            "CREATE INDEX IF NOT EXISTS steps_run_id ON steps (run_id)",
            "CREATE INDEX IF NOT EXISTS kernels_run_id ON kernels (run_id)"]


def redact(url: str) -> str:
    """Return the URL with any password replaced by ***."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _connect(url: str):
    try:
        import psycopg
    except ImportError:
        raise TrainperfError("a postgresql:// store needs psycopg: pip install 'psycopg[binary]'") from None

    try:
        return psycopg.connect(url, connect_timeout=5)
    except psycopg.Error as e:
        msg = " ".join(str(e).split())
        raise TrainperfError(f"store {redact(url)}: PostgreSQL unreachable ({msg[:200]})") from None


def _ensure_schema(con) -> None:
    with con.cursor() as cur:
        # serialise concurrent first-time schema creation (CREATE TABLE IF NOT EXISTS races)
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (7_411_845_120,))
        for stmt in _ddl():
            cur.execute(stmt)


def write_run_pg(rec: RunRecord, url: str) -> None:
    """Insert one run (run row, step rows, kernel rows) in one transaction."""
    con = _connect(url)
    import psycopg

    row = record_row(rec)
    row["job"], row["date"] = rec.job, run_date(rec)
    row["samples"] = [{k: getattr(s, k) for k in _STEP_FIELDS} for s in rec.samples]
    row["kernels"] = [{k: getattr(k_, k) for k in _KERNEL_FIELDS} for k_ in rec.kernels]
    row["n_samples"], row["n_kernels"] = len(rec.samples), len(rec.kernels)
    try:
        with con.transaction():
            _ensure_schema(con)
            with con.cursor() as cur:
                cols = ", ".join(f'"{c}"' for c in PG_RUN_COLUMNS)
                marks = ", ".join(["%s"] * len(PG_RUN_COLUMNS))
                cur.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", [row[c] for c in PG_RUN_COLUMNS])
                ctx = [row[c] for c in _CTX_COLUMNS]
                if row["samples"]:
                    scols = ", ".join(f'"{c}"' for c in _CTX_COLUMNS + _STEP_FIELDS)
                    with cur.copy(f"COPY steps ({scols}) FROM STDIN") as cp:
                        for s in row["samples"]:
                            cp.write_row(ctx + [s[k] for k in _STEP_FIELDS])
                if row["kernels"]:
                    kcols = ", ".join(f'"{c}"' for c in _CTX_COLUMNS + _KERNEL_FIELDS)
                    with cur.copy(f"COPY kernels ({kcols}) FROM STDIN") as cp:
                        for k in row["kernels"]:
                            cp.write_row(ctx + [k[f] for f in _KERNEL_FIELDS])
    except psycopg.errors.UniqueViolation:
        raise TrainperfError(f"store {redact(url)}: a run with id {rec.run_id!r} already exists") from None
    finally:
        con.close()


def query_pg(sql: str, url: str, params: list | None = None):
    """Run ``sql`` (over runs, steps, kernels) in PostgreSQL; return a pyarrow.Table.

    ``params``: values for ``?`` placeholders (sent as query parameters, never formatted in).
    """
    con = _connect(url)
    import psycopg
    import pyarrow as pa

    try:
        with con.transaction():
            _ensure_schema(con)
        with con.cursor() as cur:
            try:
                if params:
                    cur.execute(sql.replace("%", "%%").replace("?", "%s"), list(params))
                else:
                    cur.execute(sql)
            except psycopg.Error as e:
                raise TrainperfError(f"query failed: {str(e).splitlines()[0]}") from None
            if cur.description is None:
                return pa.table({})
            cols = [d.name for d in cur.description]
            rows = cur.fetchall()
        return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})
    finally:
        con.close()


def read_runs_pg(url: str, job: str | None = None, run_ids: list[str] | None = None,
                 since: float | None = None) -> list[RunRecord]:
    """Return the run records matching the filters from PostgreSQL, oldest first."""
    from trainperf.store.api import run_filter
    from trainperf.store.parquet import records_from_rows

    con = _connect(url)
    try:
        with con.transaction():
            _ensure_schema(con)
        where, params = run_filter(job, run_ids, since, mark="%s", member="run_id = ANY(%s)")
        with con.cursor() as cur:
            cur.execute("SELECT * FROM runs" + where + " ORDER BY started_at, run_id", params)
            cols = [d.name for d in cur.description]
            runs = [dict(zip(cols, r)) for r in cur.fetchall()]
            if not runs:
                return []
            ids = [r["run_id"] for r in runs]
            scols = ", ".join(f'"{c}"' for c in _STEP_FIELDS)
            cur.execute(f"SELECT run_id, {scols} FROM steps WHERE run_id = ANY(%s) ORDER BY run_id, step", [ids])
            step_rows = cur.fetchall()
            kcols = ", ".join(f'"{c}"' for c in _KERNEL_FIELDS)
            cur.execute(f"SELECT run_id, {kcols} FROM kernels WHERE run_id = ANY(%s)", [ids])
            kernel_rows = cur.fetchall()
        return records_from_rows(runs, step_rows, kernel_rows)
    finally:
        con.close()
