"""Overhead of trainperf.monitor on a real training step, measured two ways in one run.

1. A/B: the tiny model's training step (forward, backward, AdamW) timed in pairs (one bare
   step and one monitored step per round, in random order: machine noise hits both arms
   alike) with and without the monitor (step context, data/phase blocks, loss read, one metrics
   line written to disk per step); medians of each arm and their ratio.
2. Direct: the monitor's own cost per step (an empty monitored step minus an empty bare
   loop iteration), as a fraction of the median bare step time. On a shared machine the A/B
   ratio carries the machine's noise; the direct figure isolates the monitor.

    python benchmarks/bench_monitor.py [--rounds 200 --block 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--block", type=int, default=1, help="steps per arm per round")
    args = ap.parse_args(argv)

    import torch

    from trainperf.monitor import Monitor
    from trainperf.specs import load_model
    from trainperf.train.model import build_model

    torch.manual_seed(0)
    spec = load_model(args.model)
    model = build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randint(0, spec.vocab, (1, spec.seq_len))
    y = torch.randint(0, spec.vocab, (1, spec.seq_len))

    def bare_step():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(tmp, model=spec, peak_flops=1e12, start_time=time.time())
        step_no = [0]

        def monitored_step():
            step_no[0] += 1
            with mon.step(step_no[0], tokens=spec.seq_len) as st:
                with st.data():
                    pass
                with st.phase("forward"):
                    loss = model(x, y)
                with st.phase("backward"):
                    loss.backward()
                with st.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                st.loss = loss

        for _ in range(5):  # warm-up both paths
            bare_step()
            monitored_step()
        bare, monitored = [], []
        order = random.Random(0)
        for _ in range(args.rounds):
            arms = [(bare, bare_step), (monitored, monitored_step)]
            order.shuffle(arms)  # no arm always runs first (caches, allocator, page cache)
            for arm, fn in arms:
                for _ in range(args.block):
                    t = time.perf_counter()
                    fn()
                    arm.append(time.perf_counter() - t)

        # direct cost of the monitor: empty monitored steps vs an empty loop
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            pass
        empty_loop = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for i in range(n):
            step_no[0] += 1
            with mon.step(step_no[0], tokens=spec.seq_len) as st:
                with st.data():
                    pass
                with st.phase("forward"):
                    pass
                with st.phase("backward"):
                    pass
                with st.phase("optimizer"):
                    pass
                st.loss = 1.0
        own = (time.perf_counter() - t) / n - empty_loop
        mon.close()

    mb, mm = statistics.median(bare), statistics.median(monitored)
    print(f"model {spec.name}, {len(bare)} steps per arm in {args.rounds} interleaved rounds")
    pair = statistics.median(m / b for b, m in zip(bare, monitored)) if args.block == 1 else float("nan")
    print(f"A/B   median step: bare {mb * 1e3:.3f} ms, monitored {mm * 1e3:.3f} ms, ratio {mm / mb:.4f}; "
          f"median of paired ratios {pair:.4f}")
    print(f"direct monitor cost per step: {own * 1e6:.1f} us = {own / mb * 100:.3f}% of the bare step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
