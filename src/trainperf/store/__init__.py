"""Run records: write, read, query (Parquet + DuckDB by default, PostgreSQL as an option)."""

from trainperf.store.api import Store, get_run, open_store, query, read_runs, resolve_store, write_run
from trainperf.store.record import KernelResult, RunRecord, StepSample, collect_environment, new_run_id
from trainperf.store.schema import RunFilter

__all__ = ["KernelResult", "RunFilter", "RunRecord", "StepSample", "Store", "collect_environment", "get_run",
           "new_run_id", "open_store", "query", "read_runs", "resolve_store", "write_run"]
