"""Embedded store: one Parquet file per run, hive-partitioned by date and job, read with DuckDB.

Layout on disk (readable unchanged by DuckDB, Spark, Ray, pyarrow.dataset with hive partitioning)::

    <root>/runs/date=2026-11-29/job=llama-8b/<run_id>.parquet

The partition columns ``date`` and ``job`` live in the folder names only (the Hive convention),
so a reader that enables hive partitioning sees them as ordinary columns. A run file is one flat
table: one row per run (``record = 'run'``), one per step sample (``'step'``) and one per kernel
result (``'kernel'``). Every row carries the run's context (run id, host, versions, config hash:
run-length encoded, nearly free), so slicing steps by host or version needs no join, and a
query reads only the columns it names (10 million step rows: see docs/benchmarks.md).
``step_time_s``, ``tokens_per_s``, ``mfu`` and ``mem_peak_bytes`` hold the run's summary on its
run row and the step's value on a step row. A writer never touches another writer's file, and
each file appears whole (temp name, then rename): safe for any number of concurrent writers.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from urllib.parse import quote

from trainperf.atomic import atomic_path
from trainperf.errors import TrainperfError
from trainperf.store.record import RunRecord
from trainperf.store.schema import (CONTEXT, COUNT_COLUMNS, KERNEL_FIELDS, RUN_COLUMNS, STEP_FIELDS, RunFilter,
                                    column_kind, kernel_values, records_from_rows, run_date, run_row, step_values)


class CorruptRunFileWarning(UserWarning):
    """A run file in the store could not be read; it was skipped."""


class OlderSchemaWarning(UserWarning):
    """The store holds run files of an older schema: reads are slower until `trainperf runs migrate`."""


# context columns stored in the file (job and date live in the folder names)
_FILE_CONTEXT = [c for c in CONTEXT if c not in ("job", "date")]
FILE_COLUMNS = (["record", *RUN_COLUMNS, *COUNT_COLUMNS] + [c for c in STEP_FIELDS if c not in RUN_COLUMNS]
                + list(KERNEL_FIELDS))


def arrow_schema():
    """Return the pyarrow schema of a run file (one row per run, step sample and kernel result)."""
    import pyarrow as pa

    types = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
    return pa.schema([(c, types[column_kind(c)]) for c in FILE_COLUMNS])


def record_table(rec: RunRecord):
    """Return the pyarrow Table written for ``rec``: its run row, then step rows, then kernel rows."""
    import pyarrow as pa

    schema = arrow_schema()
    run = run_row(rec)
    ns, nk = len(rec.samples), len(rec.kernels)
    n = 1 + ns + nk
    steps = [dict(zip(STEP_FIELDS, step_values(s))) for s in rec.samples]
    kerns = [dict(zip(KERNEL_FIELDS, kernel_values(k))) for k in rec.kernels]
    cols = {}
    for c in FILE_COLUMNS:
        t = schema.field(c).type
        if c == "record":
            cols[c] = pa.array(["run"] + ["step"] * ns + ["kernel"] * nk, t)
        elif c in _FILE_CONTEXT:
            cols[c] = pa.repeat(pa.scalar(run[c], t), n)
        elif c in STEP_FIELDS or c in KERNEL_FIELDS:
            head = [run.get(c)] if c in RUN_COLUMNS else [None]
            cols[c] = pa.array(head + [s.get(c) for s in steps] + [k.get(c) for k in kerns], t)
        else:  # run-only column
            cols[c] = pa.array([run[c]] + [None] * (n - 1), t)
    return pa.table(cols, schema=schema)


def partition_value(text: str) -> str:
    """Return ``text`` escaped for a hive partition folder name (Hive's %XX escaping)."""
    return quote(text or "_", safe="-_.+@,")


_RUN_ID = re.compile(r"^[A-Za-z0-9._\-]+$")


def check_store_dir(root: Path, create: bool) -> Path:
    """Return ``root/runs``; raise TrainperfError when ``root`` is not (and cannot become) a store."""
    runs = root / "runs"
    if root.exists() and not root.is_dir():
        raise TrainperfError(f"store {root}: is a file, not a store folder")
    if runs.is_dir():
        return runs
    # Another writer may create runs/ between the check above and this one: a folder holding
    # nothing but runs/ is still an empty store (concurrent first writes must all succeed).
    if create and (not root.exists() or all(p.name == "runs" for p in root.iterdir())):
        runs.mkdir(parents=True, exist_ok=True)
        return runs
    if not root.exists():
        raise TrainperfError(f"store {root}: does not exist (write a run first, or pass --store)")
    if not any(root.iterdir()):  # a folder made for the store before its first run
        raise TrainperfError(f"store {root}: holds no runs yet (an empty folder; write a run first, or pass --store)")
    raise TrainperfError(f"store {root}: not a trainperf store (no runs/ folder in a non-empty folder)")


def write_run_parquet(rec: RunRecord, root: Path) -> str:
    """Write ``rec`` as one Parquet file under ``root`` atomically; return the file path."""
    import pyarrow.parquet as pq

    if not rec.run_id or not _RUN_ID.match(rec.run_id):
        raise TrainperfError(f"run id {rec.run_id!r}: use letters, digits, '.', '_' or '-' only")
    if not rec.job:
        raise TrainperfError(f"run {rec.run_id}: job name is empty")
    runs = check_store_dir(root, create=True)
    path = runs / f"date={run_date(rec)}" / f"job={partition_value(rec.job)}" / f"{rec.run_id}.parquet"
    table = record_table(rec)
    ns, nk = len(rec.samples), len(rec.kernels)
    with atomic_path(path) as tmp:
        # one row group per record kind: its min/max statistics let a reader of the runs view
        # skip the step rows without reading them
        with pq.ParquetWriter(tmp, table.schema, compression="zstd") as w:
            for start, length in ((0, 1), (1, ns), (1 + ns, nk)):
                if length:
                    w.write_table(table.slice(start, length))
    return str(path)


def run_files(root: Path) -> list[Path]:
    """Return every finished run file under the store ``root`` (temp files excluded), sorted."""
    runs = check_store_dir(root, create=False)
    return sorted(p for p in runs.glob("date=*/job=*/*.parquet") if not p.name.startswith("."))


def readable_files(files: list[Path]) -> list[Path]:
    """Return the files whose Parquet footer reads; warn (naming the file) for each one that does not."""
    import pyarrow.parquet as pq

    good = []
    for p in files:
        try:
            pq.read_metadata(p)
            good.append(p)
        except Exception as e:  # noqa: BLE001 - any unreadable file is skipped, by name
            warnings.warn(f"skipping corrupt run file {p}: {str(e).splitlines()[0]}", CorruptRunFileWarning,
                          stacklevel=3)
    return good


def _empty_views(con) -> None:
    import pyarrow as pa

    schema = arrow_schema()
    empty = pa.table({f.name: pa.array([], f.type) for f in schema})
    con.register("raw_runs_empty", empty)
    con.execute("CREATE VIEW raw_runs AS SELECT *, NULL::VARCHAR AS job, NULL::VARCHAR AS date FROM raw_runs_empty")


def _read_files(con, files: list[Path], union: bool):
    """Return the DuckDB relation over the run ``files``. DuckDB takes the columns of the first file;
    files written before a column was added to the records (e.g. ``peak_flops``) lack it, so when the
    first file does, or ``union`` asks, the files are read by column name (``union_by_name``: a column a
    file lacks reads as NULL). That costs about 4x (a count over 300 files: 1.3 s -> 5.3-6.0 s,
    docs/benchmarks.md), paid only by a store holding files of an older schema until
    ``trainperf runs migrate`` (``migrate_store``) rewrites them."""
    names = [str(p) for p in files]
    rel = con.read_parquet(names, hive_partitioning=True, union_by_name=union)
    if not union and set(FILE_COLUMNS) - set(rel.columns):
        warnings.warn(f"store {files[0].parents[3]}: run files of an older schema (written before a record field "
                      "existed): every query reads them by column name, which is slower; `trainperf runs migrate` "
                      "rewrites them", OlderSchemaWarning, stacklevel=4)
        rel = con.read_parquet(names, hive_partitioning=True, union_by_name=True)
    return rel


def _with_every_column(con, rel) -> None:
    """Create view ``raw_runs`` over ``rel`` with every FILE_COLUMNS column: one that no file has (a store
    of older files only) reads as a typed NULL."""
    types = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE"}
    missing = [c for c in FILE_COLUMNS if c not in rel.columns]
    rel.create_view("raw_files")
    extra = "".join(f", NULL::{types[column_kind(c)]} AS {c}" for c in missing)
    con.execute(f"CREATE VIEW raw_runs AS SELECT *{extra} FROM raw_files")


def connect(root: Path, validate: bool = False):
    """Return a DuckDB connection with views ``runs``, ``steps`` and ``kernels`` over the store.

    ``runs``: one row per run; ``steps``: one row per step sample; ``kernels``: one row per kernel
    result. Step and kernel rows carry the run's context columns (host, versions, config hash).
    ``validate``: read every file's footer first and skip (with a warning) the unreadable ones, and
    read the files by column name (a file of an older schema among newer ones); otherwise DuckDB
    opens files lazily and a corrupt or older file fails the query (callers then retry).
    """
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # DuckDB draws one on stdout for queries over ~2 s
    files = run_files(root)
    if validate:
        files = readable_files(files)
    rel = None
    if files:
        try:
            rel = _read_files(con, files, union=validate)
            rel.limit(0).fetchall()
        except duckdb.Error:
            files = readable_files(files)
            rel = _read_files(con, files, union=True) if files else None
    if rel is None:
        _empty_views(con)
    else:
        _with_every_column(con, rel)
    # job and date come from the folder names; the job folder is %XX-escaped
    ctx = ", ".join("url_decode(job::VARCHAR) AS job" if c == "job" else "date::VARCHAR AS date" if c == "date"
                    else c for c in CONTEXT)
    run_cols = ", ".join(["url_decode(job::VARCHAR) AS job", "date::VARCHAR AS date", *RUN_COLUMNS, *COUNT_COLUMNS])
    con.execute(f"CREATE VIEW runs AS SELECT {run_cols} FROM raw_runs WHERE record = 'run'")
    step_cols = ", ".join([ctx, *STEP_FIELDS])
    con.execute(f"CREATE VIEW steps AS SELECT {step_cols} FROM raw_runs WHERE record = 'step'")
    kern_cols = ", ".join([ctx, *KERNEL_FIELDS])
    con.execute(f"CREATE VIEW kernels AS SELECT {kern_cols} FROM raw_runs WHERE record = 'kernel'")
    return con


def read_records(con, where: str = "", params: list | None = None, samples: bool = True) -> list[RunRecord]:
    """Return the RunRecords of the runs view matching ``where`` (SQL with ? placeholders), oldest first.

    ``samples`` False: run rows only (records without samples and kernels; much faster on long runs).
    """
    cur = con.execute(f"SELECT * FROM runs{where} ORDER BY started_at, run_id", params or [])
    cols = [d[0] for d in cur.description]
    runs = [dict(zip(cols, r)) for r in cur.fetchall()]
    if not runs or not samples:
        return records_from_rows(runs, [], [])
    ids = [r["run_id"] for r in runs]
    sc = ", ".join(STEP_FIELDS)
    step_rows = con.execute(f"SELECT run_id, {sc} FROM steps WHERE list_contains(?, run_id)", [ids]).fetchall()
    kc = ", ".join(KERNEL_FIELDS)
    kernel_rows = con.execute(f"SELECT run_id, {kc} FROM kernels WHERE list_contains(?, run_id)", [ids]).fetchall()
    return records_from_rows(runs, step_rows, kernel_rows)


def older_files(root: Path) -> list[Path]:
    """Return the run files under the store ``root`` written before a column of FILE_COLUMNS existed
    (their footers lack it), sorted."""
    import pyarrow.parquet as pq

    want = set(FILE_COLUMNS)
    return [p for p in readable_files(run_files(root)) if want - set(pq.read_schema(p).names)]


def migrate_file(path: Path) -> None:
    """Rewrite one run file of an older schema in the current one (arrow_schema: a column it lacks is
    NULL on every row), row group by row group (the run, step and kernel groups a reader skips by),
    atomically (temp name, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    src = pq.ParquetFile(path)
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as w:
        for i in range(src.num_row_groups):
            t = src.read_row_group(i)
            w.write_table(pa.table({f.name: t.column(f.name).cast(f.type) if f.name in t.column_names
                                    else pa.nulls(t.num_rows, f.type) for f in schema}, schema=schema))


def migrate_store(root: Path) -> int:
    """Rewrite every run file of an older schema under ``root`` in the current one (``migrate_file``);
    return how many. Reads are right either way (files are read by column name when schemas differ,
    ``_read_files``); after this they no longer pay for it."""
    files = older_files(root)
    for p in files:
        migrate_file(p)
    return len(files)


def store_size_bytes(root: Path) -> int:
    """Return the total bytes of run files in the store."""
    return sum(os.path.getsize(p) for p in run_files(root))


def _with_retry(run):
    """Call run(validate=False); on a DuckDB error, once more with every file checked first.

    Files are opened lazily, so a corrupt one (or one of an older schema after a newer first file)
    only shows when a query reaches it; the retry skips a corrupt file with a warning naming it and
    reads the others by column name. A second failure is the query's own fault: one line.
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


class ParquetStore:
    """The embedded store: one Parquet file per run under ``root``, read with DuckDB (see module doc)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.location = str(root)

    def write(self, record: RunRecord) -> str:
        """Write one run file atomically; return its path."""
        return write_run_parquet(record, self.root)

    def _with_connection(self, fn):
        def run(validate: bool):
            con = connect(self.root, validate=validate)
            try:
                return fn(con)
            finally:
                con.close()

        return _with_retry(run)

    def read(self, filt: RunFilter = RunFilter(), *, samples: bool = True) -> list[RunRecord]:
        """Return the records matching ``filt``, oldest first (with samples and kernels unless ``samples`` False)."""
        where, params = filt.where(mark="?", member="list_contains(?, run_id)")
        return self._with_connection(lambda con: read_records(con, where, params, samples))

    def query(self, sql: str, params: list | None = None):
        """Run ``sql`` (``?`` placeholders) over the views runs, steps, kernels; return a pyarrow.Table."""
        def run(con):
            rel = con.sql(sql, params=params) if params else con.sql(sql)
            if rel is None:  # a statement that returns no rows
                import pyarrow as pa

                return pa.table({})
            return rel.to_arrow_table()

        return self._with_connection(run)
