"""How plan results look: rich tables for the terminal, JSON objects, a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from trainperf.plan.api import step_cost
from trainperf.plan.compare import HardwareOption
from trainperf.plan.estimate import TERMS, Estimate
from trainperf.plan.search import SearchResult


def titled(title: str, table: Table) -> Group:
    """Return ``table`` under ``title`` as one line that wraps at the terminal's width, not the table's.

    A rich Table title wraps to the table's own width, which folds a long title into a narrow block.
    """
    return Group(Text(title, style="italic"), table)


def short_layout(est: Estimate) -> str:
    """Return a compact layout label: tp/pp/dp/cp, vpp, sp, zero, recompute, mbs."""
    lay = est.layout
    parts = [f"tp{lay.tp} pp{lay.pp} dp{lay.dp}"]
    if lay.cp > 1:
        parts.append(f"cp{lay.cp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}" + (f" etp{lay.etp}" if lay.etp else ""))
    if lay.vpp > 1:
        parts.append(f"vpp{lay.vpp}")
    if lay.sp:
        parts.append("sp")
    parts.append(f"zero{lay.zero}" if lay.zero < 3 else "fsdp")
    if lay.recompute != "none":
        parts.append(f"rc={lay.recompute}")
    parts.append(f"mbs{lay.mbs} ga{lay.grad_accum}")
    return " ".join(parts)


def overhead_label(est: Estimate) -> str:
    """Return 'name NN%' for the dominant non-compute term as a share of the step."""
    k = est.dominant_overhead
    return f"{k} {est.breakdown[k] / est.step_time_s:.0%}"


def search_table(res: SearchResult) -> Group:
    """Return a rich table of the ranked layouts under its title line."""
    title = (f"{res.model.name} on {res.cluster.n_gpus} x {res.cluster.accelerator.name}, seq {res.model.seq_len}, "
             f"global batch {res.global_batch} ({res.global_batch * res.model.seq_len / 1e6:.2f} M tokens), "
             f"stack {res.stack}")
    cost = res.objective == "cost"
    if cost:
        title += f", ${res.usd_per_gpu_hour:.2f} per GPU-hour (--usd-per-hour)"
    t = Table()
    cols = [("#", "right"), ("layout", "left"), ("step s", "right"), ("tok/s/GPU", "right"),
            ("MFU", "right"), ("mem GiB", "right"), ("dominant overhead", "left")]
    if cost:
        cols[3:3] = [("$/step", "right"), ("$/M tok", "right")]
    for col, just in cols:
        t.add_column(col, justify=just)
    used = res.extra.get("n_gpus_used", [])
    for i, e in enumerate(res.best, 1):
        n = used[i - 1] if used else res.cluster.n_gpus
        label = short_layout(e) + (f" ({n} GPUs)" if n != res.cluster.n_gpus else "")
        row = [str(i), label, f"{e.step_time_s:.3f}", f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu:.1%}",
               f"{e.memory_gib_per_gpu:.1f}", overhead_label(e)]
        if cost:
            usd_step, usd_mtok = step_cost(e, n, res.usd_per_gpu_hour)
            row[3:3] = [f"{usd_step:.4g}", f"{usd_mtok:.4g}"]
        t.add_row(*row)
    return titled(title, t)



def breakdown_table(est: Estimate) -> Group:
    """Return a rich table of one layout's step-time breakdown (seconds and share) under its title line."""
    t = Table()
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k in TERMS:
        v = est.breakdown[k]
        t.add_row(k, f"{v:.4f}", f"{v / est.step_time_s:.1%}")
    t.add_row("[bold]step[/]", f"[bold]{est.step_time_s:.4f}[/]", "100%")
    return titled(f"breakdown of {est.layout.to_string()}", t)


_ENERGY_UNITS = ((1e6, "GWh"), (1e3, "MWh"), (1.0, "kWh"))


def energy_unit(kwh_values: list[float]) -> tuple[str, float]:
    """Return (unit name, kWh per unit) so the largest finite value reads as 1 to 999 units.

    The one place that chooses how energy is shown, so the terminal and the HTML agree.
    """
    finite = [abs(v) for v in kwh_values if v == v and v not in (float("inf"), float("-inf"))]
    top = max(finite, default=0.0)
    return next(((name, size) for size, name in _ENERGY_UNITS if top >= size), ("kWh", 1.0))


