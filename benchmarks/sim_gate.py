"""Simulate the CI gate and compare's interval: A/A false alarms and power against a known change.

``--series`` (the interval over autocorrelated steps, ``trainperf.compare.interval.shift``,
which `compare` and `gate` on runs share): per-step times 1 + noise with CV ``--cv``, AR(1)
with phi 0, 0.3, 0.6, 0.9; noise kinds: ``normal``; ``heavy`` (Student t3 innovations scaled to
the same spread, plus 5% outlier steps at +20%); ``trend`` (the same slow drift in every run:
+2% linear over the run, as a machine warming up); ``walk`` (a different slow drift in each
run: a random walk whose end has sd 0.5%). Steps per run ``--steps`` (50 and 200). A/A: two
runs of one distribution, the share of 95% intervals excluding zero; power: B slower by 2%,
5%, 10%, the share of intervals above zero. ``walk`` also with 3 runs a side (repeats).

    .venv/bin/python benchmarks/sim_gate.py --series [--trials 4000]

Without ``--series``, the gate on independent samples (sample files):

Baseline and candidate are each ``--n`` samples of step time with a coefficient of variation
``--cv`` (normal noise, and a heavy-tailed variant: Student t with 3 degrees of freedom scaled to
the same spread, plus 5% outliers at +20%). A/A: both from the same distribution; any
"regression" verdict is a false alarm. Power: the candidate is ``--shift`` slower; the share of
"regression" verdicts. Defaults are the gate's (Mann-Whitney U, alpha 0.005, min effect 2%).

    .venv/bin/python benchmarks/sim_gate.py [--trials 5000] [--n 10] [--cv 0.01] [--shift 0.03]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trainperf.fleet.gate import compare


def draw(rng, n, cv, heavy):
    if not heavy:
        return 1.0 + cv * rng.standard_normal(n)
    x = 1.0 + cv * rng.standard_t(3, n) / np.sqrt(3.0)  # t3 has variance 3
    out = rng.random(n) < 0.05
    x[out] *= 1.2
    return x


PHIS = (0.0, 0.3, 0.6, 0.9)
EFFECTS = (0.02, 0.05, 0.10)
KINDS = ("normal", "heavy", "trend", "walk")


def series(rng, reps, n, cv, phi, kind):
    """Return ``reps`` step-time series of ``n`` steps (rows): 1 + AR(1) noise of marginal sd ``cv`` (module doc)."""
    e = rng.standard_t(3, (reps, n)) / np.sqrt(3.0) if kind == "heavy" else rng.standard_normal((reps, n))
    x = np.empty((reps, n))
    x[:, 0] = e[:, 0]
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + np.sqrt(1 - phi**2) * e[:, i]
    x = 1.0 + cv * x
    if kind == "heavy":
        x[rng.random((reps, n)) < 0.05] *= 1.2
    elif kind == "trend":
        x *= 1.0 + 0.02 * np.arange(n) / n
    elif kind == "walk":
        x *= 1.0 + np.cumsum(rng.normal(0, 0.005 / np.sqrt(n), (reps, n)), axis=1)
    return x


def run_series(args) -> None:
    from trainperf.compare.interval import shift

    rng = np.random.default_rng(args.seed)
    power_trials = max(args.trials // 4, 100)
    print(f"trials={args.trials} (A/A), {power_trials} (each power column), cv={args.cv:.1%}, 95% intervals")
    print("| noise | steps | runs a side | phi | A/A false | " + " | ".join(f"power {e:.0%}" for e in args.effects) + " |")
    print("|---|---|---|---|---|" + "---|" * len(args.effects))
    t0 = time.process_time()
    calls = 0
    for kind in args.kinds:
        for n in args.steps:
            for runs in ((1, 3) if kind == "walk" else (1,)):
                for phi in PHIS:
                    def trial(k, effect=0.0):
                        x = series(rng, 2 * runs * k, n, args.cv, phi, kind)
                        x[runs * k:] *= 1.0 + effect
                        return [shift(list(x[i * runs:(i + 1) * runs]), list(x[(k + i) * runs:(k + i + 1) * runs]))
                                for i in range(k)]
                    aa = trial(args.trials)
                    false = np.mean([not (s.lo < 0 < s.hi) for s in aa])
                    power = [np.mean([s.lo > 0 for s in trial(power_trials, e)]) for e in args.effects]
                    calls += args.trials + len(args.effects) * power_trials
                    print(f"| {kind} | {n} | {runs} | {phi:.1f} | {false:.1%} | "
                          + " | ".join(f"{p:.0%}" for p in power) + " |", flush=True)
    print(f"{(time.process_time() - t0) / calls * 1e3:.2f} CPU-ms per interval")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", action="store_true", help="compare's interval over autocorrelated steps")
    ap.add_argument("--steps", type=lambda s: [int(v) for v in s.split(",")], default=[50, 200])
    ap.add_argument("--effects", type=lambda s: [float(v) for v in s.split(",")], default=list(EFFECTS),
                    help="--series: slowdowns of B for the power columns")
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS), help="--series: noise kinds")
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--cv", type=float, default=0.01)
    ap.add_argument("--shift", type=float, default=0.03)
    ap.add_argument("--min-effect", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.series:
        run_series(args)
        return
    rng = np.random.default_rng(args.seed)
    print(f"trials={args.trials} n={args.n} cv={args.cv:.1%} shift={args.shift:.1%} min_effect={args.min_effect:.1%}")
    print(f"{'noise':<8} {'min_effect':>10} {'A/A false alarm':>16} {'A/A verdicts':>40} {'power':>7} {'s/trial':>8}")
    for heavy in (False, True):
        for me in (args.min_effect, 0.0):
            t0 = time.perf_counter()
            aa = {}
            for _ in range(args.trials):
                v = compare(draw(rng, args.n, args.cv, heavy), draw(rng, args.n, args.cv, heavy), min_effect=me).verdict
                aa[v] = aa.get(v, 0) + 1
            hits = sum(compare(draw(rng, args.n, args.cv, heavy),
                               draw(rng, args.n, args.cv, heavy) * (1 + args.shift), min_effect=me).verdict == "regression"
                       for _ in range(args.trials))
            dt = (time.perf_counter() - t0) / (2 * args.trials)
            fa = aa.get("regression", 0) / args.trials
            summary = ", ".join(f"{k} {v / args.trials:.1%}" for k, v in sorted(aa.items()))
            print(f"{'t3+5%out' if heavy else 'normal':<8} {me:>10.1%} {fa:>16.2%} {summary:>40} "
                  f"{hits / args.trials:>7.1%} {dt:>8.5f}")


if __name__ == "__main__":
    main()
