"""The CI gate: is the candidate's metric worse than the baseline's, by how much, how sure?

Runs (run folders, store run ids, or several of either separated by commas) give each run's
steady-state per-step series (warm-up cut as `compare` cuts it, ``steady_samples``): successive
steps are not independent, so the effect, its interval and the p-value are those of
``compare.interval.shift`` (the one place `compare` computes its interval): the change of the
mean with an autocorrelation-robust t interval, or a t over run means with repeats. With one
run a side, a speed metric's interval holds the same between-run term as `compare`'s (the
store's history of repeated runs on the host, else the stated default, raised to the runs' own
level drift): two runs alone cannot show how much a machine's speed moves between runs. When
the sides ran on different hosts, the hosts' term is compare's too (``compare.history.hosts_between``:
the compared hosts' offset measured on the store's runs and taken off the change, or the spread of
hosts of the kind); when nothing measures it the verdict is inconclusive, with compare's reason.

Sample files (one number per line: independent repeats of a benchmark) use a rank test.
Test: two-sided Mann-Whitney U (rank test: outliers and heavy tails cannot fake or hide a
change; asv uses the same test). Effect: the Hodges-Lehmann estimate of the ratio
candidate/baseline - 1 (median of pairwise log ratios, exponentiated) with its distribution-free
confidence interval (Mann-Whitney inversion). Verdict:

- regression / improvement: p < alpha and the effect, in the bad / good direction, is at
  least ``min_effect`` (a statistically real 0.1% change does not block a pull request);
- no change: otherwise, when the confidence interval rules out a change of ``min_effect``
  either way;
- inconclusive: too few samples (the smallest attainable p-value is not below alpha, or
  fewer than 3 a side), or the interval still allows a change of ``min_effect`` or more
  (significant or not: "no change" is said only when the interval excludes it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError

# metrics that follow the machine's speed: with one run a side their interval holds the between-run term
SPEED_METRICS = {"step_time", "step_time_s", "tokens_per_s", "mfu"}
# metrics where a larger value is better; every other metric is a time or a cost (lower is better)
HIGHER_IS_BETTER = {"tokens_per_s", "mfu", "goodput", "gbps", "tflops", "pct_roofline", "throughput"}
# Fewest steady steps a side for the interval over steps (one run each): K >= 2 cosines need ~10 steps,
# and fewer leave the t quantile at 1-2 degrees of freedom (an interval wider than any effect).
MIN_STEPS = 10


@dataclass
class GateResult:
    """The gate's verdict with its evidence."""

    verdict: str  # "regression", "improvement", "no change", "inconclusive"
    metric: str
    n_baseline: int
    n_candidate: int
    baseline_median: float
    candidate_median: float
    effect: float  # candidate / baseline - 1 (Hodges-Lehmann), e.g. 0.03 = 3% larger
    effect_ci: tuple[float, float]  # confidence interval of the effect (level 1 - ci_alpha)
    p_value: float
    test: str
    alpha: float
    min_effect: float
    higher_is_better: bool
    reason: str

    @property
    def exit_code(self) -> int:
        """Return 1 for a regression, else 0."""
        return 1 if self.verdict == "regression" else 0

    def to_dict(self) -> dict:
        """Return JSON-able data (a number the test did not give, or an unbounded interval end, as None:
        ``compare.interval.interval_ends``, as compare's JSON)."""
        from trainperf.compare.interval import interval_ends

        d = asdict(self)
        d["effect_ci"] = list(interval_ends(*self.effect_ci))
        d.update({k: None for k in ("effect", "p_value", "baseline_median", "candidate_median")
                  if not math.isfinite(d[k])})
        return d


def _min_p(n1: int, n2: int) -> float:
    """Smallest two-sided Mann-Whitney p-value attainable with these sample sizes."""
    return 2.0 / math.comb(n1 + n2, n1)


