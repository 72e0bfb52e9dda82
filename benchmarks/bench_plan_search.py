"""How long the exhaustive layout search takes, vectorised vs one layout at a time.

Usage: .venv/bin/python benchmarks/bench_plan_search.py [--repeats 7]

Case from the issue: llama3-405b, seq 8192, 16,384 H100 GPUs, global batch 2048 sequences
(16 M tokens, Llama 3's), the whole space. Side by side in the same run: the vectorised
search (NumPy arrays, one call) and the scalar estimate() called per layout on a random
sample, extrapolated to the whole space (what a per-configuration tool such as Calculon,
~33 ms per configuration by its authors' account, pays).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from trainperf.plan.estimate import estimate
from trainperf.plan.search import evaluate_all, search
from trainperf.specs import load_model, make_cluster


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sample", type=int, default=300)
    args = ap.parse_args(argv)
    m = load_model("llama3-405b", 8192)
    c = make_cluster("h100", 16384)
    gb = 2048
    search(m, c, gb)  # warm-up (imports, caches)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        res = search(m, c, gb, top=10)
        times.append(time.perf_counter() - t0)
    arrays, _ = evaluate_all(m, c, gb)
    n = len(arrays)
    rng = np.random.default_rng(0)
    idx = rng.choice(n, size=min(args.sample, n), replace=False)
    t0 = time.perf_counter()
    for i in idx:
        estimate(m, c, arrays.at(int(i)), gb)
    per_scalar = (time.perf_counter() - t0) / len(idx)
    med = statistics.median(times)
    print(f"llama3-405b, 16384 x h100, seq 8192, global batch {gb}: {n:,} valid layouts, {res.n_fit:,} fit")
    print(f"vectorised search (whole space, ranked): median {med * 1e3:.1f} ms over {args.repeats} runs "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}); {med / n * 1e6:.2f} us per layout")
    print(f"scalar estimate() per layout: {per_scalar * 1e3:.3f} ms -> whole space {per_scalar * n:.1f} s "
          f"(ratio {per_scalar * n / med:.0f}x); at Calculon's ~33 ms/config: {0.033 * n / 60:.1f} min")
    best = res.best[0]
    print(f"best: {best.layout.to_string()} step {best.step_time_s:.2f} s MFU {best.mfu:.1%} "
          f"mem {best.memory_gib_per_gpu:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
