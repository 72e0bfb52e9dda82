"""PostgreSQL backend: the same run records in tables ``runs``, ``steps`` and ``kernels``.

Every statement that carries a value is parameterised (psycopg placeholders or COPY rows);
no value is ever formatted into SQL text. A run is written in one transaction, so readers
see all of it or none of it.

The tables are created (or given the columns an older schema lacks) once per schema version, not
on every connect: table ``trainperf_schema`` holds the fingerprint of the DDL each client applied
(``schema_version``), so a connect costs one SELECT when the store already holds this version, and
the ~90 DDL statements run only the first time a client of a new schema meets the store
(``benchmarks/bench_store.py --pg-connect``).
"""

from __future__ import annotations

import hashlib
import re
import time

from trainperf.errors import TrainperfError
from trainperf.store.record import RunRecord
from trainperf.store.schema import (CONTEXT, COUNT_COLUMNS, KERNEL_FIELDS, RUN_COLUMNS, STEP_FIELDS, RunFilter,
                                    column_kind, kernel_values, records_from_rows, run_row, step_values)

_SQL_TYPES = {"str": "TEXT", "int": "BIGINT", "float": "DOUBLE PRECISION"}
PG_RUN_COLUMNS = ("run_id", "job", "date", *RUN_COLUMNS[1:], *COUNT_COLUMNS)


def _columns(names, key: str | None = None) -> str:
    return ", ".join(f'"{c}" {_SQL_TYPES[column_kind(c)]}' + (" PRIMARY KEY" if c == key else "") for c in names)


def _ddl() -> list[str]:
    """Return the statements that create the tables, and add to tables of an older schema the columns
    they lack (a field added to the records later, e.g. ``peak_flops``: NULL in the older rows)."""
    tables = {"runs": PG_RUN_COLUMNS, "steps": CONTEXT + STEP_FIELDS, "kernels": CONTEXT + KERNEL_FIELDS}
    return [f"CREATE TABLE IF NOT EXISTS runs ({_columns(PG_RUN_COLUMNS, key='run_id')})",
            f"CREATE TABLE IF NOT EXISTS steps ({_columns(CONTEXT + STEP_FIELDS)})",
            f"CREATE TABLE IF NOT EXISTS kernels ({_columns(CONTEXT + KERNEL_FIELDS)})",
            "CREATE INDEX IF NOT EXISTS steps_run_id ON steps (run_id)",
            "CREATE INDEX IF NOT EXISTS kernels_run_id ON kernels (run_id)",
            *(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {_columns([c])}" for t, cols in tables.items() for c in cols)]


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


SCHEMA_TABLE = "trainperf_schema"  # one row per schema version applied to this store (module doc)


def schema_version() -> str:
    """Return the fingerprint of the tables this client writes: the first 16 hex digits of the SHA-256 of
    its DDL text, so that a field added to the records (a new column) is a new version with no number to bump."""
    return hashlib.sha256("\n".join(_ddl()).encode()).hexdigest()[:16]


def _ensure_schema(con) -> None:
    """Make sure the store holds this client's tables and columns (``schema_version``): one SELECT when it
    does; else the DDL (idempotent: IF NOT EXISTS everywhere) and the version recorded, in one transaction.
    Leaves ``con`` outside any transaction."""
    import psycopg

    version = schema_version()
    try:
        with con.transaction(), con.cursor() as cur:
            cur.execute(f"SELECT 1 FROM {SCHEMA_TABLE} WHERE version = %s", (version,))
            if cur.fetchone() is not None:
                return
    except psycopg.errors.UndefinedTable:  # a new store, or one created before the version table existed
        pass
    with con.transaction(), con.cursor() as cur:
        # serialise concurrent first-time schema creation (CREATE TABLE IF NOT EXISTS races)
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (7_411_845_120,))
        for stmt in _ddl():
            cur.execute(stmt)
        cur.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version TEXT PRIMARY KEY, "
                    "applied_at DOUBLE PRECISION)")
        cur.execute(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    (version, time.time()))


def write_run_pg(rec: RunRecord, url: str) -> None:
    """Insert one run (run row, step rows, kernel rows) in one transaction."""
    con = _connect(url)
    import psycopg

    row = run_row(rec)
    ctx = [row[c] for c in CONTEXT]
    try:
        _ensure_schema(con)
        with con.transaction():
            with con.cursor() as cur:
                cols = ", ".join(f'"{c}"' for c in PG_RUN_COLUMNS)
                marks = ", ".join(["%s"] * len(PG_RUN_COLUMNS))
                cur.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", [row[c] for c in PG_RUN_COLUMNS])
                for table, names, items, values in (("steps", STEP_FIELDS, rec.samples, step_values),
                                                    ("kernels", KERNEL_FIELDS, rec.kernels, kernel_values)):
                    if items:
                        cols = ", ".join(f'"{c}"' for c in CONTEXT + names)
                        with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                            for item in items:
                                cp.write_row(ctx + values(item))
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


def read_runs_pg(url: str, filt: RunFilter = RunFilter(), samples: bool = True) -> list[RunRecord]:
    """Return the run records matching ``filt`` from PostgreSQL, oldest first (``samples`` False: run rows only)."""
    con = _connect(url)
    try:
        _ensure_schema(con)
        where, params = filt.where(mark="%s", member="run_id = ANY(%s)")
        with con.cursor() as cur:
            cur.execute("SELECT * FROM runs" + where + " ORDER BY started_at, run_id", params)
            cols = [d.name for d in cur.description]
            runs = [dict(zip(cols, r)) for r in cur.fetchall()]
            if not runs or not samples:
                return records_from_rows(runs, [], [])
            ids = [r["run_id"] for r in runs]
            scols = ", ".join(f'"{c}"' for c in STEP_FIELDS)
            cur.execute(f"SELECT run_id, {scols} FROM steps WHERE run_id = ANY(%s) ORDER BY run_id, step", [ids])
            step_rows = cur.fetchall()
            kcols = ", ".join(f'"{c}"' for c in KERNEL_FIELDS)
            cur.execute(f"SELECT run_id, {kcols} FROM kernels WHERE run_id = ANY(%s)", [ids])
            kernel_rows = cur.fetchall()
        return records_from_rows(runs, step_rows, kernel_rows)
    finally:
        con.close()


class PostgresStore:
    """The fleet store: the same records in PostgreSQL tables runs, steps, kernels (see module doc)."""

    def __init__(self, url: str):
        self.url = url
        self.location = redact(url)

    def write(self, record: RunRecord) -> str:
        """Insert one run in one transaction; return ``<url without password>#<run_id>``."""
        write_run_pg(record, self.url)
        return f"{self.location}#{record.run_id}"

    def read(self, filt: RunFilter = RunFilter(), *, samples: bool = True) -> list[RunRecord]:
        """Return the records matching ``filt``, oldest first (with samples and kernels unless ``samples`` False)."""
        return read_runs_pg(self.url, filt, samples)

    def query(self, sql: str, params: list | None = None):
        """Run ``sql`` (``?`` placeholders) over the tables runs, steps, kernels; return a pyarrow.Table."""
        return query_pg(sql, self.url, params)