def hodges_lehmann_ratio(base: np.ndarray, cand: np.ndarray, ci_alpha: float = 0.05) -> tuple[float, float, float]:
    """Return (effect, lo, hi): the Hodges-Lehmann ratio cand/base - 1 and its interval."""
    if (base > 0).all() and (cand > 0).all():
        d = np.log(cand)[:, None] - np.log(base)[None, :]
        tr = np.expm1
    else:  # non-positive values: an additive shift relative to the baseline median
        scale = abs(float(np.median(base))) or 1.0
        d = (cand[:, None] - base[None, :]) / scale
        tr = lambda v: v  # noqa: E731
    from scipy.stats import norm

    from trainperf.fleet.changepoints import hodges_lehmann_interval

    med, lo, hi = hodges_lehmann_interval(d, len(base), len(cand), z=norm.ppf(1 - ci_alpha / 2))
    return float(tr(med)), float(tr(lo)), float(tr(hi))


@dataclass(kw_only=True)
class RunSeries:
    """One side's runs as the gate reads them: each run's steady-state per-step values, in step order."""

    names: list[str]
    series: list[np.ndarray]
    runs: list = field(default_factory=list)  # the compare.runs.RunData read (empty: bare series)
    store: str | None = None  # where the runs' history of repeats is (compare.history)

    def values(self) -> np.ndarray:
        """Return every run's values in one array."""
        return np.concatenate(self.series)


def _verdict(eff: float, lo: float, hi: float, p: float, *, alpha: float, ci_alpha: float, min_effect: float,
             higher_better: bool) -> tuple[str, str]:
    """Return (verdict, reason) from an effect, its interval and the p-value of the same test (module doc)."""
    worse = eff < 0 if higher_better else eff > 0
    if p < alpha and abs(eff) >= min_effect:
        return ("regression" if worse else "improvement",
                f"{'worse' if worse else 'better'} by {abs(eff):.2%} (p = {p:.2g} < {alpha})")
    if hi < min_effect and lo > -min_effect:
        reason = (f"significant but {abs(eff):.2%} is below the {min_effect:.1%} threshold, and the "
                  if p < alpha else f"not significant (p = {p:.2g}), and the ")
        return "no change", reason + f"{1 - ci_alpha:.0%} interval excludes a ±{min_effect:.1%} change"
    from trainperf.compare.interval import interval_text

    return "inconclusive", (f"{'significant' if p < alpha else 'not significant'} (p = {p:.2g}) but the "
                            f"{1 - ci_alpha:.0%} interval {interval_text(lo, hi, digits=2) or '(unbounded)'} allows a "
                            f"change of ±{min_effect:.1%} or more")


def _between(baseline: RunSeries, candidate: RunSeries, metric: str):
    """Return the between-run term of the gate as `compare` takes it. One run a side: compare.history's
    floor raised to the runs' own drift (``compare.perf.run_between``) for a speed metric, only the series'
    own drift for another metric. Repeats of a speed metric: only the hosts' term (the repeats measure
    their spread on their hosts, not a difference of hosts). None: bare series, the interval's default."""
    from trainperf.compare.interval import NO_BETWEEN, drift_between, level_drift

    one_each = len(baseline.series) == 1 and len(candidate.series) == 1
    if metric not in SPEED_METRICS:
        return (drift_between(level_drift(baseline.series[0]), level_drift(candidate.series[0]), NO_BETWEEN)
                if one_each else None)
    if not (baseline.runs and candidate.runs):
        return None
    from trainperf.compare.history import between_floor
    from trainperf.compare.perf import run_between

    floor = between_floor(baseline.runs, candidate.runs, baseline.store)
    return run_between(baseline.runs[0], candidate.runs[0], floor) if one_each else floor


