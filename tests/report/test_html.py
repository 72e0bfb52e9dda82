"""HTML reports are one self-contained file: Plotly charts (the library inlined, no network) or,
without plotly installed, static SVG; data escaped; chart values are the values given."""

import json
import re

import pytest

from trainperf.report import html as H
from trainperf.report.html import Report, bar_chart, line_chart, stacked_bar_chart, table


@pytest.fixture(params=["plotly", "svg"])
def backend(request, monkeypatch):
    if request.param == "plotly":
        pytest.importorskip("plotly")
    else:
        monkeypatch.setattr(H, "_plotly", lambda: None)
    assert H.charts_backend() == request.param
    return request.param


def _figures(text: str) -> list[dict]:
    """The Plotly figures a page carries (the JSON in each chart div's data-figure attribute)."""
    import html

    return [json.loads(html.unescape(m)) for m in re.findall(r"data-figure='([^']*)'", text)]


def test_report_is_self_contained_and_escaped(tmp_path, backend):
    rep = Report("Step <time>", "unit test")
    rep.add("Bars", bar_chart(["gemm", "nccl"], [3.0, 1.5], "ms"))
    rep.add("Stack", stacked_bar_chart(["rank0", "rank1"], {"compute": [1.0, 2.0], "idle": [0.5, 0.0]}, "s"))
    rep.add("Lines", line_chart({"a": [1.0, 2.0, float("nan"), 4.0]}, markers=[2]))
    rep.add("Table", table([["x<y", 1.23456]], ["name", "value"]))
    text = rep.write(tmp_path / "r.html").read_text()
    page = text.replace(H._plotly_js(), "") if backend == "plotly" else text  # the page around the library
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)  # nothing fetched from the network
    assert "<script src" not in page and "<link" not in page
    assert "Step &lt;time&gt;" in text and "x&lt;y" in text and "1.23" in text
    if backend == "plotly":
        assert len(_figures(text)) == 3 and text.count("Plotly.newPlot") >= 1
        assert len(text) > 1_000_000  # plotly.js itself is inlined
    else:
        assert text.count("<svg") == 3 and "<script" not in text


def test_plotly_figures_carry_the_values_units_and_order():
    pytest.importorskip("plotly")
    bar, stack, line = (_figures(x)[0] for x in (
        bar_chart(["gemm", "nccl"], [3.0, 1.5], "ms"),
        stacked_bar_chart(["rank0", "rank1"], {"compute": [1.0, 2.0], "idle": [0.5, float("nan")]}, "s"),
        line_chart({"loss": [4.0, 3.0, float("nan"), 2.0]}, xs=[10, 11, 12, 13], unit="nats", markers=[12])))
    assert bar["data"][0]["x"] == [3.0, 1.5] and bar["data"][0]["y"] == ["gemm", "nccl"]
    assert bar["layout"]["xaxis"]["title"]["text"] == "ms" and bar["layout"]["yaxis"]["autorange"] == "reversed"
    assert stack["layout"]["barmode"] == "stack" and [t["name"] for t in stack["data"]] == ["compute", "idle"]
    assert stack["data"][1]["x"] == [0.5, None]  # NaN is a gap, never a number in the JSON
    assert line["data"][0]["x"] == [10, 11, 12, 13] and line["data"][0]["y"] == [4.0, 3.0, None, 2.0]
    assert line["layout"]["yaxis"]["title"]["text"] == "nats"
    assert [s["x0"] for s in line["layout"]["shapes"]] == [12]


def test_svg_bar_widths_are_proportional(monkeypatch):
    monkeypatch.setattr(H, "_plotly", lambda: None)
    svg = bar_chart(["a", "b"], [2.0, 1.0], width=700)
    widths = [float(w) for w in re.findall(r"<rect x='\d+' y='[\d.]+' width='([\d.]+)'", svg)]
    assert widths[0] == pytest.approx(2 * widths[1])


