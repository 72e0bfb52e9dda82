"""Trace diff: what changed between a baseline and a candidate run, per training step.

Each side's step is decomposed by a sweep over its wall clock. Every instant of a step
(ProfilerStep#N span until the device has run the work launched in it; a last step cut short is dropped; the first
starts once the device is done with work launched before it, a warm-up's queue) goes to exactly one bucket, by tier:
1. compute, by kernel class (gemm, attention, elementwise, ...): time when a compute kernel runs,
   split evenly among the classes running at that instant;
2. communication: collectives running with no compute under them (exposed);
3. memcpy by direction and memory kind ("memcpy DtoH (Device -> Pageable)"), then memset;
4. GPU idle, by cause. When the op that ends the gap was launched before the gap began, the device
   idles with work queued: ``idle: kernel gaps`` when the gap is under 30 µs (the device's own
   overhead between back-to-back kernels), else ``idle: other`` (a stream or cross-rank dependency
   the trace does not show). Otherwise it waits
   for the host's launch: the gap (up to that op's start) is charged to what the host did between
   its previous launch and this one - DataLoader, checkpoint saving, allocator calls, syncs, in this
   order, each up to its host time there (removing it would have moved the launch that much
   earlier) - and the rest to ``idle: host`` (launch-bound).
In a diff, a gap of ``idle: other`` on one side is looked up on the other (infer_comm_waits): the queued op
that ends it, matched by stream, name and occurrence, waited there too (from launched with its stream free to
its start); where a collective ran through that wait, the op depends on the collective, and the gap, up to
that wait's length, is ``idle: communication`` (the dependency exposed, e.g. a collective serialised so that
nothing runs while the stream waits).
A trace without device events (CPU training) is split by what the host does instead: DataLoader,
checkpoint, allocator, sync, communication (the training loop blocked while a collective is open, doing no
work of its own), optimizer, other ("host: ..." buckets).
With several ranks a step lasts as long as its slowest rank's (a synchronous job moves at that pace); a
faster rank's shortfall is its ``idle: slower rank``, and the buckets are averaged over ranks.
So the buckets of a step add up to its time exactly, and the buckets' per-step deltas add up to
the step-time delta. ``explained_pct`` is the share of that delta that lands in named buckets
(everything but ``idle: other``, whose cause neither trace shows).
Per-name figures (kernels, operators) are summed over the events launched in the kept steps and
averaged per step and per rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainperf.diagnose.contention import computation_beside_communication
from trainperf.diagnose.device_clock import with_device_clocks_aligned
from trainperf.diagnose.host import (ALLOCATOR_RUNTIME_RE, ALLOCATOR_SPAN_RE, CHECKPOINT_RE, COMPILE_RE,
                                     DATALOADER_RE, GC_RE, OPTIMIZER_RE, SYNC_OP_RE, SYNC_RUNTIME_RE)
from trainperf.diagnose.memory import GIB, DeviceMemory, highest_peak, memory_between
from trainperf.diagnose.roofline import roofline
from trainperf.diagnose.diff_compute import compute_change, compute_change_json, compute_change_note
from trainperf.diagnose.slow_work import RankWork, WorkComparison, host_steps_work, steps_work, waits_left_out
from trainperf.diagnose.step_flops import model_flop_rows
from trainperf.diagnose.window import device_mask, launched_before_trace
from trainperf.errors import TrainperfError
from trainperf.trace.annotate import STEP_RE, correlated_host_row, step_rows, step_spans
from trainperf.trace.events import (CAT_MEMCPY, CAT_MEMSET, CATEGORY_NAMES, COMMUNICATION, CPU_OP, PYTHON,
                                    RUNTIME, USER_ANNOTATION, EventTable)
from trainperf.diagnose.units import fmt_us, short_name
from trainperf.trace.load import load_trace

# HTA drops the last ProfilerStep as possibly cut short. In the multi-step traces of ../shared (trace_filter,
# nccl_parser_config, negative_queue, df_index_resolver) the last step is 0.975-1.04x the others: complete.
# A cut step (a loop's final prof.step() opening a span that closes at the profiler's exit) holds
# only the loop's tail: far shorter. Half the median leaves a wide margin on both sides.
LAST_STEP_MIN_FRACTION = 0.5
IDLE_OTHER = "idle: other"
IDLE_COMM = "idle: communication"
IDLE_SLOWER_RANK = "idle: slower rank"
# A queued op that starts less than this after the device went idle: the device's own gap between
# back-to-back kernels (HTA's "kernel wait", its consecutive_kernel_delay default of 30 µs).
KERNEL_GAP_US = 30.0
HEADLINE_NAME_SHARE = 0.1  # a new or gone name enters the headline when it carries this share of the change
COMM = "communication"
MEMSET = "memset"
HOST_KINDS = {CPU_OP: "operator", USER_ANNOTATION: "annotation", RUNTIME: "runtime", PYTHON: "python"}


@dataclass(kw_only=True, slots=True)
class NameStat:
    """One kernel or operator name on one side: time and count per step (µs, per rank)."""

    category: str
    time_us: float
    count: float


@dataclass(kw_only=True)
class StepProfile:
    """One side of a diff: per-step times and their decomposition (µs, averaged over ranks)."""

    source: str
    ranks: list[int]
    steps: list[int]
    step_times_us: np.ndarray                 # per kept step (host span + device tail), the slowest rank's
    breakdown_us: dict[str, float]            # bucket -> µs per step, mean over ranks; sums to step_times_us.mean()
    kernels: dict[str, NameStat]              # device events (kernels, memcpy, memset) by name
    operators: dict[str, NameStat]            # host events (cpu_op, annotations, runtime calls) by name
    notes: list[str] = field(default_factory=list)
    # the device memory over the kept steps from the allocator's samples (profile_memory=True; diagnose/memory.py):
    # the rank with the highest reserved peak; None where no rank has samples
    memory: DeviceMemory | None = None
    # the matrix products', convolutions' and attention's FLOPs a step from the recorded shapes
    # (diagnose/step_flops.py), mean over the ranks that have them; None where none does (no record_shapes)
    flops_per_step: float | None = None
    # each rank's computation kernels over the kept steps, keyed by operator and shapes (slow_work.steps_work): what
    # the two sides' computation is compared on, operation by operation; without device events, its training thread's
    # own time instead (slow_work.host_steps_work; work_on_host)
    work: list[RankWork] = field(default_factory=list)
    work_on_host: bool = False
    # the computation kernels' time over the kept steps, summed over ranks, and of it the part run beside a collective
    # of their own device (contention.computation_beside_communication), µs
    computation_us: float = 0.0
    computation_beside_comm_us: float = 0.0

    @property
    def beside_comm_pct(self) -> float:
        """The share of the computation run beside a collective (%; 0 without computation)."""
        return 100.0 * self.computation_beside_comm_us / self.computation_us if self.computation_us > 0 else 0.0

    @property
    def mean_us(self) -> float:
        """Mean step time (µs)."""
        return float(self.step_times_us.mean())

    @property
    def median_us(self) -> float:
        """Median step time (µs)."""
        return float(np.median(self.step_times_us))


def median_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval of the median (order statistics of a Binomial(n, 1/2)); (min, max)
    when n is too small for the level."""
    from scipy.stats import binom

    s = np.sort(np.asarray(x, dtype=float))
    n = s.size
    if n == 0:
        return float("nan"), float("nan")
    k = int(binom.ppf((1 - level) / 2, n, 0.5))  # P(B < k) <= (1-level)/2
    while k > 0 and binom.cdf(k - 1, n, 0.5) > (1 - level) / 2:
        k -= 1
    if k <= 0:
        return float(s[0]), float(s[-1])
    return float(s[k - 1]), float(s[n - k])


