"""Self-contained HTML reports: one file per report, opened offline (from a CI artifact, an email).

Charts are drawn by Plotly (the library HTA uses): hover, zoom, legends and margins that fit
their labels. Plotly's JavaScript is inlined once per page, so the file needs no network: Plotly's
own "basic" partial bundle (bar, pie and scatter traces: 1.2 MB, shipped in report/vendor/ from the
npm package plotly.js-basic-dist-min) when it is the version the plotly package writes figures for,
else the full bundle that package carries (4.8 MB).
Where the plotly package is missing (an environment set up before it became a dependency),
the charts fall back to static SVG drawn here; `charts_backend()` says which one is used.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from trainperf.atomic import atomic_write_text

# Tableau 20: ten strong colours, then their light companions (a 13-part step-time breakdown
# must not repeat a colour).
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#f1ce63", "#86bcb6", "#ff9d9a",
           "#d37295", "#fabfd2", "#d4a6c8")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem}h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}td,th{border:1px solid #ddd;padding:.25rem .5rem;
text-align:right}th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:.9rem}.sev-high{color:#b00020;font-weight:600}.sev-medium{color:#b36b00}
.sev-low{color:#555}svg text{font-size:11px;fill:#333}code{background:#f3f3f3;padding:0 .2rem}
.chart{width:100%;margin:.5rem 0}
"""
CHART_CLASS = "trainperf-chart"
# Draw every chart of the page from the figure JSON its div carries (no ids to keep unique).
_DRAW = (f"document.querySelectorAll('div.{CHART_CLASS}').forEach(function(el){{"
         "var f=JSON.parse(el.getAttribute('data-figure'));"
         "Plotly.newPlot(el,f.data,f.layout,{responsive:true,displaylogo:false});});")


@lru_cache(maxsize=1)
def _plotly():
    """Return plotly.graph_objects, or None where plotly is not installed."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    return go


def charts_backend() -> str:
    """Return 'plotly' (interactive charts, the library inlined) or 'svg' (static fallback)."""
    return "plotly" if _plotly() is not None else "svg"


# Plotly's official partial bundle with the trace types our charts use (docs/benchmarks.md: sizes).
BASIC_BUNDLE = Path(__file__).with_name("vendor") / "plotly-basic.min.js"
BASIC_TRACES = frozenset({"bar", "pie", "scatter"})


@lru_cache(maxsize=1)
def _basic_js() -> str | None:
    """The vendored basic bundle's JavaScript, or None when it is missing or another plotly.js version than
    the one the installed plotly package writes figures for (its first lines name the version)."""
    from plotly.offline import get_plotlyjs_version

    try:
        js = BASIC_BUNDLE.read_text(encoding="utf-8")
    except OSError:
        return None
    return js if f"plotly.js (basic - minified) v{get_plotlyjs_version()}\n" in js[:200] else None


@lru_cache(maxsize=2)
def _plotly_js(basic: bool = True) -> str:
    """Plotly's JavaScript to inline: the basic partial bundle when ``basic`` and it fits, else the full one."""
    from plotly.offline import get_plotlyjs

    return (_basic_js() if basic else None) or get_plotlyjs()


def esc(text: object) -> str:
    """Return ``text`` escaped for HTML."""
    return html.escape(str(text))


@dataclass
class Section:
    """One titled block of a report: raw HTML (tables, charts, paragraphs)."""

    title: str
    body_html: str


