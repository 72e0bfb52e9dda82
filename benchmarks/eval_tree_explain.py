"""Choose `fleet tree --explain`'s thresholds by cross-validation over synthetic fleets with faults of random size.

Each fleet (trainperf.fleet.tree_synth.TreeFleet) has 4-16 hosts, 1-3 jobs (one run per host and
job), run-to-run noise 2-10%, and each of four faults present with probability 1/2, at a random
host (and job), its size drawn log-uniformly from barely visible to large: a host 1-40% slower,
a checkpoint stall of 3-1000 s, a data stall of 3 ms-3 s per step, a restart of 10-600 s with
1..all steps re-done. Truth per factor: the runs the fault hit (below plan: the slow host's runs;
checkpoint, data wait: the run; restart, start-up, lost work: the restarted run); evaluation has
no fault. A named segment is a true positive when it names exactly those runs; any other named
segment is a false positive; a missed fault is a false negative. Micro-F1 over (fleet, factor).

The thresholds: ``min_excess_share`` (a segment's excess over the typical rate / its loss) and
``alpha`` (family-wise false-alarm rate of the Bonferroni z test). Reported: the defaults'
in-sample F1, the 5-fold held-out F1 of the choice made on the other folds, and the false-alarm
rate on factors with no fault (the test's promise: at most alpha).

    .venv/bin/python benchmarks/eval_tree_explain.py [--fleets 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

FACTORS = ("below_plan", "checkpoint", "data_wait", "restart", "startup", "lost_work", "eval_other")
SHARES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)
ALPHAS = (0.001, 0.01, 0.05, 0.2)


def _logu(rng, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def draw_fleet(rng: np.random.Generator):
    """Return (TreeFleet, truth: factor -> set of run ids) with faults of random size and place."""
    from trainperf.fleet.tree_synth import TreeFleet

    hosts = tuple(f"gpu-node-{i}" for i in range(int(rng.choice([4, 6, 8, 12, 16]))))
    jobs = tuple(f"job-{j}" for j in range(int(rng.integers(1, 4))))
    n_steps = 30
    place = lambda: {"host": str(rng.choice(hosts)), "job": str(rng.choice(jobs))}  # noqa: E731
    faults = {"slow_host": {}, "checkpoint_stall": {}, "data_stall": {}, "restart": {}}
    if rng.random() < 0.5:
        faults["slow_host"] = {"host": str(rng.choice(hosts)), "slowdown": 1 - _logu(rng, 0.01, 0.4)}
    if rng.random() < 0.5:
        faults["checkpoint_stall"] = {**place(), "extra_s": _logu(rng, 3, 1000)}
    if rng.random() < 0.5:
        faults["data_stall"] = {**place(), "steps": n_steps, "extra_s": _logu(rng, 0.003, 3)}
    if rng.random() < 0.5:
        faults["restart"] = {**place(), "restart_s": _logu(rng, 10, 600),
                             "lost_steps": int(round(_logu(rng, 1, n_steps)))}
    fleet = TreeFleet(hosts=hosts, jobs=jobs, n_steps=n_steps, noise=float(rng.choice([0.02, 0.05, 0.1])),
                      seed=int(rng.integers(1 << 30)), **faults)
    runs = [(f"tree-{i:02d}-{h}-{j}", h, j) for i, (h, j) in enumerate((h, j) for h in hosts for j in jobs)]

    def hit(fault):
        return {r for r, h, j in runs if fault and fault.get("host", h) == h and fault.get("job", j) == j}

    truth = {"below_plan": hit(faults["slow_host"]), "checkpoint": hit(faults["checkpoint_stall"]),
             "data_wait": hit(faults["data_stall"]), "restart": hit(faults["restart"]),
             "startup": hit(faults["restart"]), "lost_work": hit(faults["restart"]), "eval_other": set()}
    return fleet, truth


def collect(n: int, seed: int) -> list[dict]:
    """Return per fleet and factor: the truth, localize's candidate segments with their z, and the run attributes."""
    from trainperf.fleet.tree import build_tree
    from trainperf.fleet.tree_explain import explain_candidates

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        fleet, truth = draw_fleet(rng)
        tree = build_tree(fleet.records())
        for f in FACTORS:
            expl, cands = explain_candidates(tree, f)
            out.append({"factor": f, "truth": truth[f], "leaves": expl.leaves,
                        "cands": [(set(s.run_ids), s.excess_gpu_h / s.gpu_h if s.gpu_h else 0.0, z) for s, z in cands]})
    return out


