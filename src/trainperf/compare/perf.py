"""Performance of B against A: throughput change with a 95% interval, memory, MFU, goodput.

Steady state: transients (warm-up, compile, a slow stretch) are cut by change points on the
log step-time series (``fleet.changepoints.detect_changes``): the longest segment is the
steady state; the first step is always out.

Throughput is total tokens over total time of the steady steps (a ratio of means of seconds
per token, what a job's length and cost follow; steps per second when no token count is
recorded). Its change B/A - 1 and the 95% interval come from ``compare.interval.shift``, the
one place that computes it (``trainperf gate`` on runs uses it too): with one run a side, an
autocorrelation-robust interval over the steps plus a between-run term (the store's history of
repeated runs, else a stated default, raised to the level drift the two runs show after their
warm-up); with repeats, a t interval over run means, which then measures run-to-run variation.

A change is called ``faster``/``slower`` when the interval excludes zero and the estimate is at
least ``MIN_EFFECT``; otherwise it is inside the noise (the interval says how large a change
could still hide). When A and B ran on different hosts the interval includes how much hosts
differ (``compare.history.hosts_between``, from the store's runs of one configuration on several
hosts), and when the store has runs on the compared hosts themselves, the change is corrected by their
measured offset (step time's change too); when the store cannot say, the verdict is ``inconclusive``:
a difference of hosts cannot be told from the change.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from trainperf.compare.interval import (DEFAULT_BETWEEN, NO_BETWEEN, BetweenRun, drift_between, hosts_differ,
                                        hosts_offset, hosts_text, hosts_unknown_text, interval_ends, level_drift,
                                        shift)
from trainperf.compare.runs import RunData, finite
from trainperf.store.record import PEAK_UNKNOWN, mfu_against

LEVEL = 0.95
# Smallest throughput change called faster/slower: below 1% a statistically clear change is not
# a speed-up worth a verdict (the interval, between-run term included, decides the rest).
MIN_EFFECT = 0.01
WARMUP_SIGMAS = 5.0  # a leading step this many noise sigmas above the steady level is warm-up


@dataclass(kw_only=True)
class Effect:
    """The relative change B/A - 1 of a metric with its interval (fractions: 0.05 = +5%)."""

    metric: str
    a: float  # A's value over the steady steps (throughput: total tokens / total time)
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
    verdict: str  # "faster", "slower", "inside the noise", "inconclusive" (hosts differ by an unknown amount)
    mfu: tuple[float, float]  # median of the steady steps' MFU, each against ``mfu_peak_flops`` (see mfu_note)
    mem_peak_bytes: tuple[float, float]
    goodput: tuple[float | None, float | None]
    steady: list[tuple[str, int, int]]  # (run, first steady step, last steady step)
    min_effect: float
    note: str = ""
    between_cv: float = 0.0  # one run a side: the between-run sd of a run's mean in the interval (log units)
    between_source: str = ""
    steady_steps: tuple[int, int] = (0, 0)  # steps each side's throughput, step time and MFU use
    total_steps: tuple[int, int] = (0, 0)  # steps each side recorded
    mfu_peak_flops: tuple[float | None, float | None] = (None, None)  # FLOP/s per device of each side's MFU
    mfu_comparable: bool = True  # False: the two MFUs are against different peaks (their change is not a speed change)
    mfu_note: str = ""
    hosts: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # each side's hosts
    hosts_cv: float | None = 0.0  # sd of hosts' levels in the interval (0: same hosts; None: unknown)
    hosts_offset: float = 0.0  # B's hosts' time per token against A's, taken off the changes (0.03: 3% slower)

    def to_dict(self) -> dict:
        """Return JSON-able data (an unbounded interval end as None, ``interval.interval_ends``)."""
        d = asdict(self)
        d["throughput"], d["step_time"] = self.throughput.to_dict(), self.step_time.to_dict()
        for e in (d["throughput"], d["step_time"]):
            e["lo"], e["hi"] = interval_ends(e["lo"], e["hi"])
        return d


def _log_steps(step_time_s: np.ndarray) -> np.ndarray:
    return np.log(np.where(np.asarray(step_time_s) > 0, step_time_s, np.nan))


def _warm(y: np.ndarray, a: int, b: int, level: float, sigma: float) -> int:
    """Return the first index from ``a`` whose step is not a warm-up step (WARMUP_SIGMAS above ``level``)."""
    while a < b - 2 and np.isfinite(y[a]) and y[a] - level > WARMUP_SIGMAS * max(sigma, 1e-3):
        a += 1
    return a


def _steady(step_time_s: np.ndarray) -> tuple[slice, slice]:
    """Return (steady slice, post-warm-up slice) of a step-time series (``steady_slice``, ``settled_slice``)."""
    from trainperf.fleet.changepoints import detect_changes, noise_sigma

    y = _log_steps(step_time_s)
    n = len(y)
    if n < 12 or np.isfinite(y).sum() < 12:
        s = slice(min(1, n - 1), n)
        return s, s
    cps = detect_changes(y, min_size=max(4, n // 20), trend=False).change_points
    bounds = [1] + [c for c in cps if c > 1] + [n]
    a, b = max(zip(bounds, bounds[1:]), key=lambda ab: ab[1] - ab[0])
    # A warm-up shorter than the change-point test's segments: leading steps far above the level.
    seg = finite(y[a:b])
    level, sigma = float(np.median(seg)), noise_sigma(seg)
    return slice(_warm(y, a, b, level, sigma), b), slice(_warm(y, 1, n, level, sigma), n)


def steady_slice(step_time_s: np.ndarray) -> slice:
    """Return the steady-state part of a step-time series: the longest segment between change
    points of log step time, never the first step (index slice)."""
    return _steady(step_time_s)[0]


def settled_slice(step_time_s: np.ndarray) -> slice:
    """Return the steps after the warm-up, to the run's end (index slice): the first step and the
    leading steps WARMUP_SIGMAS above the steady level are out, later level changes are kept (they are
    the evidence that the machine's speed moves, ``interval.level_drift``)."""
    return _steady(step_time_s)[1]


def seconds_per_token(run: RunData) -> np.ndarray:
    """Return the run's per-step seconds per token (step time / tokens of the step), or the step
    time itself when the run records no token counts (throughput is then steps per second)."""
    tps = np.asarray(run.tokens_per_s, dtype=float)
    if not np.isfinite(tps).any():
        return np.asarray(run.step_time_s, dtype=float)
    return np.where(tps > 0, 1.0 / tps, np.nan)


def run_between(a: RunData, b: RunData, floor: BetweenRun = DEFAULT_BETWEEN,
                settled: tuple[slice, slice] | None = None) -> BetweenRun:
    """Return the between-run term of run ``a`` against run ``b``: ``floor`` raised to the level drift
    of their seconds per token over every step after the warm-up (``settled_slice``, or ``settled``
    when already cut: not only the steady segment, a level change the steady cut leaves out is the
    evidence)."""
    cuts = settled or (settled_slice(a.step_time_s), settled_slice(b.step_time_s))
    drift = [level_drift(finite(seconds_per_token(r)[cut])) for r, cut in zip((a, b), cuts)]
    return drift_between(*drift, floor)


def compare_perf(a_runs: list[RunData], b_runs: list[RunData], min_effect: float = MIN_EFFECT,
                 level: float = LEVEL, between: BetweenRun | None = DEFAULT_BETWEEN) -> PerfResult:
    """Return B's performance against A's (see the module doc). ``between``: the between-run term
    before the runs' own drift (``compare.history.between_floor``: the store's history or the default,
    with the hosts' term when A and B ran on different hosts; with repeats only that hosts' term is
    used); None: none at all, drift included (the steps' noise only, the interval before that term,
    for comparisons)."""
    cuts = {id(r): _steady(r.step_time_s) for r in a_runs + b_runs}  # (steady, settled) slices
    steady = {k: v[0] for k, v in cuts.items()}

    def samples(runs, col):
        return [col(r)[steady[id(r)]] for r in runs]

    def mean(runs, col):
        return float(np.concatenate([finite(x) for x in samples(runs, col)]).mean())

    per_token = ([finite(x) for x in samples(a_runs, seconds_per_token)],
                 [finite(x) for x in samples(b_runs, seconds_per_token)])
    one_each = len(a_runs) == 1 and len(b_runs) == 1
    if between is None:
        between = NO_BETWEEN
    elif one_each:
        between = run_between(a_runs[0], b_runs[0], between, (cuts[id(a_runs[0])][1], cuts[id(b_runs[0])][1]))
    sh = shift(*per_token, level=level, between=between)
    hosts_note, one = "", sh
    if sh.hosts is not None and not sh.hosts.known:  # the interval is unbounded: say what it is on one host
        one = shift(*per_token, level=level, between=replace(between, hosts=None))
        hosts_note = (f"{hosts_unknown_text(sh.hosts)} (were the hosts alike, the {level:.0%} interval would be "
                      f"{math.expm1(-one.hi):+.1%} to {math.expm1(-one.lo):+.1%}); run A and B on one host, or record "
                      "runs of one configuration on several hosts")
    d, lo, hi = -sh.estimate, -sh.hi, -sh.lo  # log throughput change: the opposite of log time per token
    tput = Effect(metric="tokens_per_s", a=float(1.0 / np.concatenate(per_token[0]).mean()),
                  b=float(1.0 / np.concatenate(per_token[1]).mean()), change=math.expm1(d), lo=math.expm1(lo),
                  hi=math.expm1(hi), method=sh.method)
    st_a, st_b = mean(a_runs, lambda r: r.step_time_s), mean(b_runs, lambda r: r.step_time_s)
    offset = hosts_offset(sh.hosts)  # the hosts' measured offset, taken off as the throughput's change is
    step = Effect(metric="step_time_s", a=st_a, b=st_b, change=st_b / st_a * math.exp(-offset) - 1, lo=math.expm1(-hi),
                  hi=math.expm1(-lo), method="mean over steady steps" + (", less the hosts' offset" if offset else "")
                  + "; interval from the throughput's")
    if hosts_note:
        verdict = "inconclusive"
    elif lo > 0 and tput.change >= min_effect:
        verdict = "faster"
    elif hi < 0 and -tput.change >= min_effect:
        verdict = "slower"
    else:
        verdict = "inside the noise"

    common, mfu_ok, mfu_note = mfu_peak(a_runs + b_runs)

    def mfu(runs):  # each run's MFU re-expressed against the common peak: achieved FLOP/s / that peak
        v = np.concatenate([mfu_against(finite(x), r.peak_flops, common)
                            for r, x in zip(runs, samples(runs, lambda r: r.mfu))])
        return float(np.median(v)) if len(v) else float("nan")

    def peak(runs):
        return common or (runs[0].peak_flops if len({r.peak_flops for r in runs}) == 1 else None)

    def mem(runs):
        v = np.concatenate([finite(r.mem_peak_bytes) for r in runs])
        return float(v.max()) if len(v) else float("nan")

    def goodput(runs):
        v = [r.goodput for r in runs if r.goodput is not None]
        return float(np.median(v)) if v else None

    if hosts_note:  # hosts that differ by an unknown amount
        hosts_cv = None
    elif hosts_differ(sh.hosts):
        hosts_cv = sh.hosts.cv
    else:  # the same hosts in the same shares
        hosts_cv = 0.0
    spans = [(r.name, int(r.step[steady[id(r)]][0]), int(r.step[steady[id(r)]][-1])) for r in a_runs + b_runs]
    note = (f"one run a side: the interval includes a between-run term of {100 * one.between_cv:.3g}% a run taken from "
            f"{one.between_source}; give repeats (A1,A2,... B1,B2,...) to measure it" if one_each else "")
    if hosts_differ(sh.hosts) and sh.hosts.known:
        note = "; ".join(filter(None, [note, "A and B ran on different hosts: "
                                             + ("the changes are net of " if sh.hosts.paired else
                                                "the interval includes ") + hosts_text(sh.hosts)]))
    note = "; ".join(filter(None, [hosts_note, note]))
    return PerfResult(throughput=tput, step_time=step, verdict=verdict, mfu=(mfu(a_runs), mfu(b_runs)),
                      mem_peak_bytes=(mem(a_runs), mem(b_runs)), goodput=(goodput(a_runs), goodput(b_runs)),
                      steady=spans, min_effect=min_effect, note=note, between_cv=one.between_cv,
                      between_source=one.between_source,
                      steady_steps=(sum(len(x) for x in per_token[0]), sum(len(x) for x in per_token[1])),
                      total_steps=(sum(len(r.step) for r in a_runs), sum(len(r.step) for r in b_runs)),
                      mfu_peak_flops=(peak(a_runs), peak(b_runs)), mfu_comparable=mfu_ok, mfu_note=mfu_note,
                      hosts=tuple(tuple(sorted({r.host for r in runs})) for runs in (a_runs, b_runs)),
                      hosts_cv=hosts_cv, hosts_offset=math.expm1(offset))


def mfu_peak(runs: list[RunData]) -> tuple[float | None, bool, str]:
    """Return (the one peak FLOP/s per device every run's MFU is to be taken against, or None to keep
    each run's own; whether the runs' MFUs are then comparable; a note saying which).

    MFU = achieved FLOP/s / peak, so a change in MFU is a change in speed only against one peak.
    Runs on one device (same device and host) whose recorded peaks differ measured the same
    hardware's peak differently (a start-up matmul benchmark on a busy machine): the highest of
    their measurements is the best estimate of that peak (each is a best-of-N, a lower bound), and
    every run's MFU is re-expressed against it. Runs on different devices keep their own peaks,
    and their MFUs are marked not comparable."""
    peaks = [r.peak_flops for r in runs]
    unknown = [r.name for r in runs if r.peak_flops is None]
    if unknown and len(unknown) < len(runs):  # an MFU against an unknown peak beside one against a known peak
        return None, False, (f"MFU not comparable: {', '.join(unknown)}: {PEAK_UNKNOWN}; the others' peaks "
                             f"are known; compare tokens/s instead")
    if unknown or max(peaks) <= min(peaks) * (1 + 1e-9):
        measured = any(np.isfinite(r.mfu).any() for r in runs)  # no MFU at all: nothing to say of its peak
        return None, True, f"MFU as recorded: {PEAK_UNKNOWN}" if unknown and measured else ""
    shown = " vs ".join(f"{p / 1e9:.3g}" for p in dict.fromkeys(peaks))
    if len({(r.device, r.host) for r in runs}) == 1:
        top = max(peaks)
        return top, True, (f"MFU of every run against one peak, {top / 1e9:.3g} GFLOP/s (the highest measured on "
                           f"{runs[0].device or 'this device'}): the runs' own peaks differ ({shown} GFLOP/s)")
    return None, False, (f"MFU not comparable: peaks differ {shown} GFLOP/s (different devices); "
                         "compare tokens/s instead")
