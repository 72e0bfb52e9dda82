"""`trainperf calibrate`: measure what this machine really does and save a planner profile.

Measures, on the chosen device (CPU with small shapes, CUDA with training-sized ones):

* GEMM TFLOP/s over a set of shapes with ``torch.matmul`` (bf16 on CUDA, fp32 on CPU),
  timed with CUDA events / perf_counter after warm-up; the best rate and the half-
  saturation dimension of ``rate = best * sat(M) sat(N) sat(K)`` are fitted to them
  (least squares on log rates, the same law the planner uses);
* device copy bandwidth (``dst.copy_(src)``, bytes read + written per second);
* collective bus bandwidth of all-reduce (NCCL/gloo) when torch.distributed is
  initialised with more than one rank (NCCL's busbw convention: 2 (n-1)/n x bytes / time).

The profile is a JSON file: ``{"device", "created", "efficiency": {...}, "gemm": [...]}``;
``trainperf plan --calibration FILE`` uses ``efficiency`` in place of the catalog defaults.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

from trainperf.atomic import atomic_write_text
from trainperf.errors import TrainperfError

CPU_SHAPES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (256, 1024, 256),
              (1024, 256, 512), (128, 512, 1024)]
CUDA_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
               (4096, 1024, 4096), (8192, 2048, 8192), (4096, 14336, 4096), (4096, 4096, 14336),
               (16384, 1024, 8192), (2048, 8192, 1024)]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_s(fn, device: str, min_time_s: float, repeats: int | None = None) -> float:
    """Return the median seconds of ``fn`` over repeats totalling at least ``min_time_s``.

    ``repeats`` fixes the number of timed calls instead (collectives: every rank must make the
    same number of calls, so the count cannot depend on each rank's own clock).
    """
    fn()
    _sync(device)
    times = []
    t_total = 0.0
    while (len(times) < repeats) if repeats else (t_total < min_time_s or len(times) < 3):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        t_total += dt
        if len(times) >= 200:
            break
    return float(np.median(times))


def measure_gemms(device: str, shapes, dtype, min_time_s: float) -> list[dict]:
    """Return [{m, n, k, seconds, tflops}] for torch.matmul of (m x k) @ (k x n) on ``device``."""
    import torch

    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        s = _time_s(lambda: torch.matmul(a, b), device, min_time_s)
        out.append({"m": m, "n": n, "k": k, "seconds": s, "tflops": 2.0 * m * n * k / s / 1e12})
    return out


def fit_gemm_law(rows: list[dict]) -> tuple[float, float]:
    """Return (best TFLOP/s, half-saturation dimension) fitting rate = best * prod(x / (x + d0)).

    Grid over d0 (log-spaced 1..4096); for each, the best-fitting log(best) is the mean
    residual, and the d0 with the least squared log error wins. The best rate may not exceed
    1.3x the fastest measured shape: the law must not extrapolate far beyond what was seen
    (small CPU shapes on a loaded machine would otherwise fit any d0).
    """
    dims = np.array([[r["m"], r["n"], r["k"]] for r in rows], dtype=float)
    rate = np.log(np.array([r["tflops"] for r in rows]))
    best = (np.inf, float(np.exp(rate.max())), 1.0)
    for d0 in np.geomspace(1.0, 4096.0, 200):
        sat = np.log(dims / (dims + d0)).sum(axis=1)
        top = float(np.mean(rate - sat))
        if top > rate.max() + np.log(1.3):
            continue
        err = float(np.sum((rate - sat - top) ** 2))
        if err < best[0]:
            best = (err, float(np.exp(top)), float(d0))
    return best[1], best[2]


def measure_copy_tbps(device: str, n_bytes: int, min_time_s: float) -> float:
    """Return device copy bandwidth, bytes read + written per second, in TB/s."""
    import torch

    src = torch.empty(n_bytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    s = _time_s(lambda: dst.copy_(src), device, min_time_s)
    return 2.0 * src.numel() * 4 / s / 1e12


def measure_allreduce_busbw_gbps(device: str, n_bytes: int, min_time_s: float) -> float | None:
    """Return all-reduce bus bandwidth in GB/s, or None when torch.distributed has < 2 ranks."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    n = dist.get_world_size()
    x = torch.ones(n_bytes // 2, device=device, dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32)

    def op():
        dist.all_reduce(x)

    # One timed call, its slowest time agreed by all ranks, fixes the repeat count for all of
    # them: a per-rank "until min_time_s" loop let one rank make a call more than the other,
    # which then hung or aborted at exit.
    op()
    _sync(device)
    t0 = time.perf_counter()
    op()
    _sync(device)
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    repeats = int(min(200, max(3, math.ceil(min_time_s / max(float(one.item()), 1e-9)))))
    s = _time_s(op, device, min_time_s, repeats=repeats)
    return 2.0 * (n - 1) / n * x.numel() * x.element_size() / s / 1e9


def init_distributed_from_env(device: str) -> str:
    """Join the torchrun job when launched by torchrun (WORLD_SIZE > 1); return this rank's device.

    gloo on CPU, NCCL on CUDA (each rank on cuda:LOCAL_RANK). A no-op outside torchrun.
    """
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or dist.is_initialized():
        return device
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return f"cuda:{local}"
    dist.init_process_group("gloo")
    return device


def leave_distributed() -> None:
    """Destroy the process group that init_distributed_from_env joined (a no-op outside torchrun)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_rank_zero() -> bool:
    """True outside torch.distributed or on rank 0 (the rank that writes the profile)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def check_device(device: str) -> None:
    """Raise a one-line TrainperfError unless ``device`` is 'cpu', or 'cuda'/'cuda:N' with that GPU present."""
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and m is None:
        raise TrainperfError(f"--device must be cpu, cuda or cuda:N, not {device!r}")
    if m is None:
        return
    import torch

    if not torch.cuda.is_available():
        raise TrainperfError(f"--device {device}: no CUDA device is available here (use --device cpu)")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise TrainperfError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def calibrate(device: str = "cpu", quick: bool = False) -> dict:
    """Return a calibration profile (JSON-able dict) measured on ``device`` ('cpu' or 'cuda[:i]').

    Under torchrun (several ranks) it also measures all-reduce bus bandwidth across them.
    """
    import torch

    check_device(device)
    device = init_distributed_from_env(device)
    if device.startswith("cuda"):
        shapes, dtype, copy_bytes = CUDA_SHAPES, torch.bfloat16, 1 << 30
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        shapes, dtype, copy_bytes = CPU_SHAPES, torch.float32, 64 << 20
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    min_t = 0.02 if quick else 0.2
    if quick:
        shapes = shapes[:5]
        copy_bytes = min(copy_bytes, 16 << 20)
    gemms = measure_gemms(device, shapes, dtype, min_t)
    best_tflops, d0 = fit_gemm_law(gemms)
    copy_tbps = measure_copy_tbps(device, copy_bytes, min_t)
    busbw = measure_allreduce_busbw_gbps(device, 64 << 20 if not quick else 4 << 20, min_t)
    eff = {"measured_gemm_tflops": best_tflops, "gemm_dim_half": d0, "measured_hbm_tbps": copy_tbps,
           "source": f"trainperf calibrate on {name}"}
    if busbw:
        eff["measured_bus_gbps"] = busbw
    return {"device": name, "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "efficiency": eff,
            "gemm": gemms, "copy_tbps": copy_tbps, "allreduce_busbw_gbps": busbw}


def save_profile(profile: dict, path: str | Path) -> Path:
    """Write the profile as JSON atomically (temp file then rename); return the path."""
    p = Path(path)
    atomic_write_text(p, json.dumps(profile, indent=1) + "\n")
    return p
