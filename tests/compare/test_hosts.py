"""A and B on different hosts: the hosts' term of compare's interval (issue 13), against the unbalanced
one-way ANOVA worked by hand, the hosts' share weights by hand, and simulated fleets whose hosts differ
by a known amount."""

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from trainperf.compare import compare_runs
from trainperf.compare.history import between_floor, host_mix, host_offset, host_spread, host_term, hosts_between
from trainperf.compare.interval import (DEFAULT_BETWEEN, BetweenRun, HostSpread, long_run_variance, repeats_shift,
                                        series_shift)
from trainperf.compare.report import perf_rows
from trainperf.store import RunRecord, StepSample, write_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_between import _ar1, _run  # noqa: E402


def test_host_spread_is_the_unbalanced_anova_estimate():
    """By hand, one configuration: host X runs 0.00, 0.02; Y 0.10, 0.12; Z 0.05 (log levels). Grand mean
    0.058; SSB = 2(0.048^2) + 2(0.052^2) + 0.008^2 = 0.01008 over 2 df; SSW = 4 x 0.01^2 = 0.0004 over 2 df;
    n0 = (5 - 9/5) / 2 = 1.6; sigma^2 = (0.00504 - 0.0002) / 1.6 = 0.003025 (5.5%); Satterthwaite df
    0.00484^2 / (0.00504^2 / 2 + 0.0002^2 / 2) = 1.84."""
    g = {"c": {"X": [(0.00, 1e-9), (0.02, 1e-9)], "Y": [(0.10, 1e-9), (0.12, 1e-9)], "Z": [(0.05, 1e-9)]},
         "one host only": {"X": [(9.0, 1e-9), (9.1, 1e-9)]}}  # says nothing about hosts
    sigma2, df, hosts, configs = host_spread(g)
    assert sigma2 == pytest.approx(0.003025) and df == pytest.approx(0.00484**2 / (0.00504**2 / 2 + 0.0002**2 / 2))
    assert (hosts, configs) == (3, 1)
    # one run a host: MSW is the one-host between-run variance given plus the runs' own noise
    single = {"c": {"X": [(0.00, 1e-4)], "Y": [(0.10, 1e-4)]}}  # MSB = 2 x 0.05^2 = 0.005, n0 = 1
    assert host_spread(single, within=0.0004)[0] == pytest.approx(0.005 - 0.0004 - 1e-4)
    assert host_spread({"c": {"X": [(0.0, 1e-4), (0.1, 1e-4)]}}) == (0.0, 0.0, 0, 0)


def _sides(hosts_a, hosts_b):
    return ([_run(np.full(20, 0.1), host=h) for h in hosts_a], [_run(np.full(20, 0.1), host=h) for h in hosts_b])


def test_host_mix_weights_by_hand():
    """sum over hosts of (B's share - A's share)^2: one run a side on two hosts 2; the same hosts in the
    same shares 0; A on X and Y, B on Y only (0 - 1/2)^2 + (1 - 1/2)^2 = 0.5."""
    assert host_mix(*_sides(["X"], ["Y"])) == 2.0
    assert host_mix(*_sides(["X", "X"], ["Y", "Y"])) == 2.0
    assert host_mix(*_sides(["X", "Y"], ["Y", "X"])) == 0.0
    assert host_mix(*_sides(["X", "Y"], ["Y"])) == 0.5
    assert host_mix(*_sides(["X"], ["X"])) == 0.0


