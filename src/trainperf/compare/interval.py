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

**The between-run term.** One run a side, the two means also differ by how much a run's level
moves from one run to the next (another moment of a shared machine, another node, a clock
that settled differently): variance tau^2 per run, so the change's variance is
LRV_A / (n_A mean_A^2) + LRV_B / (n_B mean_B^2) + 2 tau^2. Two runs' own steps cannot tell
tau (the difference of their levels *is* the thing tested), so it comes from elsewhere
(``BetweenRun``): the run store's history of repeated runs on the host (``compare.history``),
else the stated default ``DEFAULT_BETWEEN_CV``; and it is raised to what the runs' own steps
show (``drift_between``: a level that moves inside a run moves between runs at least as much).
Its degrees of freedom enter the Welch-Satterthwaite sum (a history of 4 runs has 3).

**The hosts' term.** When A and B ran on different hosts, the two sides' means also differ by how
much the hosts' levels differ (``HostSpread``), with one run a side and with repeats alike (repeats
on one host show how that host's runs differ, not how hosts do). When the store holds runs on the
very hosts compared (configurations run on them and on hosts linked to them), their offset is
measured (``compare.history.host_offset``: hosts as fixed effects beside configurations): the
change is corrected by it and the interval adds its estimate's variance (and, where several
configurations show it, how much a host's offset varies from one configuration to another).
Otherwise, the spread of hosts of that kind (sd sigma_host, ``compare.history.host_spread``)
weighted by how differently the two sides' runs are spread over hosts (2 for one run a side on
two hosts): + weight x sigma_host^2. Either term enters with its own degrees of freedom. When
nothing measures it the interval is unbounded (``hosts_unknown``) and the verdict is inconclusive.

Simulated coverage (AR(1) phi 0-0.9, heavy tails, drift, between-run levels): docs/benchmarks.md
"Trainer and compare", command ``benchmarks/sim_gate.py --series``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

PHI_MAX = 0.97  # beyond this a series is a random walk over any length we see: no mean to estimate
EWC_FACTOR = 0.4  # K = EWC_FACTOR * n^(2/3) cosines (Lazarus, Lewis, Stock & Watson 2018)
# The between-run sd of a run's log mean assumed when the store has no history of repeated runs.
# The power goal is the constraint (a 3% change in 1% step noise over 50 steps, one run a
# side, on a machine whose runs do not differ, found in >= 90% of pairs), and among the candidates
# (0-3%) that meet it the one with the lowest mean A/A false rate over simulated machines (hidden run
# levels of sd 0-2%, random-walk drifts, 50-200 steps; ``benchmarks/sim_gate.py --between``): 0.75%
# (power 100%, A/A 0% on machines whose runs differ by <= 0.5%, 11% at 1%); 1% gave 72% power.
# Machines noisier than this need the store's history or repeats, and the verdict names its source.
DEFAULT_BETWEEN_CV = 0.0075
DRIFT_BLOCKS = 5  # blocks whose means show a level moving inside a run (drift_between)
# tau^2 per unit of within-run level variance: a random-walk level whose block means vary by v
# within a run of n steps puts the next run's mean 2 v away in variance (n s^2 / 3 vs n s^2 / 6);
# simulated walks (end sd 0.5-5%, 50-200 steps) then give 1-5% A/A with no other term, 11-14% with 1.
DRIFT_FACTOR = 2.0


@dataclass(kw_only=True, frozen=True)
class HostSpread:
    """How much the hosts of A and B differ. ``weight``: sum over hosts of (B's share of runs there - A's)^2
    (2 for one run a side on two hosts, 0 when both sides ran on the same hosts in the same shares).

    Measured on the compared hosts themselves (``paired``): ``offset``, B's hosts' log level minus A's
    (natural-log units of time per token: 0.01 ~ B's hosts 1% slower), subtracted from the change, with the
    variance ``offset_var`` of its estimate; ``cv``, the sd of a host's level from one configuration to
    another beyond that offset (0 when the store shows none). Otherwise ``cv`` is the sd of the log level of
    hosts of that kind (``math.inf`` when the store cannot say) and the offset is 0. Either way the two
    sides' host levels add ``variance`` = weight x cv^2 + offset_var to the change's, with ``df`` degrees of
    freedom. ``hosts``: the sides' hosts, for the note."""

    cv: float
    df: float
    source: str
    weight: float
    hosts: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    offset: float = 0.0
    offset_var: float = 0.0
    paired: bool = False
    # True where the estimate rests on few runs that can show it small by chance (a host's offset varying
    # between configurations, read from the lack of fit): the interval's df is then at most ``df``, since
    # Welch-Satterthwaite gives a term estimated small no weight however few its df
    caps_df: bool = False

    @property
    def known(self) -> bool:
        """Return whether the hosts' difference was measured (else the change cannot be told from the hosts')."""
        return math.isfinite(self.cv)

    @property
    def variance(self) -> float:
        """Return the variance the hosts add to the change of the sides' log means (log units squared)."""
        return self.weight * self.cv**2 + self.offset_var


