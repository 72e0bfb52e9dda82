"""The interval of a change between two sides: one place, shared by `compare` and `gate`.

Two runs of one configuration give two series of per-step values (step time, seconds per
token, a loss) whose successive steps are not independent: a slow stretch of a shared
machine lasts several steps. The variance of a series' mean is then its *long-run* variance
over n, not its variance over n. It is estimated per series as:

1. **AR(1) prewhitening** (Andrews & Monahan 1992): phi from the lag-1 autocorrelation of the
   series' ranks (an outlier step cannot fake or hide persistence) read on the Pearson scale,
   corrected for its small-sample bias (+(1 + 4 phi) / n, Kendall 1954), clipped to
   [0, ``PHI_MAX``]; residuals e_t = u_t - phi u_{t-1} of the centred series u;
2. **equal-weighted cosine** long-run variance of the residuals (Lazarus, Lewis, Stock &
   Watson 2018, "HAR inference: recommendations for practice", JBES): the mean of K squared
   projections on cos(pi j (t - 1/2) / n), j = 1..K, K = 0.4 n^(2/3); the t statistic then
   has K degrees of freedom (fixed-b theory), not the normal quantile that makes Newey-West
   with a data-chosen bandwidth reject too often in short series;
3. recoloured by 1 / (1 - phi)^2 (prewhitening before a kernel or cosine estimate is also the
   default of R's ``sandwich::lrvar`` and an option of ``nse::nse.cos``; neither statsmodels nor
   arch is a dependency here); its degrees of freedom are at most the effective number of
   independent steps, n (1 - phi) / (1 + phi), minus one (a series with phi 0.9 over 50 steps
   holds about 2.6 independent values, whatever K says).

The change of B against A is log mean(B) - log mean(A) (a ratio of means: total time per
token, what throughput and cost follow) with the delta-method variance
LRV_A / (n_A mean_A^2) + LRV_B / (n_B mean_B^2) and Welch-Satterthwaite degrees of freedom.
With repeats (two or more runs on each side, or on one side), each run's mean is one sample
and the interval is the pooled two-sample t on their logs: run-to-run variation (another
node, another moment of a shared machine), which no single run's steps can show, is then in it.

Simulated coverage (AR(1) phi 0-0.9, heavy tails, drift): docs/benchmarks.md "Trainer and
compare", command ``benchmarks/sim_gate.py --series``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

PHI_MAX = 0.97  # beyond this a series is a random walk over any length we see: no mean to estimate
EWC_FACTOR = 0.4  # K = EWC_FACTOR * n^(2/3) cosines (Lazarus, Lewis, Stock & Watson 2018)


@dataclass(kw_only=True)
class LongRunVariance:
    """The long-run variance of one series' mean, with what it was estimated from."""

    mean: float  # units of the series
    variance: float  # long-run variance (units^2): n x the variance of the mean
    n: int  # finite values used
    phi: float  # AR(1) coefficient the residuals were prewhitened with
    k: int  # cosines in the estimate
    df: float  # degrees of freedom of the estimate: min(k, effective n - 1)


@dataclass(kw_only=True)
class Shift:
    """The change log(B) - log(A) of a mean with its interval (natural-log units: 0.01 ~ +1%)."""

    estimate: float
    lo: float
    hi: float
    se: float
    df: float
    level: float
    method: str

    @property
    def p_value(self) -> float:
        """Return the two-sided p-value of no change from the same t statistic."""
        from scipy.special import stdtr

        if not self.se > 0:
            return 0.0 if self.estimate != 0 else 1.0
        return float(2 * stdtr(self.df, -abs(self.estimate) / self.se))

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {**asdict(self), "p_value": self.p_value}


