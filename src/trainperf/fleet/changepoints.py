"""Change points in a series of run metrics (step time, tokens/s, MFU, ...).

Three tests, one significance level ``alpha``:

- Level steps: binary segmentation with a rank test, so heavy tails and outliers cannot create
  or hide a change. In each segment the split is the maximum of Pettitt's rank CUSUM
  (U_t = 2 * sum of the first t ranks - t(m+1)); its significance is Pettitt's (1979) p-value
  p = 2 exp(-6 K^2 / (m^3 + m^2)), with the variance inflated by (1+rho)/(1-rho), rho the lag-1
  autocorrelation of the ranks around the split (a persistent series is not a string of change
  points), at most the noise's: read from differences while searching, and when each change is
  finally judged, the larger of that and the residuals' within the segments the changes leave
  (``segment_autocorr``). If both sides share a significant drift (Theil-Sen slope pooled within
  the sides, Mann-Kendall test), the drift is removed first and the variance further inflated by
  the information the fitted drift takes (1 / (1 - 3q(1-q)), q the split's position), so a slow
  drift is not cut into a staircase while a step on a drift is still found. A change is kept
  when p < alpha, both sides hold ``min_size`` points and the shift is large enough; a last pass
  re-tests every change between its neighbours, with ``drift="final"`` (the default) also
  requiring it not to be a drift: significant with one drift, fitted within all segments, in the
  null, or a sudden local step (``split_p_value``).
- Sudden persistent jumps (``trainperf.fleet.jumps``): on a series dominated by a drift, a step
  far larger than the local steps that the series then holds.
- Trend changes (``trainperf.fleet.trends``): a level step that a ramp fits better (BIC) becomes
  a ramp with its start and end; changes of slope (kinks) are scanned for on the whole series.

Settings are one ``ChangeOptions``; ``split_p_value`` is the one place a level change's p-value
is computed, so the p-value a user sees is the one the detector decided with.

Magnitude: Hodges-Lehmann shift (median of pairwise after-before differences, drift removed)
with its distribution-free confidence interval (Mann-Whitney inversion, same autocorrelation
inflation). Incremental: ``ChangeDetector.update(new_values)`` re-examines only the open last
segment. Hand-written because no maintained library pairs a robust rank test with per-change
intervals; ruptures (a dependency) is the side-by-side baseline in benchmarks/eval_cpd.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.special import stdtr  # the t distribution, without scipy.stats (~1 s to import)

from trainperf.errors import TrainperfError
from trainperf.fleet.jumps import MIN_TREND_SHARE, find_jumps, trend_share
from trainperf.fleet.noise import (noise_autocorr, noise_sigma, quantum, robust_scale,  # noqa: F401 (re-exported)
                                   segment_autocorr)
from trainperf.fleet.trends import Ramp, find_ramps, series_drift

_Z975 = 1.959963984540054
DRIFT_MODES = ("significant", "final", "always")


@dataclass(kw_only=True, frozen=True, slots=True)
class ChangeOptions:
    """Settings of the change-point detector (defaults chosen by cross-validation, docs/benchmarks.md).

    ``min_size``: fewest points per segment (and the jump test's window); ``alpha``: significance
    level of every test; ``min_rel_change``: smallest |after - before| / |before| to report (0.02 =
    2%); ``min_effect``: smallest shift in units of the point-to-point noise (robust sigma);
    ``trend``: also report changes of slope (kind "trend"); ``min_trend_share``: the jump test runs
    when a straight line explains at least this share of the robust variance (above 1: off);
    ``noise_autocorr``: bound the autocorrelation each split is tested with by the series' noise
    autocorrelation, so other steps in a segment do not read as persistence: while searching, read
    from differences (``noise_autocorr``: robust to steps, loose); in the final test of each change
    (``_prune``), the larger of that and the autocorrelation of the residuals within the segments
    the changes leave (``segment_autocorr``: efficient; a change missed reads as persistence, which
    costs power, not false alarms);
    ``seeded``: also search seeded short intervals (``_seeded``) for steps binary segmentation misses;
    ``drift``: when a level step is tested against a linear drift common to both its sides
    (``_within_drift``): "significant" (Mann-Kendall at alpha), "always" (a drift in the null:
    a slow drift in a short series fails Mann-Kendall's test yet makes a mid-series step) or
    "final" (significant while searching, always in the final test of each change between its
    neighbours, ``_prune``);
    ``max_misfit``: trend changes (ramps, kinks) are reported only when the fitted steps, ramps and
    kinks leave residuals within this many noise sigmas (``trends.find_ramps``);
    ``trimmed``: also test each level step by the size of its shift (``_trimmed_p``, Yuen's test):
    a rank test's evidence is capped by the number of points, however large the shift.
    """

    min_size: int = 5
    alpha: float = 0.01
    min_rel_change: float = 0.0
    min_effect: float = 1.0
    trend: bool = True
    min_trend_share: float = MIN_TREND_SHARE
    noise_autocorr: bool = True
    seeded: bool = True
    max_misfit: float = 1.25
    drift: str = "final"
    trimmed: bool = True

    def __post_init__(self):
        problems = [msg for bad, msg in (
            (self.min_size < 1, f"min_size {self.min_size} must be >= 1"),
            (not 0 < self.alpha < 1, f"alpha {self.alpha} must be between 0 and 1"),
            (self.min_rel_change < 0, f"min_rel_change {self.min_rel_change} must be >= 0"),
            (self.min_effect < 0, f"min_effect {self.min_effect} must be >= 0"),
            (not self.max_misfit > 0, f"max_misfit {self.max_misfit} must be > 0"),
            (self.drift not in DRIFT_MODES, f"drift {self.drift!r} must be one of {', '.join(DRIFT_MODES)}")) if bad]
        if problems:
            raise TrainperfError("change options: " + "; ".join(problems))


@dataclass
class Change:
    """One change point: the segment starting at ``index`` differs from the one before it."""

    index: int  # 0-based index of the first point of the new segment
    before: float  # median of the segment before (units of the series)
    after: float  # median of the segment after
    shift: float  # Hodges-Lehmann estimate of after - before
    shift_ci: tuple[float, float]  # confidence interval of the shift (level ``1 - alpha_ci``)
    rel_change: float  # shift / |before| (0.03 = +3%); nan when before is 0
    rel_ci: tuple[float, float]
    p_value: float  # of the test that found it: Pettitt (autocorrelation-adjusted) or the jump test
    kind: str = "level"  # "level": the level shifts; "trend": the slope shifts (shift is per point)
    end: int | None = None  # trend: first point where the old slope resumes (a ramp's end); None: lasts

    def to_dict(self) -> dict:
        """Return the change as JSON-able data."""
        d = asdict(self)
        d["shift_ci"], d["rel_ci"] = list(self.shift_ci), list(self.rel_ci)
        return d


@dataclass
class ChangeResult:
    """Change points of a series (0-based indices where a new segment starts), with evidence."""

    n: int
    changes: list[Change] = field(default_factory=list)
    test: str = ("Pettitt rank CUSUM (drift-adjusted), p-value adjusted for lag-1 autocorrelation; "
                 "sudden persistent jumps on drifting series (Bonferroni-corrected robust z); ramps and "
                 "slope changes by segmented regression (kink scan with Davies' bound, step or ramp by BIC)")

    @property
    def change_points(self) -> list[int]:
        """Return the 0-based indices where a new segment starts."""
        return [c.index for c in self.changes]

    def to_dict(self) -> dict:
        """Return the result as JSON-able data (``change_points`` first)."""
        return {"change_points": self.change_points, "n": self.n, "test": self.test,
                "changes": [c.to_dict() for c in self.changes]}


def _ranks(y: np.ndarray) -> np.ndarray:
    """Return the ranks of y (1..n), ties sharing their average rank (scipy's rankdata "average")."""
    _, inv, counts = np.unique(y, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inv.ravel()]


def _lag1(e: np.ndarray, rho_max: float = 0.98) -> float:
    """Lag-1 autocorrelation of e, clipped to [0, rho_max] (negative correlation never deflates)."""
    if len(e) < 4:
        return 0.0
    e = e - e.mean()
    den = float(e @ e)
    if den <= 0:
        return 0.0
    return float(min(max((e[1:] @ e[:-1]) / den, 0.0), rho_max))


def _within_drift(y: np.ndarray, k: int, alpha: float, rho_max: float = 0.98, cap: int = 200,
                  drift: str = "significant") -> float:
    """Return the drift (units per point) common to both sides of split k, or 0 when not used.

    Slope: Theil-Sen, pooled over pairs on the same side of the split (pairs never straddle it,
    so a step at k does not bias it). Significance: Mann-Kendall's S over the same pairs,
    variance n(n-1)(2n+5)/18 per side inflated by (1+rho)/(1-rho) (rho: lag-1 autocorrelation
    of the detrended ranks), two-sided at level ``alpha``. ``drift="always"``
    (``ChangeOptions.drift``): return the drift whatever its significance.
    """
    slopes, s_sum, var_s = [], 0.0, 0.0
    for lo, hi in ((0, k), (k, len(y))):
        if hi - lo < 3:
            continue
        idx = np.unique(np.linspace(lo, hi - 1, min(cap, hi - lo)).round().astype(int))
        i, j = np.triu_indices(len(idx), 1)
        dy = y[idx[j]] - y[idx[i]]
        slopes.append(dy / (idx[j] - idx[i]))
        s_sum += float(np.sign(dy).sum())
        n = len(idx)
        var_s += n * (n - 1) * (2 * n + 5) / 18
    if not slopes or var_s == 0:
        return 0.0
    b = float(np.median(np.concatenate(slopes)))
    r = _ranks(y - b * np.arange(len(y)))
    rho = _lag1(np.concatenate([r[:k] - r[:k].mean(), r[k:] - r[k:].mean()]), rho_max)
    z = abs(s_sum) / math.sqrt(var_s * (1 + rho) / (1 - rho))
    if drift == "always" or math.erfc(z / math.sqrt(2)) < alpha:
        return b
    return 0.0


def _rank_p(r: np.ndarray, k: int, extra: float = 1.0, rho_max: float = 0.98) -> float:
    """Pettitt p-value of a split after k points of the ranks r, inflated for lag-1 autocorrelation.

    ``extra`` multiplies the variance further (the loss of information when a drift is fitted).
    """
    m = len(r)
    big_k = abs(2 * r[:k].sum() - k * (m + 1))
    if big_k == 0:
        return 1.0
    rho = _lag1(np.concatenate([r[:k] - r[:k].mean(), r[k:] - r[k:].mean()]), rho_max)
    return min(1.0, 2.0 * math.exp(-6.0 * big_k**2 / ((m**3 + m**2) * extra * (1 + rho) / (1 - rho))))


def _vif(k: int | np.ndarray, m: int) -> float | np.ndarray:
    """Variance inflation of a step after k of m points when a linear drift is fitted with it.

    1 / (1 - corr^2) with corr^2 = 3 q (1 - q), q = k/m: the correlation of the step indicator
    with time (4 for a mid-series step, near 1 at the ends).
    """
    q = np.asarray(k) / m
    v = 1.0 / np.maximum(1.0 - 3.0 * q * (1.0 - q), 0.25)
    return float(v) if v.ndim == 0 else v


def _raw_split(r: np.ndarray, min_size: int) -> int | None:
    """Return the split (points before it) maximising Pettitt's |U_t| on the ranks r, or None."""
    m = len(r)
    lo, hi = min_size - 1, m - min_size  # split index t means segments [0, t) and [t, m)
    if m < 2 * min_size or hi <= lo:
        return None
    u = 2 * np.cumsum(r)[:-1] - np.arange(1, m) * (m + 1)  # Pettitt's U_t for a split after t points
    return int(np.argmax(np.abs(u[lo:hi]))) + lo + 1


def _segment_drift(y: np.ndarray, min_size: int, alpha: float, drift: str = "significant") -> float:
    """Return the drift common to both sides of y's best raw split (0 when not significant or too short).

    One drift per segment, whatever split is then tested, so the split search, the pruning pass
    and the reported p-value all judge a segment against the same drift.
    """
    k0 = _raw_split(_ranks(y), min_size)
    return 0.0 if k0 is None else _within_drift(y, k0, alpha, drift=drift)


def drift_vif(bounds: list[int], i: int) -> float:
    """Variance inflation of the step at bounds[i+1] (between segments i and i+1) when one drift is
    fitted over all segments: 1 + (mean t after - mean t before)^2 / (S_tt (1/n_before + 1/n_after)),
    S_tt the within-segment sum of squares of t (OLS; for two segments 1 / (1 - 3q(1-q)))."""
    n = np.diff(bounds).astype(float)
    s_tt = float((n**3 - n).sum()) / 12.0
    gap = (n[i] + n[i + 1]) / 2.0  # distance between the two segments' mean times
    return 1.0 + gap**2 / (s_tt * (1 / n[i] + 1 / n[i + 1])) if s_tt > 0 else 1.0


def split_p_value(y: np.ndarray, k: int, opts: "ChangeOptions", rho_max: float = 0.98, final: bool = True,
                  drift: tuple[float, float] | None = None) -> float:
    """Return the p-value of a level step after k points of y, allowing a common linear drift.

    The one p-value of a level change: the split search, the pruning pass and the reported
    ``Change.p_value`` all call this function (Pettitt's approximation on the ranks, variance
    inflated for lag-1 autocorrelation and, when a drift is fitted, for the drift). The drift is
    the segment's (``_segment_drift``). ``rho_max``: the autocorrelation used is at most this (the
    series' noise autocorrelation, see ``noise_autocorr``), so steps elsewhere in the segment do
    not pass for persistence. ``final``: the test that keeps or drops a change (between its
    neighbours), where ``drift="final"`` fits the drift whatever its significance; the search
    calls it with False. ``drift``: (slope, variance inflation) of a drift fitted over the whole
    series (``series_drift``, ``drift_vif``), used instead of the segment's own: the final test
    with ``drift="final"``, where the other changes are known.
    """
    if drift is not None:  # (slope, variance inflation) of a drift fitted over the whole series
        # significant as before (drift only when significant) AND not a drift: significant with the
        # drift in the null, or a sudden local step (the ranks of a short series cannot show a
        # 15-sigma step against a drift: n = 40 tops out at p 0.05); intersection-union, so the
        # larger p-value; the two ways of "not a drift" Bonferroni-combined
        b, vif = drift
        e = y - b * np.arange(len(y))
        p_drift = _level_p(e, k, vif, rho_max, opts)
        p_not_drift = min(1.0, 2 * min(p_drift, _local_step_p(e, k, 2 * opts.min_size, rho_max)))
        return max(split_p_value(y, k, replace(opts, drift="significant"), rho_max), p_not_drift)
    mode = "always" if opts.drift == "always" or (opts.drift == "final" and final) else "significant"
    b = _segment_drift(y, opts.min_size, opts.alpha, mode)
    if b == 0.0:
        return _level_p(y, k, 1.0, rho_max, opts)
    return _level_p(y - b * np.arange(len(y)), k, _vif(k, len(y)), rho_max, opts)


TRIM = 0.2  # share trimmed from each end of each side by Yuen's test (its usual 20%)


def _trimmed_p(e: np.ndarray, k: int, extra: float, rho: float, q: float) -> float:
    """Return the p-value of a level step after k points of e by the size of the shift: Yuen's (1974)
    trimmed-means test, Bonferroni-corrected over the positions a split could be chosen among.

    Each side's 20%-trimmed mean, its variance from the side's winsorised variance (Yuen), plus the
    rounding variance q^2 / 12 per point for a series quantised to q (a flat run of one value is
    known only to its quantum), inflated by (1 + rho) / (1 - rho) for AR(1) noise (``rho``: the
    series' noise autocorrelation) and by ``extra`` (a fitted drift); two-sided Student t tail with
    Yuen's degrees of freedom. The rank
    test's p-value cannot fall below about 2 exp(-0.375 m / inflation) however large the step (all
    ranks separated): 0.03 for 100 points of AR(1) 0.8 noise; this test keeps the size.
    """
    m = len(e)
    if k < 2 or m - k < 2:
        return 1.0
    d, h, mean = [], [], []
    for side in (np.sort(e[:k]), np.sort(e[k:])):
        n = len(side)
        g = int(TRIM * n)
        hj = n - 2 * g
        if hj < 2:
            return 1.0
        wins = np.clip(side, side[g], side[n - 1 - g])
        d.append((n - 1) * float(np.var(wins, ddof=1)) / (hj * (hj - 1)) + q * q / 12 / hj)
        h.append(hj)
        mean.append(float(side[g:n - g].mean()))
    var = (d[0] + d[1]) * extra * (1 + rho) / (1 - rho)
    if not var > 0:
        return 1.0 if mean[0] == mean[1] else 0.0
    # Yuen's Welch-Satterthwaite degrees of freedom: a side of a few points has a loose variance
    df = (d[0] + d[1]) ** 2 / (d[0] ** 2 / (h[0] - 1) + d[1] ** 2 / (h[1] - 1))
    t = abs(mean[1] - mean[0]) / math.sqrt(var)
    return min(1.0, 2 * m * float(stdtr(df, -t)))  # = 2m x the t survival function at t


def _level_p(e: np.ndarray, k: int, extra: float, rho_max: float, opts: "ChangeOptions") -> float:
    """Return the p-value of a level step after k points of e (drift removed): the rank test
    (``_rank_p``), or with ``opts.trimmed`` the smaller of it and the trimmed-means test.

    Not doubled for the two tests: the trimmed test is corrected for every position a split could
    take though it is evaluated at one (the rank test's), so it adds little to the false alarms
    (A/A rates in docs/benchmarks.md) and doubling cost the rank test a 2-sigma step in 120 points."""
    p = _rank_p(_ranks(e), k, extra, rho_max)
    if not opts.trimmed:
        return p
    return min(p, _trimmed_p(e, k, extra, rho_max, quantum(e)))


def _local_step_p(e: np.ndarray, k: int, w: int, rho: float) -> float:
    """Return the p-value of a sudden step after k points of e (drift removed): the difference of
    the medians of the w points each side against its spread for AR(1) noise (marginal sigma from
    ``noise_sigma`` / sqrt(1 - rho), long-run factor sqrt((1 + rho) / (1 - rho)), sqrt(pi/2) for
    a median), two-sided normal, Bonferroni over the len(e) positions the split was chosen among."""
    w = min(w, k, len(e) - k)
    sig = noise_sigma(e, quantum(e)) / math.sqrt(1 - rho) * math.sqrt((1 + rho) / (1 - rho))
    if w < 1 or not sig > 0:
        return 1.0
    d = float(np.median(e[k:k + w]) - np.median(e[k - w:k]))
    z = abs(d) / (sig * math.sqrt(2.0 / w * math.pi / 2))
    return min(1.0, len(e) * math.erfc(z / math.sqrt(2)))


def _best_split(y: np.ndarray, min_size: int, alpha: float, rho_max: float = 0.98, drift: str = "significant"
                ) -> int | None:
    """Return the split (points before it) of the best single level step in y, or None when too short.

    The split maximises Pettitt's U_t. If the segment has a significant drift
    (``_segment_drift``), the drift is removed and the split re-located on the residual, each
    candidate weighted by the variance it will be tested with, so a slow drift is not cut into a
    staircase while a step on top of a drift is still found.
    """
    m = len(y)
    split = _raw_split(_ranks(y), min_size)
    if split is None:
        return None
    b = _within_drift(y, split, alpha, drift=drift)
    if b == 0.0:
        return split
    lo, hi = min_size - 1, m - min_size
    t = np.arange(1, m)
    r = _ranks(y - b * np.arange(m))
    u = (2 * np.cumsum(r)[:-1] - t * (m + 1)) / np.sqrt(_vif(t, m))
    return int(np.argmax(np.abs(u[lo:hi]))) + lo + 1


def _subsample(a: np.ndarray, cap: int) -> np.ndarray:
    if len(a) <= cap:
        return a
    return a[np.linspace(0, len(a) - 1, cap).round().astype(int)]


def _hodges_lehmann(before: np.ndarray, after: np.ndarray, inflate: float = 1.0, cap: int = 300
                    ) -> tuple[float, float, float]:
    """Return (shift, lo, hi): Hodges-Lehmann after-before and its 95% Mann-Whitney interval."""
    b, a = _subsample(before, cap), _subsample(after, cap)
    return hodges_lehmann_interval(a[:, None] - b[None, :], len(b), len(a), inflate=inflate)


def hodges_lehmann_interval(diffs: np.ndarray, n1: int, n2: int, z: float = _Z975, inflate: float = 1.0
                            ) -> tuple[float, float, float]:
    """Return (median, lo, hi) of the n1 x n2 pairwise differences ``diffs`` (any shape, same units).

    The median is the Hodges-Lehmann estimate; lo/hi its distribution-free interval by Mann-Whitney
    inversion at the two-sided normal quantile ``z`` (1.96: 95%), the U variance multiplied by ``inflate``.
    """
    d = np.sort(np.ravel(diffs))
    c = n1 * n2 / 2 - z * math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12 * inflate)
    c = int(max(math.floor(c), 0))
    return float(np.median(d)), float(d[c]), float(d[len(d) - 1 - c])


def _describe(y: np.ndarray, a: int, s: int, b: int, p: float, drift: float = 0.0) -> Change:
    """Describe the change at s between segments [a, s) and [s, b), ``drift`` (per point) removed.

    With a drift, before/after are the two sides' levels at the change point (each side's
    median after removing the drift measured from s), so the shift is the step, not the drift.
    """
    yy = y[a:b] - drift * (np.arange(a, b) - s)
    k = s - a
    before, after = yy[:k], yy[k:]
    r = _ranks(yy)
    rho = _lag1(np.concatenate([r[:k] - r[:k].mean(), r[k:] - r[k:].mean()]))
    shift, lo, hi = _hodges_lehmann(before, after, (1 + rho) / (1 - rho))
    med_b, med_a = float(np.median(before)), float(np.median(after))
    base = abs(med_b)
    rel = (lambda v: v / base) if base > 0 else (lambda v: float("nan"))
    return Change(index=s, before=med_b, after=med_a, shift=shift, shift_ci=(lo, hi), rel_change=rel(shift),
                  rel_ci=(rel(lo), rel(hi)), p_value=p)


def _describe_trend(r: Ramp, keep: np.ndarray, s0: int) -> Change:
    """Describe a change of slope: before/after are the slopes (units per point), shift their
    difference with a normal 95% interval (long-run sigma), rel_change the shift per point
    relative to the level where the ramp starts."""
    lo, hi = r.slope - _Z975 * r.se, r.slope + _Z975 * r.se
    base = abs(r.level)
    rel = (lambda v: v / base) if base > 0 else (lambda v: float("nan"))
    end = None if r.end is None else int(keep[r.end + s0])
    return Change(index=int(keep[r.start + s0]), before=r.slope_before, after=r.slope_before + r.slope, shift=r.slope,
                  shift_ci=(lo, hi), rel_change=rel(r.slope), rel_ci=(rel(lo), rel(hi)), p_value=r.p_value,
                  kind="trend", end=end)


def _big_enough(y: np.ndarray, a: int, s: int, b: int, opts: ChangeOptions, sigma: float,
                min_rel_change: float | None = None) -> bool:
    """True when the step at s between [a, s) and [s, b) is at least ``min_effect`` x sigma and
    ``min_rel_change`` of the level before (medians)."""
    rel = opts.min_rel_change if min_rel_change is None else min_rel_change
    med_b, med_a = float(np.median(y[a:s])), float(np.median(y[s:b]))
    if abs(med_a - med_b) < opts.min_effect * sigma:
        return False
    return rel <= 0 or abs(med_a - med_b) >= rel * max(abs(med_b), 1e-300)


def _segment(y: np.ndarray, a: int, b: int, opts: ChangeOptions, sigma: float, min_rel_change: float,
             rho_max: float) -> list[int]:
    """Binary segmentation of y[a:b]: split where the rank test is significant and the step big enough."""
    out, stack = [], [(a, b)]
    while stack:
        lo, hi = stack.pop()
        search_drift = "always" if opts.drift == "always" else "significant"
        k = _best_split(y[lo:hi], opts.min_size, opts.alpha, rho_max, search_drift)
        if k is None:
            continue
        s = lo + k
        if (split_p_value(y[lo:hi], k, opts, rho_max, final=False) < opts.alpha
                and _big_enough(y, lo, s, hi, opts, sigma, min_rel_change)):
            out.append(s)
            stack += [(lo, s), (s, hi)]
    return out


def _seeded(y: np.ndarray, a: int, b: int, opts: ChangeOptions, sigma: float, min_rel_change: float,
            rho_max: float) -> list[int]:
    """Change points found on short intervals that binary segmentation can miss (steps that cancel).

    Seeded intervals (Kovacs et al. 2020): at each scale, intervals of length (b - a) / 2^j down
    to 4 x ``min_size``, shifted by half their length. Each interval's best split counts when its
    p-value is below alpha / (number of intervals at its scale x number of scales); then, narrowest
    interval first, a split is kept unless it lies within ``min_size`` of one already kept
    ("narrowest over threshold", Baranowski et al. 2019). The pruning pass re-tests them all.
    """
    w = opts.min_size
    scales = []
    length = (b - a) / 2
    while length >= 4 * w:
        starts = np.arange(a, b - length + 1, length / 2)
        scales.append([(int(round(s)), int(round(s + length))) for s in starts])
        length /= 2
    hits = []
    for intervals in scales:
        level = opts.alpha / (len(intervals) * len(scales))
        for lo, hi in intervals:
            # a short interval is screened with the plain rank test (no drift fit: cheap); the
            # pruning pass then tests every kept split with split_p_value, drift included
            m = hi - lo
            r = _ranks(y[lo:hi])
            u = np.abs(2 * np.cumsum(r)[:-1] - np.arange(1, m) * (m + 1))[w - 1:m - w]
            if len(u) == 0:
                continue
            k = int(np.argmax(u)) + w
            if _rank_p(r, k, 1.0, rho_max) < level and _big_enough(y, lo, lo + k, hi, opts, sigma, min_rel_change):
                hits.append((m, lo + k))
    kept: list[int] = []
    for _, c in sorted(hits):
        if all(abs(c - k) >= w for k in kept):
            kept.append(c)
    return kept


def _prune(y: np.ndarray, cps: list[int], a: int, b: int, opts: ChangeOptions, sigma: float,
           min_rel_change: float, rho_max: float) -> list[tuple[int, float]]:
    """Re-test each change between its neighbours until every remaining one is significant.

    Returns [(index, p-value)], the p-value being the one the change was kept with.
    """
    cps = sorted(cps)
    # the autocorrelation each change is judged with is at most the noise's: the larger of the
    # differences' (``rho_max``: robust to steps but loose, on 60-400 points of AR(1) 0.5 noise it
    # scatters by 0.2-0.35 and read 0.0-0.26 on the A/A series that got level steps) and the
    # residuals' within the segments the search found (``segment_autocorr``: scatter 0.04-0.12; but
    # a spurious change placed on the noise's wander lowers it, 0.54 -> 0.37, hence the larger).
    # Read once, with every change the search found: recomputed as failing changes were dropped,
    # each drop left its neighbours' segments holding a step that read as persistence, and a 20%
    # ramp cut into a staircase lost every step to that cascade (6 of 80 ramps not found at all)
    bounds = [a] + cps + [b]
    rho = max(rho_max, segment_autocorr(y, bounds, series_drift(y, bounds)))
    while True:
        bounds = [a] + cps + [b]
        # drift "final": one drift for the whole series, fitted within the segments the changes
        # leave (a staircase no longer reads as each window's own drift, and the step's variance
        # is inflated only by what that drift takes from it)
        slope = series_drift(y, bounds) if opts.drift == "final" else None
        scored = []
        for i, s in enumerate(cps):
            lo, hi = bounds[i], bounds[i + 2]
            given = None if slope is None else (slope, drift_vif(bounds, i))
            p = split_p_value(y[lo:hi], s - lo, opts, rho, drift=given)
            ok = p < opts.alpha and _big_enough(y, lo, s, hi, opts, sigma, min_rel_change)
            scored.append((p if ok else 1.0 + p, s, p))  # failing ones first, the least significant of them
        worst = max(scored, default=None)
        if worst is None or worst[0] <= 1.0:
            return [(s, p) for _, s, p in scored]
        cps.remove(worst[1])


def _clean(values) -> np.ndarray:
    try:
        y = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TrainperfError("series: values are not all numbers") from None
    if y.ndim != 1:
        raise TrainperfError(f"series: expected one column of numbers, got shape {y.shape}")
    if y.size == 0:
        raise TrainperfError("series: empty (no values)")
    if np.isinf(y).any():
        raise TrainperfError("series: contains infinite values")
    return y


def _level_changes(y: np.ndarray, start: int, opts: ChangeOptions, sigma: float, q: float
                   ) -> list[tuple[int, float]]:
    """Return [(index, p-value)] of level changes of y found at or after ``start``; ``sigma`` and
    ``q``: the point-to-point noise (``noise_sigma``) and resolution (``quantum``) of y[start:]."""
    rel = opts.min_rel_change
    rho_max = noise_autocorr(y[start:], q) if opts.noise_autocorr else 0.98
    cps = _segment(y, start, len(y), opts, sigma, rel, rho_max)
    # seeded intervals assume a locally constant level: on a series a straight line mostly
    # explains, the drift tests and the jump test speak instead
    if opts.seeded and trend_share(y[start:]) < opts.min_trend_share:
        cps += [c for c in _seeded(y, start, len(y), opts, sigma, rel, rho_max)
                if all(abs(c - k) >= opts.min_size for k in cps)]
    return _prune(y, cps, start, len(y), opts, sigma, rel, rho_max) if cps else []


@dataclass
class _Found:
    """A change found by one of the three tests, before it is described."""

    index: int  # position among the non-missing values
    p_value: float
    kind: str  # "level" or "trend"
    change: Change | None = None  # already described (jumps: described on local windows)


def detect_changes(values, options: ChangeOptions | None = None, *, start: int = 0, **fields) -> ChangeResult:
    """Return the change points of ``values`` (NaN = missing, skipped) with their evidence.

    ``options``: a ChangeOptions (defaults when None); keyword ``fields`` override its fields
    (``detect_changes(x, alpha=0.001)``). ``start``: search only from this index on (the
    incremental detector's open segment). Indices are 0-based positions in ``values``, missing
    values included.
    """
    opts = replace(options or ChangeOptions(), **fields)
    y_all = _clean(values)
    keep = np.flatnonzero(~np.isnan(y_all))
    y = y_all[keep]
    if len(y) == 0:
        raise TrainperfError("series: no numeric values (all missing)")
    s0 = int(np.searchsorted(keep, start))
    w = opts.min_size
    q = quantum(y[s0:])
    sigma = noise_sigma(y[s0:], q)  # the one noise level every test's minimum effect is measured in
    found = [_Found(s, p, "level") for s, p in _level_changes(y, s0, opts, sigma, q)]
    for j, p, drift in find_jumps(y[s0:], w, opts.alpha, opts.min_trend_share):
        j += s0
        if all(abs(j - f.index) >= w for f in found):
            lo = max([s0, j - 2 * w] + [f.index for f in found if f.index < j])  # local windows, not
            hi = min([len(y), j + 2 * w] + [f.index for f in found if f.index > j])  # past other changes
            ch = _describe(y, lo, j, hi, p, drift)
            rel_ok = opts.min_rel_change <= 0 or abs(ch.rel_change) >= opts.min_rel_change
            if abs(ch.shift) >= opts.min_effect * sigma and rel_ok:
                found.append(_Found(j, p, "level", ch))
    ramps = []
    if opts.trend:
        levels = [(f.index - s0, f.p_value) for f in found]
        kept, ramps = find_ramps(y[s0:], levels, w, opts.alpha, opts.max_misfit)
        ramps = [r for r in ramps if abs(r.total) >= opts.min_effect * sigma
                 and (opts.min_rel_change <= 0 or abs(r.total) >= opts.min_rel_change * max(abs(r.level), 1e-300))]
        kept_at = {s + s0 for s, _ in kept}
        found = [f for f in found if f.index in kept_at]
        # a slope change within min_size of a kept level step is that step's (no segment between them)
        ramps = [r for r in ramps if all(abs(r.start + s0 - k) >= w for k in kept_at)]
        found += [_Found(r.start + s0, r.p_value, "trend") for r in ramps]
    found.sort(key=lambda f: f.index)
    ramp_at = {r.start + s0: r for r in ramps}
    bounds = [s0] + [f.index for f in found] + [len(y)]
    # drift "final": the level steps are described with the drift their final test removed
    global_drift = series_drift(y, [s0] + [f.index for f in found if f.kind == "level"] + [len(y)])
    changes = []
    for i, f in enumerate(found):
        a, b, ch = bounds[i], bounds[i + 2], f.change
        if f.kind == "trend":
            ch = _describe_trend(ramp_at[f.index], keep, s0)
        elif ch is None:
            drift = (global_drift if opts.drift == "final"
                     else _within_drift(y[a:b], f.index - a, opts.alpha, drift=opts.drift))
            ch = _describe(y, a, f.index, b, f.p_value, drift)
        ch.index, ch.kind = int(keep[f.index]), f.kind
        changes.append(ch)
    return ChangeResult(n=len(y_all), changes=changes)


class ChangeDetector:
    """Incremental change detection: feed new points, re-examine only the open last segment.

    Change points already reported are final; each update searches from the last one on, so
    the cost of an update grows with the open segment, not with the whole history.
    """

    def __init__(self, options: ChangeOptions | None = None, **fields):
        self.options = replace(options or ChangeOptions(), **fields)
        self.values: list[float] = []
        self.changes: list[Change] = []

    def update(self, new_values) -> list[Change]:
        """Append ``new_values``; return the changes found in this update (earlier ones are kept)."""
        new = _clean(new_values) if len(new_values) else np.array([])
        self.values.extend(new.tolist())
        start = self.changes[-1].index if self.changes else 0
        res = detect_changes(self.values, self.options, start=start)
        fresh = [c for c in res.changes if c.index > start or not self.changes]
        self.changes.extend(fresh)
        return fresh

    @property
    def result(self) -> ChangeResult:
        """Return all changes found so far."""
        return ChangeResult(n=len(self.values), changes=list(self.changes))
