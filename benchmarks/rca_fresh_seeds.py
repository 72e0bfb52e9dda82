"""Root causes on synthetic incidents drawn after the parameters were fixed: micro-F1 per seed and pooled.

The shipped defaults (LocalizeOptions()) were chosen on the sets of ``eval_rca.py --seed 1`` (generator seeds
1-4). This scores them, and any other setting given with ``--at``, on the sets of other seeds: incidents no
choice ever saw. Per seed: micro-F1 and its bootstrap standard error over the 90 incidents (resampled 300
times); then micro-F1 pooled over every seed's incidents (TP, FP, FN summed).

    .venv/bin/python benchmarks/rca_fresh_seeds.py [--set uneven] [--seeds 33,43,...] [--at 0.1,0.25,3.09]

``--at PENALTY,RATIO,Z`` adds a setting (penalty, parsimony_ratio, parsimony_z), e.g. the one the
leave-one-dataset-out choice makes when the set is left out (eval_rca.py --cv).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval_rca as E  # noqa: E402  (the RCA harness: incident sets, scoring)

from trainperf.fleet.localize import LocalizeOptions  # noqa: E402


def bootstrap_se(rows: np.ndarray, seed: int, draws: int = 300) -> float:
    """Standard error of micro-F1 over incidents (rows: [incident, (TP, FP, FN, ...)]) by resampling them."""
    rng = np.random.default_rng(seed)
    n = rows.shape[0]
    return float(np.std([E._f1(rows[rng.integers(0, n, n)].sum(axis=0))[0] for _ in range(draws)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="uneven", help="incident set (fundamental, derived, uneven, riskloc)")
    ap.add_argument("--seeds", default="33,43,53,63,73,83,93,103",
                    help="generator seeds of the set (eval_rca.py --seed S scores uneven with seed S + 2)")
    ap.add_argument("--at", action="append", default=[], help="PENALTY,RATIO,Z: another setting to score")
    ap.add_argument("--incidents", type=int, default=90)
    a = ap.parse_args()
    settings = {"defaults": LocalizeOptions()}
    for at in a.at:
        pen, ratio, z = (float(v) for v in at.split(","))
        settings[f"penalty {pen:g}, ratio {ratio:g}, z {z:g}"] = LocalizeOptions(penalty=pen, parsimony_ratio=ratio,
                                                                                 parsimony_z=z)
    grid = list(settings.values())
    pooled = np.zeros((len(grid), 5))
    for seed in (int(s) for s in a.seeds.split(",")):
        arr = E.grid_scores({a.set: E.synthetic_incidents(a.set, a.incidents, seed)}, grid)[a.set]
        pooled += arr.sum(axis=1)
        cells = [f"{name} {E._f1(arr[g].sum(axis=0))[0]:.3f} (se {bootstrap_se(arr[g], seed):.3f})"
                 for g, name in enumerate(settings)]
        print(f"{a.set} seed {seed}: " + "; ".join(cells), flush=True)
    for g, name in enumerate(settings):
        tp, fp, fn = (int(v) for v in pooled[g, :3])
        print(f"pooled, {name}: micro-F1 {E._f1(pooled[g])[0]:.3f} (TP {tp}, FP {fp}, FN {fn})")


if __name__ == "__main__":
    main()
