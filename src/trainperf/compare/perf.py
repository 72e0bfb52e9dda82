"""Performance of B against A: throughput change with a 95% interval, memory, MFU, goodput.

Steady state: transients (warm-up, compile, a slow stretch) are cut by change points on the
log step-time series (``fleet.changepoints.detect_changes``): the longest segment is the
steady state; the first step is always out.

Interval of the throughput ratio B/A:

- one run a side: Hodges-Lehmann estimate of the shift of log tokens/s (median of pairwise
  differences) with its Mann-Whitney interval, the variance inflated by (1 + rho)/(1 - rho),
  rho the lag-1 autocorrelation of the ranks pooled over both series (``lag1_ranks``), and the
  normal quantile replaced by Student's t at the effective sample size (rho is estimated):
  successive steps are not independent samples;
- repeats (two or more runs on a side): each run's steady median is one sample; a pooled
  two-sample t interval on their logs. Run-to-run differences (another node, another moment
  of a shared machine) are then in the interval, which one run a side cannot see.

A change is called ``faster``/``slower`` when the interval excludes zero and the estimate is at
least ``MIN_EFFECT``; otherwise it is inside the noise (the interval says how large a change
could still hide).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from trainperf.compare.runs import RunData, finite

LEVEL = 0.95
# Smallest throughput change called faster/slower with one run a side: two runs of one
# configuration on this 2-core shared machine differ by up to ~1% between runs (A/A study,
# docs/benchmarks.md "Trainer and compare"), which within-run intervals cannot see.
MIN_EFFECT = 0.01
WARMUP_SIGMAS = 5.0  # a leading step this many noise sigmas above the steady level is warm-up


@dataclass(kw_only=True)
class Effect:
    """The relative change B/A - 1 of a metric with its interval (fractions: 0.05 = +5%)."""

    metric: str
    a: float  # A's value (median over steady steps, or over runs)
    b: float
    change: float
    lo: float
    hi: float
    method: str

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return asdict(self)


@dataclass(kw_only=True)
class PerfResult:
    """Performance of both sides and the verdict on throughput."""

    throughput: Effect  # tokens/s
    step_time: Effect  # medians only (lo/hi from the throughput interval)
    verdict: str  # "faster", "slower", "inside the noise"
    mfu: tuple[float, float]
    mem_peak_bytes: tuple[float, float]
    goodput: tuple[float | None, float | None]
    steady: list[tuple[str, int, int]]  # (run, first steady step, last steady step)
    min_effect: float
    note: str = ""

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        d = asdict(self)
        d["throughput"], d["step_time"] = self.throughput.to_dict(), self.step_time.to_dict()
        return d


def steady_slice(step_time_s: np.ndarray) -> slice:
    """Return the steady-state part of a step-time series: the longest segment between change
    points of log step time, never the first step (index slice)."""
    from trainperf.fleet.changepoints import detect_changes

    from trainperf.fleet.changepoints import noise_sigma

    y = np.log(np.where(np.asarray(step_time_s) > 0, step_time_s, np.nan))
    n = len(y)
    if n < 12 or np.isfinite(y).sum() < 12:
        return slice(min(1, n - 1), n)
    cps = detect_changes(y, min_size=max(4, n // 20), trend=False).change_points
    bounds = [1] + [c for c in cps if c > 1] + [n]
    a, b = max(zip(bounds, bounds[1:]), key=lambda ab: ab[1] - ab[0])
    # A warm-up shorter than the change-point test's segments: leading steps far above the level.
    seg = finite(y[a:b])
    level, sigma = float(np.median(seg)), noise_sigma(seg)
    while a < b - 2 and np.isfinite(y[a]) and y[a] - level > WARMUP_SIGMAS * max(sigma, 1e-3):
        a += 1
    return slice(a, b)


def _throughput(run: RunData) -> np.ndarray:
    tps = run.tokens_per_s
    if not np.isfinite(tps).any():  # no token counts: the step rate stands for the throughput
        tps = 1.0 / run.step_time_s
    return tps


def _pooled_t(a: np.ndarray, b: np.ndarray, level: float) -> tuple[float, float, float]:
    from scipy.stats import t

    d = float(b.mean() - a.mean())
    df = (len(a) - 1) + (len(b) - 1)
    ss = ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()
    se = math.sqrt(ss / df * (1 / len(a) + 1 / len(b))) if df > 0 else float("inf")
    q = float(t.ppf(0.5 + level / 2, df)) if df > 0 else float("inf")
    return d, d - q * se, d + q * se


def lag1_ranks(series: list[np.ndarray]) -> float:
    """Return the lag-1 autocorrelation of the ranks of each series around their mean, pooled over
    the series (ranks: a slow outlier step cannot fake or hide persistence), corrected for its
    small-sample bias (-(1 + 4 rho) / n, Kendall 1954) and clipped to [0, 0.95]."""
    from scipy.stats import rankdata

    num = den = 0.0
    n = []
    for y in series:
        if len(y) < 4:
            continue
        r = rankdata(y)
        r = r - r.mean()
        num += float(r[1:] @ r[:-1])
        den += float(r @ r)
        n.append(len(y))
    if den <= 0:
        return 0.0
    rho = num / den
    rho += (1 + 4 * max(rho, 0.0)) / np.mean(n)  # Kendall's small-sample bias of the lag-1 estimate
    return float(min(max(rho, 0.0), 0.95))


def log_shift(a_runs: list[np.ndarray], b_runs: list[np.ndarray], level: float = LEVEL) -> tuple[float, float, float, str]:
    """Return (shift, lo, hi, method) of log values of B against A (one array of steady samples per run)."""
    from trainperf.fleet.changepoints import hodges_lehmann_interval

    if len(a_runs) == 1 and len(b_runs) == 1:
        a, b = np.log(finite(a_runs[0])), np.log(finite(b_runs[0]))
        from scipy.stats import t

        rho = lag1_ranks([a, b])
        inflate = (1 + rho) / (1 - rho)
        # the quantile of t at the effective degrees of freedom: rho is estimated, not known
        df = max((len(a) + len(b)) / inflate - 2, 2.0)
        med, lo, hi = hodges_lehmann_interval(b[:, None] - a[None, :], len(a), len(b),
                                              z=float(t.ppf(0.5 + level / 2, df)), inflate=inflate)
        return med, lo, hi, (f"Hodges-Lehmann over steady steps, variance x {inflate:.2f} (lag-1 rho {rho:.2f}), "
                             f"t quantile at {df:.0f} effective df")
    a = np.log([np.median(finite(r)) for r in a_runs])
    b = np.log([np.median(finite(r)) for r in b_runs])
    d, lo, hi = _pooled_t(a, b, level)
    return d, lo, hi, f"pooled t over run medians ({len(a)} vs {len(b)} runs)"


def compare_perf(a_runs: list[RunData], b_runs: list[RunData], min_effect: float = MIN_EFFECT,
                 level: float = LEVEL) -> PerfResult:
    """Return B's performance against A's (see the module doc)."""
    steady = {id(r): steady_slice(r.step_time_s) for r in a_runs + b_runs}

    def samples(runs, col):
        return [col(r)[steady[id(r)]] for r in runs]

    def med(runs, col):
        return float(np.median(np.concatenate([finite(x) for x in samples(runs, col)])))

    d, lo, hi, method = log_shift(samples(a_runs, _throughput), samples(b_runs, _throughput), level)
    tput = Effect(metric="tokens_per_s", a=med(a_runs, _throughput), b=med(b_runs, _throughput), change=math.expm1(d),
                  lo=math.expm1(lo), hi=math.expm1(hi), method=method)
    st_a, st_b = med(a_runs, lambda r: r.step_time_s), med(b_runs, lambda r: r.step_time_s)
    step = Effect(metric="step_time_s", a=st_a, b=st_b, change=math.expm1(-d), lo=math.expm1(-hi),
                  hi=math.expm1(-lo), method="from the throughput interval")
    if lo > 0 and tput.change >= min_effect:
        verdict = "faster"
    elif hi < 0 and -tput.change >= min_effect:
        verdict = "slower"
    else:
        verdict = "inside the noise"

    def mfu(runs):
        v = np.concatenate([finite(x) for x in samples(runs, lambda r: r.mfu)])
        return float(np.median(v)) if len(v) else float("nan")

    def mem(runs):
        v = np.concatenate([finite(r.mem_peak_bytes) for r in runs])
        return float(v.max()) if len(v) else float("nan")

    def goodput(runs):
        v = [r.goodput for r in runs if r.goodput is not None]
        return float(np.median(v)) if v else None

    spans = [(r.name, int(r.step[steady[id(r)]][0]), int(r.step[steady[id(r)]][-1])) for r in a_runs + b_runs]
    note = ("one run a side: the interval holds the steps' noise only, not run-to-run variation (another node, "
            "another moment of a shared machine); give repeats (A1,A2,... B1,B2,...) to include it"
            if len(a_runs) == 1 and len(b_runs) == 1 else "")
    return PerfResult(throughput=tput, step_time=step, verdict=verdict, mfu=(mfu(a_runs), mfu(b_runs)),
                      mem_peak_bytes=(mem(a_runs), mem(b_runs)), goodput=(goodput(a_runs), goodput(b_runs)),
                      steady=spans, min_effect=min_effect, note=note)
