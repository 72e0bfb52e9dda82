"""HTML report of `trainperf diagnose`: per-rank breakdown, critical path, findings."""

from __future__ import annotations

from pathlib import Path

from trainperf.diagnose.memory import GIB, highest_peak
from trainperf.diagnose.render import (analysed_steps, flops_line, gain_basis, gain_text, host_only, host_rank_cells,
                                       memory_line, notes_by_rank, rank_cells, straggler_text, straggler_wait_ms)
from trainperf.report.html import Report, bar_chart, esc, line_chart, paragraph, stacked_bar_chart, table


def write_report(d, path: str | Path) -> Path:
    """Write a self-contained HTML report of a Diagnosis to path; return the path."""
    rep = Report("trainperf diagnose", f"{d.path} — {len(d.ranks)} rank(s)")
    gpu = [r for r in d.ranks if r.gpu_analyses == "ok"]
    if host_only(d):  # no GPU activity on any rank: the loop thread's time, as the terminal shows it
        rows = [[r.rank, *host_rank_cells(r), r.confidence] for r in d.ranks]
        rep.add("Per rank (host only: no GPU activity in the traces)",
                table(rows, ["rank", "window ms", "median step ms", "collectives %", "DataLoader %", "optimizer %",
                             "confidence"]), *[paragraph(n, "note") for n in notes_by_rank(d.notes)])
        rep.add("Where the host's window goes (ms)", stacked_bar_chart([f"rank {r.rank}" for r in d.ranks], {
            "collectives (their wait included)": [r.exposed_comm_us / 1e3 for r in d.ranks],
            "DataLoader": [r.dataloader_pct * r.window_us / 1e5 for r in d.ranks],
            "optimizer": [r.optimizer_pct * r.window_us / 1e5 for r in d.ranks],
            "the rest (forward, backward, Python)": [max(r.window_us * (1 - (r.dataloader_pct + r.optimizer_pct) / 100)
                                                         - r.exposed_comm_us, 0.0) / 1e3 for r in d.ranks]}, "ms"))
    else:
        rows = [[r.rank, *rank_cells(r), r.gpu_analyses, r.confidence] for r in d.ranks]
        rep.add("Per rank", table(rows, ["rank", "window ms", "idle %", "compute %", "non-compute %",
                                         "comm/comp overlap %", "idle host / kernel / other %", "GPU analyses",
                                         "confidence"]),
                *[paragraph(n, "note") for n in notes_by_rank(d.notes)])
    if gpu:
        labels = [f"rank {r.rank}" for r in gpu]
        rep.add("Where the window goes (ms)", stacked_bar_chart(labels, {
            "compute": [r.compute_pct * r.window_us / 1e5 for r in gpu],
            "non-compute (comm, memcpy)": [r.non_compute_pct * r.window_us / 1e5 for r in gpu],
            "idle": [r.idle_pct * r.window_us / 1e5 for r in gpu]}, "ms"))
        cats = sorted({c for r in gpu for c in r.kernel_categories_pct})
        rep.add("Kernel time by category (% of device time)", stacked_bar_chart(
            labels, {c: [r.kernel_categories_pct.get(c, 0.0) for r in gpu] for c in cats}, "%"))
        buckets = sorted({b for r in gpu for b in r.critical_path_pct})
        rep.add("Critical path (% of the window)", stacked_bar_chart(
            labels, {b: [r.critical_path_pct.get(b, 0.0) for r in gpu] for b in buckets}, "%"),
            paragraph("Walked back from the last event through host calls, launches, streams, syncs and "
                      "cross-rank waits; 'cpu' is host work between runtime calls; 'lag' is device work waiting, "
                      "after its launch and its stream allowed it to start, for what the trace does not show.",
                      "note"))
    if getattr(d, "memory", None):  # a Diagnosis (a hand-made one in tests may have none)
        _add_memory(rep, d)
    flops = flops_line(d)
    if flops:
        _add_flops(rep, d, flops)
    if d.cross_rank:
        x = d.cross_rank
        caused = x.get("caused_by_rank_us", {})  # per rank when collectives were matched (GPU ranks)
        ranks = sorted(caused, key=int)
        head = f"{x['n_collectives_matched']} collectives matched by sequence; "
        tail = f"compute imbalance {x['compute_imbalance_pct']:.1f}%."
        s = straggler_wait_ms(x)
        text = paragraph(f"{head}{straggler_text(x)}; {tail}")
        if s and ranks:  # a chart of zeros would only show an axis
            rep.add("Across ranks", text, bar_chart([f"rank {r}" for r in ranks],
                                                    [caused[r] / 1e3 for r in ranks], "ms of others' wait"))
        else:
            rep.add("Across ranks", text)
    for b in getattr(d, "modules", []):
        _add_modules(rep, b)
    if d.findings:
        basis = gain_basis(analysed_steps(d))  # "step time", or "the traced time" when no rank has steps
        rep.add("Findings, ranked by marginal gain", bar_chart([f.kind for f in d.findings],
                                                              [f.gain_pct for f in d.findings], f"% of {basis}"),
                paragraph(f"Fix all: ≈ {d.fix_all_gain_pct:.1f}% of {basis}. Each gain is what its fix adds to "
                          f"the fixes before it, in the order {' > '.join(d.fix_order)}." if d.fix_order else
                          "No finding has a fix whose effect could be replayed: gains are host-only estimates or "
                          "not estimated.", "note"))
        for i, f in enumerate(d.findings, 1):
            m = f.evidence.get("metrics", {})
            ev = f.evidence.get("events", [])
            conf = "" if f.confidence == "high" else f", confidence {f.confidence}"
            rep.add(f"{i}. {f.kind} ({f.severity}{conf}, {gain_text(f)})",
                    f"<p class='sev-{esc(f.severity)}'>ranks {esc(f.ranks)}; what-if: {esc(f.what_if)}"
                    + (f"; alone {f.gain_alone_pct:.1f}%, fix #{f.fix_order}" if f.fix_order else "") + "</p>",
                    *[paragraph("Note: " + n, "note") for n in f.notes],
                    table([[k, v["value"], v["unit"]] for k, v in m.items()], ["evidence", "value", "unit"]),
                    table([[e["name"][:100], e["start_us"], e["dur_us"]] for e in ev], ["event", "start µs", "dur µs"])
                    if ev else "", paragraph("Fix: " + f.recommendation))
    else:
        rep.add("Findings", paragraph("No findings: nothing in this trace is worth fixing."))
    return rep.write(path)