def compare_runs(baseline: RunSeries, candidate: RunSeries, metric: str = "step_time", min_effect: float = 0.02,
                 alpha: float = 0.005, ci_alpha: float = 0.05) -> GateResult:
    """Return the gate verdict for runs: effect, interval and p-value of ``compare.interval.shift``
    (autocorrelation-robust over the steps plus the between-run term `compare` uses with one run a
    side, t over run means with repeats)."""
    from trainperf.compare.interval import shift

    higher_better = metric.removesuffix("_s") in HIGHER_IS_BETTER or metric in HIGHER_IS_BETTER
    a_all, b_all = baseline.values(), candidate.values()
    common = dict(metric=metric, n_baseline=len(a_all), n_candidate=len(b_all), alpha=alpha, min_effect=min_effect,
                  higher_is_better=higher_better, baseline_median=float(np.median(a_all)),
                  candidate_median=float(np.median(b_all)))
    one_each = len(baseline.series) == 1 and len(candidate.series) == 1
    short = min(len(x) for x in baseline.series + candidate.series)
    too_few = one_each and short < MIN_STEPS  # repeats: the t over run means needs no steps count
    positive = a_all.mean() > 0 and b_all.mean() > 0 and (a_all >= 0).all() and (b_all >= 0).all()
    if too_few or not positive:
        why = (f"too few steady steps ({short} in the shorter run; at least {MIN_STEPS} a side, or give repeats)"
               if too_few else f"{metric} has negative values or a zero mean (the interval is of a ratio)")
        return GateResult(verdict="inconclusive", effect=float("nan"), effect_ci=(float("nan"), float("nan")),
                          p_value=float("nan"), test="compare.interval", reason=why, **common)
    sh = shift(baseline.series, candidate.series, level=1 - ci_alpha, between=_between(baseline, candidate, metric))
    if sh.hosts is not None and not sh.hosts.known:  # nothing bounds the change: say why, as compare does
        from trainperf.compare.interval import hosts_unknown_text

        return GateResult(verdict="inconclusive", effect=float("nan"), effect_ci=(float("nan"), float("nan")),
                          p_value=float("nan"), test=sh.method, reason=hosts_unknown_text(sh.hosts), **common)
    eff, lo, hi, p = math.expm1(sh.estimate), math.expm1(sh.lo), math.expm1(sh.hi), sh.p_value
    verdict, reason = _verdict(eff, lo, hi, p, alpha=alpha, ci_alpha=ci_alpha, min_effect=min_effect,
                               higher_better=higher_better)
    return GateResult(verdict=verdict, effect=eff, effect_ci=(lo, hi), p_value=p, test=sh.method, reason=reason,
                      **common)


def compare(baseline, candidate, metric: str = "step_time", min_effect: float = 0.02, alpha: float = 0.005,
            ci_alpha: float = 0.05) -> GateResult:
    """Return the gate verdict for candidate vs baseline samples of ``metric``.

    ``min_effect``: smallest relative change that counts (0.02 = 2%); ``alpha``: significance
    level of the test; ``ci_alpha``: 0.05 = 95% interval. Two ``RunSeries`` (runs) go to
    ``compare_runs``; anything else is a set of independent samples (Mann-Whitney U).
    """
    from scipy.stats import mannwhitneyu

    if isinstance(baseline, RunSeries) and isinstance(candidate, RunSeries):
        return compare_runs(baseline, candidate, metric, min_effect, alpha, ci_alpha)
    baseline, candidate = (x.values() if isinstance(x, RunSeries) else x for x in (baseline, candidate))
    a = _samples(baseline, "baseline")
    b = _samples(candidate, "candidate")
    higher_better = metric.removesuffix("_s") in HIGHER_IS_BETTER or metric in HIGHER_IS_BETTER
    common = dict(metric=metric, n_baseline=len(a), n_candidate=len(b), test="Mann-Whitney U, two-sided",
                  alpha=alpha, min_effect=min_effect, higher_is_better=higher_better)
    med_a = float(np.median(a)) if len(a) else float("nan")
    med_b = float(np.median(b)) if len(b) else float("nan")
    if len(a) < 3 or len(b) < 3 or _min_p(len(a), len(b)) >= alpha:
        return GateResult(verdict="inconclusive", baseline_median=med_a, candidate_median=med_b, effect=float("nan"),
                          effect_ci=(float("nan"), float("nan")), p_value=float("nan"),
                          reason=f"too few samples ({len(a)} vs {len(b)}) for p < {alpha}", **common)
    p = float(mannwhitneyu(b, a, alternative="two-sided").pvalue)
    eff, lo, hi = hodges_lehmann_ratio(a, b, ci_alpha)
    verdict, reason = _verdict(eff, lo, hi, p, alpha=alpha, ci_alpha=ci_alpha, min_effect=min_effect,
                               higher_better=higher_better)
    return GateResult(verdict=verdict, baseline_median=med_a, candidate_median=med_b, effect=eff, effect_ci=(lo, hi),
                      p_value=p, reason=reason, **common)