def _covered(mids: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Which points lie inside the union of [start, end) intervals."""
    if start.size == 0:
        return np.zeros(mids.size, dtype=bool)
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    i = np.searchsorted(s, mids, side="right") - 1
    ok = i >= 0
    ok[ok] = mids[ok] < e[i[ok]]
    return ok


def _last_end_before(points: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each point, the latest end among intervals that started before it (-inf if none)."""
    if start.size == 0:
        return np.full(points.size, -np.inf)
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    i = np.searchsorted(s, points, side="right") - 1
    return np.where(i >= 0, e[np.clip(i, 0, None)], -np.inf)


def _union_length(start: np.ndarray, end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each window [a, b), the length of it covered by the union of the [start, end) intervals."""
    if start.size == 0:
        return np.zeros(np.shape(a))
    o = np.argsort(start, kind="stable")
    s, e = start[o], np.maximum.accumulate(end[o])
    keep = np.r_[True, s[1:] > e[:-1]]  # merge: a new interval starts after all before it ended
    first = np.flatnonzero(keep)
    ms, me = s[first], np.r_[e[first[1:] - 1], e[-1]]
    cum = np.r_[0.0, np.cumsum(me - ms)]

    def before(x):  # covered length of (-inf, x)
        k = np.searchsorted(ms, x, side="right")
        return cum[k] - np.where(k > 0, np.maximum(me[np.clip(k - 1, 0, None)] - x, 0.0), 0.0)

    return np.maximum(before(b) - before(a), 0.0)


def device_label(t: EventTable, row: int) -> str:
    """Decomposition bucket of one device event: its kernel class, communication, memcpy kind, memset."""
    c = int(t.category[row])
    if c == COMMUNICATION:
        return COMM
    if c == CAT_MEMSET:
        return MEMSET
    if c == CAT_MEMCPY:
        name = t.names[int(t.name[row])]
        return "memcpy " + (name[len("Memcpy "):] if name.startswith("Memcpy ") else "other")
    return "compute: " + CATEGORY_NAMES[c if c >= 0 else len(CATEGORY_NAMES) - 1]


def _host_rows(t: EventTable, patterns_kinds) -> np.ndarray:
    rows = []
    for pattern, kinds in patterns_kinds:
        ids = t.ids_matching(pattern.search)
        rows.append(np.flatnonzero(np.isin(t.name, ids) & np.isin(t.kind, kinds)))
    return np.unique(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)


def _host_comm_rows(t: EventTable) -> tuple[np.ndarray, np.ndarray]:
    """(rows during which a collective is open, rows of the training loop's own work) of a host-only trace.

    Open: the c10d calls on any host thread and gloo's own spans (its worker threads run the transfer and
    the wait for the other ranks). Own work: the loop thread's (the stepping thread's) operators other than
    the ones it blocks in for a collective (crossrank.BLOCKING_OP_RE: DDP's forward waiting for its buffer
    broadcast, the autograd engine waiting for the reducer, c10d calls and waits); annotations and Python
    frames wrap waits and work alike and are not work. A gloo all-reduce that
    runs while backward computes is overlapped, not waited for; one the loop sits in, with nothing of its
    own running, is the step waiting on communication (for a slower rank, or the transfer itself)."""
    from trainperf.diagnose.crossrank import BLOCKING_OP_RE, COLLECTIVE_CALL_RE, GLOO_SPAN_PREFIX

    host = ~t.on_device & (t.dur_ns > 0)
    comm_ids = t.ids_matching(lambda n: n.startswith(GLOO_SPAN_PREFIX) or bool(COLLECTIVE_CALL_RE.search(n)))
    comm_open = np.flatnonzero(host & np.isin(t.name, comm_ids))
    srows, _ = step_rows(t)
    if srows.size == 0 or comm_open.size == 0:
        return comm_open, np.zeros(0, dtype=np.int64)
    loop = (t.pid == t.pid[srows[0]]) & (t.tid == t.tid[srows[0]])
    waits = t.ids_matching(lambda n: bool(BLOCKING_OP_RE.search(n) or COLLECTIVE_CALL_RE.search(n)
                                          or STEP_RE.match(n)))
    own = np.flatnonzero(host & loop & (t.kind == CPU_OP) & ~np.isin(t.name, waits))
    return comm_open, own


def _kept_steps(t: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, start µs, end µs) of the steps a diff uses: every ProfilerStep but a last one cut
    short (the span the profiler opens at its last step() and closes when it stops), or the whole
    trace as one step -1 without them.

    A step ends when both its host span has ended and the device has finished the work launched in
    it: where the host runs ahead of the device (a deep launch queue), the host spans are short at
    first and the device tail comes after the last one; these boundaries give every step its
    device work, and the mean step time is the run's throughput in both regimes."""
    steps, a, b = step_spans(t)
    if steps.size >= 2 and (b[-1] - a[-1]) < LAST_STEP_MIN_FRACTION * np.median(b[:-1] - a[:-1]):
        steps, a, b = steps[:-1], a[:-1], b[:-1]
    if steps.size == 0:
        return np.array([-1]), np.array([t.ts_ns.min() / 1e3]), np.array([t.end_ns.max() / 1e3])
    dev = np.flatnonzero(t.on_device & (t.step >= 0))
    tail = np.full(steps.size, -np.inf)  # end of the last device op launched in each step (ns)
    order = np.argsort(steps, kind="stable")
    pos = np.searchsorted(steps[order], t.step[dev])
    ok = pos < steps.size
    ok[ok] = steps[order][pos[ok]] == t.step[dev][ok]
    np.maximum.at(tail, order[pos[ok]], t.end_ns[dev][ok].astype(float))
    ends = np.maximum(b, tail)  # ns
    starts = a.astype(float).copy()
    starts[0] = min(max(starts[0], _busy_before_ns(t, a[0])), ends[0])
    starts[1:] = np.maximum(a[1:], ends[:-1])
    starts = np.maximum.accumulate(starts)
    ends[:-1] = starts[1:]
    return steps, starts / 1e3, ends / 1e3


def _busy_before_ns(t: EventTable, first_step_ns: int) -> float:
    """When the device finishes the work launched before the first kept step began (ns; -inf when none): work of
    earlier steps, or launched before the trace did (window.launched_before_trace). A GPU-bound loop profiled after
    its warm-up steps finds the device still running their queue: the first step starts when that work ends, as each
    later step starts when the one before it ends, or it holds an extra step's work (an H200 fp32 loop's first step
    read 477 ms, two steps' GEMMs, beside 244-ms steps)."""
    dev = np.flatnonzero(t.on_device)
    if not dev.size:
        return float("-inf")
    link = correlated_host_row(t)[dev]
    earlier = ((link >= 0) & (t.ts_ns[np.clip(link, 0, None)] < first_step_ns)) | launched_before_trace(t, dev)
    return float(t.end_ns[dev[earlier]].max()) if earlier.any() else float("-inf")


@dataclass(kw_only=True)
class RankSweep:
    """One rank's steps at the resolution of the sweep: each instant (the span between two consecutive cut
    points: event starts and ends, launches, step bounds) and the µs of it each bucket holds."""

    steps: np.ndarray             # kept step numbers
    span_us: np.ndarray           # their durations (µs)
    k: np.ndarray                 # per instant: index into steps
    mids: np.ndarray              # per instant: its midpoint (µs), ascending
    dt: np.ndarray                # per instant: its length (µs)
    comm_on: np.ndarray           # per instant: a collective runs (under compute or not)
    share: dict[str, np.ndarray]  # bucket -> µs of each instant; an instant's buckets add up to its length
    gap_op: np.ndarray            # per instant of "idle: other": row of the queued op that ends the gap, else -1
    gap_us: np.ndarray            # per instant of "idle: other": length of that gap (µs), else 0
    ready_us: np.ndarray          # per row: when a device op was launched with its stream free (µs), else nan
    op_rows: dict[tuple, int] = field(default_factory=dict)  # (stream, name, n-th on that stream) -> row

    def per_step(self) -> dict[str, np.ndarray]:
        """bucket -> µs per kept step."""
        return {l: np.bincount(self.k, weights=v, minlength=self.steps.size) for l, v in self.share.items()}

    def comm_us(self, a: float, b: float) -> float:
        """µs of [a, b) (two cut points of this sweep) during which a collective runs."""
        if not b > a:
            return 0.0
        i, j = np.searchsorted(self.mids, [a, b])
        return float(self.dt[i:j][self.comm_on[i:j]].sum())


def _op_rows(t: EventTable, rows: np.ndarray) -> dict[tuple, int]:
    """(stream, name, n) -> row of the n-th op of that name on that stream (rows taken in start order):
    the key of the same op on both sides of a diff of one program."""
    seen: dict[tuple, int] = {}
    out = {}
    for r in rows[np.argsort(t.ts_ns[rows], kind="stable")]:
        key = (int(t.stream[r]), int(t.name[r]))
        n = seen.get(key, 0)
        seen[key] = n + 1
        out[(key[0], t.names[key[1]], n)] = int(r)
    return out


def _ready_us(t: EventTable, dev: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per row: when each device op could have started on its own stream - launched, and the previous op of
    its stream done (µs); nan for other rows. A later start waits on something off the stream."""
    out = np.full(len(t), np.nan)
    ts, end = t.ts_ns[dev] / 1e3, t.end_ns[dev] / 1e3
    for s in np.unique(t.stream[dev]):
        m = np.flatnonzero(t.stream[dev] == s)
        m = m[np.argsort(ts[m], kind="stable")]
        prev_end = np.r_[-np.inf, np.maximum.accumulate(end[m])[:-1]]
        out[dev[m]] = np.maximum(launch[m], prev_end)
    return out


def rank_sweep(t: EventTable) -> RankSweep:
    """Decompose one rank's kept steps instant by instant (the tiers of the module docstring)."""
    steps, s0, s1 = _kept_steps(t)
    dev = np.flatnonzero(t.on_device)
    ts, end = t.ts_ns / 1e3, t.end_ns / 1e3
    labels = np.array([device_label(t, int(r)) for r in dev], dtype=object) if dev.size else np.zeros(0, object)
    link = correlated_host_row(t)
    launch = np.where(link[dev] >= 0, ts[np.clip(link[dev], 0, None)], -np.inf) if dev.size else np.zeros(0)
    dl = _host_rows(t, [(DATALOADER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))])
    alloc = _host_rows(t, [(ALLOCATOR_RUNTIME_RE, (RUNTIME,)), (ALLOCATOR_SPAN_RE, (USER_ANNOTATION, CPU_OP, PYTHON,
                                                                                   RUNTIME))])
    sync = _host_rows(t, [(SYNC_RUNTIME_RE, (RUNTIME,)), (SYNC_OP_RE, (CPU_OP,))])
    ckpt = _host_rows(t, [(CHECKPOINT_RE, (USER_ANNOTATION, CPU_OP, PYTHON))])
    comp = _host_rows(t, [(COMPILE_RE, (USER_ANNOTATION, CPU_OP, PYTHON))])
    gc = _host_rows(t, [(GC_RE, (PYTHON,))])
    lo, hi = s0.min(), s1.max()
    optim = _host_rows(t, [(OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))])
    host_causes = (("host: dataloader", dl), ("host: checkpoint", ckpt), ("host: compile", comp), ("host: gc", gc),
                   ("host: allocator", alloc), ("host: sync", sync), ("host: optimizer", optim))
    cuts = [s0, s1, ts[dev], end[dev], launch[np.isfinite(launch)]]
    if dev.size == 0:  # a host-only trace (CPU training): the step is split by what the host does
        comm_open, own_work = _host_comm_rows(t)
        cuts += [x for _, rows in host_causes for x in (ts[rows], end[rows])]
        cuts += [ts[comm_open], end[comm_open], ts[own_work], end[own_work]]
    cuts = np.unique(np.clip(np.concatenate(cuts), lo, hi))
    mids, dt = (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)
    k = np.searchsorted(s0, mids, side="right") - 1
    in_step = (k >= 0) & (mids < s1[np.clip(k, 0, None)])
    mids, dt, k = mids[in_step], dt[in_step], k[in_step]
    if dev.size == 0:
        free = np.ones(mids.size, dtype=bool)
        share = {}
        # the training loop blocked on a collective: one is open and the loop thread does no work of its own
        comm = _covered(mids, ts[comm_open], end[comm_open]) & ~_covered(mids, ts[own_work], end[own_work])
        for label, take in [(lb, _covered(mids, ts[rows], end[rows])) for lb, rows in host_causes[:-1]] + [
                ("host: communication", comm)] + [(host_causes[-1][0], _covered(mids, ts[host_causes[-1][1]],
                                                                                  end[host_causes[-1][1]]))]:
            take = free & take
            share[label] = np.where(take, dt, 0.0)
            free &= ~take
        share["host: other"] = np.where(free, dt, 0.0)
        return RankSweep(steps=steps, span_us=s1 - s0, k=k, mids=mids, dt=dt, comm_on=np.zeros(mids.size, bool),
                         share=share, gap_op=np.full(mids.size, -1), gap_us=np.zeros(mids.size),
                         ready_us=np.full(len(t), np.nan))

    share: dict[str, np.ndarray] = {}
    free = np.ones(mids.size, dtype=bool)  # no bucket of a higher tier holds the instant yet
    tiers = ([l for l in sorted(set(labels)) if l.startswith("compute: ")], [COMM],
             [l for l in sorted(set(labels)) if l.startswith("memcpy ")], [MEMSET])
    for tier in tiers:
        active = {l: _covered(mids, ts[dev][labels == l], end[dev][labels == l]) & free for l in tier}
        n = sum(a.astype(np.int32) for a in active.values()) if active else np.zeros(mids.size, np.int32)
        for l, a in active.items():
            share[l] = np.where(a, dt / np.maximum(n, 1), 0.0)
        free &= n == 0
    # idle gaps: work queued before the device went idle that does not start is "other"; otherwise the
    # device waits for the host's next launch, and the gap (up to that op's start, launch latency
    # included) is charged to what the host did since its previous launch
    o = np.argsort(ts[dev], kind="stable")
    dev_start, dev_launch = ts[dev][o], launch[o]
    j = np.searchsorted(dev_start, mids, side="left")
    has_next = j < dev_start.size
    jj = np.clip(j, 0, dev_start.size - 1)
    nxt = np.where(has_next, dev_start[jj], hi)
    lau = np.where(has_next, dev_launch[jj], hi)
    lau = np.where(np.isfinite(lau), lau, nxt)
    gap_start = np.maximum(_last_end_before(mids, ts[dev], end[dev]), lo)
    queued = free & (lau <= gap_start)  # launched before the device went idle, yet not started
    short = (nxt - gap_start) < KERNEL_GAP_US
    share["idle: kernel gaps"] = np.where(queued & short, dt, 0.0)
    share[IDLE_OTHER] = np.where(queued & ~short, dt, 0.0)
    waiting = free & ~queued  # the gap is the host's late launch (and the launch latency after it)
    launches = np.sort(launch[np.isfinite(launch)])
    i = np.searchsorted(launches, lau, side="left") - 1
    prev_launch = np.where(i >= 0, launches[np.clip(i, 0, None)] if launches.size else lo, lo)
    gap = np.maximum(nxt - gap_start, 1e-9)
    left = gap.copy()
    covered_before = 0.0
    rows = np.zeros(0, dtype=np.int64)
    for label, more in (("idle: dataloader", dl), ("idle: checkpoint", ckpt), ("idle: compile", comp),
                        ("idle: gc", gc), ("idle: allocator", alloc), ("idle: sync", sync)):
        rows = np.concatenate([rows, more])  # this cause and the ones ranked before it
        cov = _union_length(ts[rows], end[rows], prev_launch, lau)
        amount = np.minimum(np.maximum(cov - covered_before, 0.0), left)
        share[label] = np.where(waiting, dt * amount / gap, 0.0)
        left -= amount
        covered_before = cov
    share["idle: host"] = np.where(waiting, dt * left / gap, 0.0)
    other = queued & ~short & has_next
    comm_on = _covered(mids, ts[dev][labels == COMM], end[dev][labels == COMM])
    return RankSweep(steps=steps, span_us=s1 - s0, k=k, mids=mids, dt=dt, comm_on=comm_on, share=share,
                     gap_op=np.where(other, dev[o][jj], -1), gap_us=np.where(other, gap, 0.0),
                     ready_us=_ready_us(t, dev, launch), op_rows=_op_rows(t, dev[ts[dev] >= lo]))