def test_svg_legend_wraps_inside_the_chart(monkeypatch):
    """Defect 6 of issue 14: legend entries ran past the SVG's right edge."""
    monkeypatch.setattr(H, "_plotly", lambda: None)
    names = [f"a rather long part name {i}" for i in range(8)]
    svg = stacked_bar_chart(["r0"], {n: [1.0] for n in names}, "ms", width=700)
    width = int(re.search(r"<svg width='(\d+)'", svg).group(1))
    for x, text in re.findall(r"<text x='([\d.]+)' y='[\d.]+'>([^<]*)</text>", svg):
        assert float(x) + H._CHAR_PX * len(text) <= width, text


def test_empty_inputs_say_no_data(backend):
    assert "no data" in bar_chart([], [])
    assert "no data" in line_chart({})
    assert "no data" in line_chart({"a": [float("nan")]})
    assert "no data" in stacked_bar_chart([], {})


@pytest.fixture
def fresh_bundles():
    H._basic_js.cache_clear()
    H._plotly_js.cache_clear()
    yield
    H._basic_js.cache_clear()
    H._plotly_js.cache_clear()


def test_pages_inline_plotlys_basic_bundle_a_quarter_of_the_full_one(tmp_path, fresh_bundles):
    """Issue 14: a 4.8 MB page per report. Plotly's official basic bundle (bar, pie, scatter) draws every
    chart trainperf makes; the page stays one offline file."""
    plotly = pytest.importorskip("plotly.offline")
    version = plotly.get_plotlyjs_version()
    page = Report("t").add("c", bar_chart(["a"], [1.0], "ms"), line_chart({"a": [1.0, 2.0]})).render()
    assert f"plotly.js (basic - minified) v{version}\n" in page
    assert f"plotly.js v{version}\n" not in page  # not the full bundle as well
    full = len(plotly.get_plotlyjs())
    assert len(page) < 1_500_000 < full / 3  # 1.2 MB against 4.8 MB (docs/benchmarks.md)
    assert (H.BASIC_BUNDLE.parent / "plotly-basic.LICENSE.txt").read_text().startswith("MIT License")


def test_a_trace_outside_the_basic_bundle_gets_the_full_bundle(fresh_bundles, monkeypatch):
    plotly = pytest.importorskip("plotly.offline")
    go = pytest.importorskip("plotly.graph_objects")
    version = plotly.get_plotlyjs_version()
    heat = H._figure_div(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])), 200)
    page = Report("t").add("c", bar_chart(["a"], [1.0], "ms"), heat).render()
    assert f"plotly.js v{version}\n" in page and "(basic - minified)" not in page
    # a plotly package that writes figures for another plotly.js than the vendored one: the full bundle
    H._basic_js.cache_clear()
    H._plotly_js.cache_clear()
    monkeypatch.setattr(plotly, "get_plotlyjs_version", lambda: "0.0.1")
    page = Report("t").add("c", bar_chart(["a"], [1.0], "ms")).render()
    assert f"plotly.js v{version}\n" in page and "(basic - minified)" not in page


def test_bar_labels_keep_room_where_bars_of_both_signs_share_the_axis():
    # hand-worked: a label of n characters takes (7 n + 12) / 500 of the plot's width
    assert H.label_room([3.0, 1.5, 0.0], ["3 ms", "1.5 ms", "0 ms"]) is None  # one sign: the longest bar holds its label
    assert H.label_room([-3.0, -1.5], ["-3 ms", "-1.5 ms"]) is None
    vals = [-2735063.0, -847894.0, 31190.0, 6803.0]  # the demo's diff: one short increase among decreases
    texts = [f"{v:.3g} µs" for v in vals]
    lo, hi = H.label_room(vals, texts)
    frac = (7 * max(len(t) for t in texts) + 12) / 500
    assert lo == min(vals) and hi == pytest.approx(31190.0 + frac * (hi - lo), rel=1e-3)
    lo, hi = H.label_room([2.0e6, -5.0e3], ["2e+06 µs", "-5e+03 µs"])  # mirrored: room on the left
    assert hi == 2.0e6 and lo == pytest.approx(-5.0e3 - (7 * 9 + 12) / 500 * (hi - lo), rel=1e-3)
    if H.charts_backend() == "plotly":
        fig = _figures(bar_chart(["a", "b"], vals[:1] + vals[2:3], "µs"))[0]
        assert fig["layout"]["xaxis"]["range"][1] > 31190.0
