"""Sudden persistent jumps: level shifts of a series whose own drift hides them from a rank test.

On a trending or curving series (a thermal drift, a warm-up curve, a growing workload) a
level shift is not visible as a difference of segment levels (the drift dominates), but it is
visible as one point-to-point step far larger than the steps around it. The test:

- sudden: the step y[t] - y[t-1], minus the local drift (median of the ``w`` steps on each
  side), is compared with the robust noise of such steps (1.4826 x MAD over the series); it is
  significant when its two-sided normal tail probability, Bonferroni-corrected over the n - 1
  steps, is below ``alpha`` (the p-value reported is that corrected probability);
- persistent: the median of the ``w`` points after t minus the median of the ``w`` points
  before (both corrected for the local drift) has the step's sign and at least half its size,
  so a single outlier or a spike of fewer than w/2 points is not a jump;
- rare: a change point is a rare event. When at least one step in ``w`` is a significant jump,
  the segments between them would be shorter than ``w`` points on average: the series is a
  jump process (a sawtooth, a balance that moves in steps, periodic stalls), not a few level
  shifts, and the test reports nothing (the rank test on levels still runs).

Hand-written: the test is a few lines of NumPy; no maintained library offers it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _normal_isf(p: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(p))


def local_drift(y: np.ndarray, w: int) -> np.ndarray:
    """Return, for each step y[i+1] - y[i], the local drift around it (units per point).

    Theil-Sen slope pooled over the pairs within the 2w points before the step and within the
    2w points after it (pairs never straddle the step, so a jump does not bias its own drift);
    near the ends the windows are cut short. Returns an array of n - 1 slopes.
    """
    n, h = len(y), 2 * w
    pad = np.concatenate([np.full(h, np.nan), y, np.full(h, np.nan)])
    win = sliding_window_view(pad, h)  # win[q] = pad[q : q + h]
    i, j = np.triu_indices(h, 1)
    slopes = (win[:, j] - win[:, i]) / (j - i)  # pairwise slopes within each window
    steps = np.arange(n - 1)  # step between y[s] and y[s+1]
    before = slopes[steps + 1]  # window y[s-h+1 .. s]
    after = slopes[steps + h + 1]  # window y[s+1 .. s+h]
    return np.nanmedian(np.concatenate([before, after], axis=1), axis=1)


HELD_Z = None


MIN_TREND_SHARE = 0.5


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


def find_jumps(y: np.ndarray, w: int = 5, alpha: float = 0.01) -> list[tuple[int, float, float]]:
    """Return [(index, p_value, drift)] of sudden persistent jumps in y (no missing values).

    ``index``: first point of the new level (0-based); ``p_value``: Bonferroni-corrected normal
    tail probability of the step; ``drift``: the local drift (units per point) around it, used
    to describe the jump. Empty when y is shorter than 2w + 1 or is a jump process.
    """
    n = len(y)
    if n < 2 * w + 1 or trend_share(y) < MIN_TREND_SHARE:
        return []
    dy = np.diff(y)
    drift = local_drift(y, w)
    e = dy - drift
    scale = 1.4826 * float(np.median(np.abs(e - np.median(e))))
    if not scale > 0:
        return []
    z = np.abs(e) / scale
    # held[k]: level of the w points after step k minus that of the w points before, drift removed
    offs = np.arange(-w, w)
    held = np.full(n - 1, np.nan)
    ks = np.arange(w - 1, n - w)  # steps with w points on each side
    if len(ks) == 0:
        return []
    seg = sliding_window_view(y, 2 * w)[ks - w + 1] - drift[ks, None] * offs
    held[ks] = np.median(seg[:, w:], axis=1) - np.median(seg[:, :w], axis=1)
    h = held[ks]
    held_scale = 1.4826 * float(np.median(np.abs(h - np.median(h))))
    z_crit = _normal_isf(alpha / (2 * (n - 1)))
    sudden = z > z_crit
    if int(sudden.sum()) * w >= n - 1:  # sudden steps at least every w steps: a jump process, not changes
        return []
    significant = np.flatnonzero(sudden & (np.abs(np.nan_to_num(held)) > (HELD_Z or z_crit) * held_scale))
    found: list[tuple[int, float, float]] = []
    for k in significant[np.argsort(-z[significant])]:
        t = int(k) + 1  # the jump is between t-1 and t
        if any(abs(t - f) < w for f, _, _ in found):
            continue
        if np.sign(held[k]) != np.sign(e[k]) or abs(held[k]) < 0.5 * abs(e[k]):
            continue  # an outlier or a short spike, not a new level
        p = min(1.0, 2 * (n - 1) * _normal_sf(float(z[k])))
        found.append((t, p, float(drift[k])))
    return sorted(found)
