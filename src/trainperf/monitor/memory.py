"""Peak memory of one step: the CUDA caching allocator on GPU, resident set size on CPU."""

from __future__ import annotations

import resource

_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


def reset_peak(device_type: str) -> None:
    """Start a new peak-memory window (CUDA allocator peak, or Linux VmHWM via clear_refs)."""
    if device_type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return
    try:  # Linux >= 4.0: writing 5 resets the resident-set high-water mark of this process
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_bytes(device_type: str) -> int:
    """Return the peak memory since the last ``reset_peak`` (bytes).

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors, not the allocator's cache). CPU:
    the process's peak resident set (VmHWM); where /proc is absent, the lifetime peak
    ``ru_maxrss``.
    """
    if device_type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
