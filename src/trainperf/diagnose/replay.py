"""Dependency graph of a rank's window, replay with one change (what-if), and the critical path.

Nodes are host runtime calls (kernel launches, copies, syncs) per thread and device events per
stream, the start of the window's first ProfilerStep (the stepping thread's, window.find_step_markers),
and the end of the window's last step, after that thread's last call (host work before a step's first launch or
after its last belongs to the step). Edges, all read from the trace:
- host order: a call starts after the previous call on its thread ended plus the CPU work seen
  between them (that gap shrinks when a change removes data-loader time inside it);
- host thread wait: the part of that gap in which the thread ran nothing (no op, no named span of its
  own) is a wait for another thread (the autograd thread waits for the main thread's backward() call,
  the main thread for the backward to end): the call starts no earlier than the latest call on another
  thread that ended before it, plus the observed delay; a change that moves that thread moves this one;
- host sync: a synchronize call ends when the device work it waited for ends; a copy call that
  returned only after its copy ended (a synchronous or pageable copy) ends when that copy ends;
- launch: a device event starts no earlier than its launch call + the typical launch latency;
- stream order: after the previous event on its stream;
- cross-stream wait: a device event that started late, within EVENT_WAIT_US after an event on another stream
  ended, waits for that event (event record / wait);
- unexplained delay before a start is kept as a fixed lag, so replaying with no change
  reproduces the trace; a communication kernel's cross-rank wait (crossrank.py) is part of its
  duration and can be removed.
Nodes are replayed in observed time order, each moved after its predecessors where the trace writes it before them
(processing_order: a trace can write a kernel before its launch call), so that every edge points forward in the
order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.host import (ALLOCATOR_RUNTIME_RE, ALLOCATOR_SPAN_RE, MEMCPY_RUNTIME_RE, STALL_SPAN_RES,
                                     SYNC_OP_RE, SYNC_RUNTIME_RE, call_sites, span_rows)
from trainperf.diagnose.host_link import pinned_copy_us
from trainperf.diagnose.launch import graph_launched, launch_call_cutoff_us, small_kernel_mask
from trainperf.diagnose.window import (Window, covered_each, covered_length, iteration_hint_rows,
                                       launched_before_trace, merge_intervals)
from trainperf.trace.annotate import STEP_RE, correlated_host_row
from trainperf.trace.categories import copy_direction, from_pageable_to_device
from trainperf.trace.nesting import enclosing_span, thread_key
from trainperf.trace.events import (CAT_MEMCPY, CAT_MEMSET, CATEGORY_NAMES, COMMUNICATION, CPU_OP, KERNEL, MEMCPY, MEMSET, PYTHON, RUNTIME,
                                    USER_ANNOTATION, EventTable)

TOL_US = 5.0
# A device op that neither its launch nor its stream released, and that started within this long after an op of
# another stream (same device) ended, waited for it (an event wait: a collective for the gradients it reduces,
# compute for a collective's result). Measured with this graph's own filter (a start more than TOL_US after launch
# + latency and after its stream's previous op) on the HTA GPU traces (benchmarks/measure_event_waits.py, 1,475
# such ops): time since the latest other-stream end, 1,066 at 0-5 µs (213 per µs), 344 at 5-10 (69 per µs), 9 at
# 10-15 (1.8), 5 at 15-20 (1.0), 12 at 20-100 (0.14-0.2 per µs: the chance of an unrelated end). 20 µs is where
# the density falls to the chance rate (the corpus surgery found the same on its own filter). At TOL_US the 5-20
# µs waits, a quarter of all, were fixed lags: a straggler's last collective kept its 295-ms wait for its own
# late gradients after they were sped up (straggler-high-trace_filter-slow0: 0.8 % for a true 22.7 %).
EVENT_WAIT_US = 20.0
KERNEL_FLOOR_PERCENTILE = 1.0  # a kernel's fixed device cost: this percentile of the window's kernel durations
COPY_RETURN_US = 20.0  # a blocking copy call returns within this long after its copy ends (seen: 5-10 µs) ...
# ... or within this share of its own duration: after a long wait the driver's return (and, from pageable memory,
# the staging copy to the user's buffer) takes longer; HTA's negative_queue: 4 identical 139-147 ms blocking
# Device -> Pageable reads of 2-µs copies, two of them returning 23 µs after their copy (audit P7)
COPY_RETURN_SHARE = 0.01


def returned_with(call_start, call_end, work_start, work_end):
    """Whether a host call returned when the device work it launched ended (bool, elementwise): within COPY_RETURN_US
    (or COPY_RETURN_SHARE of the call) after it; or before it, when the work started inside the call, by no more
    than COPY_RETURN_US and COPY_RETURN_SHARE of the work: Kineto places the device's timestamps on the host clock
    only to ~10 µs (blocking 16-ms pageable copies on an H200 "returned" 10-11 µs before their copies ended, every
    one of them), while an asynchronous launch's short kernel often ends just after its call returns."""
    lag = np.asarray(call_end) - np.asarray(work_end)
    call = np.asarray(call_end) - np.asarray(call_start)
    work = np.asarray(work_end) - np.asarray(work_start)
    early_ok = (lag >= -np.minimum(COPY_RETURN_US, COPY_RETURN_SHARE * work)) & \
        (np.asarray(call_start) <= np.asarray(work_start))
    return ((lag >= 0) | early_ok) & (lag <= np.maximum(COPY_RETURN_US, COPY_RETURN_SHARE * call))


# synchronize calls that wait for one stream (the stream itself, or an event recorded on it); the others
# (cudaDeviceSynchronize, cuCtxSynchronize, a synchronous cudaMemcpy on the legacy default stream) wait for all
ONE_STREAM_SYNC_RE = re.compile(r"(Stream|Event)Synchronize")

# how a host call blocks (Graph.block_class): a sync, a pageable copy, a sync that waited for a collective, a call
# that waited for a free slot in the device's full launch queue (queue_waits)
NOT_BLOCKING, BLOCK_SYNC, BLOCK_PAGEABLE, BLOCK_COMM, BLOCK_QUEUE = 0, 1, 2, 3, 4

# named host stalls: spans whose time in a host gap is a wait of its own kind, not the thread's CPU work
NAMED_STALLS = (*STALL_SPAN_RES, ALLOCATOR_SPAN_RE)

CHANGE_KINDS = ("none", "remove_data_wait", "remove_checkpoint_wait", "remove_compile_wait", "remove_gc_wait",
                "remove_syncs", "unblock_pageable_copies", "remove_allocator", "overlap_comm", "remove_straggler_wait",
                "speedup", "host_speedup", "graph_small_kernels", "graph_launches", "compute_speedup", "speedup_rows",
                "drop_rows", "remove_wasted_rows", "remove_host_work", "fuse_optimizer", "unprofiled_host",
                "shrink_bubble", "remove_kernels", "fuse_kernels", "remove_spans", "remove_lags", "usual_launch_calls")


@dataclass(frozen=True)
class Change:
    """One what-if change. kind: none | remove_data_wait | remove_checkpoint_wait | remove_compile_wait
    (torch.compile compiles nothing inside the steps) | remove_gc_wait (Python's garbage collector pauses no thread
    inside the steps) | remove_syncs (sync calls return at once) |
    unblock_pageable_copies (host-to-device copies stop blocking the host and run on their stream at `factor` GB/s, the
    rate of a copy from pinned memory, where the trace gives their size and they took longer: pinned memory,
    non_blocking; the work after them still queues behind them on their stream, host_link.py) |
    remove_allocator (allocator calls and spans cost nothing: caching allocator) |
    overlap_comm (computation and host syncs stop waiting for collectives: fully overlapped; a collective's
    measured wait for a late rank stays, as the late rank's data arrives no sooner; with `rows`, only the collectives
    of those trace rows) | remove_straggler_wait |
    speedup (category sped up `factor` times) | compute_speedup (every computation kernel `factor`
    times faster: a straggler as fast as the other ranks) | host_speedup (CPU work between runtime calls `factor`
    times faster) | graph_small_kernels (launching a small kernel, launch.small_kernel_mask, costs the
    host neither the call nor the usual dispatch time before it, and fused into its neighbours the kernel
    stops paying a kernel's fixed device cost, Graph.kernel_floor_us) | graph_launches (the same
    for every kernel launch: the step captured as a CUDA graph) | speedup_rows (the device events of the trace rows
    `rows` sped up `factor` times: a set of kernels replaced by a fused one) | drop_rows (the device events of the
    trace rows `rows` not run: avoidable work, at a cost the trace does not show) | remove_wasted_rows (the same for
    work whose result nothing uses: a measured waste) | remove_host_work (the work that launches nothing in the gaps
    before the host calls of trace rows `rows` goes: host_work_us) | fuse_optimizer (graph_small_kernels for the
    launches of trace rows `rows` only, and the CPU work before each goes too: an optimizer's per-tensor ops done by a
    fused or foreach one) | unprofiled_host (the host's own work, its CPU time and its calls' own time, not waits nor
    the allocator's driver calls, `factor` times faster: the profiler's overhead taken off, diagnose/unprofiled.py) |
    shrink_bubble (a pipeline stage's send/recv kernels, trace rows `rows`, `factor` times shorter: its waits for
    its neighbours, the schedule's bubble, shrunk by more micro-batches or interleaving; rules.pipeline_bubble) |
    remove_kernels (the kernels of trace rows `rows` not run and their launch calls gone from the host, the calls'
    own time, Graph.launch_call_us: kernels a library launches inside an operator that a setting makes unneeded,
    layout.layout_transposes) | fuse_kernels (the same, for the kernels a fusion is assumed to fold into the ones
    kept: fusion.fusion_chains, an estimate) | remove_spans (host spans not run, `spans`: their CPU time gone from the
    gaps of their thread, the calls made inside them not made, and the device work those calls launched not run, but
    for a collective's measured wait for a late rank: work a setting makes unneeded, ddp.py, or a compiler's own
    wrappers that one graph would not run, graph_breaks.py) | remove_lags (the device events of trace rows `rows` start
    as soon as their launch and their stream allow: the waits the trace shows no cause for, Graph.lag, gone;
    rules.idle_with_work_queued) | usual_launch_calls (the launch calls of trace rows `rows` take at most `factor` µs
    of their own, the top of a launch call's usual range: a host whose every launch is slow made as fast as a usual
    one, host_bound.launch_bound). Several changes replay together (`replay(g, [a, b])`)."""

    kind: str = "none"
    category: int = -1
    factor: float = 1.0
    site: int = -1  # remove_syncs: only the syncs of this call site (Graph.site_names index); -1 all
    rows: tuple = ()  # speedup_rows, drop_rows, remove_wasted_rows, shrink_bubble, *_kernels: the trace rows
    #                   of the device events; remove_host_work: the trace rows of the host calls whose gaps lose
    #                   their work; fuse_optimizer: the trace rows of the per-tensor launch calls; overlap_comm:
    #                   the collectives overlapped (empty: all); remove_lags: the device events that start at once
    spans: tuple = ()  # remove_spans: (thread id, start µs, end µs) of each host span removed, on the window's clock

    def __post_init__(self):
        if self.kind not in CHANGE_KINDS:
            raise ValueError(f"unknown what-if change {self.kind!r}")

    def label(self) -> str:
        if self.kind == "speedup":
            return f"{CATEGORY_NAMES[self.category]} kernels {self.factor:g}x faster"
        if self.kind == "host_speedup":
            return f"host work between launches {self.factor:g}x faster"
        if self.kind == "compute_speedup":
            return f"computation kernels {self.factor:g}x faster"
        if self.kind == "speedup_rows":
            return f"{len(self.rows)} kernels {self.factor:.3g}x faster"
        if self.kind == "shrink_bubble":
            return f"pipeline bubble {self.factor:g}x smaller"
        if self.kind in ("drop_rows", "remove_wasted_rows"):
            return f"{len(self.rows)} kernels not run"
        if self.kind == "remove_kernels":
            return f"{len(self.rows)} kernels neither launched nor run"
        if self.kind == "fuse_kernels":
            return f"{len(self.rows)} kernels fused into their neighbours"
        if self.kind == "remove_spans":
            return f"{len(self.spans)} host spans not run"
        if self.kind == "remove_lags":
            return f"{len(self.rows)} waits the trace shows no cause for gone"
        if self.kind == "usual_launch_calls":
            return f"{len(self.rows)} launch calls at most {self.factor:g} us each"
        return self.kind.replace("_", " ")


