"""Numerics of B against A: is it still the same training?

Comparable runs train the same model on the same data in the same order from the same
initialisation: equal ``comparable`` entries for model, data, seed, sequence length and
samples per step (precision, kernels, compile, layout and learning rate may differ: they are
what a change changes). A and B runs are paired by seed.

Per step, the loss difference B - A (a centred running median over ``SMOOTH`` steps, so one
noisy batch is not a divergence) is held against a noise band:

- from repeats with different seeds (``MIN_SEEDS`` or more A runs): ``BAND_Z`` x the seed-to-seed
  standard deviation of A's loss at that step (running median over ``SMOOTH`` steps);
- without repeats: ``BAND_Z`` x the batch-to-batch noise of A's loss (robust scale of its
  second differences over ``NOISE_WINDOW`` steps), a stand-in for the seed band;
- from a reference run in higher precision (``reference``): the |reference - A| difference,
  times ``BAND_Z``, when the reference is given.

B diverges where the smoothed difference stays outside the band for ``PERSIST`` steps, dated
at the first step of that stretch whose own difference is outside (a centred median looks
``SMOOTH // 2`` steps ahead), or where B's loss stops being finite while A's is. The same test runs on
log grad norm. Constants: docs/benchmarks.md "Trainer and compare" (equivalent changes vs
broken ones, 5 seeds each).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from trainperf.compare.runs import RunData, finite

SAME_TRAINING = ("model", "data", "seed", "seq_len", "samples_per_step")
SMOOTH = 5  # steps in the running median of a difference
NOISE_WINDOW = 21  # steps over which the batch-to-batch loss noise is measured
BAND_Z = 4.0  # band half-width in noise standard deviations
PERSIST = 3  # steps the difference must stay outside the band
# Fewest A runs with different seeds for the seed band: two give a standard deviation with one degree
# of freedom (its 99.5% t quantile is 64), too noisy to hold a difference against; `gate` uses it too.
MIN_SEEDS = 3


@dataclass(kw_only=True)
class Divergence:
    """Where a series of B leaves A's noise band (None: it never does)."""

    metric: str  # "loss" or "grad_norm"
    seed: int | None
    step: int | None
    max_excess: float  # largest |smoothed difference| / band over the compared steps

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return asdict(self)


@dataclass(kw_only=True)
class NumericsResult:
    """The numerics verdict with its evidence."""

    verdict: str  # "equivalent", "diverges at step N", "not comparable (...)"
    comparable: bool
    reason: str
    changed: dict = field(default_factory=dict)  # comparability fields that differ: {key: [A, B]}
    band_source: str = ""
    divergences: list[Divergence] = field(default_factory=list)
    grad_norm_ratio: float | None = None  # median over the compared steps of B / A
    final_loss: tuple | None = None  # ((A, lo, hi), (B, lo, hi)): mean of each run's last final_loss_steps losses
    final_loss_steps: tuple[int, int] = (0, 0)  # the last steps averaged (``end_steps``), A's and B's first run
    eval_loss: tuple | None = None  # ((A, lo, hi), (B, lo, hi)); lo/hi None without repeats
    target_loss: float | None = None
    time_to_target: dict = field(default_factory=dict)  # {"A": {"step", "wall_s", "gpu_hours"} | None, "B": ...}
    curves: dict = field(default_factory=dict)  # step, loss_a, loss_b, band (one seed pair) for the report

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        d = asdict(self)
        d["divergences"] = [x.to_dict() for x in self.divergences]
        return d


def comparability(a: RunData, b: RunData) -> tuple[bool, str, dict]:
    """Return (comparable, reason when not, {field: [A, B]} of every recorded difference)."""
    ca, cb = a.comparable, b.comparable
    missing = [r.name for r, c in ((a, ca), (b, cb)) if not c]
    if missing:
        return False, f"no comparability record in {', '.join(missing)} (run.json 'comparable', written by trainperf train)", {}
    changed = {k: [ca.get(k), cb.get(k)] for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)}
    different = [k for k in SAME_TRAINING if k in changed]
    if different:  # model and data are long records: named, not printed
        what = ", ".join(k if k in ("model", "data") else f"{k} {changed[k][0]} vs {changed[k][1]}" for k in different)
        return False, f"different {what}", changed
    return True, "", changed


