"""Commands of the `store` verb: `trainperf runs list|show|query` (registered by trainperf.cli)."""

from __future__ import annotations

import json
import math
import warnings
from contextlib import contextmanager

import typer

from trainperf.cli_options import json_option

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
    from rich.markup import escape

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            err = Console(stderr=True)
            for w in caught:
                err.print(f"[yellow]warning:[/] {escape(str(w.message))}", highlight=False, soft_wrap=True)


def iso_time(unix_s: float) -> str:
    """Return unix seconds as an ISO 8601 UTC time to the second, e.g. 2026-09-21T14:13:20Z."""
    import datetime as dt

    return dt.datetime.fromtimestamp(unix_s, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fmt_cell(v) -> str:
    import datetime as dt

    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc)
        return v.strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def _print_table(table, title: str | None = None, limit: int = 200, whole: tuple[str, ...] = (),
                 headers: dict | None = None, drop_empty: bool = False, formats: dict | None = None) -> None:
    """Print an Arrow table; columns in ``whole`` are never cut or wrapped (ids a user copies),
    the others fold onto more lines when the terminal is narrow."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    fmts = [(formats or {}).get(name, _fmt_cell) for name in table.column_names]
    rows = [[_fmt_cell(v) if v is None else f(v) for f, v in zip(fmts, row.values())]
            for row in table.slice(0, limit).to_pylist()]
    names = list(table.column_names)
    if drop_empty and rows:  # e.g. nccl on a CPU-only store: a column of blanks only takes width
        keep = [i for i in range(len(names)) if any(r[i] for r in rows)]
        names, rows = [names[i] for i in keep], [[r[i] for i in keep] for r in rows]
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(names):
        header = (headers or {}).get(name, name)
        if name in whole:
            t.add_column(header, no_wrap=True, min_width=max([len(r[i]) for r in rows], default=1))
        else:
            t.add_column(header, overflow="fold")
    for r in rows:
        t.add_row(*r)
    Console().print(t)
    if table.num_rows > limit:
        Console().print(f"... {table.num_rows - limit} more rows (use --json)")


def _rounded(v):
    """Return ``v`` with every float inside it cut to 6 significant digits (as the scalars show)."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


# Record fields that are fractions of 1, shown as percentages as every other view shows them (the record's
# own mfu line is then worded with the peak it is a fraction of; the run summary's copies keep the %).
FRACTION_KEYS = ("goodput", "mfu", "hfu")


def _scalar(key: str, v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, float)) and key.endswith("_at") and 1e9 <= v <= 4.2e9:  # unix seconds
        return iso_time(v)
    if key in FRACTION_KEYS and isinstance(v, (int, float)):
        return f"{100 * v:.3g}%"
    if isinstance(v, (int, float)) and key.endswith("_bytes") and v >= 2**20:
        return f"{v:.6g} ({v / 2**30:.3g} GiB)"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        items = [json.dumps(_rounded(_jsonable(x)), default=str) for x in v]
        return (f"[{', '.join(items)}]" if len(items) <= 8 else
                f"[{', '.join(items[:3])}, ..., {items[-1]}] ({len(items)} items)")
    return str(v)


def show_lines(d: dict, indent: int = 0) -> list[str]:
    """Return a run record (``RunRecord.to_dict()`` less samples and kernels) as readable lines:
    nested dicts indented one level per depth, times ISO 8601 UTC, empty fields left out."""
    out = []
    for k, v in d.items():
        if v in ("", None, {}, []):
            continue
        if isinstance(v, dict):
            out.append(f"{'  ' * indent}{k}:")
            out.extend(show_lines(v, indent + 1))
        else:
            out.append(f"{'  ' * indent}{k}: {_scalar(k, v)}")
    return out


@runs_app.command("list")
def list_runs(store: str = typer.Option(None, "--store", help=STORE_HELP),
              job: str = typer.Option(None, "--job", help="Only runs of this job."),
              limit: int = typer.Option(50, "--limit", min=1, max=1_000_000, help="Most recent N runs."),
              as_json: bool = json_option("the runs")) -> None:
    """List runs, newest first: id, job, time, host, versions, summary metrics."""
    from trainperf.store import query

    cols = ("run_id, job, to_timestamp(started_at) AS started, kind, host, gpu_model, nccl, torch, layout, "
            "step_time_s, tokens_per_s, mfu, n_samples") if as_json else \
        "run_id, job, started_at AS started, host, nccl, step_time_s, n_samples"
    # run_id is never cut: `runs show` and `gate` need it; started is formatted here (SQL dialects differ)
    where, params = ("", None) if job is None else (" WHERE job = ?", [job])
    with store_warnings():
        sql = f"SELECT {cols} FROM runs{where} ORDER BY started_at DESC LIMIT {int(limit)}"
        table = query(sql, store, params)
    if as_json:
        typer.echo(dumps(table.to_pylist()))
    else:
        _print_table(table, title=f"{table.num_rows} runs", whole=("run_id", "started"),
                     headers={"started": "started (UTC)", "step_time_s": "step s", "n_samples": "steps"},
                     drop_empty=True, formats={"started": lambda v: iso_time(v)[:16].replace("T", " "),
                                               "step_time_s": lambda v: f"{v:.4g}"})


