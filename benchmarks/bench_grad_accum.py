"""How much backward time `diagnose --modules` leaves unattributed under gradient accumulation (issue 10).

A 4-block MLP (LayerNorm, Linear d x d, GELU; d=1024) on the CPU, 4 micro-batches per step (each
AccumulateGrad after the first adds into .grad: real work), profiled with with_stack=True and
record_shapes=True for 3 steps after 1 warm-up. Prints the backward time per step, the share not
attributed to any module and each row's backward, for this checkout's src/ and, with --src, another
checkout's (e.g. `git archive <commit> src | tar -x -C /tmp/old`) on the same trace.

    .venv/bin/python benchmarks/bench_grad_accum.py [--src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = r'''
import sys
from trainperf.diagnose.modules import module_breakdown
from trainperf.trace.kineto import read_kineto
b = module_breakdown(read_kineto(sys.argv[1]), by="type")
print(f"backward {b.backward_us_per_step / 1e3:.1f} ms/step, unattributed {b.unlinked_backward_us_per_step / 1e3:.1f} "
      f"ms/step ({100 * b.unlinked_backward_us_per_step / b.backward_us_per_step:.1f}%)")
for r in b.rows:
    if r.depth in (0, 3):
        print(f"  {r.path}: backward {r.backward_us_per_step / 1e3:.2f} ms/step")
'''


def record(path: Path) -> None:
    """Profile 3 optimizer steps of 4 micro-batches each of a 4-block MLP on the CPU (record_shapes) into ``path``."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    torch.set_num_threads(1)
    d = 1024
    model = nn.Sequential(*[nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(4)])
    x = torch.randn(8, d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as p:
        for _ in range(4):
            for _ in range(4):  # micro-batches
                model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            p.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", help="another checkout's src/ to compare on the same trace")
    a = ap.parse_args()
    trace = Path(tempfile.mkdtemp()) / "accum.json"
    record(trace)
    for label, src in (("this checkout", str(REPO / "src")), ("--src", a.src)):
        if src:
            out = subprocess.run([sys.executable, "-c", SUMMARY, str(trace)], capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": src})
            print(f"{label} ({src}):\n{out.stdout}")


if __name__ == "__main__":
    main()