def _samples(values, label: str) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise TrainperfError(f"{label}: samples are not all numbers") from None
    x = x[~np.isnan(x)]
    if x.size == 0:
        raise TrainperfError(f"{label}: no samples (empty series)")
    if np.isinf(x).any():
        raise TrainperfError(f"{label}: contains infinite values")
    return x


def read_sample_file(path: str | Path) -> np.ndarray:
    """Return the numbers of a file with one number per line (blank lines and # comments skipped)."""
    path = Path(path)
    out = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TrainperfError(f"{path}: cannot read ({e.__class__.__name__})") from None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        try:
            out.append(float(s.rstrip(",")))
        except ValueError:
            raise TrainperfError(f"{path}:{i}: not a number: {s[:40]!r}") from None
    if not out:
        raise TrainperfError(f"{path}: no samples (empty file)")
    return np.array(out)


STORE_METRICS = {"step_time": "step_time_s", "step_time_s": "step_time_s", "tokens_per_s": "tokens_per_s",
                 "mfu": "mfu", "goodput": "goodput", "mem_peak_bytes": "mem_peak_bytes", "loss": "loss",
                 "data_wait_s": "data_wait_s"}
# every name --metric accepts: the run metrics, and the throughput-like names of sample files
GATE_METRICS = tuple(sorted(set(STORE_METRICS) | HIGHER_IS_BETTER))


# metrics whose values are seconds, fractions (of peak FLOP/s, of wall time) and bytes, and the fixed units of the rest
SECONDS_METRICS = {"step_time", "step_time_s", "data_wait_s"}
FRACTION_METRICS = {"mfu", "goodput"}
METRIC_UNITS = {"tokens_per_s": "tokens/s", "gbps": "GB/s", "tflops": "TFLOP/s", "pct_roofline": "%"}


def format_values(metric: str, values) -> list[str]:
    """Return ``values`` of ``metric`` as text with their unit, all in one unit so they read side by side:
    seconds in ms when all are under 1 s (else s), MFU and goodput (fractions) in %, memory in GiB,
    tokens/s with thousands separators; a metric of unknown unit (loss, throughput) as bare numbers."""
    v = [float(x) for x in values]
    finite = [abs(x) for x in v if math.isfinite(x)]
    if metric in SECONDS_METRICS:
        scale, unit = (1e3, " ms") if finite and max(finite) < 1 else (1.0, " s")
        return [f"{x * scale:.4g}{unit}" for x in v]
    if metric in FRACTION_METRICS:
        # a fraction cannot exceed 1 (MFU, goodput): larger values were given in percent already
        scale = 100.0 if not finite or max(finite) <= 1 else 1.0
        return [f"{x * scale:.3g}%" for x in v]
    if metric == "mem_peak_bytes":
        return [f"{x / 2**30:.4g} GiB" for x in v]
    if metric == "tokens_per_s":
        return [f"{x:,.0f} tokens/s" if abs(x) >= 1000 else f"{x:.4g} tokens/s" for x in v]
    unit = METRIC_UNITS.get(metric)
    return [f"{x:.4g}" + ("" if unit is None else unit if unit == "%" else f" {unit}") for x in v]


def check_metric(metric: str, known=GATE_METRICS) -> str:
    """Return ``metric`` when it is one of ``known``; else raise a one-line TrainperfError listing them."""
    if metric not in known:
        raise TrainperfError(f"--metric {metric!r}: unknown; use one of {', '.join(known)}")
    return metric


def run_samples(run, metric: str) -> np.ndarray:
    """Return the per-step samples of ``metric`` from a RunRecord (else its summary value)."""
    col = STORE_METRICS.get(metric, metric)
    vals = [getattr(s, col, None) for s in run.samples]
    vals = [v for v in vals if v is not None]
    if not vals:
        v = getattr(run, col, None)
        vals = [v] if v is not None else []
    if not vals:
        raise TrainperfError(f"run {run.run_id}: no values of metric {metric!r}")
    return np.array(vals, dtype=float)