MIN_PREFIX = 8  # "20261201" alone is a day of runs: fewer characters than that name no run


def id_from_prefix(prefix: str, store: str | None) -> str | None:
    """Return the one run id that starts with ``prefix`` (a trailing "…", as a cut table shows it,
    ignored), or None when none does; raise TrainperfError naming them when several do."""
    from trainperf.errors import TrainperfError
    from trainperf.store import query

    p = prefix.strip().rstrip("…").rstrip(".")
    if len(p) < MIN_PREFIX:
        return None
    pattern = p.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
    try:
        ids = query("SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '!' ORDER BY run_id LIMIT 6", store,
                    [pattern]).column("run_id").to_pylist()
    except TrainperfError:
        return None
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise TrainperfError(f"run id {prefix!r} starts {'more than 5' if len(ids) > 5 else len(ids)} runs "
                             f"({shown}): give more of it")
    return ids[0] if ids else None


@runs_app.command("show")
def show(run_id: str = typer.Argument(..., help="Run id, or its start when only one run begins so."),
         store: str = typer.Option(None, "--store", help=STORE_HELP),
         as_json: bool = json_option("the whole record")) -> None:
    """Show one run: metadata, summary metrics, step-time statistics and kernel results."""
    import numpy as np
    from rich.console import Console

    from trainperf.errors import TrainperfError
    from trainperf.store import get_run
    from trainperf.store.record import mfu_text

    with store_warnings():
        try:
            rec = get_run(run_id, store)
        except TrainperfError:
            full = id_from_prefix(run_id, store)
            if full is None:
                raise
            rec = get_run(full, store)
    d = rec.to_dict()
    if as_json:
        typer.echo(dumps(d))
        return
    con = Console()
    for line in show_lines({k: v for k, v in d.items() if k not in ("samples", "kernels", "peak_flops", "peak_source")}):
        if line.startswith("mfu: "):  # with what it is a fraction of (or "peak unknown" in older records)
            line = f"mfu: {mfu_text(rec.mfu, rec.peak_flops, rec.peak_source)}"
        con.print(line, highlight=False, markup=False, soft_wrap=True)
    st = np.array([s.step_time_s for s in rec.samples], dtype=float)
    if st.size:  # over every stored step; the record's own step_time_s (above) leaves out its warm-up steps
        whole = f"median {np.median(st):.4g} s, " if rec.step_time_s is None else ""
        con.print(f"[bold]steps[/]: {st.size} stored, step time {whole}p10 {np.percentile(st, 10):.4g} s, "
                  f"p90 {np.percentile(st, 90):.4g} s (every stored step)", highlight=False)
    for k in rec.kernels:
        con.print(f"[bold]kernel[/] {k.kernel} {k.impl} {k.shape} {k.dtype} {k.passname}: {k.median_ms:.4g} ms",
                  highlight=False)


@runs_app.command("query")
def query_cmd(sql: str = typer.Argument(..., help='SQL over the views runs, steps, kernels, e.g. "SELECT job, '
                                                  'median(step_time_s) FROM steps GROUP BY job".'),
              store: str = typer.Option(None, "--store", help=STORE_HELP),
              as_json: bool = json_option("the rows"),
              limit: int = typer.Option(200, "--limit", min=1, max=1_000_000, help="Rows to print in the table.")) -> None:
    """Run SQL over the store: views runs (one row per run), steps (per step), kernels (per kernel result)."""
    from trainperf.store import query

    with store_warnings():
        table = query(sql, store)
    if as_json:
        typer.echo(dumps(table.to_pylist()))
    else:
        _print_table(table, limit=limit)


@runs_app.command("migrate")
def migrate_cmd(store: str = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Rewrite run files written before a record field existed (e.g. peak_flops) in the current schema.

    Reads are right without it (such files read the new fields as empty); a Parquet store holding them
    is read by column name, which costs a few milliseconds a file on every query until they are
    rewritten. A PostgreSQL store gains new columns by itself."""
    from pathlib import Path

    from trainperf.store.api import is_postgres, resolve_store
    from trainperf.store.parquet import migrate_store

    where = resolve_store(store)
    if is_postgres(where):
        typer.echo("a PostgreSQL store gains new columns when it is next opened: nothing to rewrite")
        return
    with store_warnings():
        n = migrate_store(Path(where))
    typer.echo(f"store {where}: {n} run file(s) rewritten in the current schema" if n else
               f"store {where}: every run file already has the current schema")


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.add_typer(runs_app, name="runs")
