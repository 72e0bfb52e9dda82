"""Simulate the CI gate and compare's interval: A/A false alarms and power against a known change.

``--series`` (the interval over autocorrelated steps, ``trainperf.compare.interval.shift``,
which `compare` and `gate` on runs share): per-step times 1 + noise with CV ``--cv``, AR(1)
with phi 0, 0.3, 0.6, 0.9; noise kinds: ``normal``; ``heavy`` (Student t3 innovations scaled to
the same spread, plus 5% outlier steps at +20%); ``trend`` (the same slow drift in every run:
+2% linear over the run, as a machine warming up); ``walk`` (a different slow drift in each
run: a random walk whose end has sd 0.5%). Steps per run ``--steps`` (50 and 200). A/A: two
runs of one distribution, the share of 95% intervals excluding zero; power: B slower by 2%,
5%, 10%, the share of intervals above zero. ``walk`` also with 3 runs a side (repeats).

    .venv/bin/python benchmarks/sim_gate.py --series [--trials 4000] [--no-between]

(``--no-between``: the interval from the steps' noise alone, as before the between-run term.)

``--between`` (cross-validation of the default between-run term, ``interval.DEFAULT_BETWEEN_CV``):
machines whose runs differ by a hidden level (each run's level off by a lognormal factor of sd
``c``, constant inside the run: two runs alone cannot see it) and machines whose level wanders
inside runs too (a random walk, end sd ``w``, as ``walk``), step noise CV 1%, AR(1) phi 0.3 and
0.6, 50 and 200 steps. For each candidate default, with the runs' own drift raising it as
`compare` does: the A/A false rate and the power for 3% and 10% changes. The rule, stated before
the run: the issue's power goal is the constraint (a 3% change in 1% step noise over 50 steps, on
a machine whose runs do not differ, found in at least 90% of pairs: one run a side must still see
it), and among the candidates that meet it the default is the one with the lowest mean A/A false
rate over the training scenarios. Run-to-run variation above the default is then covered only by
the store's history or by repeats. Leave-one-machine-out: each machine (c or w) is held out in turn,
the default chosen on the others and scored on it.

    .venv/bin/python benchmarks/sim_gate.py --between [--trials 1000]
    .venv/bin/python benchmarks/sim_gate.py --between --drift-factors 1,2,4 --trials 400

(``--drift-factors``: the A/A false rate of drifting machines per ``interval.DRIFT_FACTOR``, no default term.)

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


CANDIDATES = (0.0, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03)
MACHINES = (("level", 0.0), ("level", 0.0025), ("level", 0.005), ("level", 0.01), ("level", 0.02),
            ("walk", 0.005), ("walk", 0.02))


def machine_runs(rng, reps, n, phi, machine):
    """Return ``reps`` runs (rows) of a machine (module doc, --between): 1% AR(1) step noise times the
    run's hidden level (``level``) or a random-walk drift inside the run (``walk``)."""
    kind, size = machine
    x = series(rng, reps, n, 0.01, phi, "normal")
    if kind == "level":
        return x * np.exp(size * rng.standard_normal((reps, 1)))
    return x * (1.0 + np.cumsum(rng.normal(0, size / np.sqrt(n), (reps, n)), axis=1))


def pair_parts(a, b):
    """Return what every candidate default shares for one pair: the long-run variances and level drifts."""
    from trainperf.compare.interval import level_drift, long_run_variance

    return long_run_variance(a), long_run_variance(b), level_drift(a), level_drift(b)


def rates(parts, candidates):
    """Return {candidate: share of intervals excluding zero / above zero} for the pairs' parts."""
    from trainperf.compare.interval import BetweenRun, change_interval, drift_between

    out = {}
    for f in candidates:
        floor = BetweenRun(cv=f, df=float("inf"), source="candidate")
        sh = [change_interval(va, vb, drift_between(da, db, floor)) for va, vb, da, db in parts]
        out[f] = (np.mean([not (s.lo < 0 < s.hi) for s in sh]), np.mean([s.lo > 0 for s in sh]))
    return out