RUN_COLUMNS = {"step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes", "loss", "data_wait_s"}


def steady_samples(run, metric: str) -> np.ndarray:
    """Return the steady-state per-step values of ``metric`` in a run (compare.runs.RunData, from a
    folder or a store run id alike): the steps ``compare.perf.steady_slice`` keeps, so warm-up is cut
    the same way whatever the run came from; goodput, a run-level figure, is one value."""
    from trainperf.compare.perf import steady_slice

    col = STORE_METRICS.get(metric, metric)
    if col == "goodput":
        if run.goodput is None:
            raise TrainperfError(f"{run.name}: the run records no goodput")
        return np.array([run.goodput], dtype=float)
    if col not in RUN_COLUMNS:
        raise TrainperfError(f"{run.name}: a run has no per-step {metric!r}; use one of "
                             f"{', '.join(sorted(RUN_COLUMNS | {'goodput'}))}")
    vals = np.asarray(getattr(run, col), dtype=float)[steady_slice(run.step_time_s)]
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        raise TrainperfError(f"{run.name}: no values of {metric!r} in the run's steady steps")
    return vals


def _run_series(specs: list[str], metric: str, store: str | None) -> RunSeries:
    from trainperf.compare.runs import load_run

    runs = [load_run(s, store) for s in specs]
    return RunSeries(names=[r.name for r in runs], series=[steady_samples(r, metric) for r in runs], runs=runs,
                     store=store)


def load_samples(spec: str, metric: str = "step_time", store: str | None = None):
    """Return the samples named by ``spec``: a file (one number per line), a folder, or run(s).

    A run folder (holding metrics.jsonl, as `trainperf train` writes it), a run id in ``store``,
    or several of either separated by commas (repeats) give a ``RunSeries``: each run's
    per-step values after the warm-up (``steady_samples``), tested as autocorrelated series.
    A folder that is a trainperf store gives the metric of every run in it (one value per run,
    the run's median over its steps); another folder gives the numbers of all its files.
    """
    p = Path(spec)
    names = [x.strip() for x in str(spec).split(",") if x.strip()]
    if len(names) > 1 and not p.exists():
        return _run_series(names, metric, store)
    if p.is_file():
        return read_sample_file(p)
    if p.is_dir():
        if (p / "metrics.jsonl").is_file():
            return _run_series([spec], metric, store)
        if (p / "runs").is_dir():
            from trainperf.store import read_runs

            runs = read_runs(str(p))
            if not runs:
                raise TrainperfError(f"{p}: store holds no runs")
            return np.array([float(np.median(run_samples(r, metric))) for r in runs])
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        hint = "did you mean the run folder (the one holding metrics.jsonl) or a run id?"
        if not files:
            raise TrainperfError(f"{p}: not a run folder and holds no sample files; {hint}")
        try:
            return np.concatenate([read_sample_file(f) for f in files])
        except TrainperfError as e:
            raise TrainperfError(f"{p}: not a run folder, and its files are not sample files ({e}); {hint}") from None
    from trainperf.store.api import resolve_store

    try:
        return _run_series([spec], metric, store)
    except TrainperfError as e:
        if "not a run folder, nor a run id" not in str(e):
            raise
        raise TrainperfError(f"{spec!r} is not a file, folder or run id in store {resolve_store(store)} ({e})") from None


# ---- numerics: is the candidate still the same training? ----------------------------------

NUMERICS_CHECKS = ("band",)  # --numerics values (the seed / batch-noise band of compare.numerics)


