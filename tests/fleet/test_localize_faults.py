"""Root-cause localisation with several faults: one fitted change per cause element, further causes
by iterative removal, and the significance and relevance each cause element must show."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trainperf.fleet.evaluate import cause_key
from trainperf.fleet.localize import _bonferroni_z, _element_z, _fit, _noise_model, localize


def _grid(*sizes):
    """Leaves: every combination of attributes a, b, c, ... with ``sizes`` values each, expectation 100."""
    names = "abcdef"[:len(sizes)]
    mesh = np.meshgrid(*[[str(i) for i in range(k)] for k in sizes], indexing="ij")
    leaves = {n: m.ravel() for n, m in zip(names, mesh)}
    return leaves, np.full(mesh[0].size, 100.0)


def test_each_cause_element_moves_by_its_own_size():
    # a=1 doubles, a=2 rises by 20% (3 x 3 x 2 leaves of 100). By hand: one shared factor for both
    # (the previous model) is +60%, which leaves 6 x 40 + 6 x 40 = 480 of L1 against 120 for a=1
    # alone, so a=2 was dropped; with a factor per element both fit exactly (loss 0)
    leaves, exp = _grid(3, 3, 2)
    real = exp.copy()
    real[leaves["a"] == "1"] *= 2.0
    real[leaves["a"] == "2"] *= 1.2
    labels = np.select([leaves["a"] == "1", leaves["a"] == "2"], [0, 1], -1)
    assert np.allclose(_fit(real, exp, exp, labels), real)
    res = localize(leaves, real, exp)
    assert sorted(map(cause_key, res.root_causes)) == ["a=1", "a=2"]
    assert res.explained == pytest.approx(1.0) and res.confident


def test_a_second_fault_in_another_cuboid_is_found_after_the_first_is_set_aside():
    # fault 1: a=1 doubles (16 of 64 leaves); fault 2: b=2 & c=3 rises by 50% (its 3 leaves outside
    # a=1; the leaf a=1,b=2,c=3 belongs to fault 1). One candidate holds elements of one cuboid,
    # so a single search cannot name both; after a=1's leaves are set aside, b=2 & c=3 is the
    # only change left, and its parents b=2 and c=3 are refuted (their other leaves did not move)
    leaves, exp = _grid(4, 4, 4)
    real = exp.copy()
    real[leaves["a"] == "1"] *= 2.0
    real[(leaves["b"] == "2") & (leaves["c"] == "3") & (leaves["a"] != "1")] *= 1.5
    res = localize(leaves, real, exp)
    assert sorted(map(cause_key, res.root_causes)) == ["a=1", "b=2&c=3"]
    assert res.explained == pytest.approx(1.0)


def test_noise_law_and_the_significance_a_cause_needs():
    # by hand: leaves of 100 and 400 off by exactly +-sqrt(1 x exp + 0.01 x exp^2) (14.14 and 44.72):
    # the joint law var = phi_1 exp + phi_2 exp^2 fits them exactly, (1, 0.01), 4 leaves - 2 = 2 dof
    exp = np.array([100.0, 100.0, 400.0, 400.0])
    real = exp + np.sqrt(exp + 0.01 * exp ** 2) * np.array([1, -1, 1, -1])
    phi1, phi2, dof = _noise_model(real, exp)
    assert (phi1, phi2, dof) == (pytest.approx(1.0), pytest.approx(0.01), 2)
    # an element of two leaves of 100 and 400 that rose by 20 and 40: the score test of a shift that
    # scales its leaves weights each deviation by 1 / (phi_1 + phi_2 exp) = 1 / 2, 1 / 5:
    # z = (20 / 2 + 40 / 5) / sqrt(100 / 2 + 400 / 5) = 18 / sqrt(130) = 1.579 (the plain sum over
    # sqrt(1 x 500 + 0.01 x (100^2 + 400^2)), 60 / sqrt(2200) = 1.279, lets the large leaf's
    # relative error weigh 16x the small one's)
    e = np.array([100.0, 400.0])
    z = _element_z(e + np.array([20.0, 40.0]), e, np.ones(2, bool), 1.0, (phi1, phi2, dof))
    assert z == pytest.approx(18 / np.sqrt(130), rel=1e-6)
    # Poisson-like counts alone (phi_2 = 0): equal weights, the plain sum 60 / sqrt(500) = 2.683
    assert _element_z(e + np.array([20.0, 40.0]), e, np.ones(2, bool), 1.0, (1.0, 0.0, dof)) == pytest.approx(
        60 / np.sqrt(500), rel=1e-6)
    # no noise read: any rise is certain
    assert _element_z(e + 1, e, np.ones(2, bool), 1.0, (0.0, 0.0, dof)) == np.inf
    assert _bonferroni_z(0.01, 100) == pytest.approx(3.719, abs=1e-3)  # the normal's 1 - 1e-4 quantile
    # a law read on 12 leaves (10 dof) widens the bound: Student's t 1 - 1e-4 quantile, 5.694 (tables)
    assert _bonferroni_z(0.01, 100, 10.0) == pytest.approx(5.694, abs=1e-3)


def test_noise_law_of_sparse_counts_is_poisson():
    # failures on 3000 leaves expecting 0.02-0.5 each (reference: a Poisson count's variance is its
    # mean). The moment fit reads the element variance within 8% of Poisson; the median of the
    # squared deviations, the previous rule, reads ~0.65 of it (most leaves show 0 failures)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        mu = rng.uniform(0.02, 0.5, 3000)
        x = rng.poisson(mu).astype(float)
        phi1, phi2, _ = _noise_model(x, mu)
        assert (phi1 * mu.sum() + phi2 * (mu ** 2).sum()) / mu.sum() == pytest.approx(1.0, abs=0.08)
        assert np.median((x - mu) ** 2 / mu) / 0.4549 < 0.7


def test_a_small_deviation_in_noise_is_a_best_guess_not_a_cause_list():
    # 8 x 8 leaves of 1000 with 2% relative noise; a=3 rises by 2.5% (about one noise sigma per
    # leaf, 2.5 sigma for its 8 leaves: below the Bonferroni bound of ~3.6 for 8 + 8 + 64 elements)
    rng = np.random.default_rng(11)
    leaves, exp = _grid(8, 8)
    exp = exp * 10
    real = exp * (1 + 0.02 * rng.standard_normal(exp.size))
    real[leaves["a"] == "3"] *= 1.025
    res = localize(leaves, real, exp)
    assert len(res.causes) == 1 and not res.confident
    assert res.verdict.startswith("no confident cause")
    # the same fault ten times larger is a confident cause
    real[leaves["a"] == "3"] *= 1.25 / 1.025
    res = localize(leaves, real, exp)
    assert res.root_causes == [{"a": "3"}] and res.confident


def test_riskloc_incidents_place_faults_in_different_cuboids():
    from trainperf.fleet.incidents import riskloc_incident

    rng = np.random.default_rng(2)
    for n_faults in (1, 2, 3):
        inc = riskloc_incident(rng, n_faults=n_faults)
        cuboids = {tuple(sorted(c)) for c in inc.causes}
        assert len(cuboids) == n_faults and all(1 <= len(c) <= 3 for c in cuboids)
        under = np.zeros(len(inc.real), bool)
        for c in inc.causes:
            m = np.all([inc.leaves[k] == v for k, v in c.items()], axis=0)
            assert m.any() and not (under & m).any()  # faults do not overlap
            under |= m
        # the faults move their leaves one way, by severity >= 0.2 + the noise level (RiskLoc's rule,
        # so no fault hides in the noise): every leaf under them is off by more than 10%
        rel = inc.real[under] / inc.expected[under]
        assert len(np.unique(np.sign(rel - 1))) == 1 and np.all(np.abs(rel - 1) > 0.1)


def test_a_general_cause_found_later_replaces_the_specific_one_it_contains():
    # round 1 named a=1 & b=0; round 2, on the leaves left, finds a=1: its other b values moved too,
    # so a=1 replaces a=1 & b=0; a=2 found instead contains nothing found and is added
    from trainperf.fleet.localize import _merge

    cuboids = {("a",): (np.zeros(1, int), np.array([[0], [1], [2]])),
               ("a", "b"): (np.zeros(1, int), np.array([[1, 0], [1, 1], [2, 0]]))}
    found = [(("a", "b"), [0])]
    assert _merge(found, ("a",), [1], cuboids) == [(("a",), [1])]
    assert _merge(found, ("a",), [2], cuboids) == [(("a", "b"), [0]), (("a",), [2])]
    assert _merge(found, ("a", "b"), [1], cuboids) == [(("a", "b"), [0]), (("a", "b"), [1])]  # siblings stay


def test_a_further_fault_moves_most_of_its_leaves():
    # noise law phi_1 = 0, phi_2 = 0.01 (10% relative sigma): each leaf weighs exp / (0.01 exp) = 100
    # in the significance test, alike whatever its size. Element of 4 leaves of 100: three rose by 20
    # (2 sigma each), one by 0: 3 of 4 weights moved > 1 sigma -> consistent; one outlier of +300
    # and three still -> 1 of 4, not. A leaf of 1000 hardly touched (+0) and three of 100 up by 20
    # (a fault that spared its largest sub-population): 3 of 4 -> consistent (by expectation, the
    # previous count, 300 of 1300: not); the leaf of 1000 up by 150 (1.5 sigma) alone: 1 of 4, not.
    # With Poisson-like counts alone (phi_2 = 0) the weights are the expectations: 1000 of 1300 moved.
    from trainperf.fleet.localize import _consistent

    noise = (0.0, 0.01)
    exp = np.array([100.0, 100.0, 100.0, 100.0])
    assert _consistent(exp + [20, 20, 20, 0], exp, np.ones(4, bool), 1.0, noise)
    assert not _consistent(exp + [300, 0, 0, 0], exp, np.ones(4, bool), 1.0, noise)
    big = np.array([1000.0, 100.0, 100.0, 100.0])
    assert _consistent(big + [0, 20, 20, 20], big, np.ones(4, bool), 1.0, noise)
    assert not _consistent(big + [150, 0, 0, 0], big, np.ones(4, bool), 1.0, noise)
    assert _consistent(big + [150, 0, 0, 0], big, np.ones(4, bool), 1.0, (1.0, 0.0))  # 150 > sqrt(1000)
    assert not _consistent(exp - [20, 20, 20, 0], exp, np.ones(4, bool), 1.0, noise)  # the other direction


def test_a_clean_child_keeps_its_place_when_its_siblings_did_not_move():
    # a noise-free sum (not whole numbers): every leaf on forecast except a=1 & b=x, down 20%. Its
    # siblings under a=1 (b=y, b=z: 60.5 + 60.5 expected) are exactly on forecast, so they did not share
    # the change: the cause is the child. Before, leaves all on forecast read as Poisson noise of
    # scale 1 (in these units): by hand z = (0.25 x 0.2 x 121 - 0) / sqrt(1 x 121) = 0.55 < 1.645,
    # and the test climbed to a=1. (Counts on forecast keep Poisson's noise: test_localize.py's
    # parsimony tests.)
    from trainperf.fleet.localize import _dispersion

    a, b = np.meshgrid(["0", "1", "2", "3"], ["x", "y", "z"], indexing="ij")
    leaves = {"a": a.ravel(), "b": b.ravel()}
    exp = np.where(leaves["b"] == "x", 2000.5, 60.5)
    real = exp.copy()
    child = (leaves["a"] == "1") & (leaves["b"] == "x")
    real[child] *= 0.8
    assert _dispersion(real, exp, ~child) < 1e-100
    assert localize(leaves, real, exp).root_causes == [{"a": "1", "b": "x"}]
    # the same siblings with Poisson-sized noise (+-sqrt(60) each) cannot refute the parent: a=1 stays
    real[(leaves["b"] != "x")] += np.tile([7.7, -7.7], 4)
    assert localize(leaves, real, exp).root_causes == [{"a": "1"}]


def test_the_description_is_tested_both_ways_until_it_is_stable():
    # seeded "uneven" incident (trainperf.fleet.incidents, seed 3, the 7th): one fault at
    # a0=v4 & a1=v4 & a2=v2, noise-free, hitting the a3 values unequally. The search proposes the
    # worst-hit part (a1=v4 & a2=v2 & a3=v1); its parent a1=v4 & a2=v2 is kept by the climb
    # (its a3 siblings moved too); one descend-then-climb pass stopped there, though three of its
    # ten leaves (a0 != v4) are exactly on forecast: descending again finds the generator's cause
    from trainperf.fleet.incidents import incident_set

    inc = incident_set("uneven", 7, 3)[6]
    assert inc.causes == [{"a0": "v4", "a1": "v4", "a2": "v2"}] and inc.setting["noise"] == 0.0
    assert localize(inc.leaves, inc.real, inc.expected, real_b=inc.real_b).root_causes == inc.causes


def test_a_cause_must_stay_significant_on_the_leaves_no_other_cause_claims():
    # found: a=1 (its 3 leaves each +300 over 1000, sigma 10) and b=x, whose leaves are a=1 & b=x
    # (claimed by a=1 too) and a=0 & b=x, a=2 & b=x (on forecast to within +-10): on its own leaves
    # b=x moved by 0, so it goes; a=1 stays. Noise on the leaves no cause claims: 10% of 100-leaves.
    from trainperf.fleet.localize import LocalizeOptions, _own_evidence

    a, b = np.meshgrid(["0", "1", "2"] + [f"q{i}" for i in range(10)], ["x", "y", "z"], indexing="ij")
    leaves = {"a": a.ravel(), "b": b.ravel()}
    exp = np.full(a.size, 100.0)
    exp[np.isin(leaves["a"], ["0", "1", "2"])] = 1000.0
    rng = np.random.default_rng(0)
    real = exp * (1 + 0.01 * rng.standard_normal(a.size))
    real[leaves["a"] == "1"] = 1300.0
    cuboids = {cb: (np.unique(np.stack([leaves[k] for k in cb], 1), axis=0, return_inverse=True)[1].ravel(),
                    np.unique(np.stack([leaves[k] for k in cb], 1), axis=0)) for cb in (("a",), ("b",))}
    a1, bx = list(cuboids[("a",)][1][:, 0]).index("1"), list(cuboids[("b",)][1][:, 0]).index("x")
    found = [(("a",), [a1]), (("b",), [bx])]
    kept = _own_evidence(found, cuboids, real, exp, 1.0, 50, float(real.sum() - exp.sum()), LocalizeOptions())
    assert kept == [(("a",), [a1])]
    # b=x's own leaves up by 300 each too: a fault of its own, both stay
    real[(leaves["b"] == "x") & (leaves["a"] != "1")] += 300.0
    assert _own_evidence(found, cuboids, real, exp, 1.0, 50, float(real.sum() - exp.sum()), LocalizeOptions()) == found


def test_the_direction_is_that_of_a_significant_fault_not_of_the_noisy_total():
    # 50 leaves of 100 under a=0 rise by 30% (+1397 in all); the 150 leaves of 1000 outside it carry
    # 10% forecast noise, whose sum happens to fall (-4058), so the fleet's total fell (-2661). The
    # search looked only for elements that fell and named a noise leaf; a=0 is the most significant
    # element against the noise law read on every leaf, in the other direction, and beyond the bound
    mesh = np.meshgrid([str(i) for i in range(4)], [str(i) for i in range(50)], indexing="ij")
    leaves = {"a": mesh[0].ravel(), "b": mesh[1].ravel()}
    exp = np.where(leaves["a"] == "0", 100.0, 1000.0)
    rng = np.random.default_rng(10)
    real = exp * (1 + 0.1 * rng.standard_normal(exp.size))
    fault = leaves["a"] == "0"
    real[fault] *= 1.3
    assert real.sum() - exp.sum() < 0 < real[fault].sum() - exp[fault].sum()  # the setting, from the raw arrays
    noise = _noise_model(real, exp)
    z = _element_z(real, exp, fault, 1.0, noise)
    assert z >= _bonferroni_z(0.01, 4 + 50 + 200, noise[2])  # the fault is significant upwards
    res = localize(leaves, real, exp)
    assert [cause_key(c) for c in res.root_causes] == ["a=0"]
    assert res.causes[0].after > res.causes[0].before


def test_a_description_the_tests_kept_is_judged_once(monkeypatch):
    # one clean fault (a=1 doubles, no noise): the search's candidate passes, the parsimony tests keep
    # it, and no leaf is left to search: its significance is computed once, not again after the tests
    import trainperf.fleet.localize as loc

    calls = []
    real_significant = loc._significant
    monkeypatch.setattr(loc, "_significant", lambda *a: calls.append(a[1]) or real_significant(*a))
    leaves, exp = _grid(3, 3, 2)
    real = exp.copy()
    real[leaves["a"] == "1"] *= 2.0
    res = localize(leaves, real, exp)
    assert [cause_key(c) for c in res.root_causes] == ["a=1"]
    assert len(calls) == 1


def test_the_first_answer_is_the_best_ranked_candidate_that_holds_a_fault():
    # seeded "uneven" incident (trainperf.fleet.incidents, seed 23, the 46th): failures / requests,
    # forecast noise 20%, one fault at a5=v3. The search's L1 loss (in failures) ranks first a0=v3,
    # whose leaves carry large forecast errors and no significant element; the fault passes the
    # Bonferroni bound (z 4.9 against 4.6 over the 3652 elements searched: the oracle's own reading,
    # noise law outside the fault), so the answer is the fault, not a best guess of the noise
    from trainperf.fleet.incidents import incident_set
    from trainperf.fleet.localize import _cuboid

    inc = incident_set("uneven", 46, 23)[45]
    assert inc.causes == [{"a5": "v3"}] and inc.setting["noise"] == 0.2 and inc.setting["derived"]
    fault = inc.leaves["a5"] == "v3"
    noise = _noise_model(inc.real[~fault], inc.expected[~fault])
    enc = {a: np.unique(v, return_inverse=True) for a, v in inc.leaves.items()}
    cuboids: dict = {}
    n_tests = sum(len(_cuboid(cb, enc, cuboids)[1]) for d in (1, 2, 3) for cb in itertools.combinations(inc.leaves, d))
    assert _element_z(inc.real, inc.expected, fault, 1.0, noise) >= _bonferroni_z(0.01, n_tests, noise[2])
    assert localize(inc.leaves, inc.real, inc.expected, real_b=inc.real_b).root_causes == inc.causes


def test_how_visible_a_cause_is_to_the_most_powerful_test():
    # by hand: the most powerful test knows each leaf's change (3 and 4 under a=x) and noise variance
    # (1 each): it expects z = sqrt(3^2 / 1 + 4^2 / 1) = 5; a change with no noise at all: inf
    from trainperf.fleet.incidents import Incident, cause_visibility

    leaves = {"a": np.array(["x", "x", "y", "y"])}
    inc = Incident(leaves=leaves, real=np.zeros(4), expected=np.zeros(4), real_b=None, causes=[{"a": "x"}],
                   setting={}, shift=np.array([3.0, 4.0, 0.0, 0.0]), noise_var=np.ones(4))
    assert cause_visibility(inc) == [pytest.approx(5.0)]
    inc.noise_var = np.array([0.0, 0.0, 1.0, 1.0])
    assert cause_visibility(inc) == [np.inf]


def test_a_given_cause_is_judged_as_localize_judges_an_element():
    # the noise law is read outside the given cause: four leaves off by exactly
    # +-sqrt(exp + 0.01 exp^2), the law (1, 0.01) with 2 dof (test above); the cause's leaves of 100
    # and 400 rose by 20 and 40: z = 18 / sqrt(130). 2 + 4 + 6 elements searched (a, b, a & b): the
    # bound is Student's t with 2 dof at 1 - 0.01 / 12, whose CDF 1/2 + t / (2 sqrt(2 + t^2)) gives
    # t^2 = 2 (1 - 2q)^2 / (1 - (1 - 2q)^2), q = 0.01 / 12
    from trainperf.fleet.localize import cause_significance

    leaves = {"a": np.array(["n"] * 4 + ["c"] * 2), "b": np.array(["0", "1", "2", "3", "0", "1"])}
    exp = np.array([100.0, 100.0, 400.0, 400.0, 100.0, 400.0])
    real = exp + np.append(np.sqrt(exp[:4] + 0.01 * exp[:4] ** 2) * np.array([1, -1, 1, -1]), [20.0, 40.0])
    zs, bound = cause_significance(leaves, real, exp, [{"a": "c"}])
    q = 0.01 / 12
    assert zs == [pytest.approx(18 / np.sqrt(130), rel=1e-6)]
    assert bound == pytest.approx(np.sqrt(2 * (1 - 2 * q) ** 2 / (1 - (1 - 2 * q) ** 2)), rel=1e-6)


def _first_round(leaves, real, exp):
    """The first round as ``localize_each`` runs it at the defaults: (ranked candidates, cuboids, n_tests)."""
    from trainperf.fleet import localize as lz

    opts = lz.LocalizeOptions()
    attrs = list(leaves)
    enc = {k: np.unique(v, return_inverse=True) for k, v in leaves.items()}
    cuboids: dict = {}
    sign = lz._direction(attrs, enc, cuboids, real, exp, opts.max_depth, opts.alpha)
    cands = lz._candidates(attrs, enc, cuboids, real, exp, exp, sign, opts.max_depth, opts.max_elements)
    n_tests = sum(len(u) for _, u in cuboids.values())
    return lz._pick(cands, float(np.abs(real - exp).sum()), opts.penalty), cuboids, n_tests, sign, opts


def test_the_first_round_names_every_fault_of_its_cuboid_the_test_passes():
    # 4 x 3 x 3 leaves of 10000.5 (a continuous sum, no noise): a=1 & b=0 triples (+20001 on each of
    # its 3 leaves), a=2 & b=0 rises by 20% (+2000.1 each). By hand the search ranks {a=1 & b=0} alone
    # first: its loss is a=2 & b=0's 6000.3 of a base loss of 66003.3, 6000.3 / 66003.3 + 0.05 x 2
    # pairs = 0.191 against 0 + 0.05 x 4 = 0.2 for both. Widened to the cuboid's elements that moved
    # (the two), both are significant (no noise outside them: z infinite; a=2 & b=0 carries 9.1% >= 2%
    # of the change), and a=2 & b=0, with a=1 & b=0 set aside, keeps its place (its siblings under
    # a=2 and under b=0 are exactly on forecast) and moved all its leaves
    from trainperf.fleet import localize as lz

    a, b, c = np.meshgrid(["0", "1", "2", "3"], ["0", "1", "2"], ["0", "1", "2"], indexing="ij")
    leaves = {"a": a.ravel(), "b": b.ravel(), "c": c.ravel()}
    exp = np.full(36, 10000.5)
    real = exp.copy()
    real[(leaves["a"] == "1") & (leaves["b"] == "0")] *= 3.0
    real[(leaves["a"] == "2") & (leaves["b"] == "0")] *= 1.2
    ranked, cuboids, n_tests, sign, opts = _first_round(leaves, real, exp)
    active, total = np.ones(36, bool), float(real.sum() - exp.sum())
    ranked, verdict = lz._first_with_fault(ranked, cuboids, real, exp, active, sign, n_tests, total, opts)
    uniq = cuboids[("a", "b")][1]
    assert ranked[0][2] == ("a", "b") and [tuple(uniq[i]) for i in ranked[0][3]] == [(1, 0)]
    assert ranked[0][0] == pytest.approx(6000.3)
    ranked, verdict = lz._widen_first(ranked, verdict, cuboids, real, exp, exp, active, sign, n_tests, total, opts)
    assert sorted(tuple(uniq[i]) for i in ranked[0][3]) == [(1, 0), (2, 0)]
    assert sorted(verdict[0]) == sorted(ranked[0][3]) and verdict[1] == [np.inf, np.inf]
    assert sorted(map(cause_key, localize(leaves, real, exp).root_causes)) == ["a=1&b=0", "a=2&b=0"]
    # seeded "uneven" incident (trainperf.fleet.incidents, seed 3, the 83rd): two faults, a3=v0 and
    # a3=v3, noise-free failures; a3=v3 was left to the second round, whose first candidate was a
    # part of it (a1=v8 & a3=v3 & a4=v5)
    from trainperf.fleet.incidents import incident_set

    inc = incident_set("uneven", 83, 3)[82]
    assert sorted(map(cause_key, inc.causes)) == ["a3=v0", "a3=v3"] and inc.setting["noise"] == 0.0
    res = localize(inc.leaves, inc.real, inc.expected, real_b=inc.real_b)
    assert sorted(map(cause_key, res.root_causes)) == ["a3=v0", "a3=v3"]


def test_an_element_the_widening_adds_must_hold_its_place_and_move_its_leaves():
    # seeded "riskloc" incidents (seed 4): faults in several cuboids. #8: a0=v4 & a4=v6 and
    # a0=v8 & a4=v6 chosen first; their cuboid's next elements are parts of the layer-1 faults a4=v4
    # and a4=v7, which with the chosen ones climbed together to a4 (two true causes of five). #7:
    # a1=v6 & a3=v10 chosen first; a1=v9 & a3=v4, the parent of the faults a1=v9 & a2=v2 & a3=v4 and
    # a1=v9 & a2=v3 & a3=v4, moved only on their leaves. Unguarded, both lost causes
    # (docs/benchmarks.md); guarded, each is left to its own round
    from trainperf.fleet.incidents import incident_set

    incs = incident_set("riskloc", 9, 4)
    for inc in (incs[7], incs[8]):
        res = localize(inc.leaves, inc.real, inc.expected, real_b=inc.real_b)
        assert sorted(map(cause_key, res.root_causes)) == sorted(map(cause_key, inc.causes))


def test_a_child_with_no_change_of_its_own_left_is_not_climbed():
    # a sum, expectation 100 per leaf over a in {0, 1, 2} x b in {x, y}; only a=1 & b=y rose (+50). The
    # child a=1 & b=x is on forecast: with no change of its own there is nothing its parent a=1 could
    # share, and the parsimony test has nothing to weigh. Before, its z was (0.25 x 0 - 50) / sqrt(5 x
    # 100) = -2.24 < 1.645 (child_z, by hand; the dispersion outside the child is the mean of
    # (real - exp)^2 / exp, 25 / 5, its median being 0), so the parent "was not refuted" and replaced it.
    from trainperf.fleet.localize import _cuboid, _parsimony

    leaves, exp = _grid(3, 2)
    leaves = {"a": leaves["a"], "b": np.where(leaves["b"] == "0", "x", "y")}
    real = exp.copy()
    real[(leaves["a"] == "1") & (leaves["b"] == "y")] += 50.0
    enc = {k: np.unique(v, return_inverse=True) for k, v in leaves.items()}
    cuboids: dict = {}
    for cb in (("a",), ("b",), ("a", "b")):
        _cuboid(cb, enc, cuboids)
    codes, uniq = cuboids[("a", "b")]
    child = int(codes[(leaves["a"] == "1") & (leaves["b"] == "x")][0])
    cb, el, _ = _parsimony(("a", "b"), [child], cuboids, real, exp, exp, 1.0, 1.645, 0.25)
    assert (cb, el) == (("a", "b"), [child])


def test_a_set_found_as_parts_of_a_later_fault_does_not_climb_over_it():
    # seeded "uneven" incident (trainperf.fleet.incidents, seed 23, the 61st): one noise-free fault at
    # a2=v2 & a3=v0 & a4=v0. The first round names two parts of it in cuboid (a1, a2, a3); a later
    # round the fault itself. The sibling-set test then set the fault's leaves aside, which left the
    # parts with no change of their own, and climbed them to a3=v0, which swallowed the fault: the
    # answer was a3=v0. Now they are not climbed, and the own-evidence test drops them.
    from trainperf.fleet.incidents import incident_set

    inc = incident_set("uneven", 61, 23)[60]
    assert inc.causes == [{"a2": "v2", "a3": "v0", "a4": "v0"}] and inc.setting["noise"] == 0.0
    assert localize(inc.leaves, inc.real, inc.expected, real_b=inc.real_b).root_causes == inc.causes
