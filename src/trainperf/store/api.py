"""The store's API: one ``Store`` (write / read / query) over Parquet (default) or PostgreSQL.

The store location is the ``store`` argument, else env ``TRAINPERF_STORE``, else ``.trainperf``
in the current folder. A ``postgresql://`` URL selects the PostgreSQL backend. Both backends
take their columns from trainperf.store.schema (derived from the record dataclasses), so a
record reads back the same from either; the functions below are the short forms callers use.
"""

from __future__ import annotations

import os
from typing import Protocol

from trainperf.errors import TrainperfError
from trainperf.store.record import RunRecord
from trainperf.store.schema import RunFilter


class Store(Protocol):
    """What every backend offers. ``location``: where it is, safe to print (no password)."""

    location: str

    def write(self, record: RunRecord) -> str:
        """Write one run record; return where it went."""

    def read(self, filt: RunFilter = RunFilter(), *, samples: bool = True) -> list[RunRecord]:
        """Return the records matching ``filt``, oldest first (``samples`` False: without samples and kernels)."""

    def query(self, sql: str, params: list | None = None):
        """Run ``sql`` over runs, steps, kernels; return a pyarrow.Table."""


def resolve_store(store: str | os.PathLike | None = None) -> str:
    """Return the store location: the argument, else $TRAINPERF_STORE, else ``.trainperf``."""
    return str(store or os.environ.get("TRAINPERF_STORE") or ".trainperf")


def is_postgres(store: str) -> bool:
    """True when ``store`` is a PostgreSQL connection URL."""
    return store.startswith(("postgresql://", "postgres://"))


def check_writable(store: str | os.PathLike | None = None) -> None:
    """Raise TrainperfError when a run record could not be written to ``store`` (resolved as
    resolve_store does): a file, a file on the way, a non-empty folder that is not a store.
    Creates nothing; a PostgreSQL URL is checked when the record is written. For commands that
    write their record after minutes of work (train), so that they refuse at once."""
    from pathlib import Path

    from trainperf.store.parquet import check_store_dir

    where = resolve_store(store)
    if is_postgres(where):
        return
    root = Path(where)
    if root.exists() and (not root.is_dir() or (not (root / "runs").is_dir() and any(root.iterdir()))):
        check_store_dir(root, create=False)  # raises: a file, or a folder that is not a store
    blocking = next((p for p in root.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TrainperfError(f"store {root}: cannot be created ({blocking} is a file, not a folder)")


def open_store(store: str | os.PathLike | None = None) -> Store:
    """Return the backend for ``store`` (resolved as resolve_store does): PostgresStore or ParquetStore."""
    where = resolve_store(store)
    if is_postgres(where):
        from trainperf.store.postgres import PostgresStore

        return PostgresStore(where)
    from trainperf.store.parquet import ParquetStore

    return ParquetStore(where)


def write_run(record: RunRecord, store: str | None = None) -> str:
    """Write one run record; return where it went (a Parquet file path, or ``<url>#<run_id>``).

    Parquet: one file per run, written to a temp name then renamed, under
    ``<store>/runs/date=YYYY-MM-DD/job=NAME/``. PostgreSQL: one transaction.
    """
    if not isinstance(record, RunRecord):
        raise TypeError(f"write_run expects a RunRecord, got {type(record).__name__}")
    return open_store(store).write(record)


def query(sql: str, store: str | None = None, params: list | None = None):
    """Run ``sql`` over the views ``runs``, ``steps``, ``kernels``; return a pyarrow.Table.

    ``runs``: one row per run; ``steps``: one row per step sample; ``kernels``: one row per
    kernel result (step and kernel rows carry run context: job, host, versions, config hash).
    ``params``: values for ``?`` placeholders in ``sql`` (never format values into SQL text).
    """
    return open_store(store).query(sql, params)


def read_runs(store: str | None = None, job: str | None = None, run_ids: list[str] | None = None,
              since: float | None = None, host: str | None = None, samples: bool = True) -> list[RunRecord]:
    """Return the run records (with samples and kernels) matching the filters, oldest first.

    ``job``: exact job name; ``run_ids``: keep only these; ``since``: unix seconds, started at or
    after; ``host``: exact host name; ``samples`` False: run-level fields only (fast on long runs).
    """
    filt = RunFilter(job=job, run_ids=None if run_ids is None else tuple(run_ids), since=since, host=host)
    return open_store(store).read(filt, samples=samples)


def get_run(run_id: str, store: str | None = None) -> RunRecord:
    """Return the run ``run_id``; raise TrainperfError when the store has no such run."""
    runs = read_runs(store, run_ids=[run_id])
    if not runs:
        raise TrainperfError(f"store {open_store(store).location}: no run with id {run_id!r}")
    return runs[0]
