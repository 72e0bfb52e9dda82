"""How the caching allocator reaches the driver, read from where its frees are made: the fix allocator_stall names.

PyTorch's CUDA/HIP caching allocator (c10/cuda/CUDACachingAllocator.cpp) calls cudaMalloc/hipMalloc when no cached
block fits a request and cudaFree/hipFree only when it hands cached blocks back, so where the frees are made says why
the driver is reached inside the step:
- the allocator switched off (PYTORCH_NO_CUDA_MEMORY_CACHING=1 / PYTORCH_NO_HIP_MEMORY_CACHING=1): every tensor's
  death frees its memory, so frees are spread through the step, inside the operators and autograd nodes where
  tensors die and wherever Python drops them (a real H200 loop run so: 56 separate stretches of frees a step, 56 %
  of its frees inside operators);
- the cache emptied each step (torch.cuda.empty_cache() in the loop, or code calling it): every unused cached block
  handed back at once, from Python, outside any operator, and the next step's operators allocate it all again (a real
  H200 loop calling empty_cache() after each step: 36 frees a step in one stretch, none inside an operator);
- memory pressure: a cudaMalloc that fails makes the allocator hand its cached blocks back and retry, so frees are
  made inside an allocating operator, followed by an allocation in the same operator;
- otherwise (new shapes growing the cache, the frees' places mixed): the allocator's general fixes.
A stretch of frees ends where an operator starts on the thread, or where the next free is inside another operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.window import Window
from trainperf.trace.events import CPU_OP, EventTable
from trainperf.trace.nesting import enclosing_span, thread_key

FREE_RE = re.compile(r"^(cuda|hip)Free$|^(cu|hip)MemFree")
MALLOC_RE = re.compile(r"^(cuda|hip)Malloc$|^(cu|hip)MemAlloc")
# separate stretches of frees a step from which the frees read as each tensor's own (the allocator off): a model's
# step frees at least its layers' activations and gradients one by one. 10: between the two real loops (1 and 56 a
# step); stated, not fitted
ALLOCATOR_OFF_MIN_STRETCHES = 10
# the share of frees made outside every operator, with the allocations made inside them, from which the cache reads as
# emptied by the loop's Python code (the empty_cache loop: all of them)
CACHE_EMPTIED_MIN_OUTSIDE = 0.8
# the share of frees followed by an allocation inside their operator from which they read as the allocator's retries
# (stated: most of them; the real loops read 0 %, HTA's alexnet 20 %)
RETRY_MIN_SHARE = 0.8
ALLOCATOR_OFF, CACHE_EMPTIED, MEMORY_PRESSURE = "allocator_off", "cache_emptied", "memory_pressure"


@dataclass(frozen=True, kw_only=True)
class AllocatorPattern:
    """Where one rank's driver frees and allocations are made in the analysed steps, and what that reads as."""

    frees: int                 # cudaFree/hipFree calls
    mallocs: int               # cudaMalloc/hipMalloc calls
    frees_outside: float       # share (0-1) of the frees made outside every operator
    mallocs_inside: float      # share (0-1) of the allocations made inside an operator
    stretches_per_step: float  # separate stretches of frees a step
    frees_before_retry: float = 0.0  # share (0-1) of the frees followed by an allocation inside the same operator

    @property
    def kind(self) -> str:
        """MEMORY_PRESSURE (frees made to retry an allocation), ALLOCATOR_OFF (frees spread as tensors die),
        CACHE_EMPTIED (the cache handed back from Python each step) or "" (none: the allocator's general fixes)."""
        if self.frees and self.frees_before_retry >= RETRY_MIN_SHARE:
            return MEMORY_PRESSURE
        if self.stretches_per_step >= ALLOCATOR_OFF_MIN_STRETCHES:
            return ALLOCATOR_OFF
        if self.frees and self.frees_outside >= CACHE_EMPTIED_MIN_OUTSIDE and self.mallocs_inside >= 0.5:
            return CACHE_EMPTIED
        return ""


def allocator_pattern(t: EventTable, w: Window, n_steps: int) -> AllocatorPattern:
    """The AllocatorPattern of the window's driver frees and allocations over its n_steps analysed steps."""
    frees = np.flatnonzero(w.keep & np.isin(t.name, t.ids_matching(FREE_RE.search)))
    mallocs = np.flatnonzero(w.keep & np.isin(t.name, t.ids_matching(MALLOC_RE.search)))
    ops = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    key = thread_key(t.pid, t.tid)

    def enclosing(rows: np.ndarray) -> np.ndarray:
        if not rows.size or not ops.size:
            return np.full(rows.size, -1)
        return enclosing_span(key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[rows], t.ts_ns[rows])

    op_of_free, op_of_malloc = enclosing(frees), enclosing(mallocs)
    # a free followed by an allocation inside the same (innermost) operator: the allocator's retry
    last_malloc = np.full(ops.size + 1, np.iinfo(np.int64).min)  # per operator (the last slot: none)
    np.maximum.at(last_malloc, op_of_malloc, t.ts_ns[mallocs])
    retry = (op_of_free >= 0) & (last_malloc[op_of_free] > t.ts_ns[frees])
    stretches = 0
    for k in np.unique(key[frees]):
        on = key[frees] == k
        order = np.argsort(t.ts_ns[frees[on]], kind="stable")
        ts, op_of = t.ts_ns[frees[on]][order], op_of_free[on][order]
        starts = np.sort(t.ts_ns[ops[key[ops] == k]])
        # a new stretch: another enclosing operator, or an operator of the thread started since the previous free
        between = np.searchsorted(starts, ts[1:]) - np.searchsorted(starts, ts[:-1], "right")
        stretches += 1 + int(((op_of[1:] != op_of[:-1]) | (between > 0)).sum())
    return AllocatorPattern(frees=int(frees.size), mallocs=int(mallocs.size),
                            frees_outside=float((op_of_free < 0).mean()) if frees.size else 0.0,
                            mallocs_inside=float((op_of_malloc >= 0).mean()) if mallocs.size else 0.0,
                            stretches_per_step=stretches / max(n_steps, 1),
                            frees_before_retry=float(retry.mean()) if frees.size else 0.0)
