"""A gain priced without replay below MIN_GAIN_PCT (one that rounds to 0.0 % among them) is no finding, as a replayed fix's; an unpriced one says so; the HTML shows no '#-' (issue 14)."""

from trainperf.diagnose import findings as F
from trainperf.diagnose.api import Diagnosis
from trainperf.diagnose.render import gain_text
from trainperf.report.diagnose import write_report


def _no_replay(changes):
    return 0.0, 0.0


def test_host_only_gain_rounding_to_zero_is_dismissed_not_listed():
    zero = F.make("data_loader_stall", [0], [1], {"x": (1, "us")}, gain_pct=0.04, gain_us=1.0,
                  what_if="remove the DataLoader wait (host only: upper bound)")
    real = F.make("checkpoint_stall", [0], [1], {"x": (1, "us")}, gain_pct=3.0, gain_us=90.0,
                  what_if="remove the checkpoint wait (host only: upper bound)")
    ranked, plan = F.rank_by_marginal_gain([zero, real], _no_replay)
    assert [f.kind for f in ranked] == ["checkpoint_stall"]
    assert "data_loader_stall" in plan.dismissed


def test_host_only_gain_below_the_least_worth_a_fix_is_dismissed_as_a_replayed_one():
    """MIN_GAIN_PCT is 0.5 %: a host-only straggler gaining 0.3 % (it reads "gain ≈ 0.3%") is dismissed as a replayed
    fix gaining 0.3 % is; one gaining 0.6 % is listed."""
    assert F.MIN_GAIN_PCT == 0.5
    small = F.make("straggler", [0], [1], {"x": (1, "us")}, gain_pct=0.3, gain_us=9.0, what_if="no rank waits")
    kept = F.make("checkpoint_stall", [0], [1], {"x": (1, "us")}, gain_pct=0.6, gain_us=18.0,
                  what_if="remove the checkpoint wait (host only: upper bound)")
    ranked, plan = F.rank_by_marginal_gain([small, kept], _no_replay)
    assert [f.kind for f in ranked] == ["checkpoint_stall"] and plan.dismissed == ["straggler"]


def test_unpriced_finding_is_kept_and_reads_not_estimated_and_html_has_no_dash_order(tmp_path):
    unpriced = F.make("memory_bound_unfused", [0], [1], {"x": (1, "%")},
                      what_if="not priced: the achieved bandwidth needs the operators' shapes")
    ranked, plan = F.rank_by_marginal_gain([unpriced], _no_replay)
    assert ranked == [unpriced] and not plan.order
    assert "≈" not in gain_text(unpriced) and "not estimated" in gain_text(unpriced)
    d = Diagnosis(path="t.json", ranks=[], findings=ranked, cross_rank={}, fix_all_gain_pct=0.0, fix_order=plan.order)
    html = write_report(d, tmp_path / "r.html").read_text()
    assert "#-" not in html and "in the order -" not in html and "0.0%" not in html.split("memory_bound_unfused")[1][:200]
