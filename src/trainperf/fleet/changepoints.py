"""Change points in a series of run metrics (step time, tokens/s, MFU, ...).

Method: binary segmentation with a rank test, so heavy tails and outliers cannot create or hide
a change. In each segment the split is the maximum of Pettitt's rank CUSUM
(U_t = 2 * sum of the first t ranks - t(m+1)); its significance is Pettitt's (1979) p-value
p = 2 exp(-6 K^2 / (m^3 + m^2)), with the variance inflated by (1+rho)/(1-rho) where rho is the
lag-1 autocorrelation of the ranks around the split segments (a drifting or persistent series is
not a string of change points). A change is kept when p < alpha, both sides hold at least
``min_size`` points and the shift is at least ``min_rel_change`` of the level before it. A last
pass re-tests every change between its neighbours and drops those no longer significant.
Magnitude: Hodges-Lehmann shift (median of pairwise after-before differences) with its
distribution-free confidence interval (Mann-Whitney inversion, same autocorrelation inflation).

Incremental: ``ChangeDetector.update(new_values)`` re-examines only the open last segment.
Hand-written because no maintained library pairs a robust rank test with per-change intervals;
ruptures (a dependency) is the side-by-side baseline in benchmarks/eval_cpd.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from trainperf.errors import TrainperfError

_Z975 = 1.959963984540054


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
    p_value: float  # Pettitt rank test, autocorrelation-adjusted
    kind: str = "level"  # "level": the level shifts; "trend": the slope shifts (shift is per point)

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
    test: str = "Pettitt rank CUSUM, p-value adjusted for lag-1 autocorrelation"

    @property
    def change_points(self) -> list[int]:
        """Return the 0-based indices where a new segment starts."""
        return [c.index for c in self.changes]

    def to_dict(self) -> dict:
        """Return the result as JSON-able data (``change_points`` first)."""
        return {"change_points": self.change_points, "n": self.n, "test": self.test,
                "changes": [c.to_dict() for c in self.changes]}


def _ranks(y: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(y)


def _lag1(e: np.ndarray) -> float:
    """Lag-1 autocorrelation of e, clipped to [0, 0.98] (negative correlation never deflates)."""
    if len(e) < 4:
        return 0.0
    e = e - e.mean()
    den = float(e @ e)
    if den <= 0:
        return 0.0
    return float(min(max((e[1:] @ e[:-1]) / den, 0.0), 0.98))


def _pettitt(y: np.ndarray, min_size: int) -> tuple[int, float] | None:
    """Return (split, p-value) of the best single split of y, or None when y is too short."""
    m = len(y)
    if m < 2 * min_size:
        return None
    r = _ranks(y)
    t = np.arange(1, m)
    u = 2 * np.cumsum(r)[:-1] - t * (m + 1)  # Pettitt's U_t for a split after t points
    lo, hi = min_size - 1, m - min_size  # split index t means segments [0, t) and [t, m)
    seg = np.abs(u[lo:hi])
    if seg.size == 0:
        return None
    k = int(np.argmax(seg)) + lo
    split = k + 1
    big_k = float(abs(u[k]))
    if big_k == 0:
        return split, 1.0
    e = np.concatenate([r[:split] - r[:split].mean(), r[split:] - r[split:].mean()])
    rho = _lag1(e)
    inflate = (1 + rho) / (1 - rho)
    p = 2.0 * math.exp(-6.0 * big_k**2 / ((m**3 + m**2) * inflate))
    return split, min(p, 1.0)


def _subsample(a: np.ndarray, cap: int) -> np.ndarray:
    if len(a) <= cap:
        return a
    return a[np.linspace(0, len(a) - 1, cap).round().astype(int)]


def _hodges_lehmann(before: np.ndarray, after: np.ndarray, inflate: float = 1.0, cap: int = 300
                    ) -> tuple[float, float, float]:
    """Return (shift, lo, hi): Hodges-Lehmann after-before and its 95% Mann-Whitney interval."""
    b, a = _subsample(before, cap), _subsample(after, cap)
    d = np.sort((a[:, None] - b[None, :]).ravel())
    n1, n2 = len(b), len(a)
    c = n1 * n2 / 2 - _Z975 * math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12 * inflate)
    c = int(max(math.floor(c), 0))
    return float(np.median(d)), float(d[c]), float(d[min(len(d) - 1, len(d) - 1 - c)])


def _describe(y: np.ndarray, a: int, s: int, b: int, p: float) -> Change:
    before, after = y[a:s], y[s:b]
    r = _ranks(y[a:b])
    k = s - a
    rho = _lag1(np.concatenate([r[:k] - r[:k].mean(), r[k:] - r[k:].mean()]))
    shift, lo, hi = _hodges_lehmann(before, after, (1 + rho) / (1 - rho))
    med_b, med_a = float(np.median(before)), float(np.median(after))
    base = abs(med_b)
    rel = (lambda v: v / base) if base > 0 else (lambda v: float("nan"))
    return Change(index=s, before=med_b, after=med_a, shift=shift, shift_ci=(lo, hi), rel_change=rel(shift),
                  rel_ci=(rel(lo), rel(hi)), p_value=p)


def noise_sigma(y: np.ndarray) -> float:
    """Return the robust point-to-point noise level of y: MAD of first differences / (0.6745 sqrt 2)."""
    if len(y) < 3:
        return 0.0
    d = np.diff(y)
    return float(np.median(np.abs(d - np.median(d))) / 0.6744897501960817 / math.sqrt(2))


def _big_enough(y: np.ndarray, a: int, s: int, b: int, min_rel_change: float, min_effect: float = 0.0,
                sigma: float = 0.0) -> bool:
    med_b, med_a = float(np.median(y[a:s])), float(np.median(y[s:b]))
    if abs(med_a - med_b) < min_effect * sigma:
        return False
    return min_rel_change <= 0 or abs(med_a - med_b) >= min_rel_change * max(abs(med_b), 1e-300)


def _segment(y: np.ndarray, a: int, b: int, min_size: int, alpha: float, min_rel_change: float,
             min_effect: float, sigma: float, out: list[int]) -> None:
    stack = [(a, b)]
    while stack:
        lo, hi = stack.pop()
        best = _pettitt(y[lo:hi], min_size)
        if best is None:
            continue
        s, p = best
        s += lo
        if p < alpha and _big_enough(y, lo, s, hi, min_rel_change, min_effect, sigma):
            out.append(s)
            stack.append((lo, s))
            stack.append((s, hi))


def _prune(y: np.ndarray, cps: list[int], a: int, b: int, min_size: int, alpha: float,
           min_rel_change: float, min_effect: float, sigma: float) -> list[tuple[int, float]]:
    """Re-test each change between its neighbours until every remaining one is significant."""
    cps = sorted(cps)
    while True:
        bounds = [a] + cps + [b]
        scored = []
        for i, s in enumerate(cps):
            lo, hi = bounds[i], bounds[i + 2]
            yy = y[lo:hi]
            r = _ranks(yy)
            m, k = len(yy), s - lo
            big_k = abs(2 * r[:k].sum() - k * (m + 1))
            rho = _lag1(np.concatenate([r[:k] - r[:k].mean(), r[k:] - r[k:].mean()]))
            p = min(1.0, 2.0 * math.exp(-6.0 * big_k**2 / ((m**3 + m**2) * (1 + rho) / (1 - rho))))
            ok = p < alpha and _big_enough(y, lo, s, hi, min_rel_change, min_effect, sigma)
            scored.append((p if ok else 2.0, s, p))
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


def _level_changes(y: np.ndarray, start: int, min_size: int, alpha: float, min_rel_change: float,
                   min_effect: float) -> list[tuple[int, float]]:
    """Return [(index, p-value)] of level changes of y found at or after ``start``."""
    sigma = noise_sigma(y[start:])
    cps: list[int] = []
    _segment(y, start, len(y), min_size, alpha, min_rel_change, min_effect, sigma, cps)
    if not cps:
        return []
    return _prune(y, cps, start, len(y), min_size, alpha, min_rel_change, min_effect, sigma)


def detect_changes(values, min_size: int = 5, alpha: float = 0.01, min_rel_change: float = 0.0,
                   min_effect: float = 1.0, trend: bool = True, start: int = 0) -> ChangeResult:
    """Return the change points of ``values`` (NaN = missing, skipped) with their evidence.

    ``min_size``: fewest points per segment; ``alpha``: significance level of the rank test;
    ``min_rel_change``: smallest |after - before| / |before| to report (0.02 = 2%);
    ``min_effect``: smallest shift in units of the point-to-point noise (robust sigma);
    ``trend``: also report changes of slope (a level shift of the first differences), kind "trend".
    ``start``: search only from this index on (the incremental detector's open segment).
    Indices are 0-based positions in ``values``, missing values included.
    """
    y_all = _clean(values)
    keep = np.flatnonzero(~np.isnan(y_all))
    y = y_all[keep]
    if len(y) == 0:
        raise TrainperfError("series: no numeric values (all missing)")
    if min_size < 1:
        raise TrainperfError("min_size must be >= 1")
    s0 = int(np.searchsorted(keep, start))
    found = [(s, p, "level") for s, p in _level_changes(y, s0, min_size, alpha, min_rel_change, min_effect)]
    if trend and len(y) - s0 > 2 * min_size + 1:
        dy = np.diff(y)
        for j, p in _level_changes(dy, s0, min_size, alpha, 0.0, min_effect):
            if all(abs(j - s) >= min_size for s, _, _ in found):
                found.append((j, p, "trend"))
    found.sort()
    bounds = [s0] + [s for s, _, _ in found] + [len(y)]
    changes = []
    for i, (s, p, kind) in enumerate(found):
        a, b = bounds[i], bounds[i + 2]
        ch = _describe(y, a, s, b, p) if kind == "level" else _describe(np.diff(y), a, s, b - 1, p)
        ch.index, ch.kind = int(keep[s]), kind
        changes.append(ch)
    return ChangeResult(n=len(y_all), changes=changes)


class ChangeDetector:
    """Incremental change detection: feed new points, re-examine only the open last segment.

    Change points already reported are final; each update searches from the last one on, so
    the cost of an update grows with the open segment, not with the whole history.
    """

    def __init__(self, **params):
        self.params = params  # keyword arguments of detect_changes
        self.values: list[float] = []
        self.changes: list[Change] = []

    def update(self, new_values) -> list[Change]:
        """Append ``new_values``; return the changes found in this update (earlier ones are kept)."""
        new = _clean(new_values) if len(new_values) else np.array([])
        self.values.extend(new.tolist())
        start = self.changes[-1].index if self.changes else 0
        res = detect_changes(self.values, start=start, **self.params)
        fresh = [c for c in res.changes if c.index > start or not self.changes]
        self.changes.extend(fresh)
        return fresh

    @property
    def result(self) -> ChangeResult:
        """Return all changes found so far."""
        return ChangeResult(n=len(self.values), changes=list(self.changes))