@dataclass(kw_only=True)
class NumericsGate:
    """The gate's numerics verdict: "pass", "fail", "inconclusive" or "not comparable", with its one-line detail."""

    check: str  # "max-loss-delta" or "band"
    status: str  # "pass", "fail", "inconclusive" (too few baseline seeds for the band), "not comparable"
    verdict: str  # the line shown: "loss within ±0.1 ...", "diverges at step 40", "not comparable (...)"
    reason: str
    step: int | None = None  # first failing step (None when it passes)
    detail: dict | None = None  # max-loss-delta: worst step and delta; band: compare.numerics' result

    @property
    def exit_code(self) -> int:
        """Return 0 pass or inconclusive, 1 fail, 2 not comparable."""
        return {"pass": 0, "inconclusive": 0, "fail": 1}.get(self.status, 2)

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return asdict(self)


def _gate_runs(spec: str, store: str | None, label: str) -> list:
    from trainperf.compare.runs import load_side

    try:
        return load_side(spec, store)
    except TrainperfError as e:
        raise TrainperfError(f"{label} {spec!r}: numerics need a run (folder with metrics.jsonl or run id): {e}") from None


def _first_excess(steps: np.ndarray, a: np.ndarray, b: np.ndarray, limit: float) -> tuple[int | None, int | None, float, int]:
    """Return (first step with |b - a| > limit, step of the largest |b - a|, that signed delta, steps compared).

    Compared: the steps where ``a`` is finite; a non-finite ``b`` there counts as an infinite delta
    (a blown-up loss), as compare.numerics counts it."""
    keep = np.isfinite(a)
    steps, a, b = steps[keep], a[keep], b[keep]
    if not len(steps):
        return None, None, 0.0, 0
    d = np.where(np.isfinite(b), b - a, np.inf)
    over = np.flatnonzero(np.abs(d) > limit)
    w = int(np.argmax(np.abs(d)))
    return (int(steps[over[0]]) if len(over) else None), int(steps[w]), float(d[w]), int(len(steps))


def loss_delta_gate(a, b, max_loss_delta: float) -> NumericsGate:
    """Return the --max-loss-delta verdict of run ``b`` against run ``a`` (compare.runs.RunData).

    Fails when |loss_B - loss_A| (loss units) exceeds ``max_loss_delta`` at any step both runs
    recorded (the training loss per step, and the held-out loss at every evaluated step both share).
    Not comparable when the runs' comparability records say they train different things (model,
    data, seed, ...: compare.numerics.comparability) or they share no step with a loss."""
    from trainperf.compare.numerics import comparability

    check = "max-loss-delta"
    ok, why, _ = comparability(a, b)
    if not ok and a.comparable and b.comparable:  # a missing record is not a difference: the user asked for this check
        return NumericsGate(check=check, status="not comparable", verdict=f"not comparable ({why})", reason=why)
    found = {}
    for what, (sa, la), (sb, lb) in (("loss", (a.step, a.loss), (b.step, b.loss)),
                                     ("eval loss", (a.eval_step, a.eval_loss), (b.eval_step, b.eval_loss))):
        steps = np.intersect1d(sa, sb)
        if not len(steps) or not np.isfinite(lb[np.searchsorted(sb, steps)]).any():
            continue
        found[what] = _first_excess(steps, la[np.searchsorted(sa, steps)], lb[np.searchsorted(sb, steps)], max_loss_delta)
    found = {k: v for k, v in found.items() if v[3]}
    if not found:
        why = "no step where both runs record a loss"
        return NumericsGate(check=check, status="not comparable", verdict=f"not comparable ({why})", reason=why)
    detail = {k: {"first_step_over": v[0], "worst_step": v[1], "worst_delta": v[2], "n_steps": v[3]}
              for k, v in found.items()}
    failed = {k: v for k, v in found.items() if v[0] is not None}
    if failed:
        what, (first, worst, delta, _) = min(failed.items(), key=lambda kv: kv[1][0])
        return NumericsGate(check=check, status="fail", step=first, detail=detail,
                            verdict=f"{what} differs by more than {max_loss_delta:g} from step {first}",
                            reason=f"largest {what} difference {delta:+.4g} at step {worst} "
                                   f"(candidate - baseline, limit ±{max_loss_delta:g})")
    parts = [f"{k} largest {v[2]:+.4g} at step {v[1]} over {v[3]} steps" for k, v in found.items()]
    return NumericsGate(check=check, status="pass", detail=detail, verdict=f"loss within ±{max_loss_delta:g}",
                        reason="; ".join(parts))


