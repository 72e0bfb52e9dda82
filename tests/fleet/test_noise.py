"""Noise scale of quantised series and the trimmed-means step test: references are hand formulas,
scipy's Yuen test and injected changes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from trainperf.fleet.changepoints import _rank_p, _ranks, _trimmed_p, detect_changes
from trainperf.fleet.noise import (ar1_from_residuals, noise_autocorr, noise_sigma, quantum, robust_scale,
                                   segment_autocorr, spread_ties)


def test_quantum_is_the_gcd_of_the_gaps_between_values():
    assert quantum(np.array([100.0, 135, 145, 100])) == pytest.approx(5.0)  # gaps 35, 10: gcd 5
    rng = np.random.default_rng(0)
    assert quantum(np.round(rng.uniform(0, 100, 200)) * 0.1 + 1000) == pytest.approx(0.1)
    assert quantum(rng.normal(size=200)) == 0.0  # no value repeats: continuous
    assert quantum(np.ones(10)) == 0.0


def test_ties_spread_over_the_difference_of_two_rounding_errors():
    # the difference of two independent U(-q/2, q/2) rounding errors is triangular on [-q, q]:
    # standard deviation q / sqrt(6), median |d| = q (1 - 1/sqrt 2)
    q = 2.0
    v = spread_ties(np.zeros(20001), q)
    assert v.std() == pytest.approx(q / math.sqrt(6), rel=1e-3)
    assert robust_scale(np.zeros(20001), q) == pytest.approx(1.4826 * q * (1 - 1 / math.sqrt(2)), rel=1e-3)
    x = np.array([0.3, 1.7, 2.9])  # untied values stay
    assert np.array_equal(spread_ties(x, q), x)
    assert robust_scale(x) == robust_scale(x, q)


def test_persistent_modes_in_a_quantised_series_are_not_read_as_persistent_noise():
    # two modes 5% apart, each run keeping the last one's with probability 0.9, 0.3% noise, whole
    # units: 5/95% winsorising of the tied differences counted the mode switches as noise and the
    # lag-2 differences doubled them (read 0.64 here; 0.98 in other draws: a 99-fold variance)
    rng = np.random.default_rng(0)
    st = np.zeros(300, int)
    for i in range(1, 300):
        st[i] = st[i - 1] if rng.random() < 0.9 else 1 - st[i - 1]
    raw = 100 * (1 + 0.05 * st + 0.003 * rng.standard_normal(300))
    raw[180:] *= 1.10
    y = np.round(raw)
    assert noise_autocorr(y) == noise_autocorr(y, quantum(y)) < 0.5 < noise_autocorr(y, 0.0)  # tie-aware by default
    # the 10% step is found (a run of 29 points in the upper mode, 39-67, is reported too: a
    # mixture whose proportion holds for that long is a level change as far as the data can tell)
    (c,) = [c for c in detect_changes(y).changes if abs(c.index - 180) <= 5]
    assert c.rel_change == pytest.approx(0.10, abs=0.03)


def test_trimmed_p_is_yuens_test_bonferroni_corrected():
    rng = np.random.default_rng(1)
    e = np.concatenate([rng.standard_t(3, 30), 1.5 + rng.standard_t(3, 50)])
    ref = stats.ttest_ind(e[:30], e[30:], trim=0.2, equal_var=False)
    assert _trimmed_p(e, 30, 1.0, 0.0, 0.0) == pytest.approx(2 * len(e) * stats.t.sf(abs(ref.statistic), ref.df))
    # AR(1) inflation (1 + rho) / (1 - rho) divides t by its square root
    p3 = _trimmed_p(e, 30, 1.0, 0.5, 0.0)
    assert p3 == pytest.approx(2 * len(e) * stats.t.sf(abs(ref.statistic) / math.sqrt(3), ref.df))


def test_a_large_step_in_persistent_noise_is_found_by_its_size():
    # 60 points of AR(1) 0.8 noise, a 10-sigma step in the middle, both tests with the AR(1)
    # variance inflation 9: however the ranks separate, Pettitt's p-value is at least
    # 2 exp(-6 (m^2/4)^2 / (9 (m^3 + m^2))) = 0.17; the trimmed-means test sees the size
    rng = np.random.default_rng(2)
    z, e = rng.standard_normal(60) * 0.6, np.zeros(60)
    for i in range(1, 60):
        e[i] = 0.8 * e[i - 1] + z[i]
    e[30:] += 10
    assert _rank_p(_ranks(e), 30, 9.0, 0.0) >= 2 * math.exp(-6 * 900**2 / (9 * (60**3 + 60**2))) > 0.1
    assert _trimmed_p(e, 30, 9.0, 0.0, 0.0) < 1e-4


def _ar1_noise(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    e = np.zeros(n)
    e[0] = rng.standard_normal()
    z = rng.standard_normal(n) * math.sqrt(1 - phi**2)
    for i in range(1, n):
        e[i] = phi * e[i - 1] + z[i]
    return e


def test_ar1_from_residuals_undoes_the_bias_of_fitted_means():
    # Marriott & Pope (1954): the lag-1 autocorrelation of an AR(1) series around its fitted mean is
    # biased by about -(1 + 3 rho) / n; over 4 segments of 40 points each with its own mean, about
    # -(1 + 1.5) x 4 / 160 = -0.0625 at rho 0.5. Reference: the rho the noise was generated with.
    rng = np.random.default_rng(3)
    raw, corrected = [], []
    for _ in range(400):
        segs = [_ar1_noise(rng, 40, 0.5) for _ in range(4)]
        res = [s - s.mean() for s in segs]
        raw.append(sum(float(r[1:] @ r[:-1]) for r in res) / sum(float(r @ r) for r in res))
        corrected.append(ar1_from_residuals(res, 4))
    assert np.mean(raw) - 0.5 == pytest.approx(-2.5 * 4 / 160, abs=0.02)
    assert np.mean(corrected) == pytest.approx(0.5, abs=0.015)
    # white noise: corrected to about 0 (clipped at 0, so its mean is a little above)
    white = [ar1_from_residuals([r - r.mean() for r in rng.standard_normal((4, 40))], 4) for _ in range(200)]
    assert np.median(white) < 0.03
    assert ar1_from_residuals([np.ones(5)], 2) == 0.98  # too few points for the parameters


def test_segment_autocorr_reads_ar1_noise_through_steps_and_closer_than_differences():
    # AR(1) 0.5 noise with three steps of 10 sigma at known points: within the segments the steps
    # leave, the residuals' lag-1 autocorrelation is the noise's; from differences it scatters 2.5x
    # more (standard deviations over 200 draws of 150 points). A step left out of a minority of the
    # points (the last 60 of 150) does not move the length-weighted median; with no bounds at all the
    # steps read as persistence (upwards: the conservative error)
    rng = np.random.default_rng(4)
    seg, diff, missed, none = [], [], [], []
    for _ in range(200):
        y = 100 + _ar1_noise(rng, 150, 0.5) + 10 * (np.arange(150) >= 50) - 10 * (np.arange(150) >= 90)
        y[110:] += 10
        seg.append(segment_autocorr(y, [0, 50, 90, 110, 150]))
        diff.append(noise_autocorr(y))
        missed.append(segment_autocorr(y, [0, 50, 90, 150]))
        none.append(segment_autocorr(y, [0, 150]))
    assert np.mean(seg) == pytest.approx(0.5, abs=0.03)
    assert np.std(seg) < np.std(diff) / 2.5
    assert np.mean(missed) == pytest.approx(0.5, abs=0.08)  # the larger of the two clean segments' reads
    assert np.mean(none) > 0.9
    # a drift is removed before the residuals are read; outliers are clipped, not products
    t = np.arange(300)
    e = rng.standard_normal(300)
    e[::37] += 40  # stalled runs
    assert segment_autocorr(0.05 * t + e, [0, 300], drift=0.05) < 0.1
