"""`comm_contention` on simulated data-parallel steps with kernel-time noise: how often it is found, at which slowdown,
and its gain against the twin's truth; at no slowdown, how often it is found for nothing.

Each GPU-bound step (H100, one rank) runs LAYERS layers forward, then backward, 4 GEMM works a layer (the same
operators and shapes in every layer; the backward's other shapes than the forward's), back to back on one stream.
Each layer's gradient bucket is all-reduced (stream 20) as its backward ends, beside two of the next layer's backward
GEMMs (the first two after an even layer, the last two after an odd one, so each backward work runs both beside it
and alone); the last bucket's runs after the computation. With --layout fsdp, each layer's forward instead runs its
first two works beside the next layer's all-gather and its backward its first two beside the layer above's
reduce-scatter, every layer but the last: those works run alone only there. A kernel beside a collective takes
`slowdown` x its time; every kernel's time is drawn around its base with lognormal noise (sigma). The truth is the
twin: the same draws with no slowdown (the collectives as long), the step's device work that much shorter, as a share
of the step.

    .venv/bin/python benchmarks/contention_sim.py --seeds 20 [--layout fsdp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "diagnose"))
from gpu_bound import recorded_shapes, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

BF16 = "c10::BFloat16"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
LAYERS, STEPS, STEP_US = 8, 5, 60_000.0
# (dims, base µs) of a layer's 4 forward works, then its 4 backward ones
FORWARD = [([[4096, 4096], [4096, 4096]], 228), ([[4096, 4096], [4096, 16384]], 900),
           ([[4096, 16384], [16384, 4096]], 900), ([[4096, 4096], [4096, 12288]], 680)]
BACKWARD = [([[4096, 4096], [4096, 4096], []], 228), ([[4096, 16384], [16384, 4096], []], 900),
            ([[4096, 4096], [4096, 16384], []], 900), ([[4096, 12288], [12288, 4096], []], 680)]


def _step_kernels(rng: np.random.Generator, sigma: float, layout: str) -> list[tuple]:
    """One step's GEMMs in order: (dims, drawn µs, beside a collective, whether a collective starts with it, to run
    beside it and the next)."""
    out = []
    for layer in range(LAYERS):  # fsdp: the next layer's all-gather beside the first two works of each but the last
        for k, (dims, base) in enumerate(FORWARD):
            beside = layout == "fsdp" and layer < LAYERS - 1 and k < 2
            out.append((dims, base * rng.lognormal(0.0, sigma), beside, beside and k == 0))
    for layer in range(LAYERS - 1, -1, -1):
        # ddp: the bucket of the layer above beside two of this layer's works (the last two after an even layer, the
        # first two after an odd one); fsdp: the layer above's reduce-scatter beside the first two
        covered = () if layer == LAYERS - 1 else (0, 1) if layer % 2 or layout == "fsdp" else (2, 3)
        for k, (dims, base) in enumerate(BACKWARD):
            out.append((dims, base * rng.lognormal(0.0, sigma), k in covered, bool(covered) and k == covered[0]))
    return out


def _trace(folder: Path, seed: int, sigma: float, slowdown: float, layout: str) -> tuple[Path, float]:
    """Write the job's trace; return its path and the step's device end beyond the twin's (µs, the mean per step)."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    extra = []
    for s in range(STEPS):
        T = s * STEP_US
        b.step(s, T, STEP_US)
        kernels = _step_kernels(rng, sigma, layout)
        at, twin_at, comm_end = T + 10.0, T + 10.0, []
        for i, (dims, us, beside, _) in enumerate(kernels):
            b.cpu("aten::mm", T + 10.0 * i, 8.0, **recorded_shapes(dims, BF16))
            took = round(us * (slowdown if beside else 1.0))
            b.launch(GEMM, T + 10.0 * i + 2.0, at, took)
            at += took
            twin_at += round(us)
        # the buckets: each beside the two kernels it covers (their slowed times), the last after the computation
        at = T + 10.0
        for i, (dims, us, beside, starts) in enumerate(kernels):
            took = round(us * (slowdown if beside else 1.0))
            if starts:
                length = took + round(kernels[i + 1][1] * slowdown)
                b.cpu("c10d::allreduce_", at - 8.0, 6.0, tid=2)
                b.launch(ALL_REDUCE, at - 5.0, at, length, stream=20, tid=2)
                comm_end.append(at + length)
            at += took
        b.cpu("c10d::allreduce_", at - 8.0, 6.0, tid=2)
        b.launch(ALL_REDUCE, at - 5.0, at, 300.0, stream=20, tid=2)
        end = max(at + 300.0, *comm_end)
        b.cpu("cudaDeviceSynchronize", T + 10.0 * len(kernels) + 20.0, end + 5.0 - (T + 10.0 * len(kernels) + 20.0),
              cat="cuda_runtime")
        b.cpu("python_work", end + 6.0, T + STEP_US - end - 7.0)
        extra.append(at - twin_at)
    return write_trace(b, folder), statistics.mean(extra[:-1])


def main() -> None:
    """Print, per (noise, slowdown), how often comm_contention is found and its gain against the twin's."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp",
                    help="ddp: gradient buckets beside the backward; fsdp: all-gathers beside the forward and "
                         "reduce-scatters beside the backward, the same works beside them in every layer but the last")
    args = ap.parse_args()
    table = Table("kernel noise (sigma)", "slowdown", "found", "slowdown read (median)", "gain (median) %",
                  "truth (median) %", "|gain - truth| median / max pp")
    configs = [(sigma, slow) for sigma in (0.03, 0.10) for slow in (1.0, 1.05, 1.10, 1.25)]
    for sigma, slow in track(configs, description="simulated jobs"):
        found, read, errs, gains, truths = 0, [], [], [], []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                path, extra_us = _trace(Path(tmp), seed, sigma, slow, args.layout)
                d = diagnose(path)
            f = next((x for x in d.findings if x.kind == "comm_contention"), None)
            truth = 100.0 * extra_us / STEP_US
            if f is not None:
                found += 1
                read.append(f.evidence["metrics"]["slowdown_beside_communication"]["value"])
                gains.append(f.gain_alone_pct)
                truths.append(truth)
                errs.append(abs(f.gain_alone_pct - truth))
        med = (lambda x: f"{statistics.median(x):.3g}" if x else "-")
        table.add_row(f"{sigma:.2f}", f"{slow:.2f}", f"{found} of {args.seeds}", med(read), med(gains), med(truths),
                      f"{med(errs)} / {max(errs):.2g}" if errs else "-")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