FINAL_BAND_LEVEL = 0.99  # the end-point band: a 99% prediction interval of the baseline seeds' spread


def band_gate(a_runs: list, b_runs: list) -> NumericsGate:
    """Return the --numerics band verdict of the candidate runs against the baseline runs
    (compare.runs.RunData; several seeds of the baseline make the band).

    Not comparable when compare.numerics says so; inconclusive with fewer than
    ``compare.numerics.MIN_SEEDS`` baseline seeds (the batch-to-batch stand-in's verdict is given
    as a hint); else fail when compare.numerics finds a divergence against the seed-to-seed band
    at some step, or when the candidates' mean end point (``compare.numerics.end_loss``: last held-out loss, else the final
    training loss) leaves the baseline seeds' ``FINAL_BAND_LEVEL`` prediction band
    (``compare.numerics.seed_band``)."""
    from trainperf.compare.numerics import MIN_SEEDS, compare_numerics, end_loss, seed_band

    res = compare_numerics(a_runs, b_runs)
    detail = res.to_dict()
    detail.pop("curves", None)
    if not res.comparable:
        return NumericsGate(check="band", status="not comparable", verdict=res.verdict, reason=res.reason,
                            detail=detail)
    seeds = {(r.comparable or {}).get("seed") for r in a_runs} - {None}
    if len(seeds) < MIN_SEEDS:
        why = (f"the seed band needs at least {MIN_SEEDS} baseline runs with different seeds (got {len(seeds)}); "
               f"against the batch-to-batch noise of the baseline it says: {res.verdict}")
        return NumericsGate(check="band", status="inconclusive", verdict="inconclusive (too few baseline seeds)",
                            reason=why, detail=detail)
    use_eval = all(len(r.eval_loss) for r in a_runs + b_runs)
    ea, eb = [end_loss(r, use_eval) for r in a_runs], [end_loss(r, use_eval) for r in b_runs]
    lo, hi = seed_band(ea, len(eb), FINAL_BAND_LEVEL)
    what = "held-out loss" if use_eval else "final training loss"
    detail["end_band"] = {"what": what, "baseline": ea, "candidate": eb, "lo": lo, "hi": hi,
                          "level": FINAL_BAND_LEVEL}
    mean_b = float(np.mean(eb))
    end_line = f"{what} {mean_b:.4g} vs the seed band [{lo:.4g}, {hi:.4g}] ({FINAL_BAND_LEVEL:.0%}, {len(ea)} seeds)"
    if res.verdict.startswith("diverges at step"):
        step = min(d.step for d in res.divergences if d.step is not None)
        return NumericsGate(check="band", status="fail", verdict=res.verdict, reason=f"{res.reason}; {end_line}",
                            step=step, detail=detail)
    if not lo <= mean_b <= hi:
        return NumericsGate(check="band", status="fail", verdict=f"{what} outside the seed band",
                            reason=end_line, detail=detail)
    return NumericsGate(check="band", status="pass", verdict=res.verdict, reason=f"{res.reason}; {end_line}",
                        detail=detail)


def numerics_gate(baseline: str, candidate: str, *, max_loss_delta: float | None = None, band: bool = False,
                  store: str | None = None) -> NumericsGate:
    """Return the numerics verdict of the candidate run against the baseline run (folders or run ids)."""
    if (max_loss_delta is None) == (not band):
        raise TrainperfError("numerics: give exactly one of --max-loss-delta and --numerics band")
    if max_loss_delta is not None and not (max_loss_delta >= 0 and math.isfinite(max_loss_delta)):
        raise TrainperfError(f"--max-loss-delta {max_loss_delta}: must be a finite number >= 0 (loss units)")
    a, b = _gate_runs(baseline, store, "--baseline"), _gate_runs(candidate, store, "--candidate")
    if band:
        return band_gate(a, b)
    if len(a) > 1 or len(b) > 1:
        raise TrainperfError("--max-loss-delta compares one run with one run; repeats (a,b,...) go with --numerics band")
    return loss_delta_gate(a[0], b[0], max_loss_delta)
