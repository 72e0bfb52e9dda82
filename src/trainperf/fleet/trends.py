"""Changes of slope: where a ramp starts, where it ends, and whether a step was really a ramp.

Segmented regression on the whole series (Muggeo 2003's model, fitted by least squares):
a level, a common linear drift, a step column for every level change the rank tests found, and
continuous piecewise-linear terms:

- **kinks** (a hinge ``(t - k)+``: the slope changes after point k) are added one at a time by
  a scan over every k. The statistic is the hinge's t-value against the long-run noise sigma;
  its maximum over k is judged with Davies' (1987) bound for the supremum of a Gaussian process,
  P(max |Z| > u) <= 2 Phi(-u) + V/pi exp(-u^2/2), V the length of the path the normalised hinge
  columns draw on the unit sphere (the effective number of distinct tests, exact for this
  design), so the scan needs no Monte Carlo and no Bonferroni over correlated k;
- **ramps** ``clip((t - k1) / (k2 - k1), 0, 1)``: a level step, or a run of same-sign steps,
  is replaced by one ramp when the ramp fits better by BIC (residual sum of squares in units of
  the long-run noise variance plus log n per parameter) and fits with the drift the steps leave
  (``_same_drift``: not a ramp plus an opposite drift fitting some other feature). A ramp over
  fewer than ``MIN_RAMP`` points is a step.

Noise: outliers are clipped to 3 robust sigmas around a running median first (stalled runs
cannot make a kink), and the sigma the tests use is the long-run one,
sigma_diff x sqrt(1 + rho) / (1 - rho) with rho the noise's lag-1 autocorrelation read from
differences (``changepoints.noise_autocorr``): for AR(1) noise this is the standard deviation a
smooth regressor's coefficient sees, so persistent noise or a random walk is not read as kinks.
A kink that passes is judged again with the long-run sigma of the kink model's residuals, their
lag-1 autocorrelation bias-corrected for the fitted coefficients (``noise.ar1_from_residuals``):
the differences' rho scatters by 0.2-0.35 on a few hundred points.
Hand-written: ruptures' piecewise-linear cost has no test and no BIC choice between a step and
a ramp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainperf.fleet.noise import CLIP_SIGMAS, ar1_from_residuals

MIN_RAMP = 3  # a ramp reaching its new level over fewer points (k2 - k1) than this is a step
MAX_KINKS = 4  # kinks added per series at most (each one tested at alpha)
MAX_GROUP = 8  # most consecutive same-sign steps one ramp may replace (a 100-run ramp: 5 steps)
# a kink needs 2 x min_size points on each side: with fewer, its t-value rests on a handful of
# points and heavy-tailed noise breaks the normal bound (2 of 20 A/A series with 3% stalls in t3
# noise got a kink 6-8 points from an end at 1 x min_size)
KINK_SUPPORT = 2
_CANDIDATES = 400  # kink positions scanned at most per pass (evenly spaced, then refined)


@dataclass(kw_only=True, frozen=True, slots=True)
class Ramp:
    """A change of slope found in a series (positions are 0-based, among non-missing points).

    ``start``: first point off the old line (k1 + 1); ``end``: first point back on a line of the
    old slope (k2), None when the new slope lasts to the next change or the series' end;
    ``fit_end``: k2 of the fitted ramp (the model's, whether or not the ramp is seen to end);
    ``slope``: change of slope (units per point) and ``se`` its standard error (long-run sigma);
    ``level``: fitted value at k1; ``total``: level change the new slope makes (slope x its
    length, to the series' end when the ramp does not end); ``slope_before``: the fitted slope
    over the min_size points up to k1; ``p_value``: of the test that found it (the kink scan's
    bound, or the level test of the step(s) the ramp replaced); ``replaces``: those steps'
    positions.
    """

    start: int
    end: int | None
    fit_end: int | None
    slope: float
    se: float
    level: float
    total: float
    slope_before: float
    p_value: float
    replaces: tuple[int, ...] = ()


def running_median(y: np.ndarray, w: int) -> np.ndarray:
    """Return the median of the 2w + 1 points centred on each point (edges padded with the end values)."""
    pad = np.concatenate([np.full(w, y[0]), y, np.full(w, y[-1])])
    return np.median(sliding_window_view(pad, 2 * w + 1), axis=1)


def clip_outliers(y: np.ndarray, w: int, fit: np.ndarray | None = None) -> np.ndarray:
    """Return y with its outliers clipped to ``CLIP_SIGMAS`` robust sigmas of the running median.

    A point is an outlier when it lies more than ``CLIP_SIGMAS`` robust sigmas from its running
    median (2w + 1 points) and, when ``fit`` is given (the fitted steps and drift), from the fit
    too: the running median rounds a step off, the fit does not; the fit misses a ramp, the
    running median follows it.
    """
    from trainperf.fleet.noise import robust_scale

    med = running_median(y, w)
    s = robust_scale(y - med)
    if not s > 0:
        return y.copy()
    out = np.abs(y - med) > CLIP_SIGMAS * s
    if fit is not None:
        sf = robust_scale(y - fit)
        out &= ~(np.abs(y - fit) <= CLIP_SIGMAS * sf) if sf > 0 else np.zeros_like(out)
    return np.where(out, med + np.clip(y - med, -CLIP_SIGMAS * s, CLIP_SIGMAS * s), y)


def long_run_sigma(y: np.ndarray, quantum: float | None = None) -> float:
    """Return the long-run noise sigma of y: sigma_diff x sqrt(1 + rho) / (1 - rho) (AR(1) reference).

    sigma_diff is the robust point-to-point noise (``noise_sigma``: sigma sqrt(1 - rho) for AR(1)),
    so the result is sigma sqrt((1 + rho) / (1 - rho)), the spread a slowly varying regressor's
    coefficient sees; rho is at most 0.98 (a random walk: 99x the white-noise variance).
    ``quantum``: the resolution of y's values (``noise.quantum``; 0: continuous; None: read from y).
    """
    from trainperf.fleet.noise import noise_autocorr, noise_sigma

    rho = noise_autocorr(y, quantum)
    return noise_sigma(y, quantum) * math.sqrt(1 + rho) / (1 - rho)


def _orth(x: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(x)
    keep = np.abs(np.diag(r)) > 1e-9 * max(1.0, float(np.abs(np.diag(r)).max()))
    return q[:, keep]


def _resid(q: np.ndarray, a: np.ndarray) -> np.ndarray:
    return a - q @ (q.T @ a)


def _hinges(n: int, ks: np.ndarray) -> np.ndarray:
    return np.maximum(np.arange(n)[:, None] - ks[None, :], 0.0)


def _normal_isf(p: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(p))


def davies_p(u: float, path_length: float) -> float:
    """Return Davies' (1987) bound on P(max_k |Z_k| > u) for a unit-variance Gaussian process Z
    whose normalised directions trace a path of length ``path_length`` (radians) on the sphere."""
    return float(min(1.0, math.erfc(u / math.sqrt(2)) + path_length / math.pi * math.exp(-u * u / 2)))


def kink_scan(y: np.ndarray, design: np.ndarray, lo: int, hi: int, sigma: float
              ) -> tuple[int, float, float, float] | None:
    """Scan hinges (t - k)+ for k in [lo, hi] against ``design`` (n x p); return (k, slope, se, p).

    ``slope``: the hinge's least-squares coefficient (units per point) with the design; ``se``:
    its standard error with noise sigma ``sigma``; ``p``: Davies' bound for the maximum |t| over
    the scanned k. None when there is nothing to scan.
    """
    n = len(y)
    if hi < lo or not sigma > 0:
        return None
    q = _orth(design)
    ks = np.unique(np.linspace(lo, hi, min(_CANDIDATES, hi - lo + 1)).round().astype(int))
    hr = _resid(q, _hinges(n, ks))
    nrm = np.sqrt((hr * hr).sum(axis=0))
    ok = nrm > 1e-9
    if not ok.any():
        return None
    ks, hr, nrm = ks[ok], hr[:, ok], nrm[ok]
    e = hr / nrm
    z = (e.T @ y) / sigma
    path = float(np.arccos(np.clip((e[:, :-1] * e[:, 1:]).sum(axis=0), -1.0, 1.0)).sum()) if len(ks) > 1 else 0.0
    j = int(np.argmax(np.abs(z)))
    if len(ks) < hi - lo + 1:  # refine between the scanned neighbours
        a, b = ks[max(j - 1, 0)], ks[min(j + 1, len(ks) - 1)]
        fine = np.arange(a, b + 1)
        hf = _resid(q, _hinges(n, fine))
        nf = np.sqrt((hf * hf).sum(axis=0))
        zf = np.where(nf > 1e-9, (hf.T @ y) / np.maximum(nf, 1e-300) / sigma, 0.0)
        i = int(np.argmax(np.abs(zf)))
        if abs(zf[i]) > abs(z[j]):
            return int(fine[i]), float(zf[i] * sigma / nf[i]), float(sigma / nf[i]), davies_p(abs(zf[i]), path)
    return int(ks[j]), float(z[j] * sigma / nrm[j]), float(sigma / nrm[j]), davies_p(abs(float(z[j])), path)


def _ramp_col(n: int, k1: int, k2: int) -> np.ndarray:
    """Ramp from 0 (t <= k1) to k2 - k1 (t >= k2), slope 1 per point between."""
    t = np.arange(n)
    return np.clip(t - k1, 0, k2 - k1).astype(float)


def _step_col(n: int, s: int) -> np.ndarray:
    return (np.arange(n) >= s).astype(float)


def _best_ramp(y: np.ndarray, q: np.ndarray, k1s: np.ndarray, k2s: np.ndarray, sigma: float,
               lengths: tuple[int, int] = (MIN_RAMP, 1 << 62), sign: float = 0.0) -> tuple[float, int, int]:
    """Return (gain, k1, k2): the ramp with k1 in k1s, k2 in k2s and k2 - k1 within ``lengths``
    (inclusive) that most reduces the residual sum of squares of y on the basis ``q`` (gain in units
    of sigma^2); gain -inf if none. A ramp of length 1 is a step. ``sign`` (+1 / -1): only ramps
    going that way (with the drift in the basis, a ramp from the series' start is the same fit as a
    ramp of the other sign elsewhere)."""
    n = len(y)
    ks = np.unique(np.concatenate([k1s, k2s]))
    hr = _resid(q, _hinges(n, ks))  # a ramp is a difference of two hinges: (t-k1)+ - (t-k2)+
    g = hr.T @ y
    gram = hr.T @ hr
    i1, i2 = np.searchsorted(ks, k1s), np.searchsorted(ks, k2s)
    a, b = np.meshgrid(i1, i2, indexing="ij")
    length = ks[b] - ks[a]
    valid = (length >= lengths[0]) & (length <= lengths[1])
    if sign:
        valid &= np.sign(g[a] - g[b]) == sign
    num = (g[a] - g[b]) ** 2
    den = gram[a, a] - 2 * gram[a, b] + gram[b, b]
    gain = np.where(valid & (den > 1e-12), num / np.maximum(den, 1e-300), -np.inf) / sigma**2
    if not np.isfinite(gain).any():
        return -np.inf, -1, -1
    i, j = np.unravel_index(int(np.argmax(gain)), gain.shape)
    return float(gain[i, j]), int(k1s[i]), int(k2s[j])


def _grid(lo: int, hi: int, near: tuple[int, ...], w: int, cap: int = 120) -> np.ndarray:
    """Candidate positions in [lo, hi]: every point within 2w of ``near``, plus an even grid."""
    if hi < lo:
        return np.array([], int)
    pts = [np.linspace(lo, hi, min(cap, hi - lo + 1)).round()]
    pts += [np.arange(max(lo, c - 2 * w), min(hi, c + 2 * w) + 1) for c in near]
    return np.unique(np.concatenate(pts)).astype(int)


def _basis(n: int, steps: list[int], ramps: list[tuple[int, int]], kinks: list[int]) -> np.ndarray:
    cols = [np.ones(n), np.arange(n, dtype=float)] + [_step_col(n, s) for s in steps]
    cols += [_ramp_col(n, a, b) for a, b in ramps] + [np.maximum(np.arange(n) - k, 0.0) for k in kinks]
    return np.column_stack(cols)


def _rss(y: np.ndarray, x: np.ndarray) -> float:
    r = _resid(_orth(x), y)
    return float(r @ r)


def _drift_coef(y: np.ndarray, others: np.ndarray, sigma: float) -> tuple[float, float]:
    """Return (coefficient, standard error) of the drift column t in the least-squares fit of y on
    [t, others] (units per point; noise sigma ``sigma``)."""
    t = _resid(_orth(others), np.arange(len(y), dtype=float))
    tt = float(t @ t)
    return float(t @ y) / tt, sigma / math.sqrt(tt)


def series_drift(y: np.ndarray, bounds: list[int], cap: int = 200) -> float:
    """Return the drift (units per point) common to all segments [bounds[i], bounds[i+1]) of y:
    Theil-Sen, the median slope of pairs within one segment (never across a change), at most
    ``cap`` evenly spaced points per segment."""
    slopes = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi - lo < 3:
            continue
        idx = np.unique(np.linspace(lo, hi - 1, min(cap, hi - lo)).round().astype(int))
        i, j = np.triu_indices(len(idx), 1)
        slopes.append((y[idx[j]] - y[idx[i]]) / (idx[j] - idx[i]))
    return float(np.median(np.concatenate(slopes))) if slopes else 0.0


def _same_drift(y: np.ndarray, steps: list[int], k1: int, k2: int, sigma: float, z_crit: float) -> bool:
    """False when the ramp (k1, k2) fits y only with a drift that undoes it: the ramp model's drift
    is opposite to the ramp, at least half its slope, and more than ``z_crit`` standard errors from
    the Theil-Sen drift within the steps' segments (``series_drift``; standard errors of
    the two combined, the within-segment one as least squares'). True otherwise.

    A ramp replaces steps when it explains the same change. With the drift free, a ramp and an
    opposite drift draw a V (a kink with a slope before it) that can fit some other feature: a short
    first segment the level tests could not confirm (bimodal run times, docs/benchmarks.md: a drift
    of -0.60 per point under a ramp of +0.70, where the segments hold -0.01). The within-segment drift
    alone is no reference: on a long ramp cut by its steps the segments hold mostly ramp (a real
    ramp's drift moved 5-47 standard errors from it), but a real ramp's model keeps its drift small
    against the ramp's slope (at most 4% of it in 40 draws of steady ramps)."""
    n = len(y)
    bounds = [0] + list(steps) + [n]
    b_ref = series_drift(y, bounds)
    sizes = np.diff(bounds).astype(float)
    s_tt = float((sizes**3 - sizes).sum()) / 12.0
    cols = np.column_stack([np.ones(n), _ramp_col(n, k1, k2)])
    b_ramp, se = _drift_coef(y, cols, sigma)
    slope = float(np.linalg.lstsq(np.column_stack([cols, np.arange(n)]), y, rcond=None)[0][1])
    se = math.hypot(se, sigma / math.sqrt(s_tt)) if s_tt > 0 else math.inf
    undoes = np.sign(b_ramp) == -np.sign(slope) and abs(b_ramp) >= 0.5 * abs(slope)
    return not (undoes and abs(b_ramp - b_ref) > z_crit * se)


def ramps_from_steps(y: np.ndarray, steps: list[tuple[int, float]], w: int, sigma: float, alpha: float = 0.01
                     ) -> tuple[list[tuple[int, float]], list[Ramp]]:
    """Replace level steps that a ramp fits better (BIC) by ramps; return (steps kept, ramps).

    ``steps``: [(position, p-value)] sorted; a run of consecutive steps of one sign (up to ``MAX_GROUP``)
    becomes one ramp from before its first step to after its last when
    RSS_ramp / sigma^2 + 3 log n < RSS_steps / sigma^2 + 2 m log n (BIC with the long-run sigma;
    m steps: a position and a size each; the ramp: two ends and a size). A single step is
    compared in its best short form (a transition over fewer than ``MIN_RAMP`` points, placed
    anywhere a ramp could start or end). Greedy, best gain first.
    """
    n = len(y)
    pen = math.log(n)
    steps = list(steps)
    ramps: list[tuple[int, int, float, tuple[int, ...]]] = []
    open_ends: set[tuple[int, int]] = set()  # ramps that end fewer than w points before the next change
    while True:
        pos = [s for s, _ in steps]
        best = None
        for i in range(len(steps)):
            for m in range(1, MAX_GROUP + 1):
                group = steps[i:i + m]
                if len(group) < m:
                    break
                signs = {np.sign(np.median(y[s:s + w]) - np.median(y[max(s - w, 0):s])) for s, _ in group}
                if len(signs) > 1:
                    break
                sign = signs.pop()
                first, last = group[0][0], group[-1][0]
                # the window between the neighbouring changes: only its fit changes
                lo = max([0] + [s for s in pos if s < first] + [b for _, b, _, _ in ramps if b <= first])
                hi = min([n - 1] + [s - 1 for s in pos if s > last] + [a for a, _, _, _ in ramps if a >= last])
                yy, t0 = y[lo:hi + 1], lo
                nn = len(yy)
                # any ramp inside the window (the rank test can place a ramp's step off its middle)
                k1s = k2s = _grid(0, hi - t0, (first - 1 - t0, last - t0), w)
                if len(k1s) < 2:
                    continue
                z_crit = _normal_isf(alpha / (2 * len(k1s)))
                q = _orth(_basis(nn, [], [], []))
                gain, k1, k2 = _best_ramp(yy, q, k1s, k2s, sigma, sign=sign)
                if not np.isfinite(gain):
                    continue
                r0 = _resid(q, yy)
                rss_base = float(r0 @ r0)
                rss_steps = _rss(yy, _basis(nn, [g - t0 for g, _ in group], [], []))
                if m == 1:  # the step may sit a point off, or take 2 points: its best short form
                    short, _, _ = _best_ramp(yy, q, k1s, k2s, sigma, (1, MIN_RAMP - 1), sign)
                    rss_steps = min(rss_steps, rss_base - short * sigma**2)
                rss_ramp = rss_base - gain * sigma**2
                delta = (rss_steps - rss_ramp) / sigma**2 + (2 * m - 3) * pen  # BIC(steps) - BIC(ramp)
                if delta > 0 and not _same_drift(yy, [g - t0 for g, _ in group], k1, k2, sigma, z_crit):
                    continue
                if delta > 0 and (best is None or delta > best[0]):
                    best = (delta, i, m, k1 + t0, k2 + t0, hi - (k2 + t0) < w)
        if best is None:
            break
        _, i, m, k1, k2, open_end = best
        group = steps[i:i + m]
        ramps.append((k1, k2, max(p for _, p in group), tuple(s for s, _ in group)))
        if open_end:
            open_ends.add((k1, k2))
        steps = steps[:i] + steps[i + m:]
    out = []
    pos = [s for s, _ in steps]
    for a, b, p, rep in ramps:
        others = [(c, d) for c, d, _, _ in ramps if (c, d) != (a, b)]
        x = _basis(n, pos, others, [])
        r = _describe_ramp(y, x, a, b, sigma, p, rep, w)
        out.append(replace(r, end=None) if (a, b) in open_ends else r)
    return steps, out


def _describe_ramp(y: np.ndarray, x: np.ndarray, k1: int, k2: int | None, sigma: float, p: float,
                   replaces: tuple[int, ...] = (), w: int = 5) -> Ramp:
    """Fit ``x`` plus the ramp (or the hinge, k2 None) and describe it."""
    n = len(y)
    col = _ramp_col(n, k1, k2) if k2 is not None else np.maximum(np.arange(n) - k1, 0.0)
    full = np.column_stack([x, col])
    coef, *_ = np.linalg.lstsq(full, y, rcond=None)
    slope = float(coef[-1])
    cr = _resid(_orth(x), col)
    se = sigma / math.sqrt(max(float(cr @ cr), 1e-300))
    fit = full @ coef
    # slope just before the change: the fitted line over the w points up to k1
    a = max(k1 - w, 0)
    before = float((fit[k1] - fit[a]) / (k1 - a)) if k1 > a else 0.0
    total = slope * ((k2 if k2 is not None else n - 1) - k1)
    return Ramp(start=k1 + 1, end=k2, fit_end=k2, slope=slope, se=se, level=float(fit[k1]), total=total,
                slope_before=before, p_value=p,
                replaces=replaces)


def _step_fits_better(y: np.ndarray, x: np.ndarray, kink: tuple[int, float, float, float], w: int) -> bool:
    """True when one level step within 2w points of the kink reduces the residual sum of squares at
    least as much as the kink does (same number of parameters: the change is a step, not a trend;
    a step the level tests did not keep, e.g. fewer than w points before the end, stays unreported)."""
    n = len(y)
    k = kink[0]
    q = _orth(x)
    h = _resid(q, np.maximum(np.arange(n) - k, 0.0))
    kink_gain = float(h @ y) ** 2 / max(float(h @ h), 1e-300)
    ss = np.arange(max(k - 2 * w, 1), min(k + 2 * w, n - 1) + 1)
    c = _resid(q, (np.arange(n)[:, None] >= ss[None, :]).astype(float))
    den = (c * c).sum(axis=0)
    gain = np.where(den > 1e-12, (c.T @ y) ** 2 / np.maximum(den, 1e-300), 0.0)
    return bool(gain.max(initial=0.0) >= kink_gain)


def _residual_sigma(y: np.ndarray, x: np.ndarray) -> float:
    """Return the long-run sigma of the residuals of y on ``x``: their standard deviation x
    sqrt((1 + rho) / (1 - rho)), rho their lag-1 autocorrelation with the bias of the fitted
    coefficients undone (``noise.ar1_from_residuals``: -0.04 to -0.08 on 80-200 points of AR(1) 0.5
    noise for 2-3 coefficients), clipped to [0, 0.98].

    The standard deviation, not a robust scale: a kink's t-value is a weighted sum of points, whose
    spread is the noise's standard deviation (1.7x the robust scale for t3 noise; y's outliers are
    clipped already). The differences' autocorrelation (``noise_autocorr``) is robust but loose on
    short series (0.0-0.35 on 70-220 points of AR(1) 0.5 noise); the fitted model's residuals give
    the efficient estimate."""
    q = _orth(x)
    r = _resid(q, y)
    rho = ar1_from_residuals([r], q.shape[1])
    return float(np.std(r)) * math.sqrt((1 + rho) / (1 - rho))


def _fits_to_noise(y: np.ndarray, x: np.ndarray, max_misfit: float, quantum: float = 0.0) -> bool:
    """True when the residuals of y on ``x`` are noise: their robust scale is at most ``max_misfit``
    times the marginal noise sigma (sigma_diff / sqrt(1 - rho), the AR(1) reference)."""
    from trainperf.fleet.noise import noise_autocorr, noise_sigma, robust_scale

    r = _resid(_orth(x), y)
    marginal = noise_sigma(y, quantum) / math.sqrt(1 - noise_autocorr(y, quantum))
    return robust_scale(r) <= max_misfit * marginal


def find_ramps(y: np.ndarray, steps: list[tuple[int, float]], w: int, alpha: float, max_misfit: float = 1.5
               ) -> tuple[list[tuple[int, float]], list[Ramp]]:
    """Return (steps kept, ramps): level steps that are ramps become ramps, then kinks are added.

    ``y``: the series (no missing values); ``steps``: [(position, p-value)] of the level changes
    found; ``w``: fewest points per segment; ``alpha``: level of the kink scan; ``max_misfit``:
    ramps and kinks are kept only when the fitted model (drift, steps, ramps, kinks) leaves
    residuals within this many marginal noise sigmas (``_fits_to_noise``): on a curve or a
    sawtooth, slope changes are everywhere and none is a change. A kink and the
    next one with a slope change of the opposite sign, within two standard errors of it, are one
    ramp that starts at the first and ends at the second.
    """
    n = len(y)
    if n < 4 * w:
        return steps, []
    x0 = _basis(n, sorted(s for s, _ in steps), [], [])
    from trainperf.fleet.noise import quantum

    q = quantum(y)  # of the values as measured (clipping moves outliers off the grid)
    yc = clip_outliers(y, w, x0 @ np.linalg.lstsq(x0, y, rcond=None)[0])
    sigma = long_run_sigma(yc, q)
    if not sigma > 0:
        return steps, []
    original = list(steps)
    steps, ramps = ramps_from_steps(yc, sorted(steps), w, sigma, alpha)
    pos = [s for s, _ in steps]
    ramp_ends = [(r.start - 1, r.fit_end) for r in ramps]
    kinks: list[tuple[int, float]] = []
    for _ in range(MAX_KINKS):
        x = _basis(n, pos, ramp_ends, [k for k, _ in kinks])
        found = kink_scan(yc, x, KINK_SUPPORT * w - 1, n - 1 - KINK_SUPPORT * w, sigma)
        if found is not None and found[3] < alpha:  # judged again with the noise the kink's model leaves
            resid_sigma = _residual_sigma(yc, np.column_stack([x, np.maximum(np.arange(n) - found[0], 0.0)]))
            if resid_sigma > sigma:
                found = kink_scan(yc, x, KINK_SUPPORT * w - 1, n - 1 - KINK_SUPPORT * w, resid_sigma)
        if found is None or found[3] >= alpha or _step_fits_better(yc, x, found, w):
            break
        kinks.append((found[0], found[3]))
    if kinks and not _fits_to_noise(yc, _basis(n, pos, ramp_ends, [k for k, _ in kinks]), max_misfit, q):
        kinks = []  # a sawtooth, a curve: slope changes everywhere are the process, not changes
    if ramps and not kinks and not _fits_to_noise(yc, _basis(n, pos, ramp_ends, []), max_misfit, q):
        return sorted(original), []  # nor is a step a ramp on a series that steps and ramps do not describe
    kinks.sort()
    out, i = list(ramps), 0
    while i < len(kinks):
        k, p = kinks[i]
        others = [c for c, _ in kinks if c != k]
        r = _describe_ramp(yc, _basis(n, pos, ramp_ends, others), k, None, sigma, p, w=w)
        if i + 1 < len(kinks):
            k2, p2 = kinks[i + 1]
            x2 = _basis(n, pos, ramp_ends, [c for c, _ in kinks if c != k2])
            r2 = _describe_ramp(yc, x2, k2, None, sigma, p2, w=w)
            if np.sign(r2.slope) != np.sign(r.slope) and abs(r2.slope + r.slope) <= 2 * math.hypot(r.se, r2.se):
                x = _basis(n, pos, ramp_ends, [c for c, _ in kinks if c not in (k, k2)])
                # the two kinks were placed one at a time: place the ramp's ends jointly
                cand = _grid(0, n - 1, (k, k2), w)
                gain, a, b = _best_ramp(yc, _orth(x), cand, cand, sigma, sign=float(np.sign(r.slope)))
                a, b = (a, b) if np.isfinite(gain) else (k, k2)
                out.append(_describe_ramp(yc, x, a, b, sigma, max(p, p2), w=w))
                i += 2
                continue
        out.append(r)
        i += 1
    return steps, sorted(out, key=lambda r: r.start)
