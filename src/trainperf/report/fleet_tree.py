"""The fleet metric tree as a terminal tree (rich) and as a self-contained HTML page with a waterfall."""

from __future__ import annotations

from pathlib import Path

from trainperf.fleet.tree import LABELS, LOSSES
from trainperf.report.html import PALETTE, Report, charts_backend, esc, floating_bar_chart, paragraph, table

_LOSS, _GAIN, _TOTAL = "#e15759", "#59a14f", PALETTE[0]


def _money(usd: float | None) -> str:
    return "" if usd is None else f"${usd:,.0f}" if abs(usd) >= 100 else f"${usd:,.2f}"


def node_text(node) -> str:
    """Return one line for a node: label, GPU-hours, dollars, share of allocated."""
    usd = _money(node.usd)
    return f"{node.label}: {node.gpu_h:,.3g} GPU-h" + (f"  {usd}" if usd else "") + f"  ({node.share:.1%})"


def terminal_tree(tree, explanations=()):
    """Return a rich renderable: the tree (losses red, effective green), notes and the explanation."""
    from rich.console import Group
    from rich.text import Text
    from rich.tree import Tree

    style = {"loss": "red", "result": "bold green", "stage": "bold", "unsplit": "yellow"}

    def add(parent, node):
        for c in node.children:
            add(parent.add(Text(node_text(c), style=style.get(c.kind, ""))), c)

    root = Tree(Text(node_text(tree.root), style="bold"))
    add(root, tree.root)
    parts = [root, Text(f"effective training throughput: {_pct(tree.effective_fraction)} of allocated GPU-hours "
                        f"({len(tree.accounts)} runs)")]
    parts += [Text(f"note: {n}", style="yellow") for n in tree.notes]
    parts += [Text(f"explain: {e.verdict}", style="bold") for e in explanations]
    return Group(*parts)


def waterfall_bars(tree) -> list[tuple[str, float, float, str]]:
    """(label, low, high GPU-h, colour) of each waterfall step: allocated, each loss leaf, effective last."""
    leaves = [n for n in tree.root.walk() if n.kind in ("loss", "unsplit")]
    total = tree.root.gpu_h
    bars = [("allocated", 0.0, total, _TOTAL)]
    level = total
    for n in leaves:
        top, level = level, level - n.gpu_h
        bars.append((n.label.split(" (")[0], min(top, level), max(top, level), _LOSS if n.gpu_h >= 0 else _GAIN))
    bars.append(("effective", 0.0, tree.effective_gpu_h or 0.0, _GAIN))
    return bars


def waterfall_chart(tree, width: int = 1000, height: int = 340) -> str:
    """Return the waterfall of GPU-hours: a Plotly chart, or static SVG where plotly is not installed."""
    bars = waterfall_bars(tree)
    if charts_backend() == "plotly":
        return floating_bar_chart(*zip(*bars), unit="GPU-h", height=height + 60)
    total = tree.root.gpu_h
    hi = max(total, max(b[2] for b in bars), 1e-12)
    left, top_pad, bottom = 60, 20, 105
    ph = height - top_pad - bottom
    step = (width - left - 10) / len(bars)
    bw = step * 0.7

    def y(v: float) -> float:
        return top_pad + ph * (1 - v / hi)

    out = [f"<svg width='{width}' height='{height}' role='img'>",
           f"<line x1='{left}' x2='{width - 10}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#999'/>",
           f"<text x='{left - 4}' y='{y(hi) + 10:.1f}' text-anchor='end'>{hi:.3g}</text>",
           f"<text x='{left - 4}' y='{y(0):.1f}' text-anchor='end'>0 GPU-h</text>"]
    for i, (label, lo, up, color) in enumerate(bars):
        x = left + i * step + (step - bw) / 2
        h = max(y(lo) - y(up), 0.5)
        out.append(f"<rect x='{x:.1f}' y='{y(up):.1f}' width='{bw:.1f}' height='{h:.1f}' fill='{color}'>"
                   f"<title>{esc(label)}: {up - lo:.4g} GPU-h</title></rect>"
                   f"<text x='{x + bw / 2:.1f}' y='{y(up) - 3:.1f}' text-anchor='middle'>{up - lo:.3g}</text>")
        if i + 1 < len(bars) and i > 0:  # connector to the next bar's top
            out.append(f"<line x1='{x + bw:.1f}' x2='{x + step:.1f}' y1='{y(lo):.1f}' y2='{y(lo):.1f}' "
                       f"stroke='#bbb' stroke-dasharray='2,2'/>")
        tx, ty = x + bw / 2, y(0) + 12
        out.append(f"<text x='{tx:.1f}' y='{ty:.1f}' text-anchor='end' transform='rotate(-40 {tx:.1f} {ty:.1f})'>"
                   f"{esc(label[:28])}</text>")
    out.append("</svg>")
    return "".join(out)


def tree_report(tree, path: str | Path, explanations=(), title: str = "Fleet metric tree") -> Path:
    """Write the tree as a self-contained HTML page (waterfall, factor table, runs); return the path."""
    rows = []

    def walk(node, depth):
        rows.append(["\u00a0\u00a0" * depth + node.label, f"{node.gpu_h:.4g}", _money(node.usd), f"{node.share:.1%}"])
        for c in node.children:
            walk(c, depth + 1)

    walk(tree.root, 0)
    rep = Report(title, f"{len(tree.accounts)} runs, {tree.root.gpu_h:.4g} allocated GPU-hours, effective "
                        f"{_pct(tree.effective_fraction)}")
    rep.add("Where the GPU-hours went", waterfall_chart(tree), paragraph(
        "Allocated GPU-hours step down by each loss (red) to the effective GPU-hours: model FLOPs at the "
        "accelerator's peak. A green step inside the losses is a run beating the planner's prediction.", "note"))
    rep.add("Factors", table(rows, ["factor", "GPU-h", "USD", "of allocated"]),
            *[paragraph(f"note: {n}", "note") for n in tree.notes])
    for explanation in explanations:
        seg_rows = [[s.where, f"{s.gpu_h:.4g}", f"{s.rate:.1%}", f"{s.excess_gpu_h:.4g}", f"{s.share:.0%}"]
                    for s in explanation.segments]
        rep.add(f"Where {explanation.label} sits", paragraph(explanation.verdict),
                table(seg_rows, ["segment", "GPU-h", "of allocated", "above typical (GPU-h)", "share of excess"])
                if seg_rows else "")
    run_rows = [[a.run_id, a.attrs["job"], a.attrs["host"], f"{a.parts['allocated']:.4g}",
                 "" if a.achieved_mfu is None else f"{a.achieved_mfu:.1%}",
                 "" if a.planned_mfu is None else f"{a.planned_mfu:.1%}",
                 LABELS.get(max((k for k in a.parts if k in LOSSES), key=lambda k: a.parts[k], default=""), "")]
                for a in tree.accounts]
    rep.add("Runs", table(run_rows, ["run", "job", "host", "allocated GPU-h", "achieved MFU", "planned MFU",
                                     "largest loss"]))
    return rep.write(path)


def _pct(fraction: float | None) -> str:
    return "not measured (no run recorded its MFU)" if fraction is None else f"{fraction:.1%}"
