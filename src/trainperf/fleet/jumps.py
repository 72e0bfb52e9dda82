"""Sudden persistent jumps: level shifts that a drift hides from the rank test on levels.

On a trending series (a growing workload, a slow thermal drift, a warm-up curve) a level shift
is not visible as a difference of segment levels, because the drift dominates both segments;
it is visible as one step far larger than the steps around it, after which the series goes on
from the new level. The test, at one significance level ``alpha`` Bonferroni-corrected over the
n - 1 steps (two-sided normal tails on robust z-scores):

- sudden: the step y[t] - y[t-1] minus the local drift (Theil-Sen slope of the 2w points on
  each side, pairs not straddling the step) is significant against the robust spread
  (1.4826 x MAD) of all such steps;
- persistent: the level of the 2w points after t minus that of the 2w points before (medians,
  local drift removed; the step's own two points in neither, ``held_levels``, so the two tests are
  independent evidence) is significant against the robust spread of that statistic over the
  series, has the step's sign and at least half its size, so an outlier, a burst of up to w
  stalled runs (w points were too few: 3 stalls in 5 runs moved the median, 6% false jumps on
  drifting series with 3% stalls) or autocorrelated wander is not a jump;
- only where a drift dominates: a straight line (Theil-Sen) must explain at least half of the
  series' robust variance (``MIN_TREND_SHARE``). A stationary series, however jumpy (a sawtooth,
  a balance that moves in steps, periodic stalls, heavy-tailed noise), is left to the rank test
  on levels, which sees that its level does not change;
- rare: if sudden steps come at least every w steps, the series is a jump process, not a few
  level shifts, and nothing is reported.

The p-value reported is the larger of the two corrected tail probabilities. Hand-written: a few
lines of NumPy; no maintained library offers this test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _normal_isf(p: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(p))


def _pair_slopes(y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (before, after), each (n - 1, pairs): for each step y[s+1] - y[s], the slopes of all
    pairs within the 2w points before it (y[s-2w+1..s]) and within the 2w points after it
    (y[s+1..s+2w]); NaN where a window runs past the ends."""
    n, h = len(y), 2 * w
    pad = np.concatenate([np.full(h, np.nan), y, np.full(h, np.nan)])
    win = sliding_window_view(pad, h)  # win[q] = pad[q : q + h]
    i, j = np.triu_indices(h, 1)
    steps = np.arange(n - 1)  # step between y[s] and y[s+1]
    before = (win[steps + 1][:, j] - win[steps + 1][:, i]) / (j - i)
    after = (win[steps + h + 1][:, j] - win[steps + h + 1][:, i]) / (j - i)
    return before, after