def running_median(x: np.ndarray, w: int = SMOOTH) -> np.ndarray:
    """Return the centred running median of ``x`` over ``w`` points (shorter at the ends; NaN ignored)."""
    x = np.asarray(x, dtype=float)
    h = w // 2
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        seg = x[max(0, i - h): i + h + 1]
        seg = seg[np.isfinite(seg)]
        if len(seg):
            out[i] = np.median(seg)
    return out


def batch_noise(x: np.ndarray, window: int = NOISE_WINDOW) -> np.ndarray:
    """Return, per point, the batch-to-batch noise (standard deviation, units of ``x``) of a loss
    curve over ``window`` points: the robust scale of second differences / sqrt(6), which a
    locally straight trend (a falling loss) does not inflate."""
    from trainperf.fleet.noise import quantum, robust_scale

    x = np.asarray(x, dtype=float)
    d2 = np.full(len(x), np.nan)
    d2[1:-1] = x[2:] - 2 * x[1:-1] + x[:-2]
    h = window // 2
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        seg = finite(d2[max(0, i - h): i + h + 1])
        if len(seg) >= 3:
            out[i] = robust_scale(seg, quantum(seg)) / np.sqrt(6.0)  # tie-aware on quantised values
    fill = np.nanmedian(out) if np.isfinite(out).any() else 0.0
    return np.where(np.isfinite(out), out, fill)


def _aligned(runs: list[RunData], col) -> tuple[np.ndarray, list[np.ndarray]]:
    common = set(runs[0].step.tolist())
    for r in runs[1:]:
        common &= set(r.step.tolist())
    steps = np.array(sorted(common))
    return steps, [col(r)[np.searchsorted(r.step, steps)] for r in runs]


def band(a_runs: list[RunData], col, steps: np.ndarray, reference: RunData | None = None) -> tuple[np.ndarray, str]:
    """Return the noise band half-width per step of ``col`` (loss or log grad norm) and its source."""
    if reference is not None:
        _, (ref, a0) = _aligned([reference, a_runs[0]], col)
        return BAND_Z * running_median(np.abs(ref - a0)) + 1e-12, f"{BAND_Z:g} x |reference - A| ({reference.name})"
    ys = [col(r)[np.searchsorted(r.step, steps)] for r in a_runs]
    seeds = {(r.comparable or {}).get("seed") for r in a_runs}
    if len(seeds - {None}) >= MIN_SEEDS:
        sd = np.nanstd(np.vstack(ys), axis=0, ddof=1)
        return BAND_Z * running_median(sd) + 1e-12, f"{BAND_Z:g} x seed-to-seed sd of A ({len(a_runs)} seeds)"
    return BAND_Z * batch_noise(ys[0]) + 1e-12, f"{BAND_Z:g} x batch-to-batch noise of A (fewer than {MIN_SEEDS} seeds)"


