"""Run records: write, read, query (Parquet + DuckDB by default, PostgreSQL as an option)."""

from trainperf.store.api import get_run, query, read_runs, resolve_store, write_run
from trainperf.store.record import KernelResult, RunRecord, StepSample, collect_environment, new_run_id

__all__ = ["KernelResult", "RunRecord", "StepSample", "collect_environment", "get_run", "new_run_id", "query",
           "read_runs", "resolve_store", "write_run"]