def _nanmedian_rows(a: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():  # a window of one point at the very ends has no slope: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=1)


def side_slopes(y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (before, after): for each step y[s+1] - y[s], the Theil-Sen slopes (units per point)
    of the 2w points before it and of the 2w points after it, shorter at the ends (NaN at the
    very ends). Pairs never straddle the step, so a jump does not bias the slopes around it.
    """
    before, after = _pair_slopes(y, w)
    return _nanmedian_rows(before), _nanmedian_rows(after)


def local_drift(y: np.ndarray, w: int) -> np.ndarray:
    """Return, for each step y[i+1] - y[i], the local drift around it (units per point).

    Theil-Sen slope pooled over the pairs within the 2w points before the step and within the
    2w points after it (pairs never straddle the step, so a jump does not bias its own drift);
    near the ends the windows are cut short. Returns an array of n - 1 slopes.
    """
    before, after = _pair_slopes(y, w)
    return _nanmedian_rows(np.concatenate([before, after], axis=1))


MIN_TREND_SHARE = 0.5  # the jump test runs when a straight line explains >= half the robust variance


def _mad(v: np.ndarray) -> float:
    return float(np.median(np.abs(v - np.median(v))))


def trend_share(y: np.ndarray, cap: int = 300) -> float:
    """Return the share of y's robust variance that a straight line explains: 1 - (MAD resid / MAD y)^2.

    The line is Theil-Sen (median of pairwise slopes, on at most ``cap`` evenly spaced points).
    Near 1 for a trending series, near 0 (or below) for a stationary one, however jumpy.
    """
    n = len(y)
    idx = np.unique(np.linspace(0, n - 1, min(cap, n)).round().astype(int))
    i, j = np.triu_indices(len(idx), 1)
    b = float(np.median((y[idx[j]] - y[idx[i]]) / (idx[j] - idx[i])))
    spread = _mad(y)
    return 1.0 - (_mad(y - b * np.arange(n)) / spread) ** 2 if spread > 0 else 0.0


def held_levels(y: np.ndarray, w: int, before: np.ndarray | None = None, after: np.ndarray | None = None
                ) -> np.ndarray:
    """Return, for each step y[k+1] - y[k], the level the series holds after it: the median of the
    2w points after the step minus that of the 2w points before (units of y), the pooled local drift
    of those points removed (Theil-Sen, pairs within each side); NaN where a side is short.

    The step's own two points (y[k], y[k+1]) are in neither the levels nor that drift, so the held
    level is evidence apart from the step: with them in, an outlier at either end of the step made
    the step large and also tilted the drift (its pairs) and so the held level; in t3 noise on a
    drift, a held level beyond the test's threshold was 17x likelier where the step was sudden than
    elsewhere, and 4% of A/A series of 500 points got a jump. Left out, the two rates are the same.
    ``before``/``after``: ``_pair_slopes(y, w)``, when already computed.
    """
    if before is None or after is None:
        before, after = _pair_slopes(y, w)
    n, hw = len(y), 2 * w  # 2w points a side: a burst of w stalled runs is not a level
    held = np.full(n - 1, np.nan)
    ks = np.arange(hw, n - hw - 1)  # steps with 2w points on each side beyond the step's own two
    if len(ks) == 0:
        return held
    offs = np.r_[np.arange(-hw - 1, -1), np.arange(1, hw + 1)] + 0.5  # distance of each point from the step
    drift = _nanmedian_rows(np.concatenate([before[ks - 1], after[ks + 1]], axis=1))
    seg = np.delete(sliding_window_view(y, 2 * hw + 2)[ks - hw], [hw, hw + 1], axis=1) - drift[:, None] * offs
    held[ks] = np.median(seg[:, hw:], axis=1) - np.median(seg[:, :hw], axis=1)
    return held


def find_jumps(y: np.ndarray, w: int = 5, alpha: float = 0.01, min_trend_share: float = MIN_TREND_SHARE
               ) -> list[tuple[int, float, float]]:
    """Return [(index, p_value, drift)] of sudden persistent jumps in y (no missing values).

    ``index``: first point of the new level (0-based); ``p_value``: the larger of the
    Bonferroni-corrected tail probabilities of the step and of the held level; ``drift``: the
    local drift (units per point) around it, used to describe the jump. Empty when y is shorter
    than 2w + 1, is not dominated by a drift, or is a jump process.
    """
    n = len(y)
    if n < 2 * w + 1 or trend_share(y) < min_trend_share:
        return []
    dy = np.diff(y)
    before, after = _pair_slopes(y, w)
    drift = _nanmedian_rows(np.concatenate([before, after], axis=1))
    b_before, b_after = _nanmedian_rows(before), _nanmedian_rows(after)
    b_before = np.where(np.isnan(b_before), drift, b_before)
    b_after = np.where(np.isnan(b_after), drift, b_after)
    # the step's excess over the slope on either side, whichever explains it better (so a
    # change of slope, a kink, is not a sudden step)
    e = dy - np.where(np.abs(dy - b_before) <= np.abs(dy - b_after), b_before, b_after)
    scale = 1.4826 * _mad(e)
    if not scale > 0:
        return []
    z = np.abs(e) / scale
    held = held_levels(y, w, before, after)
    ks = np.flatnonzero(np.isfinite(held))
    if len(ks) == 0:
        return []
    h = held[ks]
    held_scale = 1.4826 * _mad(h)
    if not held_scale > 0:
        return []
    z_crit = _normal_isf(alpha / (2 * (n - 1)))
    sudden = z > z_crit
    if int(sudden.sum()) * w >= n - 1:  # sudden steps at least every w steps: a jump process, not changes
        return []
    significant = np.flatnonzero(sudden & (np.abs(np.nan_to_num(held)) > z_crit * held_scale))
    found: list[tuple[int, float, float]] = []
    for k in significant[np.argsort(-z[significant])]:
        t = int(k) + 1  # the jump is between t-1 and t
        if any(abs(t - f) < w for f, _, _ in found):
            continue
        if np.sign(held[k]) != np.sign(e[k]) or abs(held[k]) < 0.5 * abs(e[k]):
            continue  # an outlier or a short spike, not a new level
        z_min = min(float(z[k]), abs(float(held[k])) / held_scale)
        p = min(1.0, 2 * (n - 1) * _normal_sf(z_min))
        found.append((t, p, float(drift[k])))
    return sorted(found)
