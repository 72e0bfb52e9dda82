"""The diagnose HTML report's cross-rank section (issue 14: a newcomer reads what it shows)."""

from types import SimpleNamespace

from trainperf.report.diagnose import write_report


def _diagnosis(caused_by_rank_us: dict, straggler_rank: int | None):
    return SimpleNamespace(path="traces/", ranks=[], notes=[], findings=[], modules=[], fix_order=[],
                           fix_all_gain_pct=0.0,
                           cross_rank={"caused_by_rank_us": caused_by_rank_us, "straggler_rank": straggler_rank,
                                       "n_collectives_matched": 0 if not any(caused_by_rank_us.values()) else 12,
                                       "compute_imbalance_pct": 12.1})


def _section(html: str, title: str) -> str:
    start = html.index(f">{title}<")
    nxt = html.find("<h2", start)
    return html[start:nxt if nxt > 0 else len(html)]


def test_no_waiting_names_no_straggler_and_draws_no_empty_chart(tmp_path):
    """On HTA's 2-rank trace no collective matched and no rank waited: the page said "straggler rank 0"
    above an empty chart whose axis read 10µ ... 70µ ms."""
    html = write_report(_diagnosis({"0": 0.0, "1": 0.0}, 0), tmp_path / "d.html").read_text()
    section = _section(html, "Across ranks")
    assert "straggler rank" not in section
    assert "no rank waited on another" in section
    assert "<div" not in section.split("no rank waited on another", 1)[1]  # no chart after the sentence


def test_a_straggler_that_made_others_wait_is_named_with_its_chart(tmp_path):
    html = write_report(_diagnosis({"0": 0.0, "1": 5300.0}, 1), tmp_path / "d.html").read_text()
    section = _section(html, "Across ranks")
    assert "straggler rank 1" in section and "5.3 ms" in section
    assert "ms of others" in section  # the chart's axis
