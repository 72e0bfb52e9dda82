"""Run metadata: where and with what software a run ran (one dict, JSON-able)."""

from __future__ import annotations

import os
import platform
import sys
import time

from trainperf.store.record import collect_environment


def process_start_time() -> float:
    """Return this process's start (unix seconds) from /proc, else the current time.

    Start-up badput then includes interpreter start and imports, which a timer started in
    the training script would miss.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of proc(5); two fields precede this slice
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def run_metadata(world_size: int = 1, layout: str = "", device: str = "cpu") -> dict:
    """Return torch/CUDA/NCCL/driver versions, GPU model, host, git sha, world size, layout, device."""
    env = collect_environment()
    env.update({
        "world_size": int(world_size), "layout": layout, "device": device,
        "python": platform.python_version(), "platform": platform.platform(),
        "argv": " ".join(sys.argv),
    })
    return env


def cpu_contention(load_1min: float, n_cpus: int, threads: int) -> str | None:
    """Return a note when more threads were runnable than the machine has CPUs, or None.

    ``load_1min`` is the 1-minute load average as a run ends (runnable threads, this run's own
    included), ``n_cpus`` the machine's CPUs, ``threads`` torch's intra-op threads per process.
    With at least one runnable thread more than there are CPUs, the threads of every torch op wait
    for each other at its end: on a 2-core machine at load 13 the tiny model's median step took
    1.2-5.4 s with 2 threads and 0.11-0.40 s with OMP_NUM_THREADS=1 (docs/benchmarks.md, issue 14).
    """
    if n_cpus < 1 or load_1min - n_cpus < 1.0:
        return None
    return (f"the CPUs were oversubscribed: load average {load_1min:.1f} on {n_cpus} CPUs over the last minute "
            f"(other processes compete with this run's {threads} thread(s) per process): step times, MFU and the "
            f"CPU peak read slower and noisier than on a quiet machine; rerun when it is idle, or with "
            f"OMP_NUM_THREADS=1 to keep torch's threads from waiting on each other")


def cpu_load() -> dict | None:
    """Return {'load_1min', 'cpus', 'threads'} of this machine and process now, or None where the OS has no
    load average."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    import torch

    return {"load_1min": load, "cpus": os.cpu_count() or 1, "threads": torch.get_num_threads()}
