"""How diagnose scales with the events of one rank: wall time and peak RSS of `trainperf diagnose` on a built trace.

The trace is one thread launching tiny kernels back to back (an op of 25 us, its 20-us kernel), STEPS steps of
OPS ops; --gap-every K adds a 2-ms gap with no op after every K-th op (Python outside ops: the host waits the
replay looks for another thread to explain), the shape that made the replay's search for that thread quadratic.
--ranks N writes N copies of that rank (rank 0..N-1) into one folder: how the memory of a job grows with its ranks.

    .venv/bin/python benchmarks/bench_diagnose_scale.py --ops 30000 --steps 10 --gap-every 100
    .venv/bin/python benchmarks/bench_diagnose_scale.py --ops 20000 --steps 5 --ranks 8 --repeat 1
    PYTHONPATH=<worktree>/src .venv/bin/python benchmarks/bench_diagnose_scale.py ...   # another checkout's code

Each run is a fresh process (`trainperf.cli diagnose`), so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_trace(folder: Path, *, steps: int, ops: int, gap_every: int, ranks: int = 1) -> int:
    """Write the trace (module docstring) as rank<r>.json.gz for each of `ranks` ranks into folder; returns the
    number of complete events of one rank."""
    events = []
    corr = 1000
    t = 0.0
    for s in range(steps):
        start = t
        for k in range(ops):
            corr += 1
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 10, "tid": 1, "ts": t, "dur": 25.0})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 1,
                           "ts": t + 10.0, "dur": 4.0, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>",
                           "pid": 0, "tid": 7, "ts": t + 20.0, "dur": 20.0,
                           "args": {"correlation": corr, "stream": 7, "device": 0}})
            t += 30.0 + (2000.0 if gap_every and k % gap_every == gap_every - 1 else 0.0)
        t += 100.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 10, "tid": 1,
                       "ts": start, "dur": t - start})
    for r in range(ranks):
        doc = {"schemaVersion": 1, "traceEvents": events,
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks}}
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return len(events)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=30000, help="ops (each one launch and one kernel) per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--gap-every", type=int, default=100, help="a 2-ms gap with no op after every K-th op (0: none)")
    ap.add_argument("--ranks", type=int, default=1, help="copies of the rank, as ranks 0..N-1 of one job")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "job"
        trace.mkdir()
        n = build_trace(trace, steps=args.steps, ops=args.ops, gap_every=args.gap_every, ranks=args.ranks)
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "trainperf.cli", "diagnose", str(trace), "--json",
                            str(Path(tmp) / "out.json")], check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        walls.sort()
        print(json.dumps({"ranks": args.ranks, "events_per_rank": n,
                          "json_mb": round(sum(f.stat().st_size for f in trace.iterdir()) / 1e6, 1),
                          "wall_s_median": round(walls[len(walls) // 2], 2), "wall_s": [round(w, 2) for w in walls],
                          "peak_rss_mb": round(peak_mb)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
