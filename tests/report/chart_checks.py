"""Checks of the charts in a report page, for the tests of every verb that writes one.

`"<svg" in page` proved nothing (Plotly's own JavaScript contains "<svg"): these look at each chart.
That the charts then render and nothing is clipped is checked in headless Chromium by
tests/report/test_report_browser.py, on every report type at once.
"""

from __future__ import annotations

import html
import json
import re

from trainperf.report.html import CHART_CLASS, charts_backend

_PLOTLY_DIV = re.compile(rf"<div class='{CHART_CLASS}[^']*'[^>]*data-figure='([^']*)'>")
_SVG = re.compile(r"<svg [^>]*role='img'>(.*?)</svg>", re.S)


def _has_values(trace: dict) -> bool:
    for axis in ("x", "y", "values"):
        vals = trace.get(axis)
        if isinstance(vals, list) and any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return True
    return False


def plotly_figures(page: str) -> list[dict]:
    """The Plotly figures a page carries (the JSON of each chart div), in page order."""
    return [json.loads(html.unescape(m)) for m in _PLOTLY_DIV.findall(page)]


def assert_charts(page: str, at_least: int = 1) -> list[dict]:
    """Assert that ``page`` holds at least ``at_least`` charts, each with data to draw; return the Plotly figures.

    With plotly installed: every chart is a trainperf-chart div whose figure has traces with numbers and
    titled value axes, the page inlines Plotly and draws the divs (Plotly.newPlot), and no hand-drawn
    SVG chart is left. Without plotly: SVG charts with marks (bars, lines)."""
    assert page.startswith("<!doctype html>"), page[:80]
    if charts_backend() == "plotly":
        figures = plotly_figures(page)
        assert len(figures) >= at_least, f"{len(figures)} Plotly chart(s), expected at least {at_least}"
        assert "Plotly.newPlot" in page and re.search(r"plotly\.js \([^)]*\) v\d|plotly\.js v\d", page), \
            "the page does not inline Plotly"
        assert not _SVG.search(page), "a hand-drawn SVG chart is left beside the Plotly ones"
        for i, fig in enumerate(figures):
            assert fig["data"] and all(_has_values(t) for t in fig["data"]), f"chart {i} has no numbers: {fig['data']}"
            if any(t.get("type") in ("bar", "scatter", None) for t in fig["data"]):
                layout = fig["layout"]
                titles = [layout.get(ax, {}).get("title", {}).get("text") for ax in ("xaxis", "yaxis")]
                assert any(titles), f"chart {i}: no axis title (unit)"
        return figures
    svgs = _SVG.findall(page)
    assert len(svgs) >= at_least, f"{len(svgs)} SVG chart(s), expected at least {at_least}"
    assert all(re.search(r"<(rect|polyline)", s) for s in svgs), "an SVG chart without bars or lines"
    return []