def hosts_differ(hosts: HostSpread | None) -> bool:
    """Return whether A and B ran on different hosts (or the same hosts in different shares)."""
    return hosts is not None and hosts.weight > 0


@dataclass(kw_only=True, frozen=True)
class BetweenRun:
    """The between-run term of one run's log mean: its sd ``cv`` (natural-log units, 0.01 ~ 1%) on one
    host, the degrees of freedom of its estimate (``math.inf`` for a stated value) and where it came
    from; ``hosts``: the term added when A and B ran on different hosts (None: the same hosts)."""

    cv: float
    df: float
    source: str
    hosts: HostSpread | None = None


DEFAULT_BETWEEN = BetweenRun(cv=DEFAULT_BETWEEN_CV, df=math.inf,
                             source="the stated default (no history of repeated runs in the store)")
NO_BETWEEN = BetweenRun(cv=0.0, df=math.inf, source="none (the steps' noise only)")


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
    between_cv: float = 0.0  # the between-run sd in the interval (one run a side), log units
    between_source: str = ""  # where it came from
    hosts: HostSpread | None = None  # the hosts' term in the interval (None: A and B on the same hosts)

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


def interval_ends(lo: float, hi: float) -> tuple[float | None, float | None]:
    """Return the ends of a relative change's interval (fractions: -0.02 = -2%) as compare and gate report
    them: None for an end the interval does not bound (infinite or NaN, or a lower end at or below -100%,
    where the log of a ratio is -inf), so that their JSON holds no Infinity or NaN."""
    return (lo if math.isfinite(lo) and lo > -1 else None), (hi if math.isfinite(hi) else None)


def interval_text(lo: float, hi: float, digits: int = 1) -> str | None:
    """Return a relative change's interval as compare and gate print it, "[-1.2%, +3.4%]" (``digits``
    decimals of a percent), or None when it is unbounded (``interval_ends``): the verb says why instead."""
    ends = interval_ends(lo, hi)
    if None in ends:
        return None
    return f"[{ends[0]:+.{digits}%}, {ends[1]:+.{digits}%}]"


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


def level_drift(x) -> float:
    """Return how much the level of series ``x`` moves inside it: the variance of the log means of
    ``DRIFT_BLOCKS`` consecutive blocks beyond what the steps' noise explains (the long-run variance
    of the steps around their own block's mean, over the block length), floored at 0 (log units
    squared; 0 with fewer than 4 steps a block). The noise is read around the block means, not the
    run's mean, so that the drift being measured does not inflate the noise it is held against."""
    x = _finite(x)
    m, size = DRIFT_BLOCKS, len(x) // DRIFT_BLOCKS
    if size < 4 or not (x > 0).all():
        return 0.0
    xb = x[len(x) - m * size:].reshape(m, size)  # the last m * size steps
    means = xb.mean(axis=1)
    v = long_run_variance((xb / means[:, None]).ravel())  # each block at its own level (mean 1)
    return max(float(np.log(means).var(ddof=1)) - v.variance / (size * v.mean**2), 0.0)


def drift_between(drift_a: float, drift_b: float, floor: BetweenRun) -> BetweenRun:
    """Return the between-run term of two runs whose ``level_drift`` are ``drift_a`` and ``drift_b``:
    ``floor`` (history or default), raised to ``DRIFT_FACTOR`` x their mean when that is larger
    (with 2 (DRIFT_BLOCKS - 1) degrees of freedom, the blocks of both runs)."""
    tau2 = DRIFT_FACTOR * (drift_a + drift_b) / 2
    if tau2 <= floor.cv**2:
        return floor
    return BetweenRun(cv=math.sqrt(tau2), df=2.0 * (DRIFT_BLOCKS - 1),
                      source=f"the runs' own level drift (above the {100 * floor.cv:.3g}% of {floor.source})",
                      hosts=floor.hosts)