@dataclass
class Graph:
    """The window's nodes (host calls then device events) and their observed timing (µs)."""

    rows: np.ndarray            # trace row per node
    is_host: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    host_prev: np.ndarray       # previous host call on the same thread (node index) or -1
    host_tid: np.ndarray        # thread id of a host node (the host chains are per thread id), -1 for device nodes
    host_gap: np.ndarray        # CPU time between host_prev's end and this start (µs)
    gap_dataloader: np.ndarray  # part of host_gap inside data-loader spans (µs)
    gap_checkpoint: np.ndarray  # part of host_gap inside checkpoint-saving spans (µs)
    gap_compile: np.ndarray     # part of host_gap inside torch.compile's compile phases (µs)
    gap_gc: np.ndarray          # part of host_gap inside Python's garbage collections (µs)
    gap_allocator: np.ndarray   # part of host_gap inside allocator spans (µs)
    gap_idle: np.ndarray        # part of host_gap in which the thread ran nothing of its own: a wait (µs)
    host_dep: np.ndarray        # host call on another thread a call with an idle gap waited for, or -1
    host_dep_lag: np.ndarray    # observed start - host_dep's end (µs), kept fixed but for ...
    host_dep_work: np.ndarray   # ... the thread's own work in it (µs: what it ran once woken, an optimizer step after
    #                             the backward), which shrinks as a change takes the thread's work away
    is_sync: np.ndarray         # the call blocked until device work ended (block_class != 0)
    block_class: np.ndarray     # NOT_BLOCKING, BLOCK_SYNC, BLOCK_PAGEABLE, BLOCK_COMM or BLOCK_QUEUE
    sync_on: np.ndarray         # device node a sync waited for, or -1
    sync_on_nc: np.ndarray      # the same, ignoring communication (for overlap_comm), or -1
    sync_base: np.ndarray       # the sync call's own cost without waiting (µs)
    sync_tail: np.ndarray       # how long the call went on after the work it waited for ended (µs)
    sync_site: np.ndarray       # call site of a blocking call (index into site_names), -1 others
    gap_syncop: np.ndarray      # part of host_gap inside an op that made a blocking read (aten::item, ...) (µs)
    syncop_site: np.ndarray     # call site of that op's blocking call, -1 none
    in_syncop: np.ndarray       # a blocking call made inside such an op (the read goes when the sync does)
    site_names: list            # call sites (host.call_sites) of the blocking calls
    is_alloc: np.ndarray        # host node is a recurring allocator call (cudaMalloc, hipFree, ...: allocation_traffic)
    small_launch: np.ndarray    # host node launched a small kernel (launch.small_kernel_mask)
    kernel_launch: np.ndarray   # host node launched a kernel
    own_launch: np.ndarray      # device node launched by a call of its own, not a graph's replay (graph_launched)
    launch_call_us: np.ndarray  # the launch overhead in a host call: its duration (its unblocked cost for a call that
    #                             blocked), 0 for an outlier (launch.launch_call_cutoff_us: a wait a graph keeps) (µs)
    kernel_floor_us: float      # a kernel's fixed device cost: 1st percentile of the window's kernel durations (µs)
    kernel_gap_us: float        # the device's gap before a kernel queued behind another on its stream: their median
    #                             lag (µs; 0 where no kernel queued: queued_kernel_gap_us)
    before_window: np.ndarray   # device node launched before the trace began, queued_before_window (the rules'
    #                             evidence is the window's own work: they leave these out)
    dispatch_us: float          # typical op dispatch per kernel launch: median CPU work since the previous launch on
    #                             its thread and its op's start, other calls' own time left out (µs; launch_dispatch_us)
    launch_group: np.ndarray    # host node -> the kernel-launch node that ends its stretch (the next launch on its
    #                             thread, itself for a launch), -1 for calls after a thread's last launch and device
    launch: np.ndarray          # launch node of a device node, or -1
    lat: np.ndarray             # launch latency used (µs)
    stream_prev: np.ndarray     # previous device node on the same stream, or -1
    stream_prev_nc: np.ndarray  # previous non-communication device node on the same stream, or -1
    copy_bytes: np.ndarray      # bytes a device copy node moved (the trace's "bytes"), -1 unknown or not a copy
    pageable_copy: np.ndarray   # device node is a copy its host call blocked on (BLOCK_PAGEABLE)
    dep: np.ndarray             # inferred cross-stream predecessor, or -1
    lag: np.ndarray             # unexplained delay kept fixed (µs)
    category: np.ndarray
    comm_wait: np.ndarray       # cross-rank wait inside a communication kernel (µs)
    comm_wait_rank: np.ndarray  # the rank that wait was for (-1 none)
    order: np.ndarray           # processing order (observed start)
    names: list = field(default_factory=list)
    # per node, the earliest its work can end whatever this rank changes (µs; -inf: none): a later pipeline stage's
    # receives that open its steps end when the stage before sends (facts.collect_facts sets them; _arrival_floor)
    arrival_floor: np.ndarray | None = None
    _lists: dict = field(default_factory=dict, repr=False)
    _moved_floors: dict = field(default_factory=dict, repr=False)  # _arrival_floor's, by the bubble's changes

    @property
    def cpu_work_us(self) -> np.ndarray:
        """Each host node's own CPU work in its gap (µs): replay.cpu_work_us of this graph's gap columns."""
        return cpu_work_us(self.host_gap, self.gap_dataloader, self.gap_checkpoint, self.gap_compile, self.gap_gc,
                           self.gap_allocator, self.gap_idle)

    @property
    def blocking_us(self) -> np.ndarray:
        """Each node's host time blocked beyond the call's own cost (µs; 0 where the call did not block): the measure
        blocked_us sums per blocking class."""
        return np.where(self.block_class != NOT_BLOCKING, self.dur - self.sync_base, 0.0)

    def as_list(self, name: str) -> list:
        """A column as a Python list (cached): the replay loop reads lists ~3x faster than arrays."""
        if name not in self._lists:
            self._lists[name] = getattr(self, name).tolist()
        return self._lists[name]


def spans_time_us(spans: Sequence[tuple[int, float, float]]) -> float:
    """The host time (µs) the remove_spans spans (thread id, start µs, end µs) cover, each thread's overlaps counted
    once: what their removal takes off their threads before the replay says what it gains."""
    by_thread: dict[int, list[tuple[float, float]]] = {}
    for tid, start, end in spans:
        by_thread.setdefault(int(tid), []).append((float(start), float(end)))
    return float(sum(covered_length(*map(np.array, zip(*pieces))) for pieces in by_thread.values()))