@dataclass
class Report:
    """A report page: a title, a subtitle line and sections, rendered to one HTML file."""

    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)

    def add(self, title: str, *parts: str) -> "Report":
        """Append a section made of HTML parts; return self."""
        self.sections.append(Section(title, "\n".join(parts)))
        return self

    def render(self) -> str:
        """Return the whole page as an HTML string (Plotly's JavaScript inlined when a chart needs it)."""
        body = "\n".join(f"<h2>{esc(s.title)}</h2>\n{s.body_html}" for s in self.sections)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        lib = draw = ""
        if f"class='{CHART_CLASS}" in body:
            basic = "data-bundle='full'" not in body
            lib = f"<script type='text/javascript'>{_plotly_js(basic)}</script>"
            draw = f"<script type='text/javascript'>{_DRAW}</script>"
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
                f"<meta name='description' content='{esc(self.subtitle)}'><style>{_CSS}</style>{lib}</head><body><h1>{esc(self.title)}</h1>"
                f"<p class='note'>{esc(self.subtitle)} · generated by trainperf {stamp}</p>{body}{draw}</body></html>")

    def write(self, path: str | Path) -> Path:
        """Write the page atomically to ``path``; return the path."""
        return atomic_write_text(path, self.render())


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Return an HTML table; floats are shown with 3 significant digits."""
    def cell(v: object) -> str:
        return esc(f"{v:.3g}" if isinstance(v, float) else v)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def paragraph(text: str, cls: str = "") -> str:
    """Return an escaped HTML paragraph."""
    return f"<p class='{cls}'>{esc(text)}</p>" if cls else f"<p>{esc(text)}</p>"


def _finite(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def _figure_div(fig, height_px: int, legend_px: int = 0) -> str:
    """Return the div that Report.render's script draws ``fig`` into.

    The top margin holds the legend's rows (``legend_px``) under the 30 px of the mode bar, so
    the two never overlap.
    """
    fig.update_layout(height=height_px, template="plotly_white", font={"size": 12},
                      margin={"l": 10, "r": 10, "t": 30 + legend_px, "b": 10}, hoverlabel={"namelength": -1})
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    spec = fig.to_plotly_json()
    data = json.dumps({"data": spec["data"], "layout": spec["layout"]}, default=_json_default, allow_nan=False)
    # a trace type outside the basic bundle makes Report.render inline the full one
    bundle = "basic" if {t.get("type", "scatter") for t in spec["data"]} <= BASIC_TRACES else "full"
    return (f"<div class='{CHART_CLASS} chart' style='height:{height_px}px' data-bundle='{bundle}' "
            f"data-figure='{esc(data)}'></div>")


def _json_default(o):
    if hasattr(o, "tolist"):  # numpy arrays and scalars
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _legend_on_top(n_names: int) -> tuple[dict, int]:
    """Return a horizontal legend above the plot and the extra height (px) its rows need."""
    rows = 1 + n_names // 5
    return ({"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0.0, "traceorder": "normal"},
            22 * rows)


def bar_chart(labels: Sequence[str], values: Sequence[float], unit: str = "", width: int = 700,
              color: str = PALETTE[0], *, axis_title: str = "") -> str:
    """Return a horizontal bar chart of ``values`` (one bar per label, first at the top); ``unit`` follows
    each value and titles the axis unless ``axis_title`` is given."""
    if len(values) == 0:
        return paragraph("(no data)", "note")
    go = _plotly()
    if go is None:
        return _svg_bar_chart(labels, values, unit, width, color)
    vals = [_finite(v) for v in values]
    texts = [f"{v:.3g} {unit}".strip() if v is not None else "" for v in vals]
    fig = go.Figure(go.Bar(x=vals, y=[str(lab) for lab in labels], orientation="h", marker_color=color,
                           text=texts, textposition="auto", cliponaxis=False,
                           hovertemplate="%{y}: %{x:.4g} " + esc(unit) + "<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title_text=axis_title or unit, rangemode="tozero")
    if (span := label_room(vals, texts)) is not None:
        fig.update_xaxes(range=list(span))
    return _figure_div(fig, 90 + 28 * len(vals))


# The narrowest plot area a chart gets on the report page (1100 px wide, less the label column).
_PLOT_PX = 500


def label_room(values: Sequence[float | None], texts: Sequence[str]) -> tuple[float, float] | None:
    """Return the value-axis range (lo, hi) that keeps every bar's label inside the chart, or None
    when Plotly's own range already does.

    Plotly writes a bar's label outside the bar when the bar is too short to hold it, and clips
    it at the plot's edge: with bars of both signs, a short bar at one end of the axis (a small
    increase among large decreases) has its label cut. Labels are taken as ``_CHAR_PX`` per
    character on a ``_PLOT_PX`` wide plot.
    """
    finite = [v for v in values if v is not None]
    if not finite or not texts:
        return None
    lo, hi = min(0.0, *finite), max(0.0, *finite)
    frac = min(0.45, (_CHAR_PX * max(len(t) for t in texts) + 12) / _PLOT_PX)  # a label's share of the width
    new_lo, new_hi = lo, hi
    for _ in range(8):  # the label's width in data units grows with the range it widens
        width = frac * ((new_hi - new_lo) or 1.0)
        new_hi = max([hi] + [v + width for v in finite if 0 <= v < width])
        new_lo = min([lo] + [v - width for v in finite if -width < v < 0])
    return None if (new_lo, new_hi) == (lo, hi) else (new_lo, new_hi)


def stacked_bar_chart(labels: Sequence[str], parts_by_name: dict[str, Sequence[float]], unit: str = "",
                      width: int = 700, *, axis_title: str = "") -> str:
    """Return a horizontal stacked bar chart: one bar per label, one colour per part, legend above."""
    names = list(parts_by_name)
    if len(labels) == 0 or not names:
        return paragraph("(no data)", "note")
    go = _plotly()
    if go is None:
        return _svg_stacked_bar_chart(labels, parts_by_name, unit, width)
    ys = [str(lab) for lab in labels]
    fig = go.Figure([go.Bar(name=k, x=[_finite(v) for v in parts_by_name[k]], y=ys, orientation="h",
                            marker_color=PALETTE[j % len(PALETTE)],
                            hovertemplate=esc(k) + " %{y}: %{x:.4g} " + esc(unit) + "<extra></extra>")
                     for j, k in enumerate(names)])
    legend, legend_px = _legend_on_top(len(names))
    fig.update_layout(barmode="stack", legend=legend)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title_text=axis_title or unit, rangemode="tozero")
    return _figure_div(fig, 100 + legend_px + 28 * len(ys), legend_px)


def line_chart(series: dict[str, Sequence[float]], xs: Sequence[float] | None = None, unit: str = "",
               markers: Sequence[float] = (), width: int = 900, height: int = 260, x_title: str | None = None) -> str:
    """Return a line chart of one or more series (``unit`` titles the value axis); ``markers`` draws vertical
    lines at those x. ``x_title`` names the x axis (default: 'index' when ``xs`` is not given)."""
    names = list(series)
    if not names or not any(_finite(v) is not None for k in names for v in series[k]):
        return paragraph("(no data)", "note")
    go = _plotly()
    if go is None:
        return _svg_line_chart(series, xs, unit, markers, width, height)
    n = max(len(series[k]) for k in names)
    x = list(xs) if xs is not None else list(range(n))
    fig = go.Figure([go.Scatter(name=k, x=x[:len(series[k])], y=[_finite(v) for v in series[k]], mode="lines",
                                line={"color": PALETTE[j % len(PALETTE)], "width": 1.5})
                     for j, k in enumerate(names)])
    for m in markers:
        fig.add_vline(x=m, line={"color": "#e15759", "dash": "dash", "width": 1})
    legend, legend_px = _legend_on_top(len(names))
    fig.update_layout(legend=legend, showlegend=len(names) > 1 or bool(markers), hovermode="x unified")
    fig.update_xaxes(title_text=x_title if x_title is not None else ("" if xs is not None else "index"))
    fig.update_yaxes(title_text=unit)
    return _figure_div(fig, max(height, 200) + legend_px, legend_px if len(names) > 1 or markers else 0)


def grouped_bar_chart(labels: Sequence[str], series: dict[str, Sequence[float | None]], axis_title: str,
                      value_range: tuple[float, float] | None = None) -> str:
    """Return horizontal bars side by side: one group per label (first at the top), one bar and colour per series,
    legend above; ``axis_title`` names the value axis. Plotly only (as floating_bar_chart): without it, a note."""
    go = _plotly()
    names = list(series)
    if go is None or len(labels) == 0 or not names:
        return paragraph("(no data)" if go is not None else "(the chart needs plotly)", "note")
    ys = [str(lab) for lab in labels]
    fig = go.Figure([go.Bar(name=k, x=[_finite(v) for v in series[k]], y=ys,
                            orientation="h", marker_color=PALETTE[j % len(PALETTE)],
                            hovertemplate=esc(k) + " %{y}: %{x:.3g}<extra></extra>")
                     for j, k in enumerate(names)])
    legend, legend_px = _legend_on_top(len(names))
    fig.update_layout(barmode="group", legend=legend)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title_text=axis_title, range=list(value_range) if value_range else None, rangemode="tozero")
    return _figure_div(fig, 100 + legend_px + 14 * len(names) * len(ys), legend_px)


@dataclass(frozen=True, kw_only=True)
class Points:
    """One named series of a scatter chart: x and y values and a hover text for each point."""

    xs: Sequence[float]
    ys: Sequence[float]
    texts: Sequence[str]


def scatter_chart(series: dict[str, Points], x_title: str, y_title: str, diagonal: bool = False,
                  height: int = 480) -> str:
    """Return a scatter chart, one colour per series (legend above), hover showing each point's text; ``diagonal``
    draws the line y = x (a prediction against its truth). Plotly only (as floating_bar_chart): without it, a note."""
    go = _plotly()
    names = [k for k, p in series.items() if len(p.xs)]
    if go is None or not names:
        return paragraph("(no data)" if go is not None else "(the chart needs plotly)", "note")
    fig = go.Figure([go.Scatter(name=k, x=[_finite(v) for v in series[k].xs], y=[_finite(v) for v in series[k].ys],
                                text=list(series[k].texts), mode="markers",
                                marker={"color": PALETTE[j % len(PALETTE)], "size": 7, "opacity": 0.8},
                                hovertemplate="%{text}<br>%{x:.3g}, %{y:.3g}<extra></extra>")
                     for j, k in enumerate(names)])
    if diagonal:
        top = max([0.0] + [v for k in names for v in (*series[k].xs, *series[k].ys) if _finite(v) is not None])
        fig.add_trace(go.Scatter(name="y = x", x=[0.0, top], y=[0.0, top], mode="lines", hoverinfo="skip",
                                 line={"color": "#888", "dash": "dash", "width": 1}))
    legend, legend_px = _legend_on_top(len(names) + diagonal)
    fig.update_layout(legend=legend)
    fig.update_xaxes(title_text=x_title, rangemode="tozero")
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return _figure_div(fig, height + legend_px, legend_px)


def floating_bar_chart(labels: Sequence[str], lows: Sequence[float], highs: Sequence[float],
                       colors: Sequence[str], unit: str = "", height: int = 380) -> str:
    """Return vertical bars each spanning [low, high] (the steps of a waterfall), one colour per bar;
    ``unit`` titles the value axis. Plotly only: callers keep their own SVG where plotly is missing."""
    go = _plotly()
    if go is None or len(labels) == 0:
        return paragraph("(no data)", "note")
    names, seen = [], {}
    for lab in map(str, labels):  # a category axis merges equal labels
        seen[lab] = seen.get(lab, 0) + 1
        names.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    sizes = [_finite(h - lo) for lo, h in zip(lows, highs)]
    fig = go.Figure(go.Bar(x=names, y=sizes, base=[_finite(v) for v in lows], marker_color=list(colors),
                           text=[f"{v:.3g}" if v is not None else "" for v in sizes], textposition="outside",
                           cliponaxis=False, hovertemplate="%{x}: %{y:.4g} " + esc(unit) + "<extra></extra>"))
    fig.update_xaxes(type="category", tickangle=-40)
    fig.update_yaxes(title_text=unit, rangemode="tozero")
    return _figure_div(fig, height)


# ---- static SVG fallback (no plotly installed) ------------------------------------------------
# Every text is kept inside its SVG: label columns are sized to the longest label and the
# legend wraps to new rows (at ~7 px per character of 11 px text).
_CHAR_PX = 7


def _svg_bar_chart(labels, values, unit, width, color) -> str:
    n = len(values)
    row_h = 22
    shown = [str(lab)[:40] for lab in labels]
    value_txt = [f"{v:.3g} {unit}" for v in values]
    left = 12 + _CHAR_PX * max(len(t) for t in shown)
    right = 12 + _CHAR_PX * max(len(t) for t in value_txt)
    width = max(width, left + right + 100)
    vmax = max(max(values), 1e-12)
    inner = width - left - right
    parts = [f"<svg width='{width}' height='{n * row_h + 10}' role='img'>"]
    for i, (lab, v, t) in enumerate(zip(shown, values, value_txt)):
        y = 5 + i * row_h
        w = max(0.0, inner * v / vmax)
        parts.append(f"<text x='{left - 6}' y='{y + 14}' text-anchor='end'>{esc(lab)}</text>"
                     f"<rect x='{left}' y='{y + 3}' width='{w:.1f}' height='{row_h - 6}' fill='{color}'/>"
                     f"<text x='{left + w + 4:.1f}' y='{y + 14}'>{esc(t)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _svg_stacked_bar_chart(labels, parts_by_name, unit, width) -> str:
    names = list(parts_by_name)
    n = len(labels)
    row_h = 22
    shown = [str(lab)[:30] for lab in labels]
    totals = [sum(parts_by_name[k][i] for k in names) for i in range(n)]
    total_txt = [f"{t:.3g} {unit}" for t in totals]
    left = 12 + _CHAR_PX * max(len(t) for t in shown)
    right = 12 + _CHAR_PX * max(len(t) for t in total_txt)
    width = max(width, left + right + 100)
    vmax = max(max(totals), 1e-12)
    inner = width - left - right
    legend, lx, ly = [], 10, n * row_h + 20
    for j, k in enumerate(names):
        w = 14 + _CHAR_PX * len(k) + 16
        if lx + w > width and lx > 10:
            lx, ly = 10, ly + 18
        legend.append(f"<rect x='{lx}' y='{ly - 9}' width='10' height='10' fill='{PALETTE[j % len(PALETTE)]}'/>"
                      f"<text x='{lx + 14}' y='{ly}'>{esc(k)}</text>")
        lx += w
    out = [f"<svg width='{width}' height='{ly + 10}' role='img'>"]
    for i, lab in enumerate(shown):
        y, x = 5 + i * row_h, float(left)
        out.append(f"<text x='{left - 6}' y='{y + 14}' text-anchor='end'>{esc(lab)}</text>")
        for j, k in enumerate(names):
            w = max(inner * parts_by_name[k][i] / vmax, 0)
            out.append(f"<rect x='{x:.1f}' y='{y + 3}' width='{w:.1f}' height='{row_h - 6}' "
                       f"fill='{PALETTE[j % len(PALETTE)]}'><title>{esc(k)}: {parts_by_name[k][i]:.3g} {esc(unit)}"
                       f"</title></rect>")
            x += w
        out.append(f"<text x='{x + 4:.1f}' y='{y + 14}'>{esc(total_txt[i])}</text>")
    out += legend
    out.append("</svg>")
    return "".join(out)


def _svg_line_chart(series, xs, unit, markers, width, height) -> str:
    names = list(series)
    n = max(len(series[k]) for k in names)
    xs = list(xs) if xs is not None else list(range(n))
    allv = [v for k in names for v in series[k] if v == v]
    lo, hi = min(allv), max(allv)
    if hi == lo:
        hi = lo + 1.0
    x0, x1 = (min(xs), max(xs)) if len(xs) > 1 else (0.0, 1.0)
    if x1 == x0:
        x1 = x0 + 1
    left, bottom, top, right = 12 + _CHAR_PX * max(len(f"{hi:.3g}"), len(f"{lo:.3g}")), 25, 10, 10
    pw, ph = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + pw * (x - x0) / (x1 - x0)

    def py(v: float) -> float:
        return top + ph * (1 - (v - lo) / (hi - lo))

    out = [f"<svg width='{width}' height='{height}' role='img'>",
           f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#ccc'/>",
           f"<text x='{left - 4}' y='{top + 10}' text-anchor='end'>{hi:.3g}</text>",
           f"<text x='{left - 4}' y='{top + ph}' text-anchor='end'>{lo:.3g}</text>",
           f"<text x='{left}' y='{height - 6}'>{x0:.4g}</text>",
           f"<text x='{left + pw}' y='{height - 6}' text-anchor='end'>{x1:.4g}</text>"]
    for m in markers:
        out.append(f"<line x1='{px(m):.1f}' x2='{px(m):.1f}' y1='{top}' y2='{top + ph}' stroke='#e15759' "
                   f"stroke-dasharray='4,3'/>")
    for j, k in enumerate(names):
        pts = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, series[k]) if v == v)
        out.append(f"<polyline points='{pts}' fill='none' stroke='{PALETTE[j % len(PALETTE)]}' stroke-width='1.5'>"
                   f"<title>{esc(k)} ({esc(unit)})</title></polyline>")
    out.append("</svg>")
    return "".join(out)