def hosts_unknown_text(hosts: HostSpread) -> str:
    """Return why a change between sides on hosts that differ by an unknown amount has no interval, as
    compare and gate say it: "A ran on X, B on Y, and <source>: a difference of hosts cannot be told from
    the change"."""
    a, b = (", ".join(h) or "?" for h in hosts.hosts)
    return f"A ran on {a}, B on {b}, and {hosts.source}: a difference of hosts cannot be told from the change"


def hosts_unknown(d: float, level: float, hosts: HostSpread, method: str) -> Shift:
    """Return the interval of a change ``d`` (log units) between sides on different hosts whose spread is
    unknown: any change is possible (-inf to +inf), the method says why."""
    return Shift(estimate=d, lo=-math.inf, hi=math.inf, se=math.inf, df=1.0, level=level, hosts=hosts,
                 method=f"{hosts_unknown_text(hosts)} ({method} on one host)")


def _with_hosts(terms: list[tuple[float, float]], hosts: HostSpread | None) -> list[tuple[float, float]]:
    """Return the (variance, df) terms of a change with the hosts' term added when the sides' hosts differ."""
    if not hosts_differ(hosts) or hosts.variance <= 0:
        return terms
    return terms + [(hosts.variance, hosts.df)]


def hosts_offset(hosts: HostSpread | None) -> float:
    """Return the measured offset of B's hosts against A's to take off the change (log units; 0 when the
    sides' hosts do not differ or only their spread is known)."""
    return hosts.offset if hosts_differ(hosts) and hosts.known else 0.0


def hosts_text(hosts: HostSpread | None) -> str:
    """Return what the hosts' term holds, as a noun phrase ("" when the sides' hosts do not differ): the
    offset taken off the change ("B's hosts' offset of +6.19% ... against A's (...)") or the spread of hosts
    added to the interval ("hosts that differ by 2% (from ...)"), with where it came from."""
    if not hosts_differ(hosts):
        return ""
    if hosts.paired:
        per_config = f", and {100 * hosts.cv:.3g}% per configuration" if hosts.cv > 0 else ""
        return (f"B's hosts' offset of {math.expm1(hosts.offset):+.2%} in time per token against A's "
                f"(±{100 * math.sqrt(hosts.offset_var):.2g}% sd{per_config}; from {hosts.source})")
    return f"hosts that differ by {100 * hosts.cv:.3g}% (from {hosts.source})"


def _hosts_text(hosts: HostSpread | None) -> str:
    """Return the clause a Shift's method adds for the hosts' term ("" when the sides' hosts do not differ)."""
    text = hosts_text(hosts)
    return f", {'less' if hosts.paired else 'plus'} {text}" if text else ""


def change_interval(va: LongRunVariance, vb: LongRunVariance, between: BetweenRun, level: float = 0.95) -> Shift:
    """Return log mean B - log mean A with its ``level`` t interval from the two runs' long-run
    variances and the between-run term (module doc; positive means, at least 3 steps a side)."""
    from scipy.special import stdtrit

    # (variance of the change, degrees of freedom) per term: A's steps, B's steps, the two runs' levels,
    # and the two hosts' levels when A and B ran on different hosts
    d = math.log(vb.mean) - math.log(va.mean) - hosts_offset(between.hosts)
    what = (f"ratio of means over steps, autocorrelation-robust (AR(1) phi {va.phi:.2f}/{vb.phi:.2f} prewhitened "
            f"cosine long-run variance) plus a between-run sd of {100 * between.cv:.3g}% a run from {between.source}")
    if hosts_differ(between.hosts) and not between.hosts.known:
        return hosts_unknown(d, level, between.hosts, what)
    terms = _with_hosts([(va.variance / (va.n * va.mean**2), va.df), (vb.variance / (vb.n * vb.mean**2), vb.df),
                         (2 * between.cv**2, between.df)], between.hosts)
    se, df = _welch(terms, fallback_df=va.df + vb.df, hosts=between.hosts)
    q = float(stdtrit(df, 0.5 + level / 2))  # Student's t quantile
    return Shift(estimate=d, lo=d - q * se, hi=d + q * se, se=se, df=df, level=level,
                 between_cv=between.cv, between_source=between.source, hosts=between.hosts,
                 method=f"{what}{_hosts_text(between.hosts)}, t at {df:.0f} df")