def infer_comm_waits(sweep: RankSweep, t: EventTable, other: RankSweep, t_other: EventTable) -> float:
    """Move the "idle: other" of one side that the other side shows to be a wait on a collective to
    "idle: communication" (in place); return the µs moved, summed over the rank's kept steps.

    A gap of "idle: other" ends when a queued op X starts: X waited on something off its stream that the
    trace does not show. The same op X' on the other side (same stream, name and rank of occurrence) waited
    from its ready time (launched, its stream free) to its start too; where a collective ran through that
    wait there (exposed or under another stream's compute), X depends on the collective (DDP's buckets,
    FSDP's gathered parameters: a stream waits on the communication stream's event), and this side's gap
    before X, up to the length of X''s wait and in the share of it the collective ran, is the same
    dependency, exposed now that nothing runs beside it. A gap longer than X''s wait keeps the excess in
    "idle: other"; a wait the other side spent on compute or idle is not moved."""
    rows = np.unique(sweep.gap_op[sweep.gap_op >= 0])
    if rows.size == 0 or not other.comm_on.any():
        return 0.0
    keys = {v: k for k, v in sweep.op_rows.items()}
    gaps = np.zeros(len(t))  # per gap-ending op: its gap (µs)
    np.maximum.at(gaps, sweep.gap_op[sweep.gap_op >= 0], sweep.gap_us[sweep.gap_op >= 0])
    frac = np.zeros(len(t))  # per gap-ending op: share of its gap that was a communication wait
    for r in rows:
        twin = other.op_rows.get(keys.get(int(r), ()))
        if twin is None:
            continue
        a, b = other.ready_us[twin], t_other.ts_ns[twin] / 1e3
        if not b - a >= KERNEL_GAP_US:
            continue
        held = other.comm_us(a, b)  # µs of X''s wait during which a collective ran
        frac[r] = held / (b - a) * min(gaps[r], b - a) / gaps[r]
    f = np.where(sweep.gap_op >= 0, frac[np.clip(sweep.gap_op, 0, None)], 0.0)
    moved = sweep.share[IDLE_OTHER] * f
    sweep.share[IDLE_OTHER] = sweep.share[IDLE_OTHER] - moved
    sweep.share[IDLE_COMM] = sweep.share.get(IDLE_COMM, np.zeros(moved.size)) + moved
    return float(moved.sum())


