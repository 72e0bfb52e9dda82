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

import json
import os
import re
import time
import warnings
from pathlib import Path
from urllib.parse import quote

from trainperf.atomic import atomic_path
from trainperf.errors import TrainperfError
from trainperf.store.record import KernelResult, RunRecord, StepSample


class CorruptRunFileWarning(UserWarning):
    """A run file in the store could not be read; it was skipped."""


# run-level columns, in file order (partition columns job and date excluded)
RUN_COLUMNS = ["run_id", "kind", "started_at", "host", "gpu_model", "driver", "cuda", "nccl", "torch", "git_sha",
               "user", "world_size", "model", "layout", "config_json", "config_hash", "tp", "pp", "dp", "cp",
               "zero", "recompute", "mbs", "precision", "step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes",
               "goodput"]
_SUMMARY = ["step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "goodput"]
_STEP_FIELDS = ["step", "step_time_s", "tokens_per_s", "mfu", "loss", "data_wait_s", "mem_peak_bytes"]
_KERNEL_FIELDS = ["kernel", "impl", "shape", "dtype", "passname", "median_ms", "gbps", "tflops", "pct_roofline",
                  "peak_mem_bytes"]
# run-level columns repeated on every step / kernel row (no join needed to slice by them)
_CONTEXT = ["run_id", "job", "date", "kind", "started_at", "host", "gpu_model", "driver", "cuda", "nccl", "torch",
            "git_sha", "world_size", "model", "layout", "config_hash"]
_FILE_CONTEXT = [c for c in _CONTEXT if c not in ("job", "date")]
_INT = {"world_size", "tp", "pp", "dp", "cp", "zero", "mbs", "step", "n_samples", "n_kernels"}
_STR = {"record", "run_id", "kind", "host", "gpu_model", "driver", "cuda", "nccl", "torch", "git_sha", "user",
        "model", "layout", "config_json", "config_hash", "recompute", "precision", "kernel", "impl", "shape", "dtype",
        "passname"}
FILE_COLUMNS = (["record"] + RUN_COLUMNS + ["n_samples", "n_kernels"]
                + [c for c in _STEP_FIELDS if c not in RUN_COLUMNS] + _KERNEL_FIELDS)


def arrow_schema():
    """Return the pyarrow schema of a run file (one row per run, step sample and kernel result)."""
    import pyarrow as pa

    def typ(c):
        return pa.string() if c in _STR else pa.int64() if c in _INT else pa.float64()

    return pa.schema([(c, typ(c)) for c in FILE_COLUMNS])


def _layout_fields(layout: str) -> dict:
    """Return tp/pp/dp/cp/zero/recompute/mbs/precision parsed from a layout string (None if unparsable)."""
    keys = ("tp", "pp", "dp", "cp", "zero", "recompute", "mbs", "precision")
    if not layout:
        return dict.fromkeys(keys)
    from trainperf.specs import parse_layout

    try:
        lay = parse_layout(layout)
    except (TrainperfError, ValueError):
        return dict.fromkeys(keys)
    return {k: getattr(lay, k) for k in keys}


def record_row(rec: RunRecord) -> dict:
    """Return the run-level values of ``rec`` (the run row; partition columns excluded)."""
    row = {c: getattr(rec, c) for c in RUN_COLUMNS if hasattr(RunRecord, c) or c in rec.__dict__}
    row["config_json"] = json.dumps(rec.config, sort_keys=True, default=str)
    row["config_hash"] = rec.config_hash
    row.update(_layout_fields(rec.layout))
    return row


def record_table(rec: RunRecord):
    """Return the pyarrow Table written for ``rec``: its run row, then step rows, then kernel rows."""
    import pyarrow as pa

    schema = arrow_schema()
    run = record_row(rec)
    ns, nk = len(rec.samples), len(rec.kernels)
    n = 1 + ns + nk
    cols = {}
    for c in FILE_COLUMNS:
        t = schema.field(c).type
        if c == "record":
            cols[c] = pa.array(["run"] + ["step"] * ns + ["kernel"] * nk, t)
        elif c in _FILE_CONTEXT:
            cols[c] = pa.repeat(pa.scalar(run[c], t), n)
        elif c in ("n_samples", "n_kernels"):
            cols[c] = pa.array([ns if c == "n_samples" else nk] + [None] * (n - 1), t)
        elif c in _STEP_FIELDS or c in _KERNEL_FIELDS:
            head = [run.get(c)] if c in RUN_COLUMNS else [None]
            steps = [getattr(s, c) for s in rec.samples] if c in _STEP_FIELDS else [None] * ns
            kern = [getattr(k, c) for k in rec.kernels] if c in _KERNEL_FIELDS else [None] * nk
            cols[c] = pa.array(head + steps + kern, t)
        else:  # run-only column
            cols[c] = pa.array([run[c]] + [None] * (n - 1), t)
    return pa.table(cols, schema=schema)


def partition_value(text: str) -> str:
    """Return ``text`` escaped for a hive partition folder name (Hive's %XX escaping)."""
    return quote(text or "_", safe="-_.+@,")


def run_date(rec: RunRecord) -> str:
    """Return the UTC date (YYYY-MM-DD) a run started: its date partition."""
    return time.strftime("%Y-%m-%d", time.gmtime(rec.started_at))


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


def connect(root: Path, validate: bool = False):
    """Return a DuckDB connection with views ``runs``, ``steps`` and ``kernels`` over the store.

    ``runs``: one row per run; ``steps``: one row per step sample; ``kernels``: one row per kernel
    result. Step and kernel rows carry the run's context columns (host, versions, config hash).
    ``validate``: read every file's footer first and skip (with a warning) the unreadable ones;
    otherwise DuckDB opens files lazily and a corrupt one fails the query (callers then retry).
    """
    import duckdb

    con = duckdb.connect()
    files = run_files(root)
    if validate:
        files = readable_files(files)
    rel = None
    if files:
        try:
            rel = con.read_parquet([str(p) for p in files], hive_partitioning=True)
            rel.limit(0).fetchall()
        except duckdb.Error:
            files = readable_files(files)
            rel = con.read_parquet([str(p) for p in files], hive_partitioning=True) if files else None
    if rel is None:
        _empty_views(con)
    else:
        rel.create_view("raw_runs")
    # job and date come from the folder names; the job folder is %XX-escaped
    ctx = ", ".join(f"url_decode(job::VARCHAR) AS job" if c == "job" else "date::VARCHAR AS date" if c == "date"
                    else c for c in _CONTEXT)
    run_cols = ", ".join(["url_decode(job::VARCHAR) AS job", "date::VARCHAR AS date"]
                         + [c for c in RUN_COLUMNS] + ["n_samples", "n_kernels"])
    con.execute(f"CREATE VIEW runs AS SELECT {run_cols} FROM raw_runs WHERE record = 'run'")
    step_cols = ", ".join([ctx] + [c for c in _STEP_FIELDS])
    con.execute(f"CREATE VIEW steps AS SELECT {step_cols} FROM raw_runs WHERE record = 'step'")
    kern_cols = ", ".join([ctx] + _KERNEL_FIELDS)
    con.execute(f"CREATE VIEW kernels AS SELECT {kern_cols} FROM raw_runs WHERE record = 'kernel'")
    return con


_OPTIONAL = {"step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "goodput"}


def row_to_record(row: dict) -> RunRecord:
    """Return the RunRecord for one run row (with ``samples`` and ``kernels`` lists of dicts)."""
    names = ("run_id", "job", "kind", "started_at", "host", "gpu_model", "driver", "cuda", "nccl", "torch", "git_sha",
             "user", "world_size", "model", "layout", "step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "goodput")
    kw = {k: row.get(k) for k in names}
    kw = {k: ("" if v is None and k not in _OPTIONAL | {"started_at", "world_size"} else v) for k, v in kw.items()}
    kw["world_size"] = kw["world_size"] or 1
    kw["started_at"] = kw["started_at"] or 0.0
    kw["config"] = json.loads(row.get("config_json") or "{}")
    kw["samples"] = [StepSample(**{k: s[k] for k in _STEP_FIELDS}) for s in row.get("samples") or []]
    kw["kernels"] = [KernelResult(**{k: r[k] for k in _KERNEL_FIELDS}) for r in row.get("kernels") or []]
    return RunRecord(**kw)


def read_records(con, where: str = "", params: list | None = None) -> list[RunRecord]:
    """Return the RunRecords of the runs view matching ``where`` (SQL with ? placeholders), oldest first."""
    cur = con.execute(f"SELECT * FROM runs{where} ORDER BY started_at, run_id", params or [])
    cols = [d[0] for d in cur.description]
    runs = [dict(zip(cols, r)) for r in cur.fetchall()]
    if not runs:
        return []
    ids = [r["run_id"] for r in runs]
    sc = ", ".join(_STEP_FIELDS)
    step_rows = con.execute(f"SELECT run_id, {sc} FROM steps WHERE list_contains(?, run_id)", [ids]).fetchall()
    kc = ", ".join(_KERNEL_FIELDS)
    kernel_rows = con.execute(f"SELECT run_id, {kc} FROM kernels WHERE list_contains(?, run_id)", [ids]).fetchall()
    return records_from_rows(runs, step_rows, kernel_rows)


def records_from_rows(runs: list[dict], step_rows, kernel_rows) -> list[RunRecord]:
    """Return the RunRecords of ``runs`` (run rows as dicts), in their order, samples in step order.

    ``step_rows``: tuples (run_id, *step fields); ``kernel_rows``: tuples (run_id, *kernel fields).
    """
    samples: dict = {r["run_id"]: [] for r in runs}
    kernels: dict = {r["run_id"]: [] for r in runs}
    for r in step_rows:
        samples[r[0]].append(dict(zip(_STEP_FIELDS, r[1:])))
    for r in kernel_rows:
        kernels[r[0]].append(dict(zip(_KERNEL_FIELDS, r[1:])))
    out = []
    for r in runs:
        r["samples"] = sorted(samples[r["run_id"]], key=lambda s: s["step"])
        r["kernels"] = kernels[r["run_id"]]
        out.append(row_to_record(r))
    return out


def store_size_bytes(root: Path) -> int:
    """Return the total bytes of run files in the store."""
    return sum(os.path.getsize(p) for p in run_files(root))
