"""A GPipe pipeline job written as Kineto traces, one per stage (rank), for the tests and benchmarks/slow_ranks_jobs.py.

Every stage runs the forwards of a step's micro-batches in order, then their backwards (2x the forward) in reverse. A
stage's forward of m starts when it is free and m's activations have arrived (the previous stage's forward of m
ended + 50 us); a backward when its gradient has (the next stage's backward ended + 50 us). Each transfer is a
SendRecv kernel on the sender (stream 21, 50 us from its compute's end) and on the receiver (stream 20, from when it
is free until the data arrives, at least 10 us). Each rank's host launches its step's work at the step's start
and then waits in a device sync that returns 100 us after its own GPU's last op; its next step starts 50 us later
(the stages keep their own step boundaries: a stage that finishes early waits for the next step's data in a recv).
"""

from __future__ import annotations

import random
from pathlib import Path

from kineto_builder import TraceBuilder

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
TRANSFER_US = 50.0


def gpipe_job(out: Path, forward_us: list, micro: int, steps: int = 5, noise_us: float = 0.0,
              rng: random.Random | None = None) -> Path:
    """Write rank<s>.json.gz for each stage s into out; return out. forward_us[s]: stage s's forward of a micro-batch
    (us), or a list of one per step; every compute kernel +-noise_us, uniform."""
    rng = rng or random.Random(0)
    stages = len(forward_us)
    b = [TraceBuilder(rank=s, world_size=stages) for s in range(stages)]
    T = [0.0] * stages  # each rank's step start
    for step in range(steps):
        free, n = [t + 200.0 for t in T], [0] * stages
        done: dict = {}

        def launch(s, name, start, dur, stream=7):
            n[s] += 1
            b[s].launch(name, T[s] + 10 + 2.0 * n[s], start, dur, stream=stream)

        for phase, order, mult in (("f", range(micro), 1.0), ("b", reversed(range(micro)), 2.0)):
            for m in order:
                for s in (range(stages) if phase == "f" else reversed(range(stages))):
                    src = s - 1 if phase == "f" else s + 1
                    start = free[s]
                    if 0 <= src < stages:
                        arrive = done[phase, src, m] + TRANSFER_US
                        launch(s, SEND_RECV, min(free[s], arrive - 10), max(arrive - free[s], 10.0), stream=20)
                        launch(src, SEND_RECV, done[phase, src, m], TRANSFER_US, stream=21)
                        start = max(start, arrive)
                    fwd = forward_us[s][step] if isinstance(forward_us[s], list) else forward_us[s]
                    dur = mult * fwd + rng.uniform(-noise_us, noise_us)
                    launch(s, GEMM, start, dur)
                    done[phase, s, m] = free[s] = start + dur
        for s in range(stages):
            sync_at = T[s] + 15 + 2.0 * n[s]
            end = max(free[s], done.get(("f", s, micro - 1), 0.0)) + 100
            b[s].cpu("cudaDeviceSynchronize", sync_at, end - sync_at, cat="cuda_runtime")
            b[s].step(step, T[s], end + 50 - T[s])
            T[s] = end + 50
    out.mkdir(parents=True, exist_ok=True)
    for s in range(stages):
        b[s].write(out / f"rank{s}.json.gz")
    return out
