"""What made the host's blocking syncs: the operator or call each one blocked in, so that host_sync's fix names it.

A host sync's fix depends on why the host needed the device's result:
- an operator whose output size depends on the data (nonzero, boolean-mask indexing, masked_select, unique,
  repeat_interleave without output_size, bincount without minlength) waits to learn the size before it can allocate
  the output: the fix keeps shapes static;
- a value read back (.item(), .tolist(), .cpu(), `if tensor:`) feeds the host's own logic; where the next collective
  the rank launches after it is an all-to-all, the values are its split sizes (an expert-parallel layer's token
  counts per expert in a dropless MoE, sharded embeddings' feature lengths): the fix is a fixed capacity, a dispatch
  that does not read them, or the exchange overlapped with other work;
- a synchronize call made in no operator (torch.cuda.synchronize(), stream or event synchronize: timing code,
  ordering between streams) waits for nothing the host uses: the fix drops it or waits on the device. One inside an
  operator reads for it (aten::copy_ of .cpu() or .to("cpu") synchronizes its stream). One inside FSDP1's rate
  limiter (its "FullyShardedDataParallel.rate_limiter" span: limit_all_gathers=True) waits for an earlier layer's
  unsharded parameters to be freed, capping memory: its fix is FSDP's, not the user's loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.host import MEMCPY_RUNTIME_RE
from trainperf.diagnose.launch import launched_rows
from trainperf.diagnose.replay import BLOCK_SYNC, Graph
from trainperf.diagnose.window import Window
from trainperf.trace.events import CPU_OP, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import enclosing_span, thread_key

# the span FSDP1 wraps its rate limiter's event.synchronize() in (torch.distributed.fsdp._runtime_utils._unshard)
RATE_LIMITER_RE = re.compile(r"FullyShardedDataParallel\.rate_limiter")
# operators whose output size depends on the values of their input: the device must finish before the host knows it
# (ATen's nonzero, masked_select, unique, repeat_interleave(repeats) and bincount each read a size back on CUDA/ROCm)
SHAPE_OP_RE = re.compile(r"^aten::(nonzero|masked_select|unique|_unique2?|unique_dim|unique_consecutive"
                         r"|repeat_interleave|bincount|argwhere)$")


@dataclass(frozen=True, kw_only=True)
class SyncCauses:
    """The host's blocking time in syncs (BLOCK_SYNC calls of the replay graph) by what made them (µs)."""

    total_us: float = 0.0
    shape_us: float = 0.0        # inside operators whose output size depends on the data (SHAPE_OP_RE)
    read_us: float = 0.0         # inside any other operator (a read for it), or copies back to the host
    split_read_us: float = 0.0   # of read_us: reads whose next collective launched is an all-to-all
    bare_us: float = 0.0         # synchronize calls inside no operator, on a thread whose operators are recorded
    rate_limiter_us: float = 0.0  # of bare_us: inside FSDP1's rate limiter (RATE_LIMITER_RE)
    shape_ops: list[str] = field(default_factory=list)  # the shape operators, most blocking first
    bare_calls: list[str] = field(default_factory=list)  # the bare synchronize calls, most blocking first

    def share(self, us: float) -> float:
        """us as a share of the blocking time (0-1; 0 without blocking)."""
        return us / self.total_us if self.total_us > 0 else 0.0


def _by_time(names: list[str], us: np.ndarray) -> list[str]:
    """The distinct names, the one holding most time first."""
    held: dict[str, float] = {}
    for n, u in zip(names, us.tolist()):
        held[n] = held.get(n, 0.0) + u
    return sorted(held, key=lambda n: -held[n])


def _innermost(t: EventTable, key: np.ndarray, rows: np.ndarray, among: np.ndarray, kinds=(CPU_OP,)) -> np.ndarray:
    """Per host row, the innermost span of `kinds` among `among` (a row mask) on its thread enclosing its start, as
    a trace row, else -1."""
    ops = np.flatnonzero(np.isin(t.kind, kinds) & among)
    if not ops.size:
        return np.full(rows.size, -1)
    hit = enclosing_span(key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[rows], t.ts_ns[rows])
    return np.where(hit >= 0, ops[np.clip(hit, 0, None)], -1)


def sync_causes(t: EventTable, w: Window, g: Graph, all_to_all_rows: np.ndarray, comm_rows: np.ndarray
                ) -> SyncCauses:
    """The blocking syncs of graph g split by what made them (module docstring). all_to_all_rows / comm_rows: the
    window's all-to-all and all communication kernels, as trace rows (their launches tell which collective came
    next after each read)."""
    nodes = np.flatnonzero(g.block_class == BLOCK_SYNC)
    if not nodes.size:
        return SyncCauses()
    rows = g.rows[nodes]
    blocking = g.blocking_us[nodes]
    key = thread_key(t.pid, t.tid)
    shape_op = _innermost(t, key, rows, np.isin(t.name, t.ids_matching(SHAPE_OP_RE.search)))
    any_op = _innermost(t, key, rows, np.ones(len(t), bool))
    call = [t.names[int(t.name[r])] for r in rows.tolist()]
    shape = shape_op >= 0
    copy = np.array([bool(MEMCPY_RUNTIME_RE.search(c)) for c in call], dtype=bool)
    # a call inside any operator reads for it (aten::item, aten::copy_ of .cpu() / .to("cpu"), a GradScaler's check);
    # one in no operator is bare only where the thread's operators are recorded: an Nsight Systems export without
    # PyTorch's NVTX ranges, or a rocprofv3 trace, holds none, and every read there is in no operator
    recorded = np.isin(key[rows], key[t.kind == CPU_OP])
    read = ~shape & ((any_op >= 0) | copy)
    bare = ~shape & ~read & recorded
    limiter = bare & (_innermost(t, key, rows, np.isin(t.name, t.ids_matching(RATE_LIMITER_RE.search)),
                                 (CPU_OP, USER_ANNOTATION)) >= 0)
    # the next collective each read is followed by: the first communication kernel launched after the read returned
    split = np.zeros(rows.size, bool)
    kernels, link = launched_rows(t, w)
    comm = np.isin(kernels, comm_rows)
    if comm.any() and read.any():
        launch_ns = t.ts_ns[link[comm]]
        order = np.argsort(launch_ns, kind="stable")
        launch_ns, is_a2a = launch_ns[order], np.isin(kernels[comm][order], all_to_all_rows)
        ends = t.ts_ns[rows] + t.dur_ns[rows]
        nxt = np.searchsorted(launch_ns, ends, side="left")
        split = read & (nxt < launch_ns.size) & is_a2a[np.clip(nxt, 0, launch_ns.size - 1)]
    return SyncCauses(total_us=float(blocking.sum()), shape_us=float(blocking[shape].sum()),
                      read_us=float(blocking[read].sum()), split_read_us=float(blocking[split].sum()),
                      bare_us=float(blocking[bare].sum()), rate_limiter_us=float(blocking[limiter].sum()),
                      shape_ops=_by_time([t.names[int(t.name[r])] for r in shape_op[shape].tolist()], blocking[shape]),
                      bare_calls=_by_time([c for c, b in zip(call, bare) if b], blocking[bare]))