def spans_cut(g: Graph, spans: Sequence[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """What removing the host spans (thread id, start µs, end µs) takes from the graph: per node, the µs of its gap
    (since the previous call on its thread) inside them, and whether it is a host call made inside one of them."""
    n = g.start.size
    cut, inside = np.zeros(n), np.zeros(n, bool)
    if not len(spans):
        return cut, inside
    tid = np.array([x[0] for x in spans], dtype=np.int64)
    span_start = np.array([x[1] for x in spans], dtype=float)
    span_end = np.array([x[2] for x in spans], dtype=float)
    for thread in np.unique(tid):
        s, e = merge_intervals(span_start[tid == thread], span_end[tid == thread])
        mine = np.flatnonzero(g.is_host & (g.host_tid == thread))
        k = np.searchsorted(s, g.start[mine], side="right") - 1
        held = k >= 0
        held[held] = g.start[mine][held] + g.dur[mine][held] <= e[k[held]]
        inside[mine[held]] = True
        after = mine[g.host_prev[mine] >= 0]
        prev = g.host_prev[after]
        cut[after] = covered_each(g.start[prev] + g.dur[prev], g.start[after], (s, e))
    return cut, inside


def _previous_kept(stream_prev: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """For each row, the nearest earlier row on its stream that is not `skipped` (-1 when none): stream_prev with
    the skipped rows jumped over (pointer doubling, log2 of the longest run of skipped rows)."""
    idx = np.arange(stream_prev.size)
    to = np.where(skipped, stream_prev, idx)  # a kept row is its own answer, a skipped one looks further back
    while True:
        nxt = np.where(to >= 0, to[np.clip(to, 0, None)], -1)
        if np.array_equal(nxt, to):
            break
        to = nxt
    return np.where(stream_prev >= 0, to[np.clip(stream_prev, 0, None)], -1)


DEFAULT_LAUNCH_LATENCY_US = 5.0  # launch call -> kernel start on an idle stream, when the trace never shows one
# ... and the fewest such launches whose delays say what the typical one is: a 5th percentile of one or two delays is
# the delay of one launch, which may have waited for something else (HTA's MI250 step: its one launch onto an idle
# stream started 2.85 ms after its call, behind the device's first-use set-up; taken as the latency, every later
# kernel was chained 2.85 ms behind its launch and no fix that moves the device could gain). 3: the smallest count
# whose 5th percentile (their minimum) one such outlier cannot set; stated, not fitted
LAUNCH_LATENCY_MIN_SAMPLES = 3


def launch_latency_us(obs_lat: np.ndarray, has_launch: np.ndarray, stream_prev: np.ndarray, launch_start: np.ndarray,
                      end: np.ndarray) -> float:
    """The launch latency (µs): the 5th percentile of launch->start delays of device events launched onto an
    idle stream (its previous event had ended), given LAUNCH_LATENCY_MIN_SAMPLES of them; else the shortest delay
    of any launch, at most DEFAULT_LAUNCH_LATENCY_US. Delays of events queued behind others measure the queue,
    not the launch: on a GPU that trails the host by 27 ms every delay is >= 27 ms, and taking that as
    the latency would chain every kernel to the host in a what-if."""
    # a stream's first event in the window does not count: the stream may have been busy before the window
    idle = has_launch & (stream_prev >= 0) & (end[np.clip(stream_prev, 0, None)] <= launch_start)
    if int(idle.sum()) >= LAUNCH_LATENCY_MIN_SAMPLES:
        return max(float(np.nanpercentile(obs_lat[idle], 5)), 0.0)
    seen = float(np.nanmin(obs_lat[has_launch])) if has_launch.any() else DEFAULT_LAUNCH_LATENCY_US
    return max(min(seen, DEFAULT_LAUNCH_LATENCY_US), 0.0)


def op_rows(t: EventTable, w: Window) -> np.ndarray:
    """The window's operator spans (cpu_op rows): the thread's own work and the ops that launch kernels. A
    ProfilerStep recorded as a cpu_op (PyTorch < 2.0) is the step, not an op: it encloses the thread's waits for
    the autograd thread and the host work between ops, which would otherwise read as work (HTA's nccl_parser trace
    with its steps as cpu_op: the threads' waits 383 -> 147 ms, the usual dispatch 6 -> 10 µs, launch_bound
    5.72 -> 2.63 %, audit P9)."""
    rows = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    return rows[~np.isin(t.name[rows], t.ids_matching(STEP_RE.match))]


ONE_OFF_MIN_US = 1000.0  # an allocator call at least this long ...
ONE_OFF_FACTOR = 100.0   # ... and this many times the median of its kind is initialisation (evidence.warmup_caveat too)


def one_off_first_calls(keys: np.ndarray, starts: np.ndarray, durs: np.ndarray, *, min_later: int = 2,
                        fallback_us: float | None = None) -> np.ndarray:
    """Per call (bool): the first call of its kind (keys) in time (starts) that costs (durs, µs) more than
    ONE_OFF_MIN_US and ONE_OFF_FACTOR times the median of the later calls of its kind: one-off initialisation
    (a context, a library, a first allocation). A kind with fewer than min_later later calls is compared with
    fallback_us, and with none is never one-off."""
    out = np.zeros(keys.size, dtype=bool)
    order = np.lexsort((starts, keys))
    k, d = keys[order], durs[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if k.size else np.zeros(0, dtype=np.int64)
    ends = np.r_[first[1:], k.size]
    for i, j in zip(first, ends):
        ref = float(np.median(d[i + 1:j])) if j - i > min_later else fallback_us
        if ref is not None and d[i] > max(ONE_OFF_MIN_US, ONE_OFF_FACTOR * ref):
            out[order[i]] = True
    return out


def allocation_traffic(t: EventTable, w: Window, rows: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Which of the host call rows (start: their µs) are a recurring allocator stall (bool per row): allocator
    calls (host.ALLOCATOR_RUNTIME_RE) less one-off start-up work, which no allocator setting removes and no later
    step pays again (audit P2):
    - a free before the window's first malloc releases nothing the window allocated: cudaFree(0) is how CUDA
      libraries force their context up;
    - a call longer than ONE_OFF_MIN_US and ONE_OFF_FACTOR times the median of its kind (cudaMalloc, cudaFree...)
      is initialisation, not what an allocation costs (cuDNN's init: a 6-s cudaFree among ms-long ones in HTA's
      PARAM alexnet trace; evidence.warmup_caveat names such calls with the same two numbers);
    - with 2 or more steps analysed, allocator calls in fewer than half of them are the caching allocator growing
      its pool on first use (or an occasional empty_cache), not every step's cost;
    - without steps the window is the whole trace, start-up included: mallocs with no free in it are the pool
      growing (the caching allocator frees nothing of its own; switched off, or emptied each step, it frees as it
      allocates), unless they recur iteration after iteration: a trace profiled without prof.step() still has
      torch.optim's Optimizer.step annotations, and calls in at least half of the parts they cut the window into
      recur as they would in half the steps (a pool grows in the first iterations only).
      With one step, or without steps one iteration (one Optimizer.step annotation), nothing shows recurrence either
      way: its calls count, and the one-step caveat (evidence.py) or the no-step note lowers the finding's
      confidence (HTA's MI250 step read a 20 % allocator stall with its ProfilerStep and none without it)."""
    ids = t.ids_matching(ALLOCATOR_RUNTIME_RE.search)
    alloc = np.isin(t.name[rows], ids)
    if not alloc.any():
        return alloc
    is_free = np.isin(t.name[rows], t.ids_matching(lambda s: bool(ALLOCATOR_RUNTIME_RE.search(s)) and "Free" in s))
    mallocs = alloc & ~is_free
    first_malloc = float(start[mallocs].min()) if mallocs.any() else np.inf
    keep = alloc & ~(is_free & (start < first_malloc))
    dur = w.end_us[rows] - w.ts_us[rows]
    for kind in np.unique(t.name[rows[alloc]]):
        same = alloc & (t.name[rows] == kind)
        keep &= ~(same & (dur > max(ONE_OFF_MIN_US, ONE_OFF_FACTOR * float(np.median(dur[same])))))
    steps = w.steps
    if len(steps) >= 2:
        with_calls = np.isin(steps, np.unique(t.step[rows[keep]]))
        if 2 * int(with_calls.sum()) < len(steps):
            keep[:] = False
    elif not steps and not (keep & is_free).any():
        # the iterations torch.optim's annotations mark (window.ITERATION_HINT_RE): calls before, between and after
        # them recur when they fall in at least half of those parts, as with steps
        opt = iteration_hint_rows(t)
        cuts = np.unique(w.ts_us[opt[w.keep[opt]]])
        parts = np.unique(np.searchsorted(cuts, start[keep]))
        if cuts.size != 1 and (cuts.size < 2 or 2 * parts.size < cuts.size + 1):
            keep[:] = False
    return keep


def step_anchor_rows(t: EventTable, w: Window) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) ProfilerStep span of the window, as rows (none or one each): the window's steps
    (w.markers, the one step finder's, on the stepping thread; a span of that name on another thread is no step).
    The replay starts at the first one's start, and its host chain closes inside the last one (_closing_anchors),
    so that host work before a step's first launch or after its last (a DataLoader wait, a checkpoint) is part of
    the replayed steps. A window without steps starts at its first host op instead (_window_start_anchor)."""
    rows = w.markers.host_rows[w.keep[w.markers.host_rows]]  # sorted by start
    if not rows.size:
        return _window_start_anchor(t, w), rows[:0].astype(np.int64)
    return rows[:1].astype(np.int64), rows[-1:].astype(np.int64)


def _window_start_anchor(t: EventTable, w: Window) -> np.ndarray:
    """A trace without ProfilerStep spans: the window's first host op on a thread that launches device work (as
    one row, none when a runtime call comes first; the training loop's thread, whose forward precedes the autograd
    thread's backward), where the replay starts instead of at that thread's first runtime call. The host work
    before the first launch (a DataLoader fetch, an optimizer's CPU step) is then part of the replayed span, as it
    is of a step: anchored at the first launch, the first iteration's DataLoader wait was outside the span and
    removing it gained nothing (the corpus rewritten without steps, benchmarks/format_robustness.py)."""
    launched = correlated_host_row(t)[w.device]
    launched = launched[launched >= 0]
    on = w.keep & np.isin(thread_key(t.pid, t.tid), np.unique(thread_key(t.pid[launched], t.tid[launched])))
    ops = np.flatnonzero(on & np.isin(t.kind, (CPU_OP, USER_ANNOTATION, PYTHON)))
    calls = np.flatnonzero(on & (t.kind == RUNTIME))
    if not ops.size or not calls.size:
        return np.zeros(0, dtype=np.int64)
    first = ops[np.argmin(w.ts_us[ops])]
    # a runtime call that comes first is already the chain's head (a node of its own)
    return np.array([first] if w.ts_us[first] < w.ts_us[calls].min() else [], dtype=np.int64)


def _closing_anchors(t: EventTable, w: Window, last_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, µs) closing the stepping thread's host chain: the end of the window's last step, when it comes after
    the thread's last runtime call. Host time after the last call is the step's, named (a DataLoader fetch, a
    checkpoint save) or not. Closed at its last call, the chain left that time out: a checkpoint save without Python
    frames at the end of the last analysed step was in no finding, and every gain was a share of a window shorter
    than the steps the user times (the corpus's true gains are shares of the ProfilerStep spans: what-if median
    error 0.26 -> 0.11 pp with the steps' ends)."""
    keep, at = [], []
    calls = np.flatnonzero(w.keep & (t.kind == RUNTIME))
    for r in last_steps:
        mine = calls[t.tid[calls] == t.tid[r]]
        last_call = float(w.end_us[mine].max()) if mine.size else -np.inf
        if w.end_us[r] > last_call:
            keep.append(int(r))
            at.append(float(w.end_us[r]))
    return np.array(keep, dtype=np.int64), np.array(at, dtype=float)


def step_thread_calls(t: EventTable, w: Window, step_rows: np.ndarray) -> np.ndarray:
    """Runtime calls of the window on the threads that take part in the step: a thread that launches device
    work seen in the window (kernel, copy, memset) or runs the ProfilerSteps. Other threads only poll or
    query the device (ProcessGroupNCCL's watchdog calls cudaEventQuery every few ms): nothing waits for
    them, so they are not in the step's graph. Kept in it, a polling call's observed delay after the last
    call of a step thread became a fixed host wait: on a trace with a 66 ms DataLoader stall per step the
    watchdog's last cudaEventQuery kept all 4 stalls as its lag and ended the replayed window, halving the
    replayed gain of removing them."""
    calls = np.flatnonzero(w.keep & (t.kind == RUNTIME))
    launched = correlated_host_row(t)[w.device]
    threads = np.unique(np.r_[t.tid[launched[launched >= 0]], t.tid[step_rows]])
    return calls[np.isin(t.tid[calls], threads)]


def _thread_waits(t: EventTable, w: Window, rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                  host_prev: np.ndarray, host_gap: np.ndarray, n_h: int, n_anchors: int,
                  named: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(idle µs, host_dep, lag µs, work in the lag µs) per node: the part of each host gap its thread spent running
    nothing of its own (no cpu_op, no named DataLoader/checkpoint/compile/allocator span: the rows ``named``; step
    and user annotations cover waits too, so they do not count), and for gaps with one, the call on another thread
    it waited for: the latest one that ended before it started, how long after that call's end it started, and how
    much of that time the thread ran ops of its own (woken, it works before its next call). A thread's first call in
    the window (other than a step anchor) waited the same way: the autograd thread starts when the main thread calls
    backward()."""
    n = rows.size
    idle = np.zeros(n)
    dep = np.full(n, -1)
    lag = np.zeros(n)
    work = np.zeros(n)
    spans_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    has_prev = np.flatnonzero(host_prev[:n_h] >= 0)
    tids = t.tid[rows[:n_h]]
    own = op_rows(t, w)
    for tid in np.unique(tids[has_prev]):
        mine = has_prev[tids[has_prev] == tid]
        r = np.r_[own[t.tid[own] == tid], named[t.tid[named] == tid]]
        spans_of[int(tid)] = spans = merge_intervals(w.ts_us[r], w.end_us[r])
        busy = covered_each(end[host_prev[mine]], start[mine], spans)
        idle[mine] = np.maximum(host_gap[mine] - busy, 0.0)
    first = np.flatnonzero(host_prev[:n_h] < 0)
    waiting = np.r_[np.flatnonzero(idle > TOL_US), first[first >= n_anchors]]
    if not waiting.size:
        return idle, dep, lag, work
    by_end = np.argsort(end[:n_h], kind="stable")
    for tid in np.unique(tids[waiting]):  # per thread, the other threads' calls by end: one search, not a walk back
        mine = waiting[tids[waiting] == tid]
        others = by_end[tids[by_end] != tid]
        if not others.size:
            continue
        k = np.searchsorted(end[others], start[mine], side="right") - 1
        found = k >= 0
        cand = others[np.clip(k, 0, None)]
        prev = host_prev[mine]
        # it ended while this thread waited: after this thread's previous call
        found &= (prev < 0) | (end[cand] > end[np.clip(prev, 0, None)])
        dep[mine[found]] = cand[found]
        lag[mine[found]] = start[mine[found]] - end[cand[found]]
    woken = np.flatnonzero(dep >= 0)
    for tid in np.unique(tids[woken]):  # the thread's own ops between the wake and the call, one pass per thread
        mine = woken[tids[woken] == tid]
        if int(tid) in spans_of:
            work[mine] = covered_each(start[mine] - lag[mine], start[mine], spans_of[int(tid)])
    return idle, dep, lag, work


def _sync_op_gaps(t: EventTable, w: Window, rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                  host_prev: np.ndarray, blocking: np.ndarray, sync_site: np.ndarray,
                  n_h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(µs, site, inside) per node: the part of each host gap covered by an op that made a blocking read
    (host.SYNC_OP_RE: aten::item, .cpu(), nonzero, ...; its outermost extent on the call's thread), the call
    site of the blocking call inside that op, and whether a blocking call was made inside one. Removing the
    sync removes the read, so this CPU time goes with it (the loss logged every N steps, not read each step)."""
    n = rows.size
    gap = np.zeros(n)
    site = np.full(n, -1)
    inside = np.zeros(n, bool)
    ops = span_rows(t, w, SYNC_OP_RE, (CPU_OP,))
    if not ops.size or not blocking.size:
        return gap, site, inside
    tids = t.tid[rows[:n_h]]
    for tid in np.unique(tids[blocking[blocking < n_h]]):
        mine = ops[t.tid[ops] == tid]
        if not mine.size:
            continue
        s0, e0 = merge_intervals(w.ts_us[mine], w.end_us[mine])
        b = blocking[(blocking < n_h) & (tids[blocking] == tid)]
        k = np.searchsorted(s0, start[b], side="right") - 1
        hit = (k >= 0) & (end[b] <= e0[np.clip(k, 0, None)] + TOL_US)
        inside[b[hit]] = True
        used = np.unique(k[hit])
        if not used.size:
            continue
        span_site = {int(j): int(sync_site[b[hit][k[hit] == j][0]]) for j in used}
        spans = (s0[used], e0[used])
        nodes = np.flatnonzero((tids == tid) & (host_prev[:n_h] >= 0))
        cov = covered_each(end[host_prev[nodes]], start[nodes], spans)
        gap[nodes] = cov
        # the span a covered gap falls in: the last one starting before the gap ends
        j = np.searchsorted(s0[used], start[nodes], side="right") - 1
        j = np.where((j < 0) | (cov <= 0), -1, j)
        site[nodes] = [span_site[int(used[x])] if x >= 0 else -1 for x in j]
    return gap, site, inside


def _typical_call_us(dur: np.ndarray, n_anchors: int, n_h: int, may_wait: np.ndarray,
                     fallback_us: float | None = None) -> float:
    """What a host call costs when it does not wait (µs): the median duration of the calls that cannot block
    (launches, ...); when there are none, fallback_us if given (what a call that waited for a queue slot took after
    the slot freed: queue_waits), else the median of all calls. The calls that may wait (synchronize, memcpy) are
    left out: where they are most of the calls (97 injected 24-µs .item() reads beside 20 ~5-µs launches in HTA's
    MI250 step) their median is their own blocked duration, and none of them looked blocked."""
    calls = np.arange(n_anchors, n_h)
    quiet = calls[~may_wait[calls]]
    if not quiet.size and fallback_us is not None:
        return fallback_us
    pick = quiet if quiet.size else calls
    return float(np.median(dur[pick])) if pick.size else 0.0


# A kernel launch call that returned only after its kernel ended (within a copy call's return, COPY_RETURN_US /
# COPY_RETURN_SHARE), having spent more than TOL_US and at least half its time with the kernel running, waited for
# it: launches made synchronous (CUDA_LAUNCH_BLOCKING=1, HIP_LAUNCH_BLOCKING=1, AMD_SERIALIZE_KERNEL=3, a debugging
# setting left on). A setting of the process, so read only when at least this share of the launches whose kernels ran
# long enough to show it (>= 2 TOL_US, and as long as the rest of the call) did: an asynchronous launch's kernel ends
# inside its call only by chance (a slow call of a short kernel on an idle device), and a launch that waits for a free
# slot in a full queue returns before its own kernel starts. A majority, stated, not fitted (no labeled case has
# synchronous launches)
SYNC_LAUNCH_MIN_SHARE = 0.5


def synchronous_launches(start: np.ndarray, end: np.ndarray, launch: np.ndarray,
                         kernels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node (µs times): the kernel node a launch call waited for (its last-ending kernel, SYNC_LAUNCH_MIN_SHARE
    of the long kernels' launches waiting so), -1 for every node when launches are asynchronous; and each such
    call's own cost, its time outside the wait (before its first kernel started, after its last ended; µs)."""
    n = start.size
    waited = np.full(n, -1)
    own = np.zeros(n)
    kernels = kernels[launch[kernels] >= 0]
    if not kernels.size:
        return waited, own
    calls = launch[kernels]
    last = np.full(n, -1)
    first_start = np.full(n, np.inf)
    for k in kernels[np.argsort(end[kernels], kind="stable")]:  # the last-ending kernel of each call wins
        last[launch[k]] = k
    np.minimum.at(first_start, calls, start[kernels])
    L = np.unique(calls)
    k = last[L]
    ran_from = np.maximum(start[L], first_start[L])
    wait = np.maximum(end[k] - ran_from, 0.0)
    call = end[L] - start[L]
    ended_inside = returned_with(start[L], end[L], first_start[L], end[k])
    synchronous = ended_inside & (wait > TOL_US) & (wait >= 0.5 * call)
    # a launch shows whether it waited when its kernel ran >= 2 TOL_US and at least as long as the rest of its call
    # (a synchronous call's 12 us outside a 10-us kernel leave it under half the call either way)
    ran = end[k] - first_start[L]
    long = (ran >= 2 * TOL_US) & (ran >= call - wait)
    if not long.any() or (synchronous & long).sum() < SYNC_LAUNCH_MIN_SHARE * long.sum():
        return waited, own
    # the setting is the process's: every launch whose kernel ended inside it waited for it, a short kernel's too
    waited[L[ended_inside]] = k[ended_inside]
    own[L[ended_inside]] = (call - wait)[ended_inside]
    return waited, own


# a call that waited for a queue slot returned with at least this many entries of its work's stream ahead of it
# (enqueuing calls made before it whose work had not all ended): the queue was full. CUDA's holds about 1,024 a
# stream (HTA's V100 trace ns_resolution, a GPU-bound loop without a sync: 1,015-1,021 ahead at the return of its
# 885 long launches that waited so, none above 1,021 at any call's return; the forum post in queue_waits: about
# 1,000). 900, stated: a full CUDA queue less the entries that start no device operation (event records: HTA's
# negative_queue trace waited with 906-956 ahead, none above 957 at any call's return). A queue deep but not full
# lets a call that returned right after one of its many short kernels ended pass for one that waited: with 256,
# calls at 261-639 did in ns_resolution refilling its queue (up to 719) after a checkpoint the corpus injected
# drained it; HTA's host-bound traces never go above 76. On the labeled cases of those two bases 256-950 price
# alike; below 900 negative_queue's window (720-899 ahead of its first launch) is read as opening behind a full queue
# and its healthy case gets a medium finding (docs/benchmarks.md)
CUDA_QUEUE_FULL_MIN_PENDING = 900
# HIP (ROCm's runtime, direct dispatch) writes each launch as an AQL packet into a hardware queue of 16,384 packets
# (ROCclr's ROC_AQL_QUEUE_SIZE default; dispatchGenericAqlPacket waits while it is full), streams beyond
# GPU_MAX_HW_QUEUES (4) sharing one: the same share of it, 16,384 x 900 / 1,024. Not measured on a ROCm trace (none
# here fills it); a queue shared by several streams fills with fewer entries of each and is not recognised (its
# calls keep their observed time), nor is a ROC_AQL_QUEUE_SIZE set lower. A HIP launch with 900 entries ahead has
# 15,000 free slots: it did not wait for one
HIP_QUEUE_FULL_MIN_PENDING = 14_400


def queue_full_min_pending(t: EventTable, call_rows: np.ndarray) -> np.ndarray:
    """Per enqueuing call (trace rows of host runtime calls): the entries ahead of its work from which its stream's
    launch queue is full (count), by the runtime that made the call (hip* calls: HIP's, every other: CUDA's)."""
    hip = np.isin(t.name[call_rows], t.ids_matching(lambda s: s.startswith("hip")))
    return np.where(hip, HIP_QUEUE_FULL_MIN_PENDING, CUDA_QUEUE_FULL_MIN_PENDING)


def stream_entries_ahead(t: EventTable, w: Window, own_rows: np.ndarray, returned_us: np.ndarray) -> np.ndarray:
    """Per call: the entries of the launch queue in front of its own work when it returned (count): the device work
    of that work's stream (every device event of the trace, the window's or not: work queued before the profile
    began counts) that had not ended by then (returned_us, µs) and runs before it in the stream's order. One launch
    is one entry however many operations it started (a CUDA graph's share one correlation id). own_rows: the trace
    row of each call's first device operation."""
    rows = w.device_all if w.device_all is not None else w.device
    key = thread_key(t.pid[rows], t.stream[rows])
    own_key = thread_key(t.pid[own_rows], t.stream[own_rows])
    out = np.zeros(own_rows.size, dtype=np.int64)
    pos = np.full(len(t), -1)
    for k in np.unique(own_key):
        on = rows[key == k]
        on = on[np.argsort(w.ts_us[on], kind="stable")]
        pos[on] = np.arange(on.size)
        ended = np.maximum.accumulate(w.end_us[on])  # a stream runs in order: its ends follow that order
        corr = t.correlation[on]
        new_entry = np.r_[True, corr[1:] != corr[:-1]] | (corr < 0)
        entries_before = np.r_[0, np.cumsum(new_entry)]
        mine = np.flatnonzero(own_key == k)
        p = pos[own_rows[mine]]
        q = np.minimum(np.searchsorted(ended, returned_us[mine], side="right"), p)  # the first not ended by then
        # the entries from q's to the call's own; q inside a launch's run of operations counts that launch once
        out[mine] = entries_before[p] - entries_before[q] + ((q < p) & ~new_entry[q])
    return out


def queued_before_window(t: EventTable, w: Window, link: np.ndarray) -> np.ndarray:
    """The trace rows of the device work launched before the trace began that the window's host queued behind when
    the queue was full (a profile started mid-run, the host steps ahead of the device): the window's first launch
    onto some stream returned with its queue full (queue_full_min_pending entries or more ahead of its work). The
    graph then holds that work (without a
    launch), so that the window's first calls wait for it and a change that speeds the device up speeds it up too;
    otherwise none (the window's first device work keeps the delay it had behind it, as a fixed lag). link: each
    row's launch row (trace.annotate.correlated_host_row)."""
    if w.device_all is None:
        return np.zeros(0, dtype=np.int64)
    own = w.device[np.isin(t.kind[w.device], (KERNEL, MEMCPY, MEMSET))]
    other = np.setdiff1d(w.device_all, own)
    earlier = other[np.isin(t.kind[other], (KERNEL, MEMCPY, MEMSET)) & launched_before_trace(t, other)]
    own = own[link[own] >= 0]
    if not earlier.size or not own.size:
        return np.zeros(0, dtype=np.int64)
    # the work of the window's first launch onto each stream
    own = own[np.lexsort((w.ts_us[link[own]], thread_key(t.pid[own], t.stream[own])))]
    key = thread_key(t.pid[own], t.stream[own])
    first = own[np.r_[True, key[1:] != key[:-1]]]
    full = (stream_entries_ahead(t, w, first, w.end_us[link[first]])
            >= queue_full_min_pending(t, link[first])).any()
    return earlier if full else np.zeros(0, dtype=np.int64)


def queue_waits(start: np.ndarray, end: np.ndarray, launch: np.ndarray, queue_full: np.ndarray, n_h: int,
                block: np.ndarray, sync_api: np.ndarray) -> tuple[np.ndarray, float]:
    """Per node: the device node a host call that enqueues device work (a launch, an asynchronous copy or memset)
    waited for to free a slot in the device's full launch queue, -1 for every other node; and what such a call
    costs when it does not wait (µs).

    CUDA queues about 1,000 launches; past that, each launch blocks until an earlier kernel ends and takes as long
    as the kernels it waits for (NVIDIA developer forums, "CUDA stream are blocked when launch lots of kernels
    (>1000)": 4-5 us a launch for the first 1,000 of 190-us kernels, then 190 us each). A host that runs ahead of
    a busy GPU without a sync fills it; its calls then record the device's pace, not the host's work, and a fix
    that makes the device faster makes them shorter. Such a call: longer than an enqueuing call that did not wait
    (by TOL_US), it returned right after (COPY_RETURN_US) a device node launched before it ended, with its stream's
    launch queue full in front of its own work (queue_full: per node, stream_entries_ahead at or above
    queue_full_min_pending for the enqueuing calls), which it did not wait for (as a synchronous launch does). The
    cost of one that did not wait: the median of the enqueuing calls that did not return right after a device node
    ended (none could have waited for a slot); where every one did, the median of their time after that end.
    sync_api: the synchronize calls (never enqueuing calls here). A device node with no launch in the graph (work
    launched before the trace began) counts as launched before every call."""
    n = start.size
    waited = np.full(n, -1)
    dev = np.arange(n_h, n)
    dev = dev[launch[dev] >= 0]
    if not dev.size:
        return waited, 0.0
    own_start = np.full(n, np.inf)
    np.minimum.at(own_start, launch[dev], start[dev])
    calls = np.flatnonzero(np.isfinite(own_start[:n_h]) & (block[:n_h] == NOT_BLOCKING) & ~sync_api[:n_h])
    if not calls.size:
        return waited, 0.0
    everything = np.arange(n_h, n)  # device work by end, the work launched before the trace included
    launched_at = np.where(launch >= 0, start[np.clip(launch, 0, None)], -np.inf)
    by_end = everything[np.argsort(end[everything], kind="stable")]
    ends = end[by_end]
    # the device work that ended last before each call returned (ignoring which call launched it: a vectorised
    # first pass; the candidates are checked one by one below)
    last = np.searchsorted(ends, end[calls] + TOL_US, side="right") - 1
    ended = np.where(last >= 0, ends[np.clip(last, 0, None)], -np.inf)
    returned_soon = (ended >= start[calls]) & (end[calls] - ended <= COPY_RETURN_US)
    dur = end - start
    free = calls[~returned_soon]
    # where every one returned right after device work ended (a profile that began with the queue full and never
    # saw it drain), none shows an unblocked call: what they took after that end, the enqueuing itself once the slot
    # was free, stands for it (less the call's work before it blocked, a few us)
    unblocked_us = float(np.median(dur[free])) if free.size else float(np.median(end[calls] - ended))
    cand = calls[returned_soon & (dur[calls] > unblocked_us + TOL_US) & (own_start[calls] > end[calls] + TOL_US)
                 & queue_full[calls]]
    # each candidate waited for the device work launched before it, and running when it returned, that ended last
    # (Kineto places device times on the host clock to ~10 us: up to TOL_US after the return): most often the last
    # to end at all (taken at once, vectorised); else searched back one by one. Work that started only after the
    # call returned was not what it waited for (and the replay reads the end of what it waited for when the call's
    # thread goes on: that work must have started by then)
    hi = np.searchsorted(ends, end[cand] + TOL_US, side="right") - 1
    k, last_end = by_end[np.clip(hi, 0, None)], ends[np.clip(hi, 0, None)]
    at_once = (hi >= 0) & (launched_at[k] < start[cand]) & (start[k] < end[cand])
    ok = at_once & (last_end >= start[cand]) & (end[cand] - last_end <= COPY_RETURN_US)
    waited[cand[ok]] = k[ok]
    for i, h in zip(cand[~at_once], hi[~at_once]):
        h = int(h)
        while h >= 0 and ends[h] >= start[i]:
            j = int(by_end[h])
            if launched_at[j] < start[i] and start[j] < end[i]:
                if end[i] - ends[h] <= COPY_RETURN_US:
                    waited[i] = j
                break
            h -= 1
    return waited, unblocked_us


def _launch_groups(thread_orders: list[np.ndarray], kernel_launch: np.ndarray, n: int) -> np.ndarray:
    """Per node, the kernel-launch node that closes its stretch of host calls: the next launch at or after it
    on its thread (a launch closes its own), -1 after a thread's last launch and for device nodes."""
    group = np.full(n, -1)
    for idx in thread_orders:
        pos = np.flatnonzero(kernel_launch[idx])
        if pos.size:
            nxt = np.searchsorted(pos, np.arange(idx.size), side="left")
            has = nxt < pos.size
            group[idx[has]] = idx[pos[nxt[has]]]
    return group


def launch_dispatch_us(cpu: np.ndarray, idle: np.ndarray, group: np.ndarray, host_prev: np.ndarray,
                       kernel_launch: np.ndarray, start: np.ndarray, host_gap: np.ndarray,
                       op_start: np.ndarray) -> float:
    """Typical op dispatch per kernel launch (µs): the median, over launches that follow another launch on
    their thread, of the CPU work (cpu: each node's gap less data-loader, checkpoint, allocator and idle time)
    since that launch and since the start of the op that launches it (op_start, per launch node; -inf outside
    any op), summed over the gaps of the calls in between; stretches with a wait for another thread
    (idle > TOL_US) are left out. Other runtime calls (copies, reads, hipMalloc) split a stretch but add no gap,
    so they do not move it; the median gap before every call did (5 vs 27.5 µs on HTA's MI250 step, issue 9).
    The op bound keeps the model's own Python between ops out (what fusing an op removes is its dispatch).
    Falls back to every launch's stretch (a thread's first one included) when no launch follows another."""
    n = cpu.size
    member = group >= 0
    m = np.flatnonzero(member)
    # the part of each gap after the launching op started: at most its CPU work (the gap's data-loader, idle...
    # time lies outside the op)
    lo = np.maximum(start[m] - host_gap[m], op_start[group[m]])
    work = np.bincount(group[m], weights=np.clip(np.minimum(cpu[m], start[m] - lo), 0.0, None), minlength=n)
    waited = np.bincount(group[member], weights=(idle[member] > TOL_US).astype(float), minlength=n) > 0
    launches = np.flatnonzero(kernel_launch & (group == np.arange(n)))
    if not launches.size:
        return 0.0
    # a stretch's first call: its node whose previous call on the thread is not in the stretch
    nodes = np.flatnonzero(member)
    hp = host_prev[nodes]
    opens = nodes[(hp < 0) | (group[np.clip(hp, 0, None)] != group[nodes])]
    first = np.full(n, -1)
    first[group[opens]] = opens
    prev = host_prev[first[launches]]
    after_launch = (prev >= 0) & kernel_launch[np.clip(prev, 0, None)]
    pick = launches[after_launch & ~waited[launches]]
    if not pick.size:
        pick = launches[~waited[launches]] if (~waited[launches]).any() else launches
    return float(np.median(work[pick]))


def cpu_work_us(host_gap: np.ndarray, gap_dataloader: np.ndarray, gap_checkpoint: np.ndarray, gap_compile: np.ndarray,
                gap_gc: np.ndarray, gap_allocator: np.ndarray, gap_idle: np.ndarray) -> np.ndarray:
    """The thread's own CPU work in each host node's gap (µs, >= 0): the gap less the time inside DataLoader,
    checkpoint, compile, garbage-collection and allocator spans and the time it ran nothing (a wait for another
    thread). This is the work the op dispatch, a graphed launch and a blocking read's op take their time from
    (Graph.cpu_work_us)."""
    return np.maximum(host_gap - gap_dataloader - gap_checkpoint - gap_compile - gap_gc - gap_allocator - gap_idle,
                      0.0)


def blocked_us(g: "Graph", block_class: int) -> float:
    """Host time blocked in the calls of one blocking class (BLOCK_SYNC, BLOCK_PAGEABLE, BLOCK_COMM), beyond each
    call's own cost (µs): the blocking time the host_sync, pageable_copy and exposed_comm rules report (a summary's
    host-sync share should read this, with BLOCK_SYNC, as the rule does)."""
    return float(g.blocking_us[g.block_class == block_class].sum())


def dispatch_taken(g: "Graph", cpu: np.ndarray, graphed: np.ndarray) -> np.ndarray:
    """CPU time (µs) per node that the launches in `graphed` stop costing the host: up to Graph.dispatch_us per
    launch, taken from the CPU gaps of its stretch (Graph.launch_group) latest first, so a copy or read
    between an op's dispatch and its launch does not hide the dispatch. cpu: each node's CPU gap (µs)."""
    out = np.zeros(cpu.size)
    grp = g.launch_group
    sel = np.flatnonzero((grp >= 0) & graphed[np.clip(grp, 0, None)])
    if not sel.size or g.dispatch_us <= 0:
        return out
    o = sel[np.lexsort((-g.start[sel], grp[sel]))]  # by stretch, latest call first
    c = np.maximum(cpu[o], 0.0)
    before = np.cumsum(c) - c  # work of the later calls, within the stretch after the subtraction below
    starts = np.flatnonzero(np.r_[True, grp[o][1:] != grp[o][:-1]])
    before -= np.repeat(before[starts], np.diff(np.r_[starts, o.size]))
    out[o] = np.minimum(c, np.maximum(g.dispatch_us - before, 0.0))
    return out


def host_work_us(g: "Graph") -> np.ndarray:
    """Per host node: the time in its gap its thread spends on work that launches nothing (µs, >= 0): the CPU work
    beyond the usual op dispatch that the kernel launches of its stretch take from it (dispatch_taken over every
    launch), plus the time it ran no op and waited for no other thread's call (untraced work: Python outside ops,
    the garbage collector). What remove_host_work takes off the host chain."""
    return work_beyond_dispatch_us(g, g.cpu_work_us) + g.gap_idle * (g.host_dep < 0)


def work_beyond_dispatch_us(g: "Graph", cpu: np.ndarray) -> np.ndarray:
    """Per host node: the part of its CPU gap (cpu, µs) beyond the usual op dispatch that the kernel launches of
    its stretch take from it (dispatch_taken over every launch), µs >= 0."""
    return np.maximum(cpu - dispatch_taken(g, cpu, g.kernel_launch), 0.0)


# passes of processing_order's raising: a trace whose clocks disagree can hold a cycle (a copy written before the
# kernel launched ahead of it on its stream, whose launch follows a sync on that copy), which no order satisfies;
# the passes stop there and the replay reads such a node's predecessor as the trace has it, as before
ORDER_PASSES = 16


def processing_order(start: np.ndarray, is_host: np.ndarray, chain: np.ndarray, after: Sequence[np.ndarray]
                     ) -> np.ndarray:
    """The replay's order of nodes (indices): by observed start, host calls first at equal times, each node moved
    after its predecessors where the trace has it start before them. chain: a dense id per node of the thread or
    stream it runs on in order (its earlier nodes there are predecessors); after: arrays of one more predecessor per
    node (-1 none): a device event's launch call and the event it waits for, a host call's wait for another thread,
    and the device work the sync before it waited for (the call after a sync needs that work's replayed end). A trace
    can write a kernel starting before the call that launched it (a device clock behind the host's, beyond what
    device_clock.py undoes; the corpus's surgery, until its fix, wrote one 12 µs early beside injected syncs);
    replayed in observed order it was timed before its launch and read the launch's unchanged time, so a change that
    moved the launch moved neither the kernel nor a sync waiting for it (host work of 20 % removed gained 0.2 % beside
    blocking syncs)."""
    eff = start.astype(float) - (float(start.min()) if start.size else 0.0)  # relative: the offsets below stay exact
    seg = np.lexsort((start, chain))  # each thread's and stream's nodes in order
    span = float(eff.max()) + 1.0 if eff.size else 1.0
    offset = chain[seg] * span
    # a host call after device work it needs goes after it (at an equal time host calls come first)
    after_device = [np.where((p >= 0) & ~is_host[np.clip(p, 0, None)] & is_host, 1e-6, 0.0) for p in after]
    for _ in range(ORDER_PASSES):  # each pass only raises; a real trace settles in one or two
        new = eff.copy()
        for pred, bump in zip(after, after_device):
            has = pred >= 0
            new[has] = np.maximum(new[has], eff[pred[has]] + bump[has])
        new[seg] = np.maximum.accumulate(new[seg] + offset) - offset  # a chain runs in order: a cumulative max
        if np.array_equal(new, eff):
            break
        eff = new
    return np.lexsort((~is_host, eff))


def release_us(start: np.ndarray, end: np.ndarray, launch: np.ndarray, lat: np.ndarray,
               stream_prev: np.ndarray) -> np.ndarray:
    """Per node: when its launch (call start + launch latency) and its stream's previous op (its end) allow it to
    start (µs), the later of the two; -inf for a node with neither (host nodes). A later start waited for something
    else: another stream's op (an event wait) or what the trace does not show (a fixed lag)."""
    out = np.full(start.size, -np.inf)
    launched = launch >= 0
    out[launched] = start[launch[launched]] + lat[launched]
    queued = stream_prev >= 0
    out[queued] = np.maximum(out[queued], end[stream_prev[queued]])
    return out


def queued_kernel_gap_us(is_kernel: np.ndarray, *, end: np.ndarray, released: np.ndarray, stream_prev: np.ndarray,
                         dep: np.ndarray, lag: np.ndarray, in_window: np.ndarray) -> float:
    """The gap the device leaves before a kernel queued right behind another kernel on its stream (µs): the median lag
    of the window's kernels (per node: is_kernel, in_window) whose start waited for their stream's previous op
    (released at its end) and for no other stream's; 0 where none did. A fused kernel stops paying it (the front end's
    start of each kernel; 1-3 us between back-to-back kernels on HTA's V100 and the H200 loops)."""
    prev = np.clip(stream_prev, 0, None)
    queued = (is_kernel & is_kernel[prev] & (stream_prev >= 0) & (dep < 0) & in_window & (released == end[prev]))
    return float(np.median(lag[queued])) if queued.any() else 0.0


def fused_fixed_cost_us(g: "Graph", dur: np.ndarray, lag: np.ndarray,
                        fused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each kernel fused into its neighbours (fused, per node) stops paying on the device, µs, 0 elsewhere: of its
    duration `dur` a kernel's fixed cost (start-up and tail: Graph.kernel_floor_us), of its lag `lag` the device's gap
    before a queued kernel (Graph.kernel_gap_us). Its work stays."""
    return (np.where(fused, np.minimum(dur, g.kernel_floor_us), 0.0),
            np.where(fused, np.minimum(lag, g.kernel_gap_us), 0.0))


def build_graph(t: EventTable, w: Window, comm_wait_us: dict[int, tuple[float, int]] | None = None) -> Graph:
    """Dependency graph of the window (see the module docstring).

    comm_wait_us: trace row of a collective kernel -> (µs it waited for another rank, that rank)."""
    first_steps, last_steps = step_anchor_rows(t, w)
    last_steps, close_at = _closing_anchors(t, w, last_steps)
    anchors = np.r_[first_steps, last_steps]
    host_rows = np.r_[anchors, step_thread_calls(t, w, first_steps)]
    link = correlated_host_row(t)
    earlier_rows = queued_before_window(t, w, link)
    dev_rows = np.r_[w.device[np.isin(t.kind[w.device], (KERNEL, MEMCPY, MEMSET))], earlier_rows]
    rows = np.r_[host_rows, dev_rows]
    n_h = host_rows.size
    n = rows.size
    is_host = np.r_[np.ones(n_h, bool), np.zeros(dev_rows.size, bool)]
    start = w.ts_us[rows].astype(float)
    dur = np.maximum(w.end_us[rows] - w.ts_us[rows], 0.0)
    dur[:anchors.size] = 0.0  # an anchor is a point: the start of the first step, the end of the last
    start[first_steps.size:anchors.size] = close_at
    end = start + dur
    node_of_row = {int(r): i for i, r in enumerate(rows) if i >= anchors.size}
    cat = np.full(n, -1, dtype=np.int64)
    cat[n_h:] = t.category[dev_rows]
    comm = cat == COMMUNICATION

    # host chains per thread
    host_prev = np.full(n, -1)
    host_gap = np.zeros(n)
    tids = t.tid[host_rows]
    thread_orders = []
    for tid in np.unique(tids):
        idx = np.flatnonzero(tids == tid)
        idx = idx[np.argsort(start[idx], kind="stable")]
        thread_orders.append(idx)
        host_prev[idx[1:]] = idx[:-1]
        host_gap[idx[1:]] = np.maximum(start[idx[1:]] - end[idx[:-1]], 0.0)
    has_prev = host_prev >= 0
    # each named stall's part of the gap, exclusive in NAMED_STALLS' order: a gap counted as data loading is not
    # also counted as checkpoint, compile, garbage-collection or allocator time (a collection inside a DataLoader
    # fetch goes with the fetch, which workers move off the thread). The thread's own spans only, as its idle time
    # (_thread_waits) counts them: another thread's DataLoader wait counted in this thread's gap besides that idle
    # time (a loop that steps on one thread and launches from another) made the replay of the trace unchanged
    # longer than the trace
    taken, named_gaps = np.zeros(n), []
    stall_rows = [span_rows(t, w, pattern, (USER_ANNOTATION, CPU_OP, PYTHON)) for pattern in NAMED_STALLS]
    for rows_p in stall_rows:
        part = np.zeros(n)
        for tid in np.unique(tids[has_prev[:n_h]]):
            mine = np.flatnonzero(has_prev[:n_h] & (tids == tid))
            own = rows_p[t.tid[rows_p] == tid]
            part[mine] = covered_each(end[host_prev[mine]], start[mine], merge_intervals(w.ts_us[own], w.end_us[own]))
        part = np.minimum(part, host_gap - taken)
        taken += part
        named_gaps.append(part)
    gap_dl, gap_ck, gap_co, gap_gc, gap_al = named_gaps
    gap_idle, host_dep, host_dep_lag, host_dep_work = _thread_waits(t, w, rows, start, end, host_prev, host_gap, n_h,
                                                                    anchors.size, np.concatenate(stall_rows))

    # device: launch links, stream order
    launch = np.full(n, -1)
    for i in range(n_h, n):
        lr = int(link[rows[i]])
        if lr >= 0:
            launch[i] = node_of_row.get(lr, -1)
    stream_prev = np.full(n, -1)
    dev_idx = np.arange(n_h, n)
    streams = thread_key(t.pid[dev_rows], t.stream[dev_rows])  # (device, stream): ids repeat across GPUs
    for s in np.unique(streams):
        idx = dev_idx[streams == s]
        idx = idx[np.argsort(start[idx], kind="stable")]
        stream_prev[idx[1:]] = idx[:-1]
    stream_prev_nc = _previous_kept(stream_prev, comm)
    has_launch = launch >= 0
    obs_lat = np.where(has_launch, start - start[np.clip(launch, 0, None)], np.nan)
    lat_min = launch_latency_us(obs_lat, has_launch, stream_prev, start[np.clip(launch, 0, None)], end)
    lat = np.where(has_launch, np.minimum(np.nan_to_num(obs_lat, nan=lat_min), lat_min), 0.0)

    # cross-stream waits and unexplained lags
    dep = np.full(n, -1)
    lag = np.zeros(n)
    d_end_order = dev_idx[np.argsort(end[dev_idx], kind="stable")]
    d_ends = end[d_end_order]
    d_streams = streams[d_end_order - n_h]
    prev_other = np.full(d_end_order.size, -1)  # latest earlier position on a different stream
    for k in range(1, d_end_order.size):
        prev_other[k] = k - 1 if d_streams[k - 1] != d_streams[k] else prev_other[k - 1]
    released = release_us(start, end, launch, lat, stream_prev)
    for i in range(n_h, n):
        c = float(released[i])
        if c == -np.inf:
            continue
        if start[i] - c > TOL_US:
            k = int(np.searchsorted(d_ends, start[i] + 1e-6, side="right")) - 1
            if k >= 0 and d_streams[k] == streams[i - n_h]:
                k = prev_other[k]
            if k >= 0 and start[i] - d_ends[k] <= EVENT_WAIT_US and d_ends[k] > c:
                dep[i] = d_end_order[k]
                c = d_ends[k]
        lag[i] = max(start[i] - c, 0.0)

    # blocking host calls: synchronize calls wait for the latest-ending device work launched before them;
    # a copy call that returned only after its copy ended waited for that copy
    host_names = t.name[host_rows]
    block = np.zeros(n, dtype=np.int8)
    sync_on = np.full(n, -1)
    sync_on_nc = np.full(n, -1)
    sync_base = dur.copy()
    is_sync_api = np.zeros(n, bool)
    is_sync_api[:n_h] = np.isin(host_names, t.ids_matching(SYNC_RUNTIME_RE.search))
    is_copy_call = np.zeros(n, bool)
    is_copy_call[:n_h] = np.isin(host_names, t.ids_matching(MEMCPY_RUNTIME_RE.search))
    kernel_nodes = dev_idx[t.kind[dev_rows] == KERNEL]
    waited_kernel, own_us = synchronous_launches(start, end, launch, kernel_nodes)
    # calls that waited for a slot in the full launch queue (queue_waits)
    own_first = np.full(n, -1)  # each call's earliest device operation
    launched_dev = dev_idx[launch[dev_idx] >= 0]
    by_call = launched_dev[np.lexsort((start[launched_dev], launch[launched_dev]))]
    firsts = by_call[np.r_[True, launch[by_call[1:]] != launch[by_call[:-1]]]] if by_call.size else by_call
    own_first[launch[firsts]] = firsts
    enqueuing = np.flatnonzero(own_first[:n_h] >= 0)
    queue_full = np.zeros(n, bool)
    queue_full[enqueuing] = (stream_entries_ahead(t, w, rows[own_first[enqueuing]], end[enqueuing])
                             >= queue_full_min_pending(t, rows[enqueuing]))
    queued_on, unqueued_us = queue_waits(start, end, launch, queue_full, n_h,
                                         np.where(waited_kernel >= 0, BLOCK_SYNC, NOT_BLOCKING), is_sync_api)
    # a call that waited for a queue slot does not show what a call costs either
    may_wait = is_sync_api | is_copy_call | (waited_kernel >= 0) | (queued_on >= 0)
    if (waited_kernel >= 0).any():  # launches made synchronous: none of them shows what a call costs unblocked
        launch_calls = launch[kernel_nodes]
        may_wait[launch_calls[launch_calls >= 0]] = True
    typical = _typical_call_us(dur, anchors.size, n_h, may_wait, unqueued_us if (queued_on >= 0).any() else None)
    for i in dev_idx[(t.kind[dev_rows] == MEMCPY) & has_launch[n_h:]]:
        L = launch[i]
        # the call waited for its copy: it returned right after the copy ended (and, unless synchronous, took longer
        # than a call does). An asynchronous device-to-device copy never blocks the host (a tiny one may end inside
        # its call).
        cname = t.names[int(t.name[rows[i]])]
        asynchronous = "Async" in t.names[int(t.name[rows[L]])]
        async_dtod = copy_direction(cname) in ("DtoD", "PtoP") and asynchronous
        returned_soon = bool(returned_with(start[L], end[L], start[i], end[i]))
        # a synchronous copy waits for itself whatever its length: a synchronous call (hipMemcpyWithStream, ROCm's
        # cudaMemcpyAsync + cudaStreamSynchronize in c10's memcpy_and_sync, whose sync counts as one wherever a
        # device event ends inside it; cudaMemcpy, cuMemcpyDtoH) or any copy into pageable host memory (CUDA
        # returns from those only once the copy has completed); another asynchronous call only when it took longer
        # than a call does (a tiny copy may end inside it). Where the slower launches of a host-bound step set the
        # typical call at 50 us, 103 .item() reads of 24 us a step on an MI250 read as no sync at all
        synchronous = not asynchronous or (copy_direction(cname) == "DtoH" and "Pageable" in cname)
        if is_copy_call[L] and not async_dtod and returned_soon and (synchronous or dur[L] > typical + TOL_US):
            sync_on[L] = i
            sync_on_nc[L] = i
            sync_base[L] = min(dur[L], typical)
            block[L] = BLOCK_PAGEABLE if from_pageable_to_device(cname) else BLOCK_SYNC
    for L in np.flatnonzero(waited_kernel >= 0):  # launches made synchronous: each waits for its own kernel
        sync_on[L] = sync_on_nc[L] = waited_kernel[L]
        # unblocked, it costs what a call that does not wait costs, as a copy or a synchronize call does: the time
        # outside its kernel is the device's queue-to-start latency and the completion notice too (9.3 + 3.7 us
        # around each kernel on an H200 with CUDA_LAUNCH_BLOCKING=1, where the same launch costs 6.9 us when
        # asynchronous: docs/benchmarks.md, "GPU (H200)")
        sync_base[L] = min(own_us[L], typical)
        block[L] = BLOCK_SYNC
    launched = dev_idx[launch[dev_idx] >= 0]
    if launched.size:
        # what a synchronize call waited for: the device event launched before it that ended last while it
        # was blocked (it returned right after); when none ended then, the call did not wait
        by_end = launched[np.argsort(end[launched], kind="stable")]
        ends_sorted = end[by_end]

        def waited_for(i: int, skip_comm: bool, stream: int | None = None) -> int:
            hi = int(np.searchsorted(ends_sorted, end[i] + TOL_US, side="right")) - 1
            while hi >= 0 and ends_sorted[hi] >= start[i]:
                k = int(by_end[hi])
                if start[launch[k]] < start[i] and start[k] < end[i] and not (skip_comm and comm[k]) and \
                        (stream is None or streams[k - n_h] == stream):
                    return k
                hi -= 1
            return -1

        one_stream = np.zeros(n, bool)
        one_stream[:n_h] = np.isin(host_names, t.ids_matching(ONE_STREAM_SYNC_RE.search))
        # a copy call whose own copy the trace lacks (its device activity dropped, or never recorded) shows its wait
        # as a synchronize call does: the device work that ended as it returned. Kept as host time, a 9-ms blocking
        # cudaMemcpyAsync that ended with the queue's last kernel held every replayed step to its length
        copy_unseen = is_copy_call & (own_first < 0) & (dur > typical + TOL_US)
        for i in np.flatnonzero((is_sync_api | copy_unseen) & (block == NOT_BLOCKING)):
            k = waited_for(i, False)
            if k >= 0:
                sync_on[i] = k
                sync_base[i] = min(dur[i], typical)
                # a sync that waited for a collective exposes the communication (fix: overlap it); overlapped, a
                # stream or event sync still waits for that stream's other work, a device sync for every stream's
                block[i] = BLOCK_COMM if comm[k] else BLOCK_SYNC
                sync_on_nc[i] = waited_for(i, True, streams[k - n_h] if one_stream[i] else None) if comm[k] else k
    # calls that waited for a slot in the full launch queue (found above): they end when the device work they waited
    # for ends
    q = np.flatnonzero((queued_on >= 0) & (block == NOT_BLOCKING))
    sync_on[q] = sync_on_nc[q] = queued_on[q]
    sync_base[q] = np.minimum(dur[q], unqueued_us)
    block[q] = BLOCK_QUEUE
    # a synchronize call that waited for a copy from pageable memory is that copy's: PyTorch's blocking copy_ from a
    # pageable host tensor is cudaMemcpyAsync then cudaStreamSynchronize, and pinned memory with non_blocking=True
    # removes both (a pageable input's sync on an H200 held the host 32 ms a step, the gain of pinning it)
    from_pageable = np.zeros(n, bool)
    from_pageable[sync_on[block == BLOCK_PAGEABLE]] = True
    block[(block == BLOCK_SYNC) & (sync_on >= 0) & from_pageable[np.clip(sync_on, 0, None)]] = BLOCK_PAGEABLE
    is_sync = block != NOT_BLOCKING
    sync_tail = np.zeros(n)
    sync_tail[is_sync] = np.maximum(end[is_sync] - end[sync_on[is_sync]], 0.0)
    sync_site = np.full(n, -1)
    blocking = np.flatnonzero(is_sync)
    sites = call_sites(t, rows[blocking])
    site_names = sorted(set(sites))
    sync_site[blocking] = [site_names.index(x) for x in sites]
    gap_so, so_site, in_so = _sync_op_gaps(t, w, rows, start, end, host_prev, blocking, sync_site, n_h)
    work = cpu_work_us(host_gap, gap_dl, gap_ck, gap_co, gap_gc, gap_al, gap_idle)
    gap_so = np.minimum(gap_so, work)
    pageable_copies = np.zeros(n, bool)
    pageable_copies[sync_on[block == BLOCK_PAGEABLE]] = True
    copy_bytes = np.where(~is_host & (t.kind[rows] == MEMCPY), t.nbytes[rows], -1)

    # allocator calls, and launches of small kernels
    is_alloc = np.zeros(n, bool)
    is_alloc[:n_h] = allocation_traffic(t, w, host_rows, start[:n_h])
    replayed = graph_launched(t, dev_rows)  # launched by a graph's replay, one call for many kernels
    small_launch = np.zeros(n, bool)
    small_dev = dev_idx[small_kernel_mask(t, dev_rows, dur[n_h:], replayed) & has_launch[n_h:]]
    small_launch[launch[small_dev]] = True
    before_window = np.zeros(n, bool)
    before_window[n - earlier_rows.size:] = True  # the earlier work's nodes come last (empty without any)
    kdur = dur[n_h:][(t.kind[dev_rows] == KERNEL) & (dur[n_h:] > 0) & ~before_window[n_h:]]
    kernel_floor = float(np.percentile(kdur, KERNEL_FLOOR_PERCENTILE)) if kdur.size else 0.0
    is_kernel = np.zeros(n, bool)
    is_kernel[kernel_nodes] = True
    kernel_gap = queued_kernel_gap_us(is_kernel, end=end, released=released, stream_prev=stream_prev, dep=dep, lag=lag,
                                      in_window=~before_window)
    kernel_launch = np.zeros(n, bool)
    kernel_launch[launch[dev_idx[(t.kind[dev_rows] == KERNEL) & has_launch[n_h:]]]] = True
    own_launch = np.zeros(n, bool)
    own_launch[dev_idx] = has_launch[n_h:] & ~replayed
    # a launch call's own cost, what graphing or fusing it removes: a call that blocked (for a slot in the full queue,
    # on its own kernel) what it costs unblocked (sync_base); any other its duration, unless it is an outlier
    # (launch.launch_call_cutoff_us: code loaded on first use, a wait a CUDA graph keeps)
    unblocked_launches = np.flatnonzero(kernel_launch & ~is_sync)
    usual_launch = float(np.median(dur[unblocked_launches])) if unblocked_launches.size else typical
    launch_call = np.where(is_sync, sync_base, np.where(dur <= launch_call_cutoff_us(usual_launch), dur, 0.0))
    launch_call[~is_host] = 0.0
    launch_group = _launch_groups(thread_orders, kernel_launch, n)
    op_start = np.full(n, -np.inf)
    ops = op_rows(t, w)
    kl_nodes = np.flatnonzero(kernel_launch)
    if ops.size and kl_nodes.size:
        key = thread_key(t.pid, t.tid)
        lr = rows[kl_nodes]
        enc = enclosing_span(key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[lr], t.ts_ns[lr])
        op_start[kl_nodes[enc >= 0]] = w.ts_us[ops[enc[enc >= 0]]]
    dispatch = launch_dispatch_us(work, gap_idle, launch_group, host_prev,
                                  kernel_launch, start, host_gap, op_start)

    cw = np.zeros(n)
    cw_rank = np.full(n, -1)
    if comm_wait_us:
        for r, (v, other) in comm_wait_us.items():
            i = node_of_row.get(int(r))
            if i is not None:
                cw[i] = min(v, dur[i])
                cw_rank[i] = other
    chain = np.empty(n, dtype=np.int64)  # the thread or stream each node runs on, dense
    chain[:n_h] = np.unique(tids, return_inverse=True)[1]
    chain[n_h:] = np.unique(streams, return_inverse=True)[1] + (int(chain[:n_h].max()) + 1 if n_h else 0)
    before = np.clip(host_prev, 0, None)
    sync_waits = [np.where((host_prev >= 0) & is_host, w[before], -1) for w in (sync_on, sync_on_nc)]
    order = processing_order(start, is_host, chain, (launch, dep, host_dep, *sync_waits))
    host_tid = np.full(n, -1, dtype=np.int64)
    host_tid[:n_h] = tids
    return Graph(rows=rows, is_host=is_host, start=start, dur=dur, host_prev=host_prev, host_tid=host_tid,
                 host_gap=host_gap,
                 gap_dataloader=gap_dl, gap_checkpoint=gap_ck, gap_compile=gap_co, gap_gc=gap_gc,
                 gap_allocator=gap_al, gap_idle=gap_idle,
                 host_dep=host_dep, host_dep_lag=host_dep_lag, host_dep_work=host_dep_work, is_sync=is_sync,
                 block_class=block, sync_on=sync_on, sync_on_nc=sync_on_nc, sync_base=sync_base, sync_tail=sync_tail, sync_site=sync_site, gap_syncop=gap_so, syncop_site=so_site, in_syncop=in_so,
                 site_names=site_names, is_alloc=is_alloc,
                 small_launch=small_launch, kernel_launch=kernel_launch, own_launch=own_launch,
                 launch_call_us=launch_call,
                 kernel_floor_us=kernel_floor, kernel_gap_us=kernel_gap, before_window=before_window, dispatch_us=dispatch, launch_group=launch_group, launch=launch, lat=lat, stream_prev=stream_prev,
                 stream_prev_nc=stream_prev_nc, copy_bytes=copy_bytes, pageable_copy=pageable_copies, dep=dep, lag=lag, category=cat, comm_wait=cw, comm_wait_rank=cw_rank,
                 order=order, names=t.names)


@dataclass
class Replay:
    """Replayed timing (µs) of every node and the binding predecessor of each."""

    start: np.ndarray
    end: np.ndarray
    binding: np.ndarray  # node whose end/start set this node's start (-1: anchored)

    @property
    def makespan_us(self) -> float:
        return float(self.end.max() - self.start.min()) if self.end.size else 0.0


def _as_changes(change: Change | Sequence[Change]) -> tuple[Change, ...]:
    return (change,) if isinstance(change, Change) else tuple(change)


# the changes under which a later stage's opening receives (Graph.arrival_floor) may end at any time: a straggler at
# the others' pace (compute_speedup: a slow stage's steps end later on every stage, the stage before included, so its
# sends come sooner too) or the waits for one gone, the profiler's host overhead taken off every rank alike. The
# other changes are each rank's alike: the first stage's own replay, which has no floor, prices the job's step
FLOOR_EXEMPT = frozenset({"compute_speedup", "remove_straggler_wait", "unprofiled_host"})


def _arrival_floor(g: Graph, changes: tuple[Change, ...]) -> list | None:
    """Graph.arrival_floor for a replay with these changes, as a list (None: no floor). The stage before sends when it
    did under any change of this rank's own, since its own replay prices what the change does there; the schedule's
    bubble shrunk (shrink_bubble) moves every stage, so its receives end when the bubble's fix alone has them end, and
    the other changes beside it are priced from there. With the bubble's fix alone, or a FLOOR_EXEMPT change, none."""
    kinds = {c.kind for c in changes}
    if g.arrival_floor is None or kinds & FLOOR_EXEMPT or kinds == {"shrink_bubble"}:
        return None
    shrink = tuple(c for c in changes if c.kind == "shrink_bubble")
    if not shrink:
        return g.as_list("arrival_floor")
    if shrink not in g._moved_floors:  # the arrivals under the bubble's fix alone, once for every change beside it
        moved = replay(g, shrink).end
        g._moved_floors[shrink] = np.where(np.isfinite(g.arrival_floor), moved, -np.inf).tolist()
    return g._moved_floors[shrink]


def replay(g: Graph, change: Change | Sequence[Change] = Change()) -> Replay:
    """Replay the graph with one change, or several together, applied; return the new timing."""
    changes = _as_changes(change)
    kinds = {c.kind for c in changes}
    n = g.start.size
    S = g.start.copy()
    E = g.start + g.dur
    bind = np.full(n, -1)
    dur = g.dur.copy()
    dev = ~g.is_host
    launch_gone = np.zeros(n, bool)  # remove_kernels: launch calls that are not made
    for c in changes:
        if c.kind == "speedup":
            sel = dev & (g.category == c.category)
            dur[sel] = dur[sel] / c.factor
        if c.kind == "compute_speedup":
            sel = dev & (g.category >= 0) & ~np.isin(g.category, (COMMUNICATION, CAT_MEMCPY, CAT_MEMSET))
            dur[sel] = dur[sel] / c.factor
        if c.kind in ("speedup_rows", "shrink_bubble", "drop_rows", "remove_wasted_rows", "remove_kernels",
                      "fuse_kernels"):
            sel = dev & np.isin(g.rows, np.asarray(c.rows, dtype=np.int64))
            dur[sel] = dur[sel] / c.factor if c.kind in ("speedup_rows", "shrink_bubble") else 0.0
            if c.kind in ("remove_kernels", "fuse_kernels"):  # their launches go too (the calls' own time), but
                # not a graph replay's call, which launched other work as well
                launch_gone[g.launch[sel & g.own_launch]] = True
    if "remove_straggler_wait" in kinds:
        dur = dur - g.comm_wait
    # the host gap before a call: data loading + checkpointing + compiling + allocator spans + the thread's own CPU
    # work + the time it waited for another thread (idle)
    cpu = g.cpu_work_us
    # the profiler's own cost taken off the host: its work, its calls' own time and a blocking call's own cost
    unprofiled = float(np.prod([c.factor for c in changes if c.kind == "unprofiled_host"]))
    for c in changes:  # only work gets faster; a wait for another thread moves with that thread
        if c.kind in ("host_speedup", "unprofiled_host"):
            cpu = cpu / c.factor
    if unprofiled != 1.0:
        calls = g.is_host & ~g.is_alloc & (g.block_class == NOT_BLOCKING)
        dur[calls] = dur[calls] / unprofiled
    untraced_gone = np.zeros(n, bool)  # remove_host_work: gaps whose untraced time (no op, no wait) goes too
    for c in changes:
        if c.kind == "remove_host_work":
            sel = g.is_host & np.isin(g.rows, np.asarray(c.rows, dtype=np.int64))
            cpu = cpu - np.where(sel, work_beyond_dispatch_us(g, cpu), 0.0)
            untraced_gone |= sel
    fused_launch = g.small_launch if "graph_small_kernels" in kinds else np.zeros(n, bool)
    for c in changes:
        if c.kind == "fuse_optimizer":
            # the per-tensor ops go with their launches: a foreach or fused optimizer does their work in a few ops
            loop = g.small_launch & np.isin(g.rows, np.asarray(c.rows, dtype=np.int64))
            cpu = np.where(loop, 0.0, cpu)
            fused_launch = fused_launch | loop
    graphed = g.kernel_launch if "graph_launches" in kinds else fused_launch if fused_launch.any() else None
    if graphed is not None:
        # a graphed launch costs neither the call nor the op's usual dispatch before it (other host work stays, and
        # so does an outlier call's wait: Graph.launch_call_us)
        cpu = cpu - dispatch_taken(g, cpu, graphed)
        dur[graphed & ~launch_gone] -= g.launch_call_us[graphed & ~launch_gone]
    dur[launch_gone] = np.maximum(dur[launch_gone] - g.launch_call_us[launch_gone], 0.0)
    for c in changes:
        if c.kind == "usual_launch_calls":  # (a graphed or removed launch has no call left to make faster)
            slow = (g.is_host & np.isin(g.rows, np.asarray(c.rows, dtype=np.int64)) & ~launch_gone
                    & (g.launch_call_us > c.factor) & (~graphed if graphed is not None else True))
            dur[slow] -= g.launch_call_us[slow] - c.factor
    fused = ~g.is_host & (g.launch >= 0) & fused_launch[np.clip(g.launch, 0, None)]
    any_fused = bool(fused.any())
    lag = g.lag
    if any_fused:  # fused into their neighbours, tiny kernels also stop paying their fixed device cost
        floor_part, gap_part = fused_fixed_cost_us(g, dur, g.lag, fused)
        dur, lag = dur - floor_part, g.lag - gap_part
    unread = np.zeros(n, bool)  # removed syncs whose read goes with them (made inside aten::item, .cpu(), ...)
    for c in changes:
        if c.kind == "remove_syncs":
            gone = (g.syncop_site >= 0) & ((g.syncop_site == c.site) if c.site >= 0 else True)
            cpu = cpu - np.where(gone, g.gap_syncop, 0.0)
            unread |= g.in_syncop & (g.block_class == BLOCK_SYNC) & ((g.sync_site == c.site) if c.site >= 0 else True)
    cpu = np.maximum(cpu, 0.0)
    # after the wait for another thread the thread works before its call (host_dep_work, part of the kept lag): that
    # work shrinks in the same proportion as the gap's work (where in the gap the removed work sat the trace does
    # not say), so the lag does too
    own = g.cpu_work_us
    kept = np.divide(cpu, own, out=np.ones(n), where=own > 0)
    dep_lag = g.host_dep_lag - g.host_dep_work * (1.0 - np.minimum(kept, 1.0))
    # an idle gap is a wait for another thread (host_dep), not CPU work: it shrinks when that thread moves; one
    # with no such call to wait for (-1) stays as it was observed
    cpu = cpu + g.gap_idle * ((g.host_dep < 0) & ~untraced_gone)
    gap = cpu + (0.0 if "remove_data_wait" in kinds else g.gap_dataloader) + \
        (0.0 if "remove_checkpoint_wait" in kinds else g.gap_checkpoint) + \
        (0.0 if "remove_compile_wait" in kinds else g.gap_compile) + \
        (0.0 if "remove_gc_wait" in kinds else g.gap_gc) + \
        (0.0 if "remove_allocator" in kinds else g.gap_allocator)
    if "remove_allocator" in kinds:
        dur[g.is_alloc] = 0.0
    unblocked = np.zeros(n, bool)
    for c in changes:
        if c.kind == "remove_spans":
            cut, inside = spans_cut(g, c.spans)
            gap = np.maximum(gap - cut, 0.0)
            launched = np.clip(g.launch, 0, None)
            gone = inside | (~g.is_host & (g.launch >= 0) & inside[launched])
            # a collective not made does not make a late rank arrive sooner: its measured wait for one stays (as
            # overlap_comm's), for the next collective to wait out
            dur[gone] = np.where(g.category[gone] == COMMUNICATION, np.minimum(g.comm_wait[gone], dur[gone]), 0.0)
            unblocked |= inside  # a sync made inside a span is not made: it waits for nothing
    for c in changes:
        if c.kind == "remove_syncs":
            unblocked |= (g.block_class == BLOCK_SYNC) & ((g.sync_site == c.site) if c.site >= 0 else True)
        elif c.kind == "unblock_pageable_copies":
            unblocked |= g.block_class == BLOCK_PAGEABLE
            # from pinned memory the copy runs at the link's rate (a copy already faster keeps its time, one of
            # unknown size too)
            sel = g.pageable_copy
            dur[sel] = pinned_copy_us(dur[sel], g.copy_bytes[sel], c.factor)
    overlap = "overlap_comm" in kinds
    comm = g.category == COMMUNICATION
    # overlap_comm with rows: only those collectives are overlapped (a pipeline stage's other collectives beside its
    # send/recv, which pipeline_bubble prices); syncs that waited for one of the others keep waiting for it
    only = [c.rows for c in changes if c.kind == "overlap_comm" and c.rows]
    restricted = overlap and len(only) == sum(c.kind == "overlap_comm" for c in changes)
    if restricted:
        comm = comm & np.isin(g.rows, np.concatenate([np.asarray(r, dtype=np.int64) for r in only]))
    # overlapping hides a collective's transfer, not its wait for a late rank: that rank's data arrives when it
    # arrives, and what needs it (the optimizer after DDP's last bucket, the step's end) waits for it whatever else
    # runs meanwhile. A collective that waited for another rank (measured across ranks) keeps its place for that wait,
    # its transfer gone; the others leave the critical path. Equal ranks whose jitter made them wait ~2 % of the step
    # (under the load-imbalance bar) had that wait credited to overlapping, ranked above the step's real cost
    # (benchmarks/slow_ranks_jobs.py, the "equal" jobs). With remove_straggler_wait the wait is gone too.
    waited = comm & (g.comm_wait > 0) if overlap and "remove_straggler_wait" not in kinds else np.zeros(n, bool)
    moved = comm & ~waited  # the collectives overlapping takes off the critical path
    if waited.any() or restricted:
        dur = np.where(waited, np.minimum(g.comm_wait, dur), dur)
        stream_prev = np.where(~moved, _previous_kept(g.stream_prev, moved), g.stream_prev)
    else:
        stream_prev = np.where(~comm, g.stream_prev_nc, g.stream_prev) if overlap else g.stream_prev
    sync_on = g.sync_on_nc if overlap else g.sync_on
    if restricted:  # only a sync that waited for an overlapped collective stops waiting for it
        sync_on = np.where((g.sync_on >= 0) & moved[np.clip(g.sync_on, 0, None)], g.sync_on_nc, g.sync_on)
    # a sync that waited for a collective that keeps its wait waits for that too (besides the other work it waited for)
    also_on = np.where((g.sync_on >= 0) & waited[np.clip(g.sync_on, 0, None)], g.sync_on, -1)
    dep_on = np.clip(g.dep, 0, None)
    dep = np.where((g.dep >= 0) & overlap & moved[dep_on], -1, g.dep)
    # plain Python lists: element access in the loop below is ~3x faster than on NumPy arrays
    S_, E_, bind_ = S.tolist(), E.tolist(), bind.tolist()
    gone = [np.asarray(c.rows, dtype=np.int64) for c in changes if c.kind == "remove_lags"]
    if gone or any_fused:
        lag_ = (np.where(~g.is_host & np.isin(g.rows, np.concatenate(gone)), 0.0, lag) if gone else lag).tolist()
    else:
        lag_ = g.as_list("lag")
    dur_, gap_, lat_ = dur.tolist(), gap.tolist(), g.as_list("lat")
    host_, hprev_, sprev_ = g.as_list("is_host"), g.as_list("host_prev"), stream_prev.tolist()
    launch_, dep_, is_sync_ = g.as_list("launch"), dep.tolist(), g.as_list("is_sync")
    hdep_, hlag_ = g.as_list("host_dep"), dep_lag.tolist()
    sync_on_, also_on_, tail_ = sync_on.tolist(), also_on.tolist(), g.as_list("sync_tail")
    base_ = (np.where(unread, 0.0, g.sync_base) / unprofiled).tolist()
    unblocked_ = unblocked.tolist()
    pending = [False] * n  # syncs whose end waits for device work not yet replayed
    floor_ = _arrival_floor(g, changes)

    def finish_sync(i: int) -> None:
        # a sync ends when the device work it waited for ends; by the time anything needs its end
        # (the next call on its thread, observed after the sync ended) that work has been replayed
        k, k2 = sync_on_[i], also_on_[i]
        base = min(base_[i], dur_[i])
        E_[i] = S_[i] + base
        if not unblocked_[i]:
            for j in (k, k2):
                if j >= 0:
                    E_[i] = max(E_[i], E_[j] + tail_[i])
        pending[i] = False

    neg_inf = float("-inf")
    for i in g.as_list("order"):
        if host_[i]:
            p = hprev_[i]
            if p >= 0:
                if pending[p]:
                    finish_sync(p)
                S_[i] = E_[p] + gap_[i]
                bind_[i] = p
            d = hdep_[i]
            if d >= 0:
                if pending[d]:
                    finish_sync(d)
                if p < 0 or E_[d] + hlag_[i] > S_[i]:
                    S_[i] = E_[d] + hlag_[i]
                    bind_[i] = d
            E_[i] = S_[i] + dur_[i]
            if is_sync_[i]:
                pending[i] = True
        else:
            c, b = neg_inf, -1
            L = launch_[i]
            if L >= 0:
                c, b = S_[L] + lat_[i], L
            p = sprev_[i]
            if p >= 0 and E_[p] > c:
                c, b = E_[p], p
            d = dep_[i]
            if d >= 0 and E_[d] > c:
                c, b = E_[d], d
            if c > neg_inf:
                S_[i] = c + lag_[i]
                bind_[i] = b
            E_[i] = S_[i] + dur_[i]
            if floor_ is not None and floor_[i] > E_[i]:  # the data arrives when the stage before sends it
                E_[i] = floor_[i]
    for i in [j for j in range(n) if pending[j]]:
        finish_sync(i)
    S, E, bind = np.array(S_, dtype=float), np.array(E_, dtype=float), np.array(bind_, dtype=np.int64)
    return Replay(S, E, bind)


def critical_path(g: Graph, r: Replay) -> dict[str, float]:
    """Time on the critical path (walked back from the last end) by kind of work, µs.

    Buckets: cpu (host work between calls), dataloader, checkpoint, compile, gc (Python's garbage collector),
    allocator (allocator calls and spans), runtime (other launch/API calls), sync_wait (host blocked in a sync),
    comm_wait (in a sync that waited for a collective), pageable_copy (host blocked in a host-to-device copy),
    queue_wait (in a call that waited for a slot in the full launch queue), launch_latency, kernel:<category>,
    wait_for_rank_<r> (inside a collective, waiting for rank r), lag (start delays the trace shows but no dependency
    explains)."""
    out: dict[str, float] = {}

    def add(k, v):
        if v > 0:
            out[k] = out.get(k, 0.0) + float(v)

    def before_host_call(j: int) -> int:
        # the host time between call j and its binding predecessor: data loading, the rest CPU work
        p = int(r.binding[j])
        if p >= 0 and p == g.host_dep[j]:  # waited for another thread: that thread's work is the path
            add("cpu", r.start[j] - r.end[p])
        elif p >= 0:
            left = r.start[j] - r.end[p]
            for bucket, part in (("dataloader", g.gap_dataloader[j]), ("checkpoint", g.gap_checkpoint[j]),
                                 ("compile", g.gap_compile[j]), ("gc", g.gap_gc[j]),
                                 ("allocator", g.gap_allocator[j])):
                v = min(part, left)
                add(bucket, v)
                left -= v
            add("cpu", left)
        return p

    if r.end.size == 0:
        return out
    i = int(np.argmax(r.end))
    t_cursor = r.end[i]
    seen = 0
    while i >= 0 and seen < 10 * r.end.size:
        seen += 1
        if g.is_host[i]:
            own = r.end[i] - r.start[i]
            k = g.sync_on[i]
            if g.is_sync[i] and k >= 0 and r.end[k] + g.sync_tail[i] >= r.end[i] - 1e-9 and \
                    r.end[k] + g.sync_tail[i] > r.start[i] + g.sync_base[i]:
                add({BLOCK_PAGEABLE: "pageable_copy", BLOCK_COMM: "comm_wait",
                     BLOCK_QUEUE: "queue_wait"}.get(int(g.block_class[i]), "sync_wait"),
                    r.end[i] - max(r.start[i], r.start[g.sync_on[i]]))
                t_cursor = max(r.start[i], r.start[g.sync_on[i]])
                i = int(g.sync_on[i])  # follow the device work the host waited for
            else:
                add("allocator" if g.is_alloc[i] else "runtime", own)
                i = before_host_call(i)
                continue
        if not g.is_host[i]:
            e = min(r.end[i], t_cursor)
            dur = e - r.start[i]
            cw = min(g.comm_wait[i], dur)
            add(f"wait_for_rank_{g.comm_wait_rank[i]}", cw)
            c = int(g.category[i])
            add("kernel:" + (CATEGORY_NAMES[c] if c >= 0 else "other"), dur - cw)
            b = int(r.binding[i])
            if b < 0:
                break
            add("lag", g.lag[i])
            if g.is_host[b]:
                add("launch_latency", r.start[i] - g.lag[i] - r.start[b])
                t_cursor = r.start[b]
                # continue from the launch call: its start was set by the host chain
                i = before_host_call(b)
            else:  # stream order or a cross-stream wait: continue on the predecessor
                t_cursor = r.start[i] - g.lag[i]
                i = b
    return out