def rank_breakdown(t: EventTable) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(step numbers, step time µs, {bucket: µs per step}) of one rank; buckets sum to the step time."""
    s = rank_sweep(t)
    return s.steps, s.span_us, s.per_step()


def name_stats(t: EventTable, steps: np.ndarray) -> tuple[dict[str, NameStat], dict[str, NameStat]]:
    """(device names, host names) -> time (µs) and count summed over the given steps (all rows when
    steps is [-1]: a trace without ProfilerSteps). ProfilerStep spans themselves are left out."""
    sel = np.isin(t.step, steps) if steps[0] >= 0 else np.ones(len(t), dtype=bool)
    dur = t.dur_ns / 1e3
    dev = sel & t.on_device
    kernels = _by_name(t, np.flatnonzero(dev), dur, lambda r: device_label(t, r))
    host = sel & np.isin(t.kind, list(HOST_KINDS)) & ~np.isin(t.name, t.ids_matching(lambda s: s.startswith(
        "ProfilerStep")))
    ops = _by_name(t, np.flatnonzero(host), dur, lambda r: HOST_KINDS[int(t.kind[r])])
    return kernels, ops


def _by_name(t: EventTable, rows: np.ndarray, dur: np.ndarray, category) -> dict[str, NameStat]:
    if rows.size == 0:
        return {}
    ids, first, inv = np.unique(t.name[rows], return_index=True, return_inverse=True)
    time = np.bincount(inv.reshape(-1), weights=dur[rows])
    count = np.bincount(inv.reshape(-1))
    return {t.names[int(i)]: NameStat(category=category(int(rows[f])), time_us=float(a), count=float(c))
            for i, f, a, c in zip(ids, first, time, count)}


def step_profile(tables: dict[int, EventTable], source: str = "",
                 sweeps: dict[int, RankSweep] | None = None) -> StepProfile:
    """Decompose the steps of every rank and average them: the steps all ranks share (each rank's
    own when they share none), figures per step and per rank. A shared step lasts as long as its slowest
    rank's; each other rank's shortfall is its bucket "idle: slower rank". sweeps: the ranks' sweeps when already
    made (step_profiles: with the waits the other side of a diff explains)."""
    if not tables:
        raise TrainperfError(f"{source}: no ranks to compare")
    sweeps = sweeps if sweeps is not None else {r: rank_sweep(t) for r, t in tables.items()}
    per_rank = {r: (sw.steps, sw.span_us, sw.per_step()) for r, sw in sweeps.items()}
    common = set.intersection(*[set(map(int, v[0])) for v in per_rank.values()])
    notes = []
    if not any(t.has_gpu for t in tables.values()):
        notes.append(f"{source}: no kernel, memcpy or memset events: the steps are split by host activity")
    if per_rank and all(int(v[0][0]) == -1 for v in per_rank.values()):
        notes.append(f"{source}: no ProfilerStep annotations: the whole trace is one step")
    times, buckets = [], {}
    kernels: dict[str, NameStat] = {}
    ops: dict[str, NameStat] = {}
    kept: set[int] = set()
    flops = []
    work: list[RankWork] = []
    beside_us = computation_us = 0.0
    for r, (steps, span, parts) in per_rank.items():
        keep = np.isin(steps, sorted(common)) if common else np.ones(steps.size, dtype=bool)
        kept |= set(map(int, steps[keep]))
        rows = model_flop_rows(roofline(tables[r], keep=np.isin(tables[r].step, steps[keep])
                                        if steps[0] >= 0 else None))
        if rows:
            flops.append(sum(x.total_flops for x in rows) / max(int(keep.sum()), 1))
        times.append(span[keep])
        for l, v in parts.items():
            buckets.setdefault(l, []).append(v[keep])
        got = steps_work(tables[r], steps[keep]) if tables[r].has_gpu else host_steps_work(tables[r], steps[keep])
        work += [got] if got is not None else []
        if tables[r].has_gpu:
            us = computation_beside_communication(tables[r], steps[keep])
            beside_us, computation_us = beside_us + us[0], computation_us + us[1]
        ks, os_ = name_stats(tables[r], steps[keep])
        for acc, got in ((kernels, ks), (ops, os_)):
            for n, s in got.items():
                a = acc.setdefault(n, NameStat(category=s.category, time_us=0.0, count=0.0))
                a.time_us += s.time_us
                a.count += s.count
    n_rank_steps = sum(x.size for x in times)
    if common:
        # a synchronous job steps at its slowest rank's pace: each rank's step is the slowest one's, the
        # difference is that rank waiting for it (at the next collective; where the trace ends first, unseen)
        step_times = np.max(np.stack(times), axis=0)
        if len(times) > 1:
            buckets[IDLE_SLOWER_RANK] = [step_times - x for x in times]
    else:
        step_times = np.concatenate(times)
        notes.append(f"{source}: the ranks share no ProfilerStep number: steps pooled over ranks")
    breakdown = {l: float(np.concatenate(v).sum() / n_rank_steps) for l, v in buckets.items()}
    for acc in (kernels, ops):
        for s in acc.values():
            s.time_us /= n_rank_steps
            s.count /= n_rank_steps
    on_host = not any(t.has_gpu for t in tables.values())
    return StepProfile(source=source, ranks=sorted(tables), steps=sorted(kept), step_times_us=step_times,
                       breakdown_us=breakdown, kernels=kernels, operators=ops, notes=notes,
                       memory=_peak_memory(tables, sweeps), flops_per_step=float(np.mean(flops)) if flops else None,
                       work=waits_left_out(work) if on_host else work, work_on_host=on_host,
                       computation_us=computation_us, computation_beside_comm_us=beside_us)


def _peak_memory(tables: dict[int, EventTable], sweeps: dict[int, RankSweep]) -> DeviceMemory | None:
    """The DeviceMemory over each rank's kept steps (its sweep's instants, first to last) with the highest reserved
    peak, or None where no rank has allocator samples there."""
    found = {}
    for r, t in tables.items():
        sw = sweeps[r]
        if t.memory is None or not sw.mids.size:
            continue
        lo, hi = float(sw.mids[0] - sw.dt[0] / 2), float(sw.mids[-1] + sw.dt[-1] / 2)
        m = memory_between(t, lo, hi, t.pid[device_mask(t)])
        if m is not None:
            found[r] = m
    highest = highest_peak(found)
    return highest[1] if highest else None


def step_profiles(baseline: dict[int, EventTable], candidate: dict[int, EventTable], baseline_source: str = "",
                  candidate_source: str = "") -> tuple[StepProfile, StepProfile]:
    """Both sides of a diff: each rank's sweep, the "idle: other" of each side that the other side shows to
    be a wait on a collective moved to "idle: communication" (infer_comm_waits; ranks present on both
    sides), then each side's profile."""
    if not baseline or not candidate:
        raise TrainperfError(f"{baseline_source if not baseline else candidate_source}: no ranks to compare")
    a = {r: rank_sweep(t) for r, t in baseline.items()}
    b = {r: rank_sweep(t) for r, t in candidate.items()}
    moved_a = {r: infer_comm_waits(a[r], baseline[r], b[r], candidate[r]) for r in sorted(set(a) & set(b))}
    moved_b = {r: infer_comm_waits(b[r], candidate[r], a[r], baseline[r]) for r in sorted(set(a) & set(b))}
    pa = step_profile(baseline, baseline_source, a)
    pb = step_profile(candidate, candidate_source, b)
    for p, sw, moved, other in ((pa, a, moved_a, candidate_source), (pb, b, moved_b, baseline_source)):
        if sum(moved.values()) > 0:
            per_step = sum(moved.values()) / sum(sw[r].steps.size for r in moved)
            p.notes.append(f"{p.source}: {fmt_us(per_step)} per step and rank of idle with work "
                           f"queued is a wait on a collective, as the same ops' waits in {other or 'the other side'} "
                           "show (idle: communication)")
    return pa, pb