def _welch(terms: list[tuple[float, float]], fallback_df: float,
           hosts: HostSpread | None = None) -> tuple[float, float]:
    """Return (standard error, Welch-Satterthwaite degrees of freedom) of a sum of independent variance
    terms given as (variance, df) pairs; ``fallback_df`` when every term is 0; at most the hosts' df when
    their term caps it (``HostSpread.caps_df``)."""
    var = sum(v for v, _ in terms)
    den = sum(v**2 / d for v, d in terms if v > 0)
    df = var**2 / den if den > 0 else fallback_df
    if hosts_differ(hosts) and hosts.caps_df:
        df = min(df, hosts.df)
    return math.sqrt(var), df


def series_shift(a, b, level: float = 0.95, between: BetweenRun | None = None) -> Shift:
    """Return log mean(b) - log mean(a) with its ``level`` interval for two autocorrelated
    per-step series of positive values (module doc). ``between``: the between-run term; default
    ``DEFAULT_BETWEEN`` raised to the level drift of ``a`` and ``b`` themselves (``drift_between``)."""
    va, vb = long_run_variance(a), long_run_variance(b)
    if not (va.mean > 0 and vb.mean > 0):
        raise ValueError("series_shift needs positive means (it is the interval of a ratio)")
    if va.n < 3 or vb.n < 3:  # no variance to estimate: any change is possible
        return Shift(estimate=math.log(vb.mean / va.mean), lo=-math.inf, hi=math.inf, se=math.inf, df=1.0,
                     level=level, method=f"too few steps for an interval ({va.n} vs {vb.n}; at least 3 a side)")
    if between is None:
        between = drift_between(level_drift(a), level_drift(b), DEFAULT_BETWEEN)
    return change_interval(va, vb, between, level)


def repeats_shift(a_means, b_means, level: float = 0.95, hosts: HostSpread | None = None) -> Shift:
    """Return the change of log run means, B against A, with the pooled two-sample t interval
    (one value per run; at least 3 runs in all and 2 on one side). ``hosts``: when the sides ran on
    different hosts, their measured offset is taken off the change and their term added
    (Welch-Satterthwaite); the repeats' spread only shows how a side's runs differ on its own hosts."""
    from scipy.special import stdtrit

    a, b = np.log(_finite(a_means)), np.log(_finite(b_means))
    df = (len(a) - 1) + (len(b) - 1)
    if df < 1:
        raise ValueError("repeats_shift needs two runs on at least one side")
    d = float(b.mean() - a.mean()) - hosts_offset(hosts)
    ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    what = f"pooled t over run means ({len(a)} vs {len(b)} runs)"
    if hosts_differ(hosts) and not hosts.known:
        return hosts_unknown(d, level, hosts, what)
    se, tdf = _welch(_with_hosts([(ss / df * (1 / len(a) + 1 / len(b)), float(df))], hosts), fallback_df=float(df),
                     hosts=hosts)
    q = float(stdtrit(tdf, 0.5 + level / 2))
    return Shift(estimate=d, lo=d - q * se, hi=d + q * se, se=se, df=float(tdf), level=level, hosts=hosts,
                 method=what + _hosts_text(hosts))


def shift(a_runs: list, b_runs: list, level: float = 0.95, between: BetweenRun | None = None) -> Shift:
    """Return the change of the mean of B's runs against A's (one per-step series per run):
    ``series_shift`` with one run a side (``between``: its between-run term), ``repeats_shift``
    over run means otherwise (the repeats measure the between-run variation themselves; only
    ``between.hosts`` is used, the hosts' term when the sides ran on different hosts)."""
    if len(a_runs) == 1 and len(b_runs) == 1:
        return series_shift(a_runs[0], b_runs[0], level, between)
    return repeats_shift([_finite(r).mean() for r in a_runs], [_finite(r).mean() for r in b_runs], level,
                         hosts=between.hosts if between is not None else None)
