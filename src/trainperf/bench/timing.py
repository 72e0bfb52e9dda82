"""Timing, peak memory and copy bandwidth on the device under test.

CUDA: triton.testing.do_bench (CUDA events, L2 flushed between runs, median). CPU: wall-clock
median of repeated calls (the CPU path only proves the harness works: interpreted Triton
timings mean nothing).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], device: torch.device, warmup_ms: float = 25, rep_ms: float = 100,
              cpu_reps: int = 3) -> float:
    """Return the median time of fn() in milliseconds."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()  # warm-up (compiles, caches)
    times = []
    for _ in range(cpu_reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> float | None:
    """Return the peak memory fn() allocates above what was allocated before it (bytes); None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - base)


def copy_bandwidth_gbps(device: torch.device, n_bytes: int | None = None) -> float:
    """Return the measured device-to-device copy bandwidth in GB/s, counting bytes read + written.

    Copies a buffer of n_bytes (default 1 GiB on CUDA, 64 MiB on CPU) with Tensor.copy_: the
    practical ceiling of a memory-bound kernel on this device.
    """
    n_bytes = n_bytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, cpu_reps=5)
    return 2 * n_bytes / (ms * 1e-3) / 1e9