def divergence_step(steps: np.ndarray, a: np.ndarray, b: np.ndarray, half_width: np.ndarray) -> tuple[int | None, float]:
    """Return (first step from which |running median of b - a| > band for PERSIST steps, or where b
    stops being finite while a is; None if never) and the largest excess ratio."""
    bad_b = ~np.isfinite(b) & np.isfinite(a)
    d = np.abs(running_median(np.where(bad_b, np.nan, b - a)))
    ratio = d / half_width
    out = np.nan_to_num(ratio, nan=0.0) > 1.0
    first_bad = int(np.argmax(bad_b)) if bad_b.any() else None
    run, found = 0, None
    for i, o in enumerate(out):
        run = run + 1 if o else 0
        if run >= PERSIST:
            found = i - PERSIST + 1
            break
    if found is not None:  # a centred median sees SMOOTH // 2 steps ahead: start at the first raw excursion
        raw = np.abs(b - a) > half_width
        ahead = [j for j in range(found, min(found + PERSIST + SMOOTH // 2, len(raw))) if raw[j]]
        found = ahead[0] if ahead else found
    hits = [i for i in (found, first_bad) if i is not None]
    return (int(steps[min(hits)]) if hits else None), float(np.nanmax(ratio)) if np.isfinite(ratio).any() else 0.0


def _mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float | None, float | None]:
    from scipy.stats import t

    v = finite(values)
    if len(v) < 2:
        return (float(v[0]) if len(v) else float("nan")), None, None
    half = float(t.ppf(0.5 + level / 2, len(v) - 1)) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def end_steps(n: int) -> int:
    """Return how many last training losses of ``n`` make a run's end point: max(5, 10%) (one batch's
    loss is noisy; the run summary's "final loss" is the last step's alone)."""
    return min(n, max(5, n // 10))


def _tail(r: RunData) -> np.ndarray:
    """Return the run's last ``end_steps`` finite training losses: its end point."""
    v = finite(r.loss)
    return v[len(v) - end_steps(len(v)):]


def end_loss(r: RunData, use_eval: bool) -> float:
    """Return a run's end point (loss units): its last held-out loss if ``use_eval``, else the mean
    of its last max(5, 10%) training losses."""
    if use_eval:
        return float(r.eval_loss[-1])
    t = _tail(r)
    return float(t.mean()) if len(t) else float("nan")


def seed_band(values, m: int = 1, level: float = 0.99) -> tuple[float, float]:
    """Return the ``level`` prediction interval of the mean of ``m`` new runs from the end points
    ``values`` of k runs with different seeds: mean +- t(k - 1) sd sqrt(1/k + 1/m) (normal
    seed-to-seed spread; needs k >= 2)."""
    from scipy.stats import t

    v = finite(np.asarray(values, dtype=float))
    k = len(v)
    if k < 2:
        raise ValueError("seed_band needs two or more seeds")
    half = float(t.ppf(0.5 + level / 2, k - 1)) * float(v.std(ddof=1)) * math.sqrt(1 / k + 1 / m)
    return float(v.mean() - half), float(v.mean() + half)


def final_loss(runs: list[RunData]) -> tuple[float, float | None, float | None]:
    """Return the final training loss (mean of the last max(5, 10%) steps) with a 95% interval:
    over runs when there are repeats, else over those steps with the lag-1 autocorrelation of their noise."""
    from trainperf.fleet.changepoints import noise_autocorr

    tails = [_tail(r) for r in runs]
    if len(runs) >= 2:
        return _mean_ci(np.array([t.mean() for t in tails]))
    t = tails[0]
    m, lo, hi = _mean_ci(t)
    if lo is None:
        return m, None, None
    rho = noise_autocorr(t) if len(t) >= 8 else 0.0
    k = math.sqrt((1 + rho) / (1 - rho))
    return m, m - (m - lo) * k, m + (hi - m) * k


def eval_loss(runs: list[RunData]) -> tuple[float, float | None, float | None] | None:
    """Return the last held-out loss (mean over runs, 95% interval across repeats), None without evaluations."""
    last = [r.eval_loss[-1] for r in runs if len(r.eval_loss)]
    return _mean_ci(np.array(last)) if last else None


def trailing_median(x: np.ndarray, w: int = SMOOTH) -> np.ndarray:
    """Return the median of each point and the ``w - 1`` before it (NaN ignored): what was known at that step."""
    x = np.asarray(x, dtype=float)
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        seg = finite(x[max(0, i - w + 1): i + 1])
        if len(seg):
            out[i] = np.median(seg)
    return out


def _smoothed_quality(r: RunData, use_eval: bool) -> tuple[np.ndarray, np.ndarray]:
    if use_eval:
        return r.eval_step, r.eval_loss
    return r.step, trailing_median(r.loss)


def time_to_target(r: RunData, target: float, use_eval: bool) -> dict | None:
    """Return {"step", "wall_s", "gpu_hours"}: when run ``r`` first reaches loss <= ``target``
    (held-out loss if ``use_eval``, else the median of the training loss over the last ``SMOOTH``
    steps, what was known at that step); None if never.
    Wall time counts from the job's first process start; GPU-hours = wall x world size."""
    steps, q = _smoothed_quality(r, use_eval)
    hit = np.flatnonzero(np.nan_to_num(q, nan=np.inf) <= target)
    if not len(hit):
        return None
    step = int(steps[hit[0]])
    wall = float(r.t_end[np.searchsorted(r.step, step)] - r.t_start)
    return {"step": step, "wall_s": wall, "gpu_hours": wall * r.world_size / 3600}


def _median_time(runs: list[RunData], target: float, use_eval: bool) -> dict | None:
    got = [time_to_target(r, target, use_eval) for r in runs]
    if any(g is None for g in got):
        return None
    return {k: float(np.median([g[k] for g in got])) for k in ("step", "wall_s", "gpu_hours")}


def compare_numerics(a_runs: list[RunData], b_runs: list[RunData], *, target: float | None = None,
                     reference: RunData | None = None) -> NumericsResult:
    """Return the numerics verdict of B against A (see the module doc)."""
    by_seed_b = {(r.comparable or {}).get("seed"): r for r in b_runs}
    pairs = [(a, by_seed_b[(a.comparable or {}).get("seed")]) for a in a_runs
             if (a.comparable or {}).get("seed") in by_seed_b]
    # a B seed among several A seeds: judged against the A of its seed (the others make the band)
    ok, reason, changed = comparability(*(pairs[0] if pairs else (a_runs[0], b_runs[0])))
    if ok and not pairs:
        ok, reason = False, "no A and B runs with the same seed"
    if ok:
        for a, b in pairs[1:]:
            ok2, why, _ = comparability(a, b)
            if not ok2:
                ok, reason = False, f"{a.name} vs {b.name}: {why}"
                break
    res = NumericsResult(verdict="", comparable=ok, reason=reason, changed=changed)
    if not ok:
        res.verdict = f"not comparable ({reason})"
        return res

    divs = []
    for metric, col in (("loss", lambda r: r.loss),
                        ("grad_norm", lambda r: np.log(np.where(r.grad_norm > 0, r.grad_norm, np.nan)))):
        steps, _ = _aligned(a_runs + [b for _, b in pairs], col)
        if not len(steps) or not all(np.isfinite(col(a)).any() and np.isfinite(col(b)).any() for a, b in pairs):
            continue
        half, source = band(a_runs, col, steps, reference)
        if metric == "loss":
            res.band_source = source
        for a, b in pairs:
            ya, yb = (col(r)[np.searchsorted(r.step, steps)] for r in (a, b))
            at, excess = divergence_step(steps, ya, yb, half)
            divs.append(Divergence(metric=metric, seed=(a.comparable or {}).get("seed"), step=at, max_excess=excess))
            if metric == "loss" and not res.curves:
                res.curves = {"step": steps.tolist(), "loss_a": ya.tolist(), "loss_b": yb.tolist(),
                              "band": half.tolist()}
    res.divergences = divs
    ratios = [np.nanmedian(b.grad_norm[np.searchsorted(b.step, s)] / a.grad_norm[np.searchsorted(a.step, s)])
              for a, b in pairs for s in [np.intersect1d(a.step, b.step)] if np.isfinite(a.grad_norm).any()
              and np.isfinite(b.grad_norm).any()]
    res.grad_norm_ratio = float(np.median(ratios)) if ratios else None
    res.final_loss = (final_loss(a_runs), final_loss([b for _, b in pairs]))
    res.final_loss_steps = (len(_tail(a_runs[0])), len(_tail(pairs[0][1])))
    ea, eb = eval_loss(a_runs), eval_loss([b for _, b in pairs])
    res.eval_loss = (ea, eb) if ea and eb else None
    use_eval = res.eval_loss is not None
    if target is None:  # the worse of the two end points: both runs reach it
        target = max(ea[0], eb[0]) if use_eval else max(res.final_loss[0][0], res.final_loss[1][0])
    res.target_loss = float(target)
    res.time_to_target = {"A": _median_time(a_runs, target, use_eval),
                          "B": _median_time([b for _, b in pairs], target, use_eval),
                          "quality": "held-out loss" if use_eval else f"training loss (median of the last {SMOOTH} steps)"}
    diverged = [d for d in divs if d.step is not None]
    if diverged:
        first = min(diverged, key=lambda d: d.step)
        n_seeds = len({d.seed for d in diverged})
        res.verdict = f"diverges at step {first.step}"
        res.reason = (f"{first.metric.replace('_', ' ')} leaves the band ({res.band_source}) in {n_seeds} of "
                      f"{len(pairs)} seed pair(s)")
    else:
        res.verdict = "equivalent"
        res.reason = f"loss and grad norm inside the band ({res.band_source}) at every step"
    return res
