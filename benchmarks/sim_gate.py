"""Simulate the CI gate: A/A false alarms and power against a known regression.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--cv", type=float, default=0.01)
    ap.add_argument("--shift", type=float, default=0.03)
    ap.add_argument("--min-effect", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
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