def score(items: list[dict], share: float, alpha: float, zc: dict) -> np.ndarray:
    """Return [TP, FP, FN, factors with no fault where something was named, factors with no fault,
    the same two over fleets with enough runs to test against their spread]."""
    from trainperf.fleet.tree_explain import MIN_RUNS_FOR_SPREAD

    tot = np.zeros(7)
    for k, it in enumerate(items):
        named = [runs for runs, ex, z in it["cands"] if ex >= share and z >= zc[(k, alpha)]]
        tp = int(bool(it["truth"]) and any(r == it["truth"] for r in named))
        fa, clean = int(not it["truth"] and bool(named)), int(not it["truth"])
        tested = len(next(iter(it["leaves"].values()), ())) >= MIN_RUNS_FOR_SPREAD
        tot += [tp, len(named) - tp, int(bool(it["truth"])) - tp, fa, clean, fa * tested, clean * tested]
    return tot


def f1(t) -> float:
    return 2 * t[0] / (2 * t[0] + t[1] + t[2]) if t[0] + t[1] + t[2] else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from trainperf.fleet.tree_explain import ALPHA, MIN_EXCESS_SHARE, critical_z

    t0 = time.perf_counter()
    items = collect(args.fleets, args.seed)
    zc = {(k, a): critical_z(it["leaves"], a) for k, it in enumerate(items) for a in ALPHAS}
    grid = list(itertools.product(SHARES, ALPHAS))
    fleet_of = np.arange(len(items)) // len(FACTORS)
    per_fleet = np.array([[score([items[k] for k in np.flatnonzero(fleet_of == i)], s, a,
                                 {(j, a): zc[(k, a)] for j, k in enumerate(np.flatnonzero(fleet_of == i))})
                           for s, a in grid] for i in range(args.fleets)])  # [fleet, setting, 7]
    print(f"{args.fleets} fleets x {len(FACTORS)} factors ({time.perf_counter() - t0:.0f} s)")
    print(f"{'share':>6} {'alpha':>6} {'TP':>4} {'FP':>4} {'FN':>4} {'F1':>6} {'false alarms':>13}")
    tot = per_fleet.sum(axis=0)
    for g, (s, a) in enumerate(grid):
        t = tot[g]
        print(f"{s:>6} {a:>6} {int(t[0]):>4} {int(t[1]):>4} {int(t[2]):>4} {f1(t):>6.3f} "
              f"{int(t[3]):>4}/{int(t[4])} ({t[3] / max(t[4], 1):.1%}; {t[5] / max(t[6], 1):.1%} with >= 5 runs)")
    default = grid.index((MIN_EXCESS_SHARE, ALPHA))
    fold = np.random.default_rng(0).permutation(args.fleets) % 5
    held = np.zeros(7)
    chosen = []
    for k in range(5):
        g = int(np.argmax([f1(t) for t in per_fleet[fold != k].sum(axis=0)]))  # ties: the first in grid order
        chosen.append(grid[g])
        held += per_fleet[fold == k, g].sum(axis=0)
    g_all = int(np.argmax([f1(t) for t in tot]))
    print(f"defaults (share {MIN_EXCESS_SHARE}, alpha {ALPHA}): in-sample F1 {f1(tot[default]):.3f}, "
          f"false alarms {tot[default][3] / max(tot[default][4], 1):.1%} of fault-free factors "
          f"({tot[default][5] / max(tot[default][6], 1):.1%} in fleets of >= 5 runs, where the test applies)")
    print(f"5-fold held-out F1 of the choice on the other folds: {f1(held):.3f} (TP {int(held[0])}, FP {int(held[1])}, "
          f"FN {int(held[2])}); choices {chosen}")
    print(f"chosen on all fleets: share {grid[g_all][0]}, alpha {grid[g_all][1]}: in-sample F1 {f1(tot[g_all]):.3f}")


if __name__ == "__main__":
    main()
