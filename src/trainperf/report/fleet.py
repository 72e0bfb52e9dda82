"""HTML report of change points: the series, its segment medians, the changes and their evidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainperf.report.html import Report, line_chart, paragraph, table


def change_count_text(n_changes: int, n_points: int) -> str:
    """Return e.g. '1 change point in 150 points' or 'no change points in 40 points' (singular/plural right)."""
    return f"{n_changes or 'no'} change point{'' if n_changes == 1 else 's'} in {n_points} points"


def changes_report(values, result, path: str | Path, title: str = "Change points", label: str = "value",
                   run_ids: list[str] | None = None) -> Path:
    """Write a self-contained HTML report of ``result`` (a ChangeResult) over ``values``; return the path."""
    y = np.asarray(values, dtype=float)
    bounds = [0] + result.change_points + [len(y)]
    level = np.full(len(y), np.nan)
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = y[a:b]
        if np.isfinite(seg).any():
            level[a:b] = np.nanmedian(seg)
    # line_chart draws lines through numbers only: carry the last value over missing points
    shown = y.copy()
    for i in range(len(shown)):
        if not np.isfinite(shown[i]):
            shown[i] = shown[i - 1] if i else np.nanmedian(y)
    chart = line_chart({label: shown.tolist(), "segment median": level.tolist()}, markers=result.change_points)
    rows = []
    for c in result.changes:
        unit = "/pt" if c.kind == "trend" else ""  # a trend's before/after/shift are slopes, per point
        rel = (f"{c.rel_change:+.2%}{unit} [{c.rel_ci[0]:+.2%}, {c.rel_ci[1]:+.2%}]"
               if c.rel_change == c.rel_change else "-")
        where = f"{c.index}" + (f"-{c.end}" if c.end is not None else "")
        rows.append([where if not run_ids else f"{where} ({run_ids[c.index]})", c.kind, f"{c.before:.5g}{unit}",
                     f"{c.after:.5g}{unit}", f"{c.shift:+.4g}{unit} [{c.shift_ci[0]:+.4g}, {c.shift_ci[1]:+.4g}]",
                     rel, f"{c.p_value:.2g}"])
    rep = Report(title, change_count_text(len(result.changes), result.n))
    rep.add("Series", chart, paragraph(
        "Vertical lines mark the first point of each new segment. Level changes shift the median; trend changes "
        "shift the slope (their magnitude is per point)."))
    rep.add("Changes", table(rows, ["index (a trend: onset-end)", "kind", "before (level: median; trend: slope)",
                                    "after", "shift [95% CI]",
                                    "relative [95% CI]", "p-value"]) if rows else paragraph("No change point."),
            paragraph(f"Test: {result.test}. Shift: Hodges-Lehmann estimate with its Mann-Whitney interval."))
    return rep.write(path)