def run_between(args) -> None:
    """Cross-validate the default between-run term (module doc, --between); print the tables."""
    rng = np.random.default_rng(args.seed)
    trials, power_trials = args.trials, max(args.trials // 2, 100)
    table = {}  # (machine, n, phi) -> {"aa": {f: rate}, 0.03: {f: power}, 0.10: {f: power}}
    t0 = time.process_time()
    for machine in MACHINES:
        for n in args.steps:
            for phi in (0.3, 0.6):
                row = {}
                for effect, k in ((0.0, trials), (0.03, power_trials), (0.10, power_trials)):
                    x = machine_runs(rng, 2 * k, n, phi, machine)
                    x[k:] *= 1.0 + effect
                    r = rates([pair_parts(x[i], x[k + i]) for i in range(k)], CANDIDATES)
                    row[effect] = {f: v[0 if effect == 0.0 else 1] for f, v in r.items()}
                table[(machine, n, phi)] = row
                print(f"{machine[0]} {machine[1]:.2%} n={n} phi={phi}: A/A "
                      + " ".join(f"{row[0.0][f]:.3f}" for f in CANDIDATES), flush=True)

    # the goal's case: runs that do not differ, the fewest steps, the mildest autocorrelation simulated
    quiet = [k for k in table if k[0] == ("level", 0.0) and k[1] == min(args.steps) and k[2] == 0.3]

    def choose(keys):
        # the power goal as the constraint: a 3% change in 1% noise over the fewest steps, on a
        # machine whose runs do not differ, is found in >= 90% of pairs; among those candidates the
        # one with the lowest mean A/A rate over ``keys`` (A/A falls as the default grows)
        feasible = [f for f in CANDIDATES if min(table[k][0.03][f] for k in quiet) >= 0.9] or [CANDIDATES[0]]
        return min(feasible, key=lambda f: (np.mean([table[k][0.0][f] for k in keys]), -f))

    keys = list(table)
    print("\nIn-sample (all machines): chosen default", f"{choose(keys):.2%}")
    print("| candidate | mean A/A | worst A/A (machine) | power 3% | power 10% | power 3%, goal's case |")
    print("|---|---|---|---|---|---|")
    for f in CANDIDATES:
        worst = max(keys, key=lambda k: table[k][0.0][f])
        print(f"| {f:.2%} | {np.mean([table[k][0.0][f] for k in keys]):.1%} | {table[worst][0.0][f]:.1%} "
              f"({worst[0][0]} {worst[0][1]:.2%}, n {worst[1]}, phi {worst[2]}) | "
              f"{np.mean([table[k][0.03][f] for k in keys]):.0%} | {np.mean([table[k][0.10][f] for k in keys]):.0%} | "
              f"{min(table[k][0.03][f] for k in quiet):.0%} |")
    print("\nLeave-one-machine-out (default chosen without the machine, scored on it):")
    print("| held-out machine | chosen | A/A (n 50 / 200) | power 3% (50 / 200) | power 10% (50 / 200) |")
    print("|---|---|---|---|---|")
    for machine in MACHINES:
        f = choose([k for k in keys if k[0] != machine])
        held = [k for k in keys if k[0] == machine]

        def by_n(eff):
            return " / ".join(f"{np.mean([table[k][eff][f] for k in held if k[1] == n]):.1%}" for n in args.steps)
        print(f"| {machine[0]} {machine[1]:.2%} | {f:.2%} | {by_n(0.0)} | {by_n(0.03)} | {by_n(0.10)} |")
    print(f"{(time.process_time() - t0):.0f} CPU-s")


def run_drift_factors(args) -> None:
    """Print the A/A false rate on walk machines (the level moves inside runs) with no default term,
    for each ``--drift-factors`` value of ``interval.DRIFT_FACTOR`` (tau^2 per unit of level drift)."""
    import trainperf.compare.interval as interval

    rng = np.random.default_rng(args.seed)
    walks = [(kind, size) for kind, size in MACHINES if kind == "walk"] + [("walk", 0.05), ("level", 0.0)]
    data = {}
    for machine in walks:
        for n in args.steps:
            for phi in (0.3, 0.6):
                x = machine_runs(rng, 2 * args.trials, n, phi, machine)
                data[(machine, n, phi)] = [pair_parts(x[i], x[args.trials + i]) for i in range(args.trials)]
    print("| factor | " + " | ".join(f"{m[0]} {m[1]:.1%}, n {n}, phi {phi}" for m, n, phi in data) + " |")
    print("|---|" + "---|" * len(data))
    for factor in args.drift_factors:
        interval.DRIFT_FACTOR = factor  # read at call time by drift_between
        print(f"| {factor:g} | " + " | ".join(f"{rates(p, (0.0,))[0.0][0]:.1%}" for p in data.values()) + " |",
              flush=True)


def run_series(args) -> None:
    from trainperf.compare.interval import NO_BETWEEN, shift

    between = NO_BETWEEN if args.no_between else None  # None: the default term raised to the runs' drift
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
                        return [shift(list(x[i * runs:(i + 1) * runs]), list(x[(k + i) * runs:(k + i + 1) * runs]),
                                      between=between) for i in range(k)]
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
    ap.add_argument("--between", action="store_true", help="cross-validate the default between-run term")
    ap.add_argument("--drift-factors", type=lambda s: [float(v) for v in s.split(",")], default=None,
                    help="--between: instead, the A/A false rate of drifting machines for these DRIFT_FACTOR values")
    ap.add_argument("--no-between", action="store_true",
                    help="--series: the interval without a between-run term (the steps' noise only: before)")
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
    if args.between and args.drift_factors:
        run_drift_factors(args)
        return
    if args.between:
        run_between(args)
        return
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
