"""Peak memory of one step: the CUDA caching allocator on GPU, resident set size on CPU.

On CPU the per-step peak is Linux's resident-set high-water mark (VmHWM), reset each step
by writing 5 to /proc/self/clear_refs (Linux >= 4.0) and read back at the step's end.

Reading it cheaply. Right after a training step every system call is slow (cold caches):
on this project's 2-core container, reading /proc/self/status (where VmHWM is printed)
costs ~37 us, ``getrusage`` ~11 us (docs/benchmarks.md). ``getrusage``'s
``ru_maxrss`` is max(F, high-water mark), where F, the peak of the image this process
replaced at exec (with vfork: the parent's peak), is fixed for the process's life. Any
``ru_maxrss`` reading is >= F, so one taken right after the first reset bounds F: a later
reading above that bound *is* the high-water mark (kernel/sys.c ``getrusage``); a reading at
or below it is ambiguous, and the exact value is read from /proc/self/status instead. The
two sources differ only by the kernel's batched per-CPU RSS counters (``statm``'s and
``top``'s precision: at most ``max(32, 2*ncpu)`` pages per CPU, 0-256 KiB seen here on a 460 MiB process).

The /proc files stay open (pread/write on cached fds, no open/close per step), and a forked
child drops them and the bound through an at-fork hook rather than comparing
``os.getpid()`` on every call (a real system call).
"""

from __future__ import annotations

import os
import resource
from typing import Callable

_fds: dict[str, int] = {}
_floor_bound_kb: list[int] = []  # [a ru_maxrss reading taken after a reset: >= F], once known


def _forget_fds() -> None:
    # /proc/self was resolved at open time: a forked child must open its own files; and
    # its getrusage floor is its own.
    _fds.clear()
    _floor_bound_kb.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_fds)


def _fd(path: str, flags: int) -> int | None:
    """Return a cached fd of this process's /proc file, or None where it cannot be opened."""
    fd = _fds.get(path)
    if fd is None:
        try:
            fd = os.open(path, flags)
        except OSError:
            fd = -1
        _fds[path] = fd
    return fd if fd >= 0 else None


def _reset_cpu() -> None:
    fd = _fd("/proc/self/clear_refs", os.O_WRONLY)
    if fd is not None:
        try:
            os.write(fd, b"5")
        except OSError:
            return
        if not _floor_bound_kb:
            _floor_bound_kb.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _peak_cpu() -> int:
    if _floor_bound_kb:  # the peak window was reset: getrusage is exact when above the bound
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if kb > _floor_bound_kb[0]:
            return kb * 1024
    return _peak_cpu_status()


def _peak_cpu_status() -> int:
    """Return VmHWM (bytes) from /proc/self/status; where /proc is absent, the lifetime ``ru_maxrss``."""
    fd = _fd("/proc/self/status", os.O_RDONLY)
    if fd is not None:
        try:
            text = os.pread(fd, 8192, 0)
            i = text.index(b"VmHWM:")
            return int(text[i + 6:text.index(b"kB", i)]) * 1024
        except (OSError, ValueError):
            pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _reset_cuda() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def _peak_cuda() -> int:
    import torch

    return int(torch.cuda.max_memory_allocated())


def peak_resetter(device_type: str) -> Callable[[], None]:
    """Return the function that starts a new peak-memory window on ``device_type``."""
    return _reset_cuda if device_type == "cuda" else _reset_cpu


def peak_reader(device_type: str) -> Callable[[], int]:
    """Return the function that reads the peak memory (bytes) since the last reset on ``device_type``."""
    return _peak_cuda if device_type == "cuda" else _peak_cpu


def reset_peak(device_type: str) -> None:
    """Start a new peak-memory window (CUDA allocator peak, or Linux VmHWM via clear_refs)."""
    peak_resetter(device_type)()


def peak_bytes(device_type: str) -> int:
    """Return the peak memory since the last ``reset_peak`` (bytes).

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors, not the allocator's cache). CPU:
    the process's peak resident set (VmHWM); where /proc is absent, the lifetime peak
    ``ru_maxrss``.
    """
    return peak_reader(device_type)()
