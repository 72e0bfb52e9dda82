"""The diagnose HTML report's cross-rank section (issue 14: a newcomer reads what it shows)."""

from types import SimpleNamespace

from trainperf.report.diagnose import write_report


def _diagnosis(caused_by_rank_us: dict, straggler_rank: int | None):
    return SimpleNamespace(path="traces/", ranks=[], notes=[], findings=[], modules=[], fix_order=[],
                           fix_all_gain_pct=0.0,
                           cross_rank={"caused_by_rank_us": caused_by_rank_us, "straggler_rank": straggler_rank,
                                       "straggler_caused_wait_us": max(caused_by_rank_us.values(), default=0.0),
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


def test_a_cpu_only_job_names_its_host_straggler_without_a_per_rank_chart(tmp_path, capsys):
    """CPU-only ranks (gloo) have no matched collectives: cross_rank holds the host straggler and no per-rank
    waits. The page raised KeyError 'caused_by_rank_us' (a traceback from `diagnose --html`); the terminal
    and the page now say the same."""
    from rich.console import Console

    from trainperf.diagnose.render import print_summary

    d = _diagnosis({}, 1)
    d.cross_rank = {"n_collectives_matched": 0, "straggler_rank": 1, "straggler_caused_wait_us": 1484.2e3,
                    "compute_imbalance_pct": 0.0, "host_straggler_rank": 1}
    section = _section(write_report(d, tmp_path / "d.html").read_text(), "Across ranks")
    assert "straggler rank 1 caused 1484.2 ms of waiting" in section and "<div" not in section
    con = Console(record=True, width=200)
    print_summary(d, con)
    assert "straggler rank 1 caused 1484.2 ms of waiting" in con.export_text()


def test_the_terminal_names_no_straggler_when_nobody_waited():
    """The terminal printed "straggler rank 0 caused 0.0 ms of waiting" on HTA's 2-rank demo trace."""
    from rich.console import Console

    from trainperf.diagnose.render import print_summary

    con = Console(record=True, width=200)
    print_summary(_diagnosis({"0": 0.0, "1": 0.0}, 0), con)
    out = con.export_text()
    assert "no rank waited on another, so no straggler" in out and "caused 0.0 ms" not in out
