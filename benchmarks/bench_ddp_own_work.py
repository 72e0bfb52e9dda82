"""DDP's own per-step work on a real 2-rank job: the step time with each DDP argument that removes part of it,
measured side by side, against what `trainperf diagnose` prices from a profile of the default run.

A CNN of BatchNorm blocks (3 buffers each, broadcast from rank 0 before every forward under broadcast_buffers=True;
2 parameters each, copied out of their buckets after every backward under gradient_as_bucket_view=False) trains
under four DDP configurations in rotating rounds on the same data; each configuration's step is the median over its
rounds of a round's mean step (rank 0's clock: `steps` steps, then a device synchronize). Then the default
configuration is profiled and diagnosed; the result pairs each finding's gain with the measured gain of its fix.

    torchrun --nproc-per-node 2 benchmarks/bench_ddp_own_work.py OUT [--steps 40 --rounds 5 --blocks 24]   # CPU, gloo
    torchrun --nproc-per-node 1 benchmarks/bench_ddp_own_work.py OUT --device cuda   # one GPU, NCCL (gpu_check.sh)

Writes OUT/traces/rank<R>.json (the profile) and OUT/result.json (rank 0), and prints the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainperf.atomic import atomic_write_text

CONFIGS = {"default": {}, "broadcast_buffers=False": {"broadcast_buffers": False},
           "gradient_as_bucket_view=True": {"gradient_as_bucket_view": True},
           "both": {"broadcast_buffers": False, "gradient_as_bucket_view": True}}
# each finding and the configuration that is its fix
FIX_OF = {"ddp_buffer_broadcast": "broadcast_buffers=False", "ddp_gradient_copies": "gradient_as_bucket_view=True"}


def cnn(blocks: int, width: int) -> nn.Module:
    """A stem convolution then `blocks` conv-BatchNorm-ReLU blocks of `width` channels and a linear head."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, batches: list, steps: int, prof=None) -> float:
    """Run `steps` training steps; return their mean seconds on this rank, the device's work done."""
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if prof is not None:
            prof.step()
    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=40, help="steps per configuration per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--image", type=int, default=8)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    torch.manual_seed(0)
    base = cnn(args.blocks, args.width)
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(args.batch, 3, args.image, args.image, generator=gen).to(device),
                torch.randint(0, 10, (args.batch,), generator=gen).to(device)) for _ in range(8)]
    runs = {}
    for name, kwargs in CONFIGS.items():
        net = cnn(args.blocks, args.width)
        net.load_state_dict(base.state_dict())
        model = DDP(net.to(device), device_ids=[device.index] if cuda else None, **kwargs)
        runs[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
        train_steps(*runs[name], batches, 3)  # warm-up: buckets rebuilt, allocations made
    means: dict[str, list[float]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier()
            means[name].append(train_steps(*runs[name], batches, args.steps))
    step_ms = {name: 1e3 * statistics.median(v) for name, v in means.items()}

    traces = args.out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=4, repeat=1)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities, schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(traces / f"rank{rank}.json"))
                                ) as prof:
        train_steps(*runs["default"], batches, 7, prof)
    dist.barrier()
    if rank == 0:
        from trainperf.diagnose.api import diagnose

        found = {f.kind: f for f in diagnose(traces).findings}
        default = step_ms["default"]
        rows = {kind: {"fix": fix, "measured_gain_pct": round(100.0 * (1.0 - step_ms[fix] / default), 2),
                       "diagnosed_gain_pct": found[kind].gain_pct if kind in found else None,
                       "evidence_share_pct": (found[kind].evidence["metrics"]["their_share"]["value"]
                                              if kind in found else None)}
                for kind, fix in FIX_OF.items()}
        result = {"step_ms": {k: round(v, 3) for k, v in step_ms.items()}, "findings": rows,
                  "rounds": args.rounds, "steps": args.steps, "blocks": args.blocks, "width": args.width,
                  "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                  "torch": torch.__version__, "world_size": dist.get_world_size()}
        atomic_write_text(args.out / "result.json", json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
