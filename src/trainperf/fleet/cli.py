"""Commands of the `fleet` verb (`trainperf fleet changes|localize|tree`) and `trainperf gate`."""

from __future__ import annotations

import typer

from trainperf.cli_options import given, json_option, older_name, parse_fraction  # noqa: F401 (parse_fraction: was defined here)
from trainperf.store.cli import STORE_HELP, dumps, store_warnings

fleet_app = typer.Typer(help="Fleet regressions: change points in run metrics and the attributes that explain them.",
                        no_args_is_help=True)

RUN_ATTRS = ["host", "gpu_model", "driver", "cuda", "nccl", "torch", "layout", "job", "world_size", "git_sha"]


JSONL_HINT = ("give a CSV with a header row, or leave out --csv to read the runs `trainperf train` recorded "
              "in the store (--store)")


def _read_csv(path: str) -> dict:
    """Return the columns of the CSV at ``path`` (localize.read_csv_columns); refuse a JSON or JSON-lines file
    with one line naming it and what to pass instead (a CSV reader would take its first record for the header)."""
    from pathlib import Path

    from trainperf.errors import TrainperfError
    from trainperf.fleet.localize import read_csv_columns

    try:
        with Path(path).open("rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        head = b""  # read_csv_columns names the problem (no such file, a folder, ...)
    if head[:1] in (b"{", b"["):
        lines = head[:1] == b"{" and (b"\n{" in head.replace(b"\r\n", b"\n") or path.endswith((".jsonl", ".ndjson")))
        kind = "JSON lines" if lines else "JSON"
        raise TrainperfError(f"{path}: not a CSV (looks like {kind}); {JSONL_HINT}")
    return read_csv_columns(path)


def _csv_column(path: str, column: str):
    import numpy as np

    from trainperf.errors import TrainperfError

    cols = _read_csv(path)
    if column not in cols:
        raise TrainperfError(f"{path}: no column {column!r} (columns: {', '.join(cols)})")
    raw = cols[column]
    try:
        return np.asarray(raw, dtype=float)
    except (TypeError, ValueError):
        for i, v in enumerate(raw):
            try:
                float(v) if v is not None else None
            except (TypeError, ValueError):
                raise TrainperfError(f"{path}: column {column!r} row {i + 1}: not a number: {str(v)[:40]!r}") from None
        raise


def _metric_sql(col: str) -> str:
    """SQL for a run's value of ``col``: its summary, else the median of its steps (DuckDB and PostgreSQL)."""
    if col in ("step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes"):
        return (f"COALESCE(r.{col}, (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.{col}) "
                f"FROM steps s WHERE s.run_id = r.run_id))")
    return f"r.{col}"


def _run_metric_column(metric: str) -> str:
    """Return the runs column holding ``metric``; raise TrainperfError for one runs do not carry."""
    from trainperf.errors import TrainperfError
    from trainperf.fleet.gate import STORE_METRICS

    col = STORE_METRICS.get(metric, metric)
    if col not in ("step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "goodput"):
        raise TrainperfError(f"--metric {metric!r}: unknown; use one of {', '.join(FLEET_METRICS)}")
    return col


FLEET_METRICS = ("step_time", "step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "goodput")


def _store_series(store, job, host, metric):
    import numpy as np

    from trainperf.errors import TrainperfError
    from trainperf.store import query

    col = _run_metric_column(metric)
    conds = [(c, v) for c, v in (("job", job), ("host", host)) if v is not None]
    where = (" WHERE " + " AND ".join(f"r.{c} = ?" for c, _ in conds)) if conds else ""
    t = query(f"SELECT r.run_id, {_metric_sql(col)} AS v FROM runs r{where} ORDER BY r.started_at, r.run_id", store,
              [v for _, v in conds] or None)
    if t.num_rows == 0:
        raise TrainperfError("store: no runs" + "".join(f" with {c} {v!r}" for c, v in conds))
    ids = t.column("run_id").to_pylist()
    vals = np.array([np.nan if v is None else v for v in t.column("v").to_pylist()], dtype=float)
    if np.isnan(vals).all():
        raise TrainperfError(f"store: no run has a value of metric {metric!r}")
    return ids, vals


@fleet_app.command("changes")
def changes(csv: str = typer.Option(None, "--csv", help="CSV file with the series (else: runs in the store)."),
            column: str = typer.Option(None, "--column", help="Column of the CSV holding the series."),
            store: str = typer.Option(None, "--store", help=STORE_HELP),
            job: str = typer.Option(None, "--job", help="Store: only runs of this job."),
            host: str = typer.Option(None, "--host", help="Store: only runs on this host."),
            metric: str = typer.Option("step_time", "--metric", help="Store: run metric (step_time, tokens_per_s, mfu, ...)."),
            min_size: int = typer.Option(5, "--min-size", min=2, help="Fewest points per segment."),
            alpha: float = typer.Option(0.01, "--alpha", min=0.0, max=1.0, help="Significance level of the rank test."),
            min_rel_change: str = typer.Option("2%", "--min-rel-change",
                                               help="Smallest relative shift, e.g. 2% or 0.02 (0: any; "
                                                    "2% is what the nested CV chose)."),
            min_noise_multiple: float = typer.Option(1.0, "--min-noise-multiple", min=0.0,
                                                     help="Smallest shift in units of point-to-point noise."),
            min_effect_older: float = older_name("--min-effect", "--min-noise-multiple", min=0.0),
            html: str = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
            verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the full description of the tests."),
            as_json: bool = json_option("the change points")) -> None:
    """Find change points (0-based indices where a new segment starts) with magnitudes and confidence."""
    from trainperf.errors import TrainperfError
    from trainperf.fleet.changepoints import ChangeOptions, detect_changes

    _run_metric_column(metric)  # an unknown --metric is refused with --csv too (there it names nothing)
    if html:
        from trainperf.atomic import check_output_file

        check_output_file(html, "--html")  # before the series is read
    if csv is not None:
        if not column:
            raise TrainperfError("--csv needs --column NAME")
        ids, values = None, _csv_column(csv, column)
    else:
        with store_warnings():
            ids, values = _store_series(store, job, host, metric)
    opts = ChangeOptions(min_size=min_size, alpha=alpha, min_effect=given(min_noise_multiple, min_effect_older),
                         min_rel_change=parse_fraction(min_rel_change, "--min-rel-change"))
    res = detect_changes(values, opts)
    out = res.to_dict()
    if ids is not None:
        out["run_ids"] = [ids[c] for c in res.change_points]
    if html:
        from trainperf.report.fleet import changes_report

        changes_report(values, res, html, title=f"Change points: {column or metric}", label=column or metric,
                       run_ids=ids)
    if as_json:
        typer.echo(dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    from trainperf.report.fleet import change_count_text

    con.print(change_count_text(len(res.changes), res.n), highlight=False)
    if verbose:
        con.print(f"method: {res.test}", highlight=False)
    else:
        con.print(f"method: {method_summary(res.test)} (--verbose: the full method)", style="dim", highlight=False,
                  overflow="ellipsis", no_wrap=True)  # one line: the detail is under --verbose
    if res.changes:
        t = Table("index", "kind", "before", "after", "change", "95% CI", "p-value")
        for c in res.changes:
            # a trend's before/after/change are slopes: per point
            unit = "/pt" if c.kind == "trend" else ""
            rel = (f"{c.rel_change:+.2%}{unit}", f"[{c.rel_ci[0]:+.2%}, {c.rel_ci[1]:+.2%}]") \
                if c.rel_change == c.rel_change \
                else (f"{c.shift:+.4g}{unit}", f"[{c.shift_ci[0]:+.4g}, {c.shift_ci[1]:+.4g}]")
            where = str(c.index) + (f"-{c.end}" if c.end is not None else "") + (f" ({ids[c.index]})" if ids else "")
            t.add_row(where, c.kind, f"{c.before:.4g}{unit}", f"{c.after:.4g}{unit}", *rel, f"{c.p_value:.2g}")
        con.print(t)


def method_summary(test: str) -> str:
    """Return a short form of a change-point result's method text: the first of its ``;``-separated tests
    without its parenthesised and comma-separated detail, and how many more (``--verbose``, the JSON and the
    HTML keep the full text)."""
    import re

    heads = []
    for part in test.split(";"):
        while re.search(r"\([^()]*\)", part):  # innermost parentheses first
            part = re.sub(r"\s*\([^()]*\)", "", part)
        heads.append(part.split(",")[0].strip())
    heads = [h for h in heads if h]
    return heads[0] + (f" + {len(heads) - 1} more test{'' if len(heads) == 2 else 's'}" if len(heads) > 1 else "")


def _split_window(text: str, name: str) -> tuple[str, str]:
    from trainperf.errors import TrainperfError

    if ":" not in text:
        raise TrainperfError(f"{name}: {text!r} is not a window START:END")
    a, b = text.split(":", 1)
    return a, b


def _store_rows(store, job, metric, at):
    import numpy as np

    from trainperf.errors import TrainperfError
    from trainperf.store import query

    col = _run_metric_column(metric)
    where, params = ("", None) if job is None else (" WHERE r.job = ?", [job])
    attrs = ", ".join(f"r.{a}" for a in RUN_ATTRS)
    t = query(f"SELECT r.started_at, {attrs}, {_metric_sql(col)} AS v FROM runs r{where}", store, params)
    if t.num_rows == 0:
        raise TrainperfError("store: no runs" + (f" of job {job!r}" if job else ""))
    try:
        at_s = float(at)
    except ValueError:
        from datetime import datetime, timezone

        try:
            dt = datetime.fromisoformat(at)
        except ValueError:
            raise TrainperfError(f"--at {at!r}: give unix seconds or an ISO date/time") from None
        at_s = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    d = t.to_pydict()
    keep = [i for i, v in enumerate(d["v"]) if v is not None]
    cols = {a: np.array([str(d[a][i]) for i in keep]) for a in RUN_ATTRS}
    cols["period"] = np.array([1.0 if d["started_at"][i] >= at_s else 0.0 for i in keep])
    cols["value"] = np.array([d["v"][i] for i in keep], dtype=float)
    return cols


@fleet_app.command("localize")
def localize_cmd(csv: str = typer.Option(None, "--csv", help="CSV: one row per leaf and time (else: runs in the store)."),
                 time_col: str = typer.Option(None, "--time-col", help="CSV column holding the time."),
                 measure: str = typer.Option(None, "--measure", help="CSV column of the measure (numerator)."),
                 per: str = typer.Option(None, "--per", help="Denominator column: the measure becomes MEASURE/PER."),
                 at: str = typer.Option(None, "--at", help="The changed time; earlier rows are the history."),
                 before: str = typer.Option(None, "--before", help="History window START:END (instead of --at)."),
                 after: str = typer.Option(None, "--after", help="Changed window START:END (instead of --at)."),
                 history: int = typer.Option(4, "--history", min=0, help="With --at: the last N times before it (0 = all)."),
                 attrs: str = typer.Option(None, "--attrs", help="Comma-separated attribute columns (default: all others)."),
                 store: str = typer.Option(None, "--store", help=STORE_HELP),
                 job: str = typer.Option(None, "--job", help="Store: only runs of this job."),
                 metric: str = typer.Option("step_time", "--metric", help="Store: run metric."),
                 as_json: bool = json_option("the causes")) -> None:
    """Find the attribute combinations that explain a change, with before/after and share of the change."""
    from trainperf.errors import TrainperfError
    from trainperf.fleet.localize import localize_rows

    attr_list = [a.strip() for a in attrs.split(",")] if attrs else None
    _run_metric_column(metric)  # an unknown --metric is refused with --csv too (there it names nothing)
    if csv is not None:
        if not time_col or not measure:
            raise TrainperfError("--csv needs --time-col and --measure")
        cols = _read_csv(csv)
        unknown = [c for c in (attr_list or []) if c not in cols]
        if unknown:
            raise TrainperfError(f"{csv}: --attrs {unknown[0]!r}: no such column (columns: {', '.join(cols)})")
        kw = {}
        if at is not None:
            kw = {"at": at, "history": history or None}
        elif before and after:
            kw = {"before": _split_window(before, "--before"), "after": _split_window(after, "--after")}
        else:
            raise TrainperfError("give --at TIME, or --before START:END and --after START:END")
        try:
            res = localize_rows(cols, time_col, measure, per=per, attrs=attr_list, **kw)
        except TrainperfError as e:
            raise TrainperfError(f"{csv}: {e}") from None
    else:
        if at is None:
            raise TrainperfError("store: give --at TIME (runs before it are the history, from it on the change)")
        with store_warnings():
            cols = _store_rows(store, job, metric, at)
        use = attr_list or [a for a in RUN_ATTRS if len(set(cols[a])) > 1] or RUN_ATTRS[:1]
        res = localize_rows(cols, "period", "value", at=1.0, history=None, attrs=use)
    out = res.to_dict()
    if as_json:
        typer.echo(dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"total before {res.total_before:.6g}, after {res.total_after:.6g}; {res.verdict}", highlight=False)
    if not res.causes:
        return
    t = Table("rank", "cause", "confidence", "before", "after", "signed share of change", "leaves")
    for i, c in enumerate(res.causes + res.alternatives):
        label = "answer" if i < len(res.causes) else "alternative"
        t.add_row(f"{i + 1} ({label})", " & ".join(f"{k}={v}" for k, v in c.attrs.items()), f"{c.confidence:.0%}",
                  f"{c.before:.4g}", f"{c.after:.4g}", f"{c.share:.0%}", str(c.n_leaves))
    con.print(t)
    con.print("confidence: the share of the leaf-level deviation the cause alone explains; signed share of "
              "change: the cause's part of the total change, over 100% (or negative) when other leaves moved the "
              "other way", highlight=False)


def gate(baseline: str = typer.Option(..., "--baseline", help="Run id, folder or file (one number per line)."),
         candidate: str = typer.Option(..., "--candidate", help="Run id, folder or file (one number per line)."),
         metric: str = typer.Option("step_time", "--metric", help="Metric (lower is better unless a throughput/MFU)."),
         min_rel_change: str = typer.Option("2%", "--min-rel-change",
                                            help="Smallest relative change that counts, e.g. 2% or 0.02."),
         min_effect_older: str = older_name("--min-effect", "--min-rel-change"),
         alpha: float = typer.Option(0.005, "--alpha", min=0.0, max=1.0,
                                     help="Significance level of the speed test (compare's interval for runs, "
                                          "Mann-Whitney U for sample files), strictly between 0 and 1."),
         max_loss_delta: float = typer.Option(None, "--max-loss-delta", min=0.0,
                                              help="Also fail when the loss (per step, and held-out) differs by more "
                                                   "than this (loss units); runs only."),
         numerics: str = typer.Option(None, "--numerics",
                                      help="'band': also fail when compare's numerics verdict says diverges; runs only."),
         store: str = typer.Option(None, "--store", help=STORE_HELP),
         as_json: bool = json_option("the verdict")) -> None:
    """CI gate: regression / improvement / no change / inconclusive, and optionally the numerics.
    Exit 0 pass, 1 regression or numerics fail, 2 usage error or numerics not comparable."""
    from trainperf.errors import TrainperfError
    from trainperf.fleet.gate import NUMERICS_CHECKS, check_metric, compare, format_values, load_samples, numerics_gate

    if not 0 < alpha < 1:
        raise TrainperfError(f"--alpha {alpha}: must be strictly between 0 and 1")
    check_metric(metric)
    if numerics is not None and numerics not in NUMERICS_CHECKS:
        raise TrainperfError(f"--numerics {numerics!r}: unknown; use one of {', '.join(NUMERICS_CHECKS)}")
    if numerics is not None and max_loss_delta is not None:
        raise TrainperfError("give one of --max-loss-delta and --numerics band, not both")
    eff = (parse_fraction(min_rel_change, "--min-rel-change") if min_effect_older is None else
           parse_fraction(min_effect_older, "--min-effect"))
    with store_warnings():
        a = load_samples(baseline, metric, store)
        b = load_samples(candidate, metric, store)
        num = (numerics_gate(baseline, candidate, max_loss_delta=max_loss_delta, band=numerics == "band", store=store)
               if numerics is not None or max_loss_delta is not None else None)
    res = compare(a, b, metric=metric, min_effect=eff, alpha=alpha)
    rc = max(res.exit_code, num.exit_code) if num is not None else res.exit_code
    if as_json:
        typer.echo(dumps({**res.to_dict(), **({"numerics": num.to_dict()} if num is not None else {})}))
    else:
        from rich.console import Console
        from rich.markup import escape

        color = {"regression": "red", "improvement": "green", "no change": "blue"}.get(res.verdict, "yellow")
        before, after = format_values(res.metric, [res.baseline_median, res.candidate_median])
        line = (f"[bold {color}]{res.verdict}[/]: {res.metric} {before} -> {after} "
                f"(n = {res.n_baseline} vs {res.n_candidate}); ")
        if res.effect == res.effect:  # not NaN: the test ran
            line += (f"effect {res.effect:+.2%} [95% CI {res.effect_ci[0]:+.2%}, {res.effect_ci[1]:+.2%}]; "
                     f"{res.test} p = {res.p_value:.2g}; ")
        Console().print(line + res.reason, highlight=False, soft_wrap=True)
        if num is not None:
            color = {"pass": "green", "fail": "red"}.get(num.status, "yellow")
            Console().print(f"[bold {color}]numerics[/] ({num.check}): {escape(num.verdict)}"
                            + (f"; {escape(num.reason)}" if num.reason and num.status != "not comparable" else ""),
                            highlight=False, soft_wrap=True)
    raise typer.Exit(rc)


from trainperf.fleet.tree_cli import tree_cmd  # noqa: E402 - the `fleet tree` command lives in its own module

fleet_app.command("tree")(tree_cmd)


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.add_typer(fleet_app, name="fleet")
    app.command("gate")(gate)