@dataclass(kw_only=True, slots=True)
class Contribution:
    """One kernel or operator name: time and count per step on each side (µs, per rank)."""

    name: str
    category: str
    baseline_us: float
    candidate_us: float
    count_baseline_per_step: float
    count_candidate_per_step: float

    @property
    def delta_us_per_step(self) -> float:
        return self.candidate_us - self.baseline_us

    def to_json(self) -> dict:
        return {"name": self.name, "category": self.category, "delta_us_per_step": round(self.delta_us_per_step, 3),
                "baseline_us_per_step": round(self.baseline_us, 3), "candidate_us_per_step": round(self.candidate_us, 3),
                "count_baseline_per_step": round(self.count_baseline_per_step, 3),
                "count_candidate_per_step": round(self.count_candidate_per_step, 3)}


@dataclass(kw_only=True, slots=True)
class FindingChange:
    """A `trainperf diagnose` finding that appeared, disappeared or changed severity between the sides."""

    kind: str
    change: str                        # "appeared", "disappeared", "severity"
    baseline_severity: str             # "" when absent
    candidate_severity: str
    baseline_gain_pct: float
    candidate_gain_pct: float

    def to_json(self) -> dict:
        return {"kind": self.kind, "change": self.change, "baseline_severity": self.baseline_severity,
                "candidate_severity": self.candidate_severity,
                "baseline_gain_pct": round(self.baseline_gain_pct, 3),
                "candidate_gain_pct": round(self.candidate_gain_pct, 3)}


