"""The comparison's HTML page: verdict, tables, the two loss curves with the band, step-time distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainperf.compare.api import Comparison
from trainperf.compare.interval import interval_text
from trainperf.compare.runs import RunData, finite
from trainperf.report.html import Report, line_chart, paragraph, table
from trainperf.store.record import PEAK_UNKNOWN


def perf_rows(c: Comparison) -> list[list]:
    """Return the performance table: metric, A, B, change (shared by the terminal and the HTML). Each
    label names its statistic: the steady steps (warm-up and transients cut, ``perf.steady_slice``),
    not the run summaries' medians over every step after the first."""
    p = c.perf
    t, s = p.throughput, p.step_time

    def rel(a, b):
        return f"{b / a - 1:+.1%}" if a and b and a == a and b == b else "-"

    def change(e):  # an unbounded interval (hosts that differ by an unknown amount): perf_notes says why
        shown = interval_text(e.lo, e.hi)
        return f"{e.change:+.1%} " + (shown or ("(hosts differ)" if p.verdict == "inconclusive" else "(no interval)"))

    def used(side):
        return f"{p.steady_steps[side]} of {p.total_steps[side]}"

    gpa, gpb = p.goodput
    return [
        ["steady steps used (of all)", used(0), used(1), "-"],
        ["tokens/s, total over steady steps", f"{t.a:,.0f}", f"{t.b:,.0f}", change(t)],
        ["step time (ms), mean of steady steps", f"{s.a * 1e3:.2f}", f"{s.b * 1e3:.2f}", change(s)],
        ["MFU, median of steady steps", f"{p.mfu[0]:.2%}", f"{p.mfu[1]:.2%}",
         rel(*p.mfu) if p.mfu_comparable else "- (a peak unknown)" if PEAK_UNKNOWN in p.mfu_note
         else "- (peaks differ)"],
        ["peak memory / rank (MiB), max", f"{p.mem_peak_bytes[0] / 2**20:.1f}", f"{p.mem_peak_bytes[1] / 2**20:.1f}",
         rel(*p.mem_peak_bytes)],
        ["goodput", "-" if gpa is None else f"{gpa:.1%}", "-" if gpb is None else f"{gpb:.1%}",
         "-" if gpa is None or gpb is None else f"{(gpb - gpa) * 100:+.1f} points"],
    ]


def perf_notes(c: Comparison) -> list[str]:
    """Return the performance table's notes: the MFU peaks when they differ, the between-run term."""
    return [n for n in (c.perf.mfu_note, c.perf.note) if n]


def _ci(x) -> str:
    if x is None:
        return "-"
    m, lo, hi = x
    return f"{m:.4f}" + (f" [{lo:.4f}, {hi:.4f}]" if lo is not None else "")


def numerics_rows(c: Comparison) -> list[list]:
    """Return the numerics table: quantity, A, B (shared by the terminal and the HTML)."""
    n = c.numerics
    if not n.comparable:
        return [["comparable", "no", n.reason]]
    rows = []
    if n.final_loss:
        ka, kb = n.final_loss_steps
        last = f"{ka}" if ka == kb else f"{ka} (A) / {kb} (B)"
        rows.append([f"final training loss, mean of last {last} steps", _ci(n.final_loss[0]), _ci(n.final_loss[1])])
    if n.eval_loss:
        rows.append(["held-out loss", _ci(n.eval_loss[0]), _ci(n.eval_loss[1])])
    if n.grad_norm_ratio is not None:
        rows.append(["grad norm B / A (median)", f"{1:.3f}", f"{n.grad_norm_ratio:.3f}"])
    tt = n.time_to_target
    for key, label, fmt in (("step", "step", "{:.0f}"), ("wall_s", "wall-clock (s)", "{:.1f}"),
                            ("gpu_hours", "device-hours", "{:.4f}")):
        rows.append([f"to loss {n.target_loss:.4f}: {label}"] +
                    [fmt.format(tt[s][key]) if tt.get(s) else "not reached" for s in ("A", "B")])
    for d in n.divergences:
        # A is the band's centre: its own excursion is 0 by definition
        rows.append([f"{d.metric} vs band, seed {d.seed}", f"max {0:.2f} x band (reference)", f"max {d.max_excess:.2f} x band"
                     + (f", leaves at step {d.step}" if d.step is not None else "")])
    return rows


def write_html(c: Comparison, path: str | Path, a_runs: list[RunData], b_runs: list[RunData]) -> Path:
    """Write the comparison page to ``path``; return it."""
    rep = Report("trainperf compare", c.headline)
    rep.add("Performance", table(perf_rows(c), ["metric", "A", "B", "change [95% interval]"]),
            paragraph("; ".join([f"{c.perf.throughput.method}; steady steps: "
                                 + "; ".join(f"{n} {a}-{b}" for n, a, b in c.perf.steady), *perf_notes(c)]), "note"))
    n = c.numerics
    rep.add("Numerics", paragraph(f"{n.verdict}: {n.reason}"), table(numerics_rows(c), ["", "A", "B"]))
    if n.changed:
        rep.add("What differs between A and B", table([[k, str(v[0]), str(v[1])] for k, v in n.changed.items()],
                                                      ["field", "A", "B"]))
    if n.curves:
        cv = n.curves
        a, band = np.array(cv["loss_a"]), np.array(cv["band"])
        marks = [d.step for d in n.divergences if d.step is not None][:1]
        rep.add("Loss (first seed pair) and the band", line_chart(
            {"A": cv["loss_a"], "B": cv["loss_b"], "A - band": (a - band).tolist(), "A + band": (a + band).tolist()},
            xs=cv["step"], unit="loss (nats)", markers=marks, x_title="step"))
    dist = {}
    for side, runs in (("A", a_runs), ("B", b_runs)):
        v = np.sort(np.concatenate([finite(r.step_time_s[1:]) for r in runs])) * 1e3
        dist[side] = np.quantile(v, np.linspace(0, 1, 101)).tolist() if len(v) else []
    rep.add("Step-time distribution (ms at each percentile, first step left out)",
            line_chart(dist, xs=list(range(101)), unit="ms", x_title="percentile"))
    return rep.write(path)
