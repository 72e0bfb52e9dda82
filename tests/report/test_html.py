"""HTML reports are one self-contained file: no scripts, no external resources, data escaped."""

import re

from trainperf.report.html import Report, bar_chart, line_chart, stacked_bar_chart, table


def test_report_is_self_contained_and_escaped(tmp_path):
    rep = Report("Step <time>", "unit test")
    rep.add("Bars", bar_chart(["gemm", "nccl"], [3.0, 1.5], "ms"))
    rep.add("Stack", stacked_bar_chart(["rank0", "rank1"], {"compute": [1.0, 2.0], "idle": [0.5, 0.0]}, "s"))
    rep.add("Lines", line_chart({"a": [1.0, 2.0, float("nan"), 4.0]}, markers=[2]))
    rep.add("Table", table([["x<y", 1.23456]], ["name", "value"]))
    path = rep.write(tmp_path / "r.html")
    text = path.read_text()
    assert "<script" not in text
    assert not re.search(r"(src|href)=['\"]https?://", text)
    assert "Step &lt;time&gt;" in text and "x&lt;y" in text
    assert "1.23" in text and text.count("<svg") == 3


def test_bar_widths_are_proportional():
    svg = bar_chart(["a", "b"], [2.0, 1.0], width=700)
    widths = [float(w) for w in re.findall(r"<rect x='220' y='[\d.]+' width='([\d.]+)'", svg)]
    assert widths[0] == 2 * widths[1]  # 700 - 220 - 90 = 390 px for the largest value
    assert widths[0] == 390.0


def test_empty_inputs_say_no_data():
    assert "no data" in bar_chart([], [])
    assert "no data" in line_chart({})
