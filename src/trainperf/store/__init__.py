"""Run records: write, read, query (Parquet + DuckDB by default, PostgreSQL as an option)."""

from trainperf.store.record import KernelResult, RunRecord, StepSample, collect_environment, new_run_id

__all__ = ["KernelResult", "RunRecord", "StepSample", "collect_environment", "new_run_id"]
