"""A and B on different hosts: the hosts' term of compare's interval (issue 13), against the unbalanced
one-way ANOVA worked by hand, the hosts' share weights by hand, and simulated fleets whose hosts differ
by a known amount."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from trainperf.compare import compare_runs
from trainperf.compare.history import between_floor, host_mix, host_spread, hosts_between
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
    assert compare(side["a"], side["b"], metric="step_time").verdict == "inconclusive"
    b.host = "node1"
    assert compare_runs([a], [b], store=str(tmp_path / "none")).perf.verdict == "slower"


def test_the_store_measures_how_much_hosts_differ(tmp_path):
    """Six hosts whose levels are 0.100 x (1 + m), m = -3, -1, 0, 1, 2, 3%, two runs of one configuration
    each (0.2% step noise): the estimate follows the ANOVA of their log levels by hand; a compared pair on
    two of them then gets that term, and the verdict says where it came from."""
    rng = np.random.default_rng(2)
    store = str(tmp_path / "store")
    m = {f"n{i}": v for i, v in enumerate([-0.03, -0.01, 0.0, 0.01, 0.02, 0.03])}
    for h, v in m.items():
        for k in range(2):
            _record(store, f"{h}-{k}", 0.1 * (1 + v), rng, h)
    lv = np.log(1 + np.array(list(m.values())))
    by_hand = ((lv - lv.mean()) ** 2).sum() / 5  # two runs a host at the same level: MSB / 2 = the hosts' variance
    a = _run(0.1 * (1 + 0.01 * _ar1(rng, 50)[0]), name="a", run_id="a", host="n0")
    b = _run(0.1 * (1 + 0.01 * _ar1(rng, 50)[0]), name="b", run_id="b", host="n5")
    got = hosts_between([a], [b], store)
    assert got.cv == pytest.approx(math.sqrt(by_hand), rel=0.05) and got.weight == 2.0
    assert "1 configuration(s) on 6 hosts" in got.source
    floor = between_floor([a], [b], store)
    assert floor.hosts == got
    c = compare_runs([a], [b], store=store)
    assert c.perf.verdict != "inconclusive" and c.perf.hosts_cv == pytest.approx(got.cv)
    assert "A and B ran on different hosts: the interval includes hosts that differ by" in c.perf.note
    assert hosts_between([a], [_run(a.step_time_s, name="b2", host="n0")], store) is None  # same host: no term


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