def finding_changes(baseline: list, candidate: list) -> list[FindingChange]:
    """Compare two lists of diagnose findings (objects with kind, severity, gain_pct) by kind."""
    def by_kind(fs):
        out = {}
        for f in fs:
            if f.kind not in out or f.gain_pct > out[f.kind].gain_pct:
                out[f.kind] = f
        return out

    a, b = by_kind(baseline), by_kind(candidate)
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        change = "appeared" if x is None else "disappeared" if y is None else (
            "severity" if x.severity != y.severity else "")
        if change:
            out.append(FindingChange(kind=k, change=change, baseline_severity=x.severity if x else "",
                                     candidate_severity=y.severity if y else "",
                                     baseline_gain_pct=x.gain_pct if x else 0.0,
                                     candidate_gain_pct=y.gain_pct if y else 0.0))
    return sorted(out, key=lambda c: -abs(c.candidate_gain_pct - c.baseline_gain_pct))


@dataclass(kw_only=True)
class TraceDiff:
    """The result of `trainperf diff`: both sides, the step-time change and what it is made of."""

    baseline: StepProfile
    candidate: StepProfile
    delta_median_us: float                         # Hodges-Lehmann shift of the per-step times
    delta_interval_us: tuple[float, float]         # its 95% Mann-Whitney interval
    decomposition: list[tuple[str, float, float]]  # (bucket, baseline µs/step, candidate µs/step)
    kernels: list[Contribution]                    # device names, by |delta| descending
    operators: list[Contribution]                  # host names, by |delta| descending
    findings: list[FindingChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the side computing more a step against the other, operation by operation (compute_change): the same work
    # slower or faster, or more or less work; None where neither computes more
    compute_change: WorkComparison | None = None
    compute_change_side: str = ""  # "candidate" (it computes more) or "baseline"

    @property
    def delta_mean_us(self) -> float:
        """Change of the mean step time (µs): what the decomposition adds up to."""
        return self.candidate.mean_us - self.baseline.mean_us

    @property
    def step_time_delta_pct(self) -> float:
        """Change of the median step time, % of the baseline's."""
        b = self.baseline.median_us
        return 100.0 * (self.candidate.median_us - b) / b if b > 0 else float("nan")

    @property
    def explained_pct(self) -> float:
        """Share of the mean step-time change that lands in named buckets (all but idle: other), %;
        above 100 when the idle of unknown cause shrank while the named buckets grew."""
        d = self.delta_mean_us
        if d == 0:
            return 100.0
        other = next((c - b for n, b, c in self.decomposition if n == IDLE_OTHER), 0.0)
        return 100.0 * (d - other) / d

    @property
    def new(self) -> list[Contribution]:
        """Names seen only in the candidate."""
        return [c for c in self.kernels + self.operators if c.count_baseline_per_step == 0]

    @property
    def gone(self) -> list[Contribution]:
        """Names seen only in the baseline."""
        return [c for c in self.kernels + self.operators if c.count_candidate_per_step == 0]

    def headline(self) -> str:
        """One line: the change and the bucket and names that carry most of it."""
        d = self.delta_mean_us
        pct = self.step_time_delta_pct
        verb = "slower" if d > 0 else "faster"
        if not self.decomposition or d == 0:
            return f"step time unchanged ({pct:+.1f}%)"
        n, b, c = max(self.decomposition, key=lambda x: (x[2] - x[1]) * math.copysign(1, d))
        same_way = [k for k in self.kernels if k.delta_us_per_step * d > 0]
        top = (f"; top kernel {short_name(same_way[0].name)} {fmt_us(same_way[0].delta_us_per_step, True)}/step"
               if same_way else "")
        # a name that appears or vanishes and carries a tenth of the change is usually the story
        moved = [x for x in (self.new if d > 0 else self.gone) if abs(x.delta_us_per_step) >= HEADLINE_NAME_SHARE * abs(d)]
        if moved:
            x = max(moved, key=lambda x: abs(x.delta_us_per_step))
            top += f"; {'new' if d > 0 else 'gone'}: {short_name(x.name)} {fmt_us(x.delta_us_per_step, True)}/step"
        # the % is the median's, the decomposition the mean's: where they move apart (a few noisy steps) say both
        dm = self.candidate.median_us - self.baseline.median_us
        mean = "" if dm * d > 0 else f", mean {fmt_us(d, True)}"
        verb = verb if dm * d > 0 else ("slower" if dm > 0 else "faster" if dm < 0 else "unchanged")
        # a step of different work (another batch or model) is compared per FLOP too: the step alone misleads
        per_flop = per_flop_change_pct(self.baseline, self.candidate)
        work = "" if per_flop is None else \
            f" but {abs(per_flop):.1f}% {'slower' if per_flop > 0 else 'faster'} per FLOP (different work a step)"
        return (f"candidate {abs(pct):.1f}% {verb} per step{work} (median {fmt_us(self.baseline.median_us)} -> "
                f"{fmt_us(self.candidate.median_us)}{mean}); largest change: {n} {fmt_us(c - b, True)}/step{top}")

    def to_json(self, top: int = 30) -> dict:
        """The documented JSON object (times µs per step, per rank)."""
        def side(p: StepProfile) -> dict:
            lo, hi = median_interval(p.step_times_us)
            return {"source": p.source, "ranks": p.ranks, "steps": p.steps, "step_time_us": round(p.median_us, 3),
                    "step_time_interval_us": [round(lo, 3), round(hi, 3)], "step_time_mean_us": round(p.mean_us, 3),
                    "step_times_us": [round(float(x), 3) for x in p.step_times_us],
                    "breakdown_us": {k: round(v, 3) for k, v in sorted(p.breakdown_us.items())},
                    "memory": None if p.memory is None else {
                        "peak_allocated_bytes": p.memory.peak_allocated_bytes,
                        "peak_reserved_bytes": p.memory.peak_reserved_bytes,
                        "kept_bytes": p.memory.floor_allocated_bytes, "device_bytes": p.memory.capacity_bytes},
                    "flops_per_step": p.flops_per_step}
        contribs = sorted(self.kernels + self.operators, key=lambda c: -abs(c.delta_us_per_step))
        return {"baseline": side(self.baseline), "candidate": side(self.candidate),
                "step_time_delta_us": round(self.candidate.median_us - self.baseline.median_us, 3),
                "step_time_delta_pct": round(self.step_time_delta_pct, 3),
                "step_time_delta_hl_us": round(self.delta_median_us, 3),
                "step_time_delta_interval_us": [round(v, 3) for v in self.delta_interval_us],
                "step_time_mean_delta_us": round(self.delta_mean_us, 3),
                "explained_pct": round(self.explained_pct, 3),
                "unexplained_us": round(next((c - b for n, b, c in self.decomposition if n == IDLE_OTHER), 0.0), 3),
                "headline": self.headline(),
                "decomposition": [{"category": n, "baseline_us": round(b, 3), "candidate_us": round(c, 3),
                                   "delta_us": round(c - b, 3)} for n, b, c in self.decomposition],
                "contributions": [c.to_json() for c in contribs[:top]],
                "new": [c.to_json() for c in self.new], "gone": [c.to_json() for c in self.gone],
                "findings": [f.to_json() for f in self.findings], "notes": self.notes,
                "compute_change": compute_change_json(self.compute_change, self.compute_change_side,
                                                      self.candidate.work_on_host,
                                                      _beside_pct(self.baseline, self.candidate,
                                                                  self.compute_change_side))}


# the change of the work a step (FLOPs from the recorded shapes) above which the two sides are said not to do the same
# work: a tenth of a percent is what a different sequence length or batch moves first, below rounding of the shapes
WORK_CHANGE_MIN_PCT = 0.1


def per_flop_change_pct(baseline: StepProfile, candidate: StepProfile) -> float | None:
    """The candidate's change of time per FLOP (%, + slower) where both sides record their shapes and the
    candidate's matrix products, convolutions and attention do more or less work a step (> WORK_CHANGE_MIN_PCT):
    its step time is then not the same work's; None otherwise."""
    a, b = baseline.flops_per_step, candidate.flops_per_step
    if not a or not b or not baseline.median_us or abs(100.0 * (b / a - 1.0)) <= WORK_CHANGE_MIN_PCT:
        return None
    return 100.0 * (a / b * candidate.median_us / baseline.median_us - 1.0)


def work_change_note(baseline: StepProfile, candidate: StepProfile) -> str:
    """A note where the two sides do different work (per_flop_change_pct), with the change per FLOP; "" otherwise."""
    per_flop = per_flop_change_pct(baseline, candidate)
    if per_flop is None:
        return ""
    way = "slower" if per_flop > 0 else "faster"
    return (f"the two sides do different work: {work_change_text(baseline, candidate)} (another batch, sequence "
            f"length or model); per FLOP the candidate is {abs(per_flop):.1f} % {way}")


def work_change_text(baseline: StepProfile, candidate: StepProfile) -> str:
    """'171.8 -> 171.8 GFLOP a step of matrix products, convolutions and attention (+0.0 %)' where both sides
    record their shapes, else ""."""
    a, b = baseline.flops_per_step, candidate.flops_per_step
    if not a or b is None:
        return ""
    return (f"{a / 1e9:.4g} -> {b / 1e9:.4g} GFLOP a step of matrix products, convolutions and attention "
            f"({100.0 * (b / a - 1.0):+.1f} %)")


def memory_change_text(baseline: DeviceMemory | None, candidate: DeviceMemory | None) -> str:
    """'peak reserved 11.90 -> 9.20 GiB (-2.70), allocated 6.17 -> 4.00 GiB (-2.17), kept 3.82 -> 3.82 GiB' where both
    sides have allocator samples, else ""."""
    if baseline is None or candidate is None:
        return ""
    parts = [(name, getattr(baseline, a) / GIB, getattr(candidate, a) / GIB)
             for name, a in (("peak reserved", "peak_reserved_bytes"), ("allocated", "peak_allocated_bytes"),
                             ("kept", "floor_allocated_bytes"))]
    return ", ".join(f"{n} {b:.2f} -> {c:.2f} GiB ({c - b:+.2f})" for n, b, c in parts)


def _contributions(a: dict[str, NameStat], b: dict[str, NameStat]) -> list[Contribution]:
    zero = NameStat(category="", time_us=0.0, count=0.0)
    out = []
    for n in set(a) | set(b):
        x, y = a.get(n, zero), b.get(n, zero)
        out.append(Contribution(name=n, category=y.category or x.category, baseline_us=x.time_us,
                                candidate_us=y.time_us, count_baseline_per_step=x.count,
                                count_candidate_per_step=y.count))
    return sorted(out, key=lambda c: (-abs(c.delta_us_per_step), c.name))


def diff_profiles(baseline: StepProfile, candidate: StepProfile) -> TraceDiff:
    """Compare two step profiles: step-time shift with its interval, buckets, names."""
    from trainperf.fleet.changepoints import hodges_lehmann_interval

    a, b = baseline.step_times_us, candidate.step_times_us
    shift, lo, hi = hodges_lehmann_interval(b[:, None] - a[None, :], a.size, b.size)
    names = sorted(set(baseline.breakdown_us) | set(candidate.breakdown_us))
    dec = [(n, baseline.breakdown_us.get(n, 0.0), candidate.breakdown_us.get(n, 0.0)) for n in names]
    dec = [x for x in dec if x[1] or x[2]]
    dec.sort(key=lambda x: -abs(x[2] - x[1]))
    notes = baseline.notes + candidate.notes + [n for n in (work_change_note(baseline, candidate),) if n]
    if min(a.size, b.size) < 3:
        notes.append(f"few steps ({a.size} baseline, {b.size} candidate): the intervals are wide or min-max")
    change, side = compute_change(baseline, candidate)
    notes += [n for n in (compute_change_note(change, side, host=candidate.work_on_host,
                                              beside_pct=_beside_pct(baseline, candidate, side)),) if n]
    return TraceDiff(baseline=baseline, candidate=candidate, delta_median_us=shift, delta_interval_us=(lo, hi),
                     decomposition=dec, kernels=_contributions(baseline.kernels, candidate.kernels),
                     operators=_contributions(baseline.operators, candidate.operators), notes=notes,
                     compute_change=change, compute_change_side=side)


def _beside_pct(baseline: StepProfile, candidate: StepProfile, side: str) -> tuple[float, float] | None:
    """(the side computing more's share of its computation run beside a collective, the other side's), %; None where
    no side computes more."""
    if side not in ("baseline", "candidate"):
        return None
    more, other = (candidate, baseline) if side == "candidate" else (baseline, candidate)
    return more.beside_comm_pct, other.beside_comm_pct


def diff(baseline: str | Path, candidate: str | Path, progress: bool = False, findings: bool = False) -> TraceDiff:
    """Load two traces (a Kineto file or a folder of ranks each) and diff them; with findings, also
    run `trainperf diagnose` on both and list the findings that appear, disappear or change severity."""
    # a device clock behind the host's read and undone as diagnose does (device_clock.py)
    (ta, clock_a), (tb, clock_b) = (with_device_clocks_aligned(load_trace(p, progress=progress))
                                    for p in (baseline, candidate))
    a, b = step_profiles(ta, tb, str(baseline), str(candidate))
    a.notes += [f"{baseline}: {n}" for n in clock_a]
    b.notes += [f"{candidate}: {n}" for n in clock_b]
    d = diff_profiles(a, b)
    if findings:
        from trainperf.diagnose.api import diagnose

        d.findings = finding_changes(diagnose(baseline, top=10_000).findings, diagnose(candidate, top=10_000).findings)
    return d