def format_energy(kwh: float) -> str:
    """Return an energy given in kWh as text in the unit energy_unit picks, e.g. '2,856.3 MWh'."""
    unit, size = energy_unit([kwh])
    return f"{kwh / size:,.1f} {unit}"


def compare_table(options: list[HardwareOption], tokens: float) -> Group:
    """Return a rich table comparing accelerators (time, $, energy in the unit energy_unit picks, $ per M tokens)."""
    unit, size = energy_unit([o.kwh for o in options if o.best is not None])
    title = f"training {tokens:.3g} tokens ({unit} = TDP x GPUs x hours x PUE {options[0].pue if options else 1.2})"
    t = Table()
    for col in ("gpu", "GPUs", "best layout", "tok/s/GPU", "MFU", "days", "$ (M)", unit, "$/M tok"):
        t.add_column(col, justify="left" if col in ("gpu", "best layout") else "right")
    for o in options:
        if o.best is None:
            t.add_row(o.gpu, str(o.n_gpus), f"[red]{o.problem}[/]", "", "", "", "", "", "")
            continue
        t.add_row(o.gpu, str(o.n_gpus), short_layout(o.best), f"{o.best.tokens_per_s_per_gpu:,.0f}", f"{o.best.mfu:.1%}",
                  f"{o.train_hours / 24:,.1f}", f"{o.usd / 1e6:,.2f}", f"{o.kwh / size:,.1f}",
                  f"{o.usd_per_million_tokens:.3f}")
    return titled(title, t)


def html_report(path: str | Path, res: SearchResult | None = None, est: Estimate | None = None,
                options: list[HardwareOption] | None = None, tokens: float = 0.0) -> Path:
    """Write a self-contained HTML report of a search, one layout or a hardware comparison; return the path."""
    from trainperf.report.html import Report, bar_chart, paragraph, stacked_bar_chart, table

    rep = Report("trainperf plan", "analytical step-time and memory model; figures are predictions")
    if res is not None:
        rows = [[i, short_layout(e), f"{e.step_time_s:.3f}", f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu:.1%}",
                 f"{e.memory_gib_per_gpu:.1f}", overhead_label(e)] for i, e in enumerate(res.best, 1)]
        rep.add(f"{res.model.name} on {res.cluster.n_gpus} x {res.cluster.accelerator.name}",
                paragraph(f"{res.n_candidates:,} valid layouts evaluated in {res.elapsed_s * 1e3:.0f} ms, "
                          f"{res.n_fit:,} fit in memory."),
                table(rows, ["#", "layout", "step s", "tok/s/GPU", "MFU", "mem GiB", "dominant overhead"]),
                paragraph(f"Chart: predicted time per step (s) of layouts #1-#{len(res.best)}, split by term.",
                          cls="note"),
                stacked_bar_chart([f"#{i}" for i in range(1, len(res.best) + 1)],
                                  {k: [e.breakdown[k] for e in res.best] for k in TERMS}, unit="s",
                                  axis_title="time per step (s)"))
    if est is not None:
        rep.add(f"breakdown of {est.layout.to_string()}",
                paragraph("Chart: predicted time per step (s) by term.", cls="note"),
                bar_chart(list(TERMS), [est.breakdown[k] for k in TERMS], unit="s", axis_title="time per step (s)"),
                table([[k, f"{est.breakdown[k]:.4f}", f"{est.breakdown[k] / est.step_time_s:.1%}"] for k in TERMS],
                      ["term", "seconds", "share"]))
    if options:
        ok = [o for o in options if o.best is not None]
        unit, size = energy_unit([o.kwh for o in ok])
        rep.add(f"hardware comparison for {tokens:.3g} tokens",
                table([[o.gpu, o.n_gpus, short_layout(o.best), f"{o.train_hours / 24:,.1f}", f"{o.usd:,.0f}",
                        f"{o.kwh / size:,.1f}", f"{o.usd_per_million_tokens:.3f}"] for o in ok],
                      ["gpu", "GPUs", "best layout", "days", "USD", unit, "USD per M tokens"]),
                paragraph("Chart: predicted cost per million tokens trained (USD).", cls="note"),
                bar_chart([o.gpu for o in ok], [o.usd_per_million_tokens for o in ok], unit="$/Mtok",
                          axis_title="USD per million tokens"))
    return rep.write(path)
