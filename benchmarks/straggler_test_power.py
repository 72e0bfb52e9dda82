"""The CPU-only straggler test (crossrank.straggler_p_value) against the plain sign-flip test of the sum it replaced:
false alarms with no straggler and detections with one, on simulated per-step extras of 2 ranks.

Each series is 10 steps (the corpus' real runs' analysed window) of the slow-candidate rank's extra work over the
other rank in the same step, in units of the load noise's standard deviation: noise alone (independent from step
to step, or AR(1) correlated: load that persists for a few steps), or noise plus a rank late by delta in every step,
or from some step on (a rank that turns slow inside the window and stays slow). The straggler is the rank with the
larger sum, as crossrank.host_straggler picks it. Detected: p <= stragglers.STRAGGLER_HOST_ALPHA.

    .venv/bin/python benchmarks/straggler_test_power.py [--series 1000] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.progress import track
from scipy.stats import permutation_test

from trainperf.diagnose.crossrank import straggler_p_value
from trainperf.diagnose.stragglers import STRAGGLER_HOST_ALPHA

STEPS = 10
# (label, AR(1) correlation of the noise, first late step (0-based), lateness in noise sd)
SCENARIOS = (("no straggler, independent noise", 0.0, 0, 0.0), ("no straggler, AR(1) 0.3", 0.3, 0, 0.0),
             ("no straggler, AR(1) 0.6", 0.6, 0, 0.0), ("late in every step by 0.5 sd", 0.0, 0, 0.5),
             ("late in every step by 1 sd", 0.0, 0, 1.0), ("late from step 4 by 1 sd", 0.0, 3, 1.0),
             ("late from step 4 by 2 sd", 0.0, 3, 2.0), ("late from step 6 by 2 sd", 0.0, 5, 2.0))


def sum_test_p(x: np.ndarray, n_ranks: int) -> float:
    """The test before: one-sided sign-flip p of the plain sum over the window, times n_ranks."""
    res = permutation_test((x,), np.sum, permutation_type="samples", alternative="greater", n_resamples=np.inf)
    return min(1.0, n_ranks * float(res.pvalue))


def series(rng: np.random.Generator, rho: float, onset: int, delta: float) -> np.ndarray:
    """One simulated window of per-step extras, oriented so that its sum is >= 0 (the chosen straggler's)."""
    e = rng.standard_normal(STEPS)
    x = np.empty(STEPS)
    x[0] = e[0]
    for i in range(1, STEPS):
        x[i] = rho * x[i - 1] + np.sqrt(1.0 - rho * rho) * e[i]
    x = x + delta * (np.arange(STEPS) >= onset)
    return x if x.sum() >= 0 else -x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f"| scenario ({a.series} series of {STEPS} steps) | sum test | sum over the last steps too (now) |")
    print("|---|---|---|")
    for label, rho, onset, delta in track(SCENARIOS, description="scenarios", transient=True):
        before = now = 0
        for _ in range(a.series):
            x = series(rng, rho, onset, delta)
            before += sum_test_p(x, 2) <= STRAGGLER_HOST_ALPHA
            now += straggler_p_value(x, 2) <= STRAGGLER_HOST_ALPHA
        print(f"| {label} | {before / a.series:.3f} | {now / a.series:.3f} |")


if __name__ == "__main__":
    main()
