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