def _finite(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


def lag1(x: np.ndarray) -> float:
    """Return the lag-1 autocorrelation of ``x`` around its mean (Yule-Walker: sum u_t u_(t-1) / sum u_t^2)."""
    u = x - x.mean()
    den = float(u @ u)
    return float(u[1:] @ u[:-1]) / den if den > 0 else 0.0


def ranks(x: np.ndarray) -> np.ndarray:
    """Return the ranks of ``x`` (1..n, ties get their average rank: scipy.stats.rankdata's default)."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inv]


def ar1_phi(x: np.ndarray) -> float:
    """Return the AR(1) coefficient of ``x`` for prewhitening: the lag-1 autocorrelation r of its
    ranks read as a Pearson correlation (2 sin(pi r / 6): ranks of a Gaussian pair with correlation
    phi correlate (6/pi) arcsin(phi/2)), plus Kendall's small-sample bias (1 + 4 phi) / n, clipped
    to [0, PHI_MAX]."""
    x = _finite(x)
    if len(x) < 4 or x.min() == x.max():
        return 0.0
    phi = 2 * math.sin(math.pi * lag1(ranks(x)) / 6)
    return float(min(max(phi + (1 + 4 * max(phi, 0.0)) / len(x), 0.0), PHI_MAX))


@lru_cache(maxsize=64)
def _cosines(n: int, k: int) -> np.ndarray:
    t = np.arange(1, n + 1) - 0.5
    return np.sqrt(2.0 / n) * np.cos(np.pi * np.arange(1, k + 1)[:, None] * t[None, :] / n)


def cosine_lrv(u: np.ndarray, k: int) -> float:
    """Return the equal-weighted cosine estimate of the long-run variance of ``u`` (units^2):
    mean over j = 1..k of (sqrt(2/n) sum_t cos(pi j (t - 1/2) / n) (u_t - mean u))^2."""
    u = np.asarray(u, dtype=float)
    proj = _cosines(len(u), k) @ (u - u.mean())
    return float(proj @ proj) / k


def long_run_variance(x) -> LongRunVariance:
    """Return the long-run variance of the mean of series ``x`` (module doc: prewhitened cosine estimate)."""
    x = _finite(x)
    n = len(x)
    if n < 3:
        return LongRunVariance(mean=float(x.mean()) if n else float("nan"), variance=float("nan"), n=n, phi=0.0,
                               k=0, df=0.0)
    phi = ar1_phi(x)
    u = x - x.mean()
    e = u[1:] - phi * u[:-1]
    k = max(2, min(int(round(EWC_FACTOR * n ** (2 / 3))), len(e) - 1))
    ess = n * (1 - phi) / (1 + phi)
    return LongRunVariance(mean=float(x.mean()), variance=cosine_lrv(e, k) / (1 - phi) ** 2, n=n, phi=phi, k=k,
                           df=float(max(min(k, ess - 1), 1.0)))


def series_shift(a, b, level: float = 0.95) -> Shift:
    """Return log mean(b) - log mean(a) with its ``level`` interval for two autocorrelated
    per-step series of positive values (module doc)."""
    from scipy.special import stdtrit

    va, vb = long_run_variance(a), long_run_variance(b)
    if not (va.mean > 0 and vb.mean > 0):
        raise ValueError("series_shift needs positive means (it is the interval of a ratio)")
    if va.n < 3 or vb.n < 3:  # no variance to estimate: any change is possible
        return Shift(estimate=math.log(vb.mean / va.mean), lo=-math.inf, hi=math.inf, se=math.inf, df=1.0,
                     level=level, method=f"too few steps for an interval ({va.n} vs {vb.n}; at least 3 a side)")
    sa, sb = va.variance / (va.n * va.mean**2), vb.variance / (vb.n * vb.mean**2)
    se = math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / (sa**2 / va.df + sb**2 / vb.df) if sa + sb > 0 else va.df + vb.df
    d = math.log(vb.mean) - math.log(va.mean)
    q = float(stdtrit(df, 0.5 + level / 2))  # Student's t quantile
    return Shift(estimate=d, lo=d - q * se, hi=d + q * se, se=se, df=df, level=level,
                 method=(f"ratio of means over steps, autocorrelation-robust (AR(1) phi {va.phi:.2f}/{vb.phi:.2f} "
                         f"prewhitened cosine long-run variance, t at {df:.0f} df)"))


def repeats_shift(a_means, b_means, level: float = 0.95) -> Shift:
    """Return the change of log run means, B against A, with the pooled two-sample t interval
    (one value per run; at least 3 runs in all and 2 on one side)."""
    from scipy.stats import t

    a, b = np.log(_finite(a_means)), np.log(_finite(b_means))
    df = (len(a) - 1) + (len(b) - 1)
    if df < 1:
        raise ValueError("repeats_shift needs two runs on at least one side")
    d = float(b.mean() - a.mean())
    ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    se = math.sqrt(ss / df * (1 / len(a) + 1 / len(b)))
    q = float(t.ppf(0.5 + level / 2, df))
    return Shift(estimate=d, lo=d - q * se, hi=d + q * se, se=se, df=float(df), level=level,
                 method=f"pooled t over run means ({len(a)} vs {len(b)} runs)")


def shift(a_runs: list, b_runs: list, level: float = 0.95) -> Shift:
    """Return the change of the mean of B's runs against A's (one per-step series per run):
    ``series_shift`` with one run a side, ``repeats_shift`` over run means otherwise."""
    if len(a_runs) == 1 and len(b_runs) == 1:
        return series_shift(a_runs[0], b_runs[0], level)
    return repeats_shift([_finite(r).mean() for r in a_runs], [_finite(r).mean() for r in b_runs], level)
