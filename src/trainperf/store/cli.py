"""Commands of the `store` verb: `trainperf runs list|show|query` (registered by trainperf.cli)."""

from __future__ import annotations

import json
import math
import warnings
from contextlib import contextmanager

import typer

runs_app = typer.Typer(help="List, show and query run records in the store (Parquet + DuckDB, or PostgreSQL).",
                       no_args_is_help=True)

STORE_HELP = "Store: a folder (default $TRAINPERF_STORE or .trainperf) or a postgresql:// URL."


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def dumps(obj) -> str:
    """Return strict JSON (NaN and infinities as null)."""
    return json.dumps(_jsonable(obj), indent=1, default=str, allow_nan=False)


@contextmanager
def store_warnings():
    """Print each store warning (e.g. a corrupt run file skipped) as one line on stderr."""
    from rich.console import Console

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            err = Console(stderr=True)
            for w in caught:
                err.print(f"[yellow]warning:[/] {w.message}", highlight=False, soft_wrap=True)


def _print_table(table, title: str | None = None, limit: int = 200) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for name in table.column_names:
        t.add_column(name)
    import datetime as dt

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        if isinstance(v, dt.datetime):
            return v.strftime("%Y-%m-%d %H:%M:%S")
        return str(v)

    for row in table.slice(0, limit).to_pylist():
        t.add_row(*[fmt(v) for v in row.values()])
    Console().print(t)
    if table.num_rows > limit:
        Console().print(f"... {table.num_rows - limit} more rows (use --json)")


@runs_app.command("list")
def list_runs(store: str = typer.Option(None, "--store", help=STORE_HELP),
              job: str = typer.Option(None, "--job", help="Only runs of this job."),
              limit: int = typer.Option(50, "--limit", help="Most recent N runs."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List runs, newest first: id, job, time, host, versions, summary metrics."""
    from trainperf.store import query

    cols = ("run_id, job, to_timestamp(started_at) AS started, kind, host, gpu_model, nccl, torch, layout, "
            "step_time_s, tokens_per_s, mfu, n_samples") if as_json else \
        "run_id, job, to_timestamp(started_at) AS started, host, nccl, step_time_s, n_samples"
    where, params = ("", None) if job is None else (" WHERE job = ?", [job])
    with store_warnings():
        sql = f"SELECT {cols} FROM runs{where} ORDER BY started_at DESC LIMIT {int(limit)}"
        table = query(sql, store, params)
    if as_json:
        typer.echo(dumps(table.to_pylist()))
    else:
        _print_table(table, title=f"{table.num_rows} runs")


@runs_app.command("show")
def show(run_id: str = typer.Argument(..., help="Run id."),
         store: str = typer.Option(None, "--store", help=STORE_HELP),
         as_json: bool = typer.Option(False, "--json", help="Print the whole record as JSON.")) -> None:
    """Show one run: metadata, summary metrics, step-time statistics and kernel results."""
    import numpy as np
    from rich.console import Console

    from trainperf.store import get_run

    with store_warnings():
        rec = get_run(run_id, store)
    d = rec.to_dict()
    if as_json:
        typer.echo(dumps(d))
        return
    con = Console()
    for k, v in d.items():
        if k not in ("samples", "kernels") and v not in ("", None, {}):
            con.print(f"[bold]{k}[/]: {v}", highlight=False)
    st = np.array([s.step_time_s for s in rec.samples], dtype=float)
    if st.size:
        con.print(f"[bold]steps[/]: {st.size}, step time median {np.median(st):.4g} s, "
                  f"p10 {np.percentile(st, 10):.4g} s, p90 {np.percentile(st, 90):.4g} s", highlight=False)
    for k in rec.kernels:
        con.print(f"[bold]kernel[/] {k.kernel} {k.impl} {k.shape} {k.dtype} {k.passname}: {k.median_ms:.4g} ms",
                  highlight=False)


@runs_app.command("query")
def query_cmd(sql: str = typer.Argument(..., help='SQL over the views runs, steps, kernels, e.g. "SELECT job, '
                                                  'median(step_time_s) FROM steps GROUP BY job".'),
              store: str = typer.Option(None, "--store", help=STORE_HELP),
              as_json: bool = typer.Option(False, "--json", help="Print rows as JSON."),
              limit: int = typer.Option(200, "--limit", help="Rows to print in the table.")) -> None:
    """Run SQL over the store: views runs (one row per run), steps (per step), kernels (per kernel result)."""
    from trainperf.store import query

    with store_warnings():
        table = query(sql, store)
    if as_json:
        typer.echo(dumps(table.to_pylist()))
    else:
        _print_table(table, limit=limit)


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.add_typer(runs_app, name="runs")
