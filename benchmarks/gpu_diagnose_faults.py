"""Real GPU traces of faults `trainperf diagnose` should name, each beside its measured cost.

Scenarios, each in a subprocess of its own (CUDA_LAUNCH_BLOCKING must be set before CUDA starts):
  async     the training loop as it is: a 12-block MLP in bf16, AdamW (foreach), GPU-bound;
  blocking  the same loop with CUDA_LAUNCH_BLOCKING=1 (every launch returns after its kernel);
  scalar    the same loop in a one-rank NCCL group with dist.all_reduce(loss) and dist.barrier() every step
            (collectives of one value);
  nocache   the same loop with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree).
Each: the median step time (ms) over TIMED_STEPS steps without the profiler, then a profile of 4 active steps
(torch.profiler.schedule(wait=1, warmup=1, active=4)) exported to OUT/<scenario>.json.gz. OUT/faults.json holds
the step times and each planted fault's true gain, 1 - async / faulty (unsetting CUDA_LAUNCH_BLOCKING,
the caching allocator), which `diagnose OUT/<scenario>.json.gz` should price (docs/benchmarks.md records both).

    python benchmarks/gpu_diagnose_faults.py --out DIR            # on a CUDA machine (~1 min)
    python benchmarks/gpu_diagnose_faults.py --out DIR --device cpu --steps 3   # a CPU smoke test (no kernels)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

WIDTH, BLOCKS, TOKENS = 2048, 12, 4096
SCENARIOS = {"async": {}, "blocking": {"CUDA_LAUNCH_BLOCKING": "1"}, "scalar": {},
             "nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}}
# the fault each scenario plants, priced as 1 - async / scenario (the scalar scenario's cost is not a fix)
FIXED_BY = {"blocking": "unset CUDA_LAUNCH_BLOCKING", "nocache": "the caching allocator"}


def _model(device: str):
    """The MLP the loop trains (bf16 on CUDA, fp32 on CPU) and its AdamW."""
    import torch
    from torch import nn

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    blocks = [m for _ in range(BLOCKS) for m in (nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH))]
    model = nn.Sequential(*blocks).to(device=device, dtype=dtype)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True), dtype


def _scenario(name: str, out: Path, device: str, steps: int) -> None:
    """Run one scenario in this process: time `steps` steps, then profile 6 and export the trace."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    scalar = name == "scalar"
    if scalar:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method="tcp://127.0.0.1:29517",
                                rank=0, world_size=1)
    model, opt, dtype = _model(device)
    x = torch.randn(TOKENS, WIDTH, device=device, dtype=dtype)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        if scalar:
            reduced = loss.detach().clone()
            dist.all_reduce(reduced)
            dist.barrier(device_ids=[0]) if device == "cuda" else dist.barrier()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(5):  # warm-up: allocator pool, cuBLAS handles, NCCL communicator
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    raw = out / f"{name}.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=4),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(6):
            step()
            prof.step()
    sync()
    with open(raw, "rb") as f, gzip.open(out / f"{name}.json.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    (out / f"{name}.steps.json").write_text(json.dumps({"step_ms": times}))
    if scalar:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--scenario-timeout-s", type=float, default=90.0)
    ap.add_argument("--only", default="", help="run this scenario in this process (used by the parent)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        _scenario(args.only, out, args.device, args.steps)
        return
    figures = {}
    for name, env in SCENARIOS.items():
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, __file__, "--out", str(out), "--device", args.device, "--steps",
                                 str(args.steps), "--only", name], env={**os.environ, **env},
                                timeout=args.scenario_timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        steps_file = out / f"{name}.steps.json"
        if rc or not steps_file.exists():
            figures[name] = {"error": f"exit {rc}"}
            continue
        ms = json.loads(steps_file.read_text())["step_ms"]
        steps_file.unlink()
        figures[name] = {"median_step_ms": statistics.median(ms), "steps": len(ms),
                         "seconds": round(time.perf_counter() - t0, 1)}
        print(name, figures[name], flush=True)
    healthy = figures.get("async", {}).get("median_step_ms")
    for name, fix in FIXED_BY.items():
        faulty = figures.get(name, {}).get("median_step_ms")
        if healthy and faulty:
            figures[name]["fixed_by"] = fix
            figures[name]["true_gain_pct"] = 100.0 * (1.0 - healthy / faulty)
    (out / "faults.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