def _add_modules(rep: Report, b) -> None:
    """A rank's time per nn.Module (modules.ModuleBreakdown): exclusive time by module as a chart (the
    leaves and the unattributed rows add up to the step), every path in a table, indented by depth."""
    from trainperf.diagnose.modules_render import BASIS_TEXT

    if not b.rows:
        return
    own = sorted((r for r in b.rows if r.exclusive_us_per_step > 0), key=lambda r: -r.exclusive_us_per_step)[:20]
    rows = [["\u00a0" * 4 * max(r.depth - 1, 0) + (r.path.rsplit("/", 1)[-1] if r.depth else r.path),
             f"{r.inclusive_us_per_step / 1e3:.3f}", f"{r.exclusive_us_per_step / 1e3:.3f}", f"{r.pct_of_step:.1f}",
             f"{r.calls_per_step:g}", f"{r.events_per_step:g}"] for r in b.rows]
    rep.add(f"Rank {b.rank}: time per nn.Module, per step",
            bar_chart([r.path for r in own], [r.exclusive_us_per_step / 1e3 for r in own], "ms per step (exclusive)"),
            table(rows, ["module", "incl. ms", "excl. ms", "% of step", "calls", "events"]),
            paragraph(f"Basis: {BASIS_TEXT[b.basis]}. {b.steps} step(s); {b.attributed_pct:.1f}% of the step's time "
                      f"is inside module forwards.", "note"),
            *[paragraph(n, "note") for n in b.notes])


def _add_memory(rep: Report, d) -> None:
    """The device memory over the window of the rank with the highest reserved peak (allocator samples), as GiB
    against ms from its first sample, with the usable memory where the device's capacity is known."""
    r, m = highest_peak(d.memory)
    tl = m.timeline
    ms = [(x - tl[0, 0]) / 1e3 for x in tl[:, 0]]
    series = {"allocated": list(tl[:, 1] / GIB), "reserved": list(tl[:, 2] / GIB)}
    if m.usable_bytes:
        series["usable (capacity less the runtime's reserve)"] = [m.usable_bytes / GIB] * len(ms)
    rep.add(f"Device memory over the window (rank {r}{', the highest reserved peak' if len(d.memory) > 1 else ''})",
            line_chart(series, ms, "GiB", x_title="ms from the first sample"), paragraph(memory_line(d)))


def _add_flops(rep: Report, d, line: str) -> None:
    """The matrix products', convolutions' and attention's FLOPs from the recorded shapes (render.flops_line), with
    each rank's share of the peak (else its TFLOP/s) where the job has several ranks: a rank that computes slower
    stands out."""
    ranks = [r for r in d.ranks if r.achieved_tflops is not None]
    rated = all(r.flops_utilisation_pct is not None for r in ranks)
    parts = [bar_chart([f"rank {r.rank}" for r in ranks],
                       [r.flops_utilisation_pct if rated else r.achieved_tflops for r in ranks],
                       "% of peak" if rated else "TFLOP/s")] if len(ranks) > 1 else []
    rep.add("FLOPs of matrix products, convolutions and attention (from the recorded shapes)", *parts, paragraph(line))