def test_the_hosts_term_adds_weight_times_its_variance():
    """Reference: Var = steps' terms + 2 tau^2 + weight x sigma_host^2 (one run a side), and the repeats'
    pooled-t variance + weight x sigma_host^2, each by hand."""
    rng = np.random.default_rng(0)
    a, b = 1 + 0.01 * _ar1(rng, 80)[0], 1 + 0.01 * _ar1(rng, 80)[0]
    va, vb = long_run_variance(a), long_run_variance(b)
    steps = va.variance / (80 * va.mean**2) + vb.variance / (80 * vb.mean**2)
    hosts = HostSpread(cv=0.02, df=math.inf, source="test", weight=2.0)
    sh = series_shift(a, b, between=BetweenRun(cv=0.01, df=math.inf, source="t", hosts=hosts))
    assert sh.se == pytest.approx(math.sqrt(steps + 2 * 0.01**2 + 2 * 0.02**2))
    assert "hosts that differ by 2% (from test)" in sh.method
    means_a, means_b = [1.00, 1.02, 0.99], [1.05, 1.06, 1.04]
    la, lb = np.log(means_a), np.log(means_b)
    ss = ((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()
    rep = repeats_shift(means_a, means_b, hosts=hosts)
    assert rep.se == pytest.approx(math.sqrt(ss / 4 * (2 / 3) + 2 * 0.02**2))
    assert repeats_shift(means_a, means_b).se == pytest.approx(math.sqrt(ss / 4 * (2 / 3)))


def _record(store, run_id, level, rng, host, n=40, model="tiny"):
    st = level * (1 + 0.002 * rng.normal(size=n))
    write_run(RunRecord(run_id=run_id, job="train", host=host, gpu_model="cpu", model=model, layout="mbs=1",
                        started_at=1000.0, config={"comparable": {"kernels": False}},
                        samples=[StepSample(i + 1, float(s), tokens_per_s=256 / float(s)) for i, s in enumerate(st)]),
              store)


def test_different_hosts_and_no_store_runs_across_hosts_is_inconclusive(tmp_path):
    """The same code on two hosts, 5% apart, one run a side, nothing in the store: compare cannot tell the
    hosts from a change and says so (no 'slower'), as does the gate; on one host the same runs are called."""
    from trainperf.fleet.gate import RunSeries, compare, steady_samples

    rng = np.random.default_rng(1)
    x = 0.1 * (1 + 0.01 * _ar1(rng, 50, reps=2))
    a, b = _run(x[0], name="a", host="node1"), _run(1.05 * x[1], name="b", host="node2")
    c = compare_runs([a], [b], store=str(tmp_path / "none"))
    assert c.perf.verdict == "inconclusive" and c.perf.hosts == (("node1",), ("node2",)) and c.perf.hosts_cv is None
    assert f"cannot be told from its host's ({c.perf.throughput.change:+.1%} on node2 against node1" in c.headline
    assert c.perf.throughput.change == pytest.approx(1 / 1.05 - 1, abs=0.01)
    assert "a difference of hosts cannot be told from the change (were the hosts alike, the 95% interval" in c.perf.note
    assert perf_rows(c)[1][3].endswith("(hosts differ)")  # not [..]: rich reads brackets as markup
    assert "a between-run term of 0.75% a run taken from the stated default" in c.perf.note
    d = c.to_dict()["performance"]["throughput"]
    assert d["lo"] is None and d["hi"] is None
    side = {r.name: RunSeries(names=[r.name], series=[steady_samples(r, "step_time")], runs=[r],
                              store=str(tmp_path / "none")) for r in (a, b)}
    g = compare(side["a"], side["b"], metric="step_time")
    assert g.verdict == "inconclusive" and g.reason.startswith("A ran on node1, B on node2, and the store holds no runs")
    # both verbs' JSON say an unbounded interval as null (strict JSON: no Infinity or NaN)
    import json

    from trainperf.cli_options import dumps

    def strict(doc):
        return json.loads(dumps(doc), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))

    assert strict(g.to_dict())["effect_ci"] == [None, None] and strict(g.to_dict())["effect"] is None
    assert strict(c.to_dict())["performance"]["step_time"]["hi"] is None
    b.host = "node1"
    assert compare_runs([a], [b], store=str(tmp_path / "none")).perf.verdict == "slower"


def test_host_offset_is_the_two_way_least_squares_contrast():
    """By hand: configuration c1 on X (0.00, 0.02) and Y (0.10, 0.12); c2 on Y (0.30) and Z (0.35). Log
    level = configuration + host: Y - X = 0.11 - 0.01 = 0.10 (c1), Z - Y = 0.05 (c2), so Z - X = 0.15.
    Pure error: c1's replicates, 4 x 0.01^2 = 0.0004 over 2 df, 0.0002; no lack-of-fit df (each link is
    one configuration); Var(Z - X) = 0.0002 (1/2 + 1/2) + 0.0002 (1 + 1) = 0.0006. X and W (c3) are not
    linked: None."""
    g = {"c1": {"X": [(0.00, 1e-9), (0.02, 1e-9)], "Y": [(0.10, 1e-9), (0.12, 1e-9)]},
         "c2": {"Y": [(0.30, 1e-9)], "Z": [(0.35, 1e-9)]}, "c3": {"V": [(1.0, 1e-9)], "W": [(1.2, 1e-9)]}}
    off = host_offset(g, {"X": -1.0, "Z": 1.0}, within=0.0001, within_df=math.inf)
    assert off.offset == pytest.approx(0.15) and off.variance == pytest.approx(0.0006)
    assert (off.df, off.per_config, off.hosts, off.configs) == (2, 0.0, 5, 3)
    assert host_offset(g, {"X": -1.0, "W": 1.0}, 0.0001, math.inf) is None  # no shared configuration links them
    assert host_offset(g, {"X": -1.0, "U": 1.0}, 0.0001, math.inf) is None  # U never ran
    # one run a host of one configuration: no residual, so the variance is within + the runs', at within's df
    one = host_offset({"c": {"X": [(0.0, 1e-4)], "Y": [(0.05, 1e-4)]}}, {"X": -1.0, "Y": 1.0}, 0.0004, 6.0)
    assert (one.offset, one.df, one.per_config) == (pytest.approx(0.05), 6.0, 0.0)
    assert one.variance == pytest.approx(2 * (0.0004 + 1e-4))
    # two configurations on X and Y, one run each: the offsets 0.10 and 0.14 disagree. Lack of fit: residuals
    # +-0.01 in 4 cells, 0.0004 over 1 df; per configuration (0.0004 - (0.0001 + 1e-9)) / 1; the offset's
    # variance is that of the mean of two offsets, by hand: var(0.10, 0.14) / 2 = 0.0008 / 2 = 0.0004. The
    # sum 0.0004 + 2 x per configuration = 3 x 0.0004 - 2 x 0.0001 (mean squares), Satterthwaite's df
    # 0.001^2 / (0.0012^2 / 1 + 0): 0.69
    two = host_offset({"c1": {"X": [(0.0, 1e-9)], "Y": [(0.10, 1e-9)]}, "c2": {"X": [(0.5, 1e-9)], "Y": [(0.64, 1e-9)]}},
                      {"X": -1.0, "Y": 1.0}, 0.0001, math.inf)
    assert two.offset == pytest.approx(0.12) and two.variance == pytest.approx(0.0004)
    assert two.per_config == pytest.approx(0.0003 - 1e-9) and two.df == pytest.approx(0.001**2 / 0.0012**2, rel=1e-5)
    # host_term: the offset when linked, else the spread of hosts of the kind
    assert host_term(g, {"X": -1.0, "Z": 1.0}).paired
    spread = host_term(g, {"X": -1.0, "W": 1.0})
    assert not spread.paired and spread.offset == 0.0 and spread.known


def _six_hosts(store, rng) -> dict[str, float]:
    """Write two runs of one configuration on each of six hosts n0..n5 at 0.100 x (1 + m), m = -3, -1, 0, 1,
    2, 3%; return m by host."""
    m = {f"n{i}": v for i, v in enumerate([-0.03, -0.01, 0.0, 0.01, 0.02, 0.03])}
    for h, v in m.items():
        for k in range(2):
            _record(store, f"{h}-{k}", 0.1 * (1 + v), rng, h)
    return m


def test_the_offset_of_the_compared_hosts_corrects_the_change(tmp_path):
    """The compared hosts are in the store: host n5 is 0.100 x 1.03, n0 0.100 x 0.97 (two runs of one
    configuration each, 0.2% step noise). The same code on n0 and n5 is 6.2% apart in time per token; the
    offset log(1.03 / 0.97) is taken off, so compare calls it inside the noise with a change near 0, and
    a B 5% slower in time (same hosts) is called slower by about 1 - 1/1.05."""
    rng = np.random.default_rng(4)
    store = str(tmp_path / "store")
    m = _six_hosts(store, rng)
    a = _run(0.097 * (1 + 0.01 * _ar1(rng, 50)[0]), name="a", run_id="a", host="n0")
    b = _run(0.103 * (1 + 0.01 * _ar1(rng, 50)[0]), name="b", run_id="b", host="n5")
    got = hosts_between([a], [b], store)
    assert got.paired and got.offset == pytest.approx(math.log(1.03 / 0.97), abs=0.003) and got.weight == 2.0
    assert "1 configuration(s) on 6 linked hosts" in got.source
    c = compare_runs([a], [b], store=store)
    assert c.perf.verdict == "inside the noise" and abs(c.perf.throughput.change) < 0.01
    assert "less B's hosts' offset of +6." in c.perf.throughput.method
    slow = _run(1.05 * b.step_time_s, name="slow", run_id="slow", host="n5")
    c = compare_runs([a], [slow], store=store)
    assert c.perf.verdict == "slower" and c.perf.throughput.change == pytest.approx(1 / 1.05 - 1, abs=0.01)
    assert c.perf.hosts_offset == pytest.approx(1.03 / 0.97 - 1, abs=0.003)
    assert f"net of B's hosts' {c.perf.hosts_offset:+.1%} in time per token against A's (from the store)" in c.headline
    assert c.perf.step_time.change == pytest.approx(0.05, abs=0.01)  # the step time's change is net of it too


def test_the_store_measures_how_much_hosts_differ(tmp_path):
    """Six hosts whose levels are 0.100 x (1 + m), m = -3, -1, 0, 1, 2, 3%, two runs of one configuration
    each (0.2% step noise): the estimate follows the ANOVA of their log levels by hand; a compared pair on
    two other hosts of the kind then gets that term, and the verdict says where it came from."""
    rng = np.random.default_rng(2)
    store = str(tmp_path / "store")
    m = _six_hosts(store, rng)
    lv = np.log(1 + np.array(list(m.values())))
    by_hand = ((lv - lv.mean()) ** 2).sum() / 5  # two runs a host at the same level: MSB / 2 = the hosts' variance
    a = _run(0.1 * (1 + 0.01 * _ar1(rng, 50)[0]), name="a", run_id="a", host="n6")
    b = _run(0.1 * (1 + 0.01 * _ar1(rng, 50)[0]), name="b", run_id="b", host="n7")
    got = hosts_between([a], [b], store)
    assert not got.paired and got.cv == pytest.approx(math.sqrt(by_hand), rel=0.05) and got.weight == 2.0
    assert "1 configuration(s) on 6 hosts" in got.source
    floor = between_floor([a], [b], store)
    assert floor.hosts == got
    c = compare_runs([a], [b], store=store)
    assert c.perf.verdict != "inconclusive" and c.perf.hosts_cv == pytest.approx(got.cv)
    assert "A and B ran on different hosts: the interval includes hosts that differ by" in c.perf.note
    assert hosts_between([a], [_run(a.step_time_s, name="b2", host="n6")], store) is None  # same host: no term


def test_simulated_fleets_a_a_across_hosts():
    """Simulated fleets (hosts differ by 2%; within a host runs differ by 0.25%; 1% AR(1) step noise, 50
    steps), the store holding 2 runs on each of 6 hosts: one run a side on two other hosts is called
    faster/slower in most A/A pairs without the hosts' term and in at most ~7% with it (200 pairs:
    standard error 1.5% at 5%)."""
    rng = np.random.default_rng(3)
    trials, calls_before, calls_after = 200, 0, 0
    for _ in range(trials):
        mh = rng.normal(0, 0.02, 8)
        levels = {f"h{i}": [(mh[i] + rng.normal(0, 0.0025), 2e-6) for _ in range(2)] for i in range(6)}
        sigma2, df, _, _ = host_spread({"c": levels})
        x = 1 + 0.01 * _ar1(rng, 50, reps=2)
        a, b = x[0] * math.exp(mh[6] + rng.normal(0, 0.0025)), x[1] * math.exp(mh[7] + rng.normal(0, 0.0025))
        before = series_shift(a, b, between=DEFAULT_BETWEEN)
        hosts = HostSpread(cv=math.sqrt(sigma2), df=df, source="sim", weight=2.0)
        after = series_shift(a, b, between=BetweenRun(cv=DEFAULT_BETWEEN.cv, df=math.inf, source="d", hosts=hosts))
        calls_before += not (before.lo < 0 < before.hi)
        calls_after += not (after.lo < 0 < after.hi)
    assert calls_before / trials > 0.3 and calls_after / trials <= 0.07


def test_interval_ends_and_text_by_hand():
    """One rule for both verbs: an end at -100% or beyond, infinite or NaN is unbounded (None); else the
    interval prints as [lo, hi] in percent."""
    from trainperf.compare.interval import interval_ends, interval_text

    assert interval_ends(-0.012, 0.034) == (-0.012, 0.034)
    assert interval_ends(-1.0, math.inf) == (None, None) and interval_ends(float("nan"), 0.1) == (None, 0.1)
    assert interval_text(-0.012, 0.034) == "[-1.2%, +3.4%]" and interval_text(-0.012, 0.034, digits=2) == "[-1.20%, +3.40%]"
    assert interval_text(-1.0, 0.5) is None


def test_between_floor_reads_the_store_once_for_both_terms(tmp_path, monkeypatch):
    """Repeats on the compared hosts (history) and runs across hosts (the hosts' term) in one store:
    between_floor reads the run rows once and the samples once (2 read_runs calls; it made 6 before), and
    gives the same terms as history_between and hosts_between reading the store each on their own."""
    import trainperf.store as store_mod
    from trainperf.compare.history import history_between

    rng = np.random.default_rng(6)
    store = str(tmp_path / "store")
    for i, h in enumerate(["n0", "n1", "n2"]):
        for k in range(3):
            _record(store, f"{h}-{k}", 0.1 * (1 + 0.01 * i), rng, h)
    a = _run(0.1 * (1 + 0.01 * _ar1(rng, 50)[0]), name="a", run_id="a", host="n0")
    b = _run(0.101 * (1 + 0.01 * _ar1(rng, 50)[0]), name="b", run_id="b", host="n1")
    alone = (history_between({"n0", "n1"}, {"a", "b"}, store), hosts_between([a], [b], store,
                                                                            history_between({"n0", "n1"}, {"a", "b"}, store)))
    calls, real = [], store_mod.read_runs
    monkeypatch.setattr(store_mod, "read_runs", lambda *x, **k: calls.append(k) or real(*x, **k))
    floor = between_floor([a], [b], store)
    assert len(calls) == 2 and calls[0].get("samples") is False and len(calls[1]["run_ids"]) == 9
    assert (dataclasses.replace(floor, hosts=None), floor.hosts) == alone and floor.hosts.paired


def test_a_measured_offset_is_taken_off_and_its_variance_added():
    """Reference, by hand: estimate = log mean B - log mean A - offset; Var = steps' terms + 2 tau^2 + weight x
    cv^2 + offset_var; with caps_df (a per-configuration term read from few runs) the t's df is at most the
    hosts' df, else Welch-Satterthwaite's."""
    rng = np.random.default_rng(7)
    a, b = 1 + 0.01 * _ar1(rng, 80)[0], 1.03 * (1 + 0.01 * _ar1(rng, 80)[0])
    va, vb = long_run_variance(a), long_run_variance(b)
    steps = va.variance / (80 * va.mean**2) + vb.variance / (80 * vb.mean**2)
    hosts = HostSpread(cv=0.004, df=3.0, source="test", weight=2.0, offset=0.02, offset_var=1e-5, paired=True)
    sh = series_shift(a, b, between=BetweenRun(cv=0.01, df=math.inf, source="t", hosts=hosts))
    assert sh.estimate == pytest.approx(math.log(vb.mean / va.mean) - 0.02)
    assert sh.se == pytest.approx(math.sqrt(steps + 2 * 0.01**2 + 2 * 0.004**2 + 1e-5)) and sh.df > 3
    assert "less B's hosts' offset of +2.02% in time per token against A's" in sh.method
    capped = series_shift(a, b, between=BetweenRun(cv=0.01, df=math.inf, source="t",
                                                   hosts=dataclasses.replace(hosts, caps_df=True)))
    assert capped.df == 3.0 and capped.se == sh.se
    # repeats: the pooled t over run means, net of the offset, plus the same hosts' variance
    means_a, means_b = [1.00, 1.02, 0.99], [1.05, 1.06, 1.04]
    la, lb = np.log(means_a), np.log(means_b)
    ss = ((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()
    rep = repeats_shift(means_a, means_b, hosts=hosts)
    assert rep.estimate == pytest.approx(lb.mean() - la.mean() - 0.02)
    assert rep.se == pytest.approx(math.sqrt(ss / 4 * (2 / 3) + 2 * 0.004**2 + 1e-5))


def test_simulated_fleets_a_3pct_change_across_hosts_is_found():
    """The issue's goal across hosts (a 3% change, 1% AR(1) noise, 50 steps, one run a side), hosts whose
    levels differ by 2%, runs on one host by 0.25%, the store holding 2 runs of one configuration on each
    of 6 hosts, the compared two among them: with their measured offset (host_term) the 3% change is found
    in >= 80% of 200 pairs (the spread term alone: 10.5%) and A/A pairs are called in <= 7% (standard error
    1.5% at 5%)."""
    from trainperf.compare.history import PRIOR_DF, pooled_between

    rng = np.random.default_rng(8)
    trials, found, false = 200, 0, 0
    for _ in range(trials):
        mh = rng.normal(0, 0.02, 6)
        groups = {"c": {}}
        for h in range(6):
            for x in 1 + 0.01 * _ar1(rng, 50, reps=2):
                v = long_run_variance(x * math.exp(mh[h] + rng.normal(0, 0.0025)))
                groups["c"].setdefault(f"h{h}", []).append((math.log(v.mean), v.variance / (v.n * v.mean**2)))
        tau2, df, _ = pooled_between({f"c|{h}": v for h, v in groups["c"].items()})
        cv = math.sqrt((df * tau2 + PRIOR_DF * DEFAULT_BETWEEN.cv**2) / (df + PRIOR_DF))
        within = BetweenRun(cv=cv, df=df + PRIOR_DF, source="sim")
        between = dataclasses.replace(within, hosts=host_term(groups, {"h0": -1.0, "h1": 1.0}, within))
        assert between.hosts.paired
        x = 1 + 0.01 * _ar1(rng, 50, reps=3)
        a = x[0] * math.exp(mh[0] + rng.normal(0, 0.0025))
        same, slower = (x[i] * math.exp(mh[1] + rng.normal(0, 0.0025)) for i in (1, 2))
        aa, p3 = series_shift(a, same, between=between), series_shift(a, slower * 1.03, between=between)
        false += not (aa.lo < 0 < aa.hi)
        found += p3.lo > 0
    assert found / trials >= 0.8 and false / trials <= 0.07
