"""compare.interval (the one interval `compare` and `gate` share) against independent references:
a cosine long-run variance worked by hand on a 4-step series and scipy's DCT-II, the textbook
variance of an AR(1) series' mean, the bivariate-normal rank correlation, scipy's t test."""

import math

import numpy as np
import pytest

from trainperf.compare.interval import (NO_BETWEEN, ar1_phi, cosine_lrv, long_run_variance, repeats_shift, series_shift,
                                        shift)


def _ar1(rng, n, phi, sigma=1.0, reps=None):
    shape = (n,) if reps is None else (reps, n)
    e = rng.normal(0, sigma * math.sqrt(1 - phi**2), shape)
    x = np.empty(shape)
    x[..., 0] = rng.normal(0, sigma, shape[:-1])
    for i in range(1, n):
        x[..., i] = phi * x[..., i - 1] + e[..., i]
    return x


def test_cosine_lrv_by_hand_on_four_steps():
    # u = [1, -1, 2, -2] (mean 0): projections sqrt(2/4) sum_t cos(pi j (t - 1/2) / 4) u_t
    # j = 1: 0.70711 * (0.92388 - 0.38268 - 2 * 0.38268 + 2 * 0.92388) = 1.14805, squared 1.31802
    # j = 2: 0.70711 * (0.70711 + 0.70711 - 1.41421 - 1.41421) = -1.0, squared 1.0
    u = np.array([1.0, -1.0, 2.0, -2.0])
    assert cosine_lrv(u, 1) == pytest.approx(1.31802, abs=1e-5)
    assert cosine_lrv(u, 2) == pytest.approx((1.31802 + 1.0) / 2, abs=1e-5)


def test_cosine_lrv_is_the_mean_square_of_scipys_orthonormal_dct():
    from scipy.fft import dct

    u = np.random.default_rng(0).normal(size=37)
    c = dct(u - u.mean(), type=2, norm="ortho")
    assert cosine_lrv(u, 6) == pytest.approx(float(np.mean(c[1:7] ** 2)))


def test_long_run_variance_matches_the_textbook_variance_of_an_ar1_mean():
    """Reference: n Var(mean) = sigma^2 [1 + 2 sum_k (1 - k/n) phi^k] for a stationary AR(1)."""
    rng = np.random.default_rng(1)
    n, phi = 400, 0.5
    exact = 1 + 2 * sum((1 - k / n) * phi**k for k in range(1, n))
    est = [long_run_variance(x).variance for x in _ar1(rng, n, phi, reps=120)]
    assert np.mean(est) == pytest.approx(exact, rel=0.12)
    x = _ar1(rng, n, phi, reps=2000)  # and the variance of the mean itself, by simulation (numpy)
    assert n * x.mean(axis=1).var() == pytest.approx(exact, rel=0.08)


def test_ranks_are_scipys_average_ranks():
    from scipy.stats import rankdata

    from trainperf.compare.interval import ranks

    x = np.array([3.0, 1.0, 2.0, 2.0, 5.0, 1.0, 2.0])
    assert ranks(x).tolist() == rankdata(x).tolist()
    assert ar1_phi(np.full(50, 0.1)) == 0.0  # a constant series (all ties) has no persistence to remove


def test_ar1_phi_follows_the_rank_correlation_of_a_gaussian_ar1():
    """Reference: ranks of a bivariate normal with correlation r correlate (6/pi) arcsin(r/2) (Pearson 1907);
    ar1_phi reads them back on the Pearson scale, so a Gaussian AR(1) gives its own phi."""
    from trainperf.compare.interval import lag1, ranks

    x = _ar1(np.random.default_rng(2), 20000, 0.7)
    assert lag1(ranks(x)) == pytest.approx(6 / math.pi * math.asin(0.35), abs=0.012)
    assert ar1_phi(x) == pytest.approx(0.7, abs=0.012)
    white = np.random.default_rng(3).normal(size=20000)
    assert ar1_phi(white) < 0.02
    spiky = _ar1(np.random.default_rng(4), 2000, 0.7)
    spiky[::50] += 50.0  # outlier steps do not hide the persistence
    assert ar1_phi(spiky) > 0.6


def test_repeats_shift_is_scipys_pooled_t_on_log_run_means():
    from scipy.stats import ttest_ind

    a, b = np.array([1.0, 1.2, 0.9, 1.1]), np.array([1.3, 1.5, 1.2])
    s = repeats_shift(a, b)
    ci = ttest_ind(np.log(b), np.log(a), equal_var=True).confidence_interval(0.95)
    assert (s.estimate, s.lo, s.hi) == pytest.approx((np.log(b).mean() - np.log(a).mean(), ci.low, ci.high))
    assert s.p_value == pytest.approx(ttest_ind(np.log(b), np.log(a), equal_var=True).pvalue)


def test_series_shift_reduces_to_welch_on_independent_steps():
    """Independent steps: the estimate is log mean(b) - log mean(a), its standard error the
    delta-method one of two means (s^2 / (n mean^2) a side) up to the long-run estimate's noise."""
    rng = np.random.default_rng(5)
    a, b = 1 + 0.01 * rng.normal(size=300), 1.02 + 0.01 * rng.normal(size=300)
    s = series_shift(a, b, between=NO_BETWEEN)  # the steps' part (test_between: the between-run term)
    assert s.estimate == pytest.approx(math.log(b.mean() / a.mean()))
    se = math.sqrt(a.var(ddof=1) / (300 * a.mean() ** 2) + b.var(ddof=1) / (300 * b.mean() ** 2))
    assert s.se == pytest.approx(se, rel=0.35)
    assert s.lo < math.log(1.02) < s.hi


def test_a_a_intervals_exclude_zero_about_5pct_of_the_time_at_phi_0_6():
    """Reference: the nominal level. Steps read as independent would exclude 0 in ~31% of these
    pairs (rho 0.6); docs/benchmarks.md has the full grid (benchmarks/sim_gate.py --series)."""
    rng = np.random.default_rng(6)
    pairs = 300
    x = 0.1 * (1 + 0.01 * _ar1(rng, 60, 0.6, reps=2 * pairs))
    excl = sum(not (s.lo < 0 < s.hi) for s in (shift([x[i]], [x[pairs + i]], between=NO_BETWEEN) for i in range(pairs)))
    assert excl / pairs <= 0.075  # nominal 5%; 300 pairs: +-1.3% standard error


def test_a_3pct_slower_b_over_50_steps_with_1pct_noise_is_seen():
    """The steps' part of the interval; on a machine whose runs do not differ (no between-run term:
    test_between has it measured by a quiet history)."""
    rng = np.random.default_rng(7)
    x = 1 + 0.01 * _ar1(rng, 50, 0.3, reps=40)
    hits = sum(shift([x[i]], [1.03 * x[20 + i]], between=NO_BETWEEN).lo > 0 for i in range(20))
    assert hits >= 19


def test_too_few_steps_give_an_unbounded_interval_not_an_error():
    s = shift([np.array([1.0, 1.1])], [np.array([1.2, 1.3, 1.25])])
    assert s.lo == -math.inf and s.hi == math.inf and s.p_value == 1.0 and "too few steps" in s.method
