"""Cost of recording and of attributing time per nn.Module (issue 10), on the CPU.

1. Recording: CPU time per training step under torch.profiler (record_shapes=True, as
   trainperf's StepProfiler) without and with `with_stack=True` (what writes the "nn.Module:" spans),
   for 8 pre-norm MLP blocks at two widths (d=32: host-bound, many tiny ops; d=256: compute-bound),
   20 steps per trace, the two settings interleaved REPS times; median of the per-trace medians.
2. Attribution: CPU seconds of loading the with_stack trace and of `module_breakdown` on it.

    .venv/bin/python benchmarks/bench_modules.py [REPS]
"""

from __future__ import annotations

import os
import statistics as st
import sys
import tempfile
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.up, self.act, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def main(reps: int = 5) -> None:
    from trainperf.diagnose.modules import module_breakdown
    from trainperf.trace.kineto import read_kineto

    torch.set_num_threads(1)
    out_dir = tempfile.mkdtemp()
    print("| model | steps/trace | off ms/step | with_stack ms/step | ratio (per-rep ratios) | trace MB off -> on |")
    print("|---|---|---|---|---|---|")
    for d, rows in ((32, 8), (256, 64)):
        torch.manual_seed(0)
        model = nn.Sequential(*[Block(d) for _ in range(8)])
        x = torch.randn(rows, d)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        for _ in range(5):
            step()
        med = {False: [], True: []}
        size = {}
        for rep in range(reps):
            for with_stack in (False, True):
                per_step = []
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack) as p:
                    for _ in range(20):
                        t = time.process_time()
                        step()
                        per_step.append(time.process_time() - t)
                        p.step()
                med[with_stack].append(st.median(per_step))
                if rep == 0:
                    path = os.path.join(out_dir, f"d{d}_{with_stack}.json")
                    p.export_chrome_trace(path)
                    size[with_stack] = os.path.getsize(path)
        a, b = st.median(med[False]), st.median(med[True])
        ratios = ", ".join(f"{y / x:.2f}" for x, y in zip(med[False], med[True]))
        print(f"| 8 blocks, d={d}, batch {rows} | 20 | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f} ({ratios}) | "
              f"{size[False] / 1e6:.1f} -> {size[True] / 1e6:.1f} |")
    path = os.path.join(out_dir, "d256_True.json")
    t0 = time.process_time()
    table = read_kineto(path)
    t1 = time.process_time()
    b = module_breakdown(table)
    t2 = time.process_time()
    print(f"\nattribution on {os.path.getsize(path) / 1e6:.1f} MB ({len(table)} events, "
          f"{sum(1 for r in b.rows if r.depth)} module paths): load {t1 - t0:.2f} CPU-s, "
          f"module_breakdown {t2 - t1:.3f} CPU-s; {b.attributed_pct:.1f}% of CPU op time inside module forwards")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
