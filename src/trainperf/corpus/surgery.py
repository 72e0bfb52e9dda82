"""Trace surgery: insert a known problem of a known size into a real Kineto trace.

Two operations, both on the raw event list (independent of trainperf.diagnose):

- `insert_host_work` — the host spends extra time at given host instants (a DataLoader fetch, a
  blocking sync, a cudaMalloc, a pageable copy, tiny-kernel launches). Every later host event is
  shifted; each device op is re-timed by a small stream model: it starts at the latest of its
  original start, its (shifted) launch plus its own launch latency, and the end of the op before
  it on the same stream. A host call that waited for the device in the original trace (a stream/
  device/event synchronize, a copy to or from pageable memory) waits for the re-timed device op
  it waited for, so GPU slack can absorb host delay as it does on a real machine.
- `insert_device_delays` — device ops run longer (a slower kernel, a collective that waits for a
  late rank) or wait for other ops (a collective moved onto the compute path), and the host may
  block on a device op (a stream synchronize after a collective); ops are re-timed in start order
  and the host moves only where it waited for the device.

Every re-timing carries an op's dependants along: an op of another stream that, in the untouched
trace, started right after it ended (an event wait) starts as long after its new end, and what
follows on that stream and the host calls that waited for it follow in turn.

Times are µs in the trace's own clock; "orig" means the untouched trace.
"""

from __future__ import annotations

import bisect
import copy
import math
from dataclasses import dataclass, field

import numpy as np

from trainperf.corpus import kineto as K


# A launch or copy call blocks when the device's launch queue is full and returns as soon as an
# earlier op completes. In ns_resolution_trace (CPU ~90 ms ahead of the GPU) 99.7 % of the 701
# runtime calls longer than 100 µs return within 20 µs of a device op's end; in nccl_parser_config
# (host-bound) the one such call does not (2.6 ms after): it is host work. Only a call that enqueues device work
# (its correlation id names a device op: launches, copies, fills, graph launches, every such wait of the bases) waits
# for a slot; on a busy GPU some op ends within 20 us of any instant, and a 6-ms cudaMalloc was read as waiting for
# the kernel that ended as it returned, stretched to 45 ms by a delay planted on that kernel.
BLOCKED_CALL_MIN_US = 100.0
BLOCKED_RETURN_US = 20.0
# ... and only while its stream's launch queue is full: CUDA queues 1,024 launches, HIP 16,384 AQL packets a hardware
# queue; a call with fewer ahead of its own work takes a free slot at once. The bases' waiting calls had 959-1,021
# launches ahead (ns_resolution 550 calls, negative_queue 73); launches the host itself made slower (150 us each on an
# H200 GPU-bound loop) had 0-194 ahead and returned within 20 us of some kernel's end by chance on a busy GPU (read
# as waits, a sync planted after them drained the queue and took their planted cost away: 21.7 % planted read 27.2);
# the H200 loop's 400-us cudaGraphLaunch calls, 1-4. Half the queue: a margin for the work a profile holds no trace of.
QUEUE_FULL_MIN_ENTRIES = {"cuda": 512, "hip": 8192}
# An op whose stream was idle before it, launched long before, that started within this long after
# an op of another stream ended was waiting for it (an event wait: a collective waiting for the
# gradients it reduces, compute waiting for the collective's result). Measured with this rule's own
# filter on the 7 healthy HTA ranks of the corpus (2,574 such ops), the time since the latest end on
# another stream: 1,079 at 0-10 µs (108 per µs), 12 at 10-15 (2.4 per µs), 6 at 15-20 (1.2 per µs),
# 27 at 20-100 (0.25-0.4 per µs: the chance of an unrelated end), 1,434 over 100 µs (waits on
# something the trace does not show). 20 µs is where the density falls to the chance rate.
DEPENDENCY_GAP_US = 20.0


@dataclass(kw_only=True, frozen=True)
class HostWork:
    """Extra host work inserted at host time `at_us` (orig clock) on the main thread.

    spans: (name, cat) outermost first, all covering the inserted host time. If `drains`, the host
    first waits until the device has finished every op launched before (a sync), and then blocks
    until its own `gpu_op` has finished (a synchronous copy). `host_us` is host time on top.
    gpu_op: (name, cat, dur_us) issued on the main stream, or None.
    """

    at_us: float
    host_us: float
    spans: tuple[tuple[str, str], ...]
    drains: bool = False
    gpu_op: tuple[str, str, float] | None = None
    gpu_args: dict = field(default_factory=dict)


@dataclass
class _Ops:
    """Device ops of the trace in launch order, as arrays."""

    idx: np.ndarray      # index into the event list
    start: np.ndarray    # orig start, µs
    dur: np.ndarray
    launch: np.ndarray   # orig host launch time, µs (own start when the launch is not in the trace)
    stream: list


@dataclass
class _Base:
    """What surgery needs of an untouched event list: its device ops, host waits, and per event
    its start and end (µs; nan for metadata and instants) and whether it is a device event."""

    ops: "_Ops"
    waits: list
    ts: np.ndarray
    te: np.ndarray
    gpu: np.ndarray
    next_correlation: int  # a correlation id no event uses
    op_args: dict          # args of a device op per stream (pid, tid): device, context, stream
    deps: list             # per op (position in ops): [(position of the op it waited for, lag µs)]


# The size search injects into the same untouched base up to SEARCH_STEPS times per case: what
# depends on the base alone is computed once per event list.
@K.cached_by_identity()
def _base(events: list[dict]) -> _Base:
    """The _Base of an event list."""
    ops = _device_ops(events)
    timed = [("ts" in e and e.get("ph") != "M") for e in events]
    ts = np.array([float(e["ts"]) if t else np.nan for e, t in zip(events, timed)])
    te = np.array([float(e["ts"]) + float(e["dur"]) if t and "dur" in e else np.nan for e, t in zip(events, timed)])
    op_args: dict = {}
    for e in events:
        if K.is_gpu_op(e):
            op_args.setdefault((e.get("pid"), e.get("tid")), e.get("args", {}))
    return _Base(ops=ops, waits=_waits(events, ops), ts=ts, te=te, gpu=np.array([K.is_gpu(e) for e in events]),
                 next_correlation=1 + max((int(c) for e in events if isinstance(c := K.correlation(e), int)),
                                          default=0),
                 op_args=op_args, deps=_dependencies(ops, K.min_launch_latency_us(events)))


def _device_ops(events: list[dict]) -> _Ops:
    launch = K.launch_times(events)
    # work queued before the window came first in its stream's queue: launched before anything inserted
    earlier = K.queued_before_window(events, launch)
    rows = [(i, float(e["ts"]), float(e.get("dur", 0.0)),
             -math.inf if i in earlier else launch.get(K.correlation(e), float(e["ts"])),
             (e.get("pid"), e.get("tid"))) for i, e in enumerate(events) if K.is_gpu_op(e)]
    rows.sort(key=lambda r: (r[3], r[1]))
    return _Ops(np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows]),
                np.array([r[2] for r in rows]), np.array([r[3] for r in rows]), [r[4] for r in rows])


def _enqueues(call: dict, by_corr: dict) -> bool:
    """Whether a runtime call put work on the device: its correlation id names a device op of the trace."""
    c = K.correlation(call)
    return c is not None and c in by_corr


def _entries_ahead(ops: _Ops, corr: np.ndarray, stream_id: np.ndarray, own: int, launched_before: float,
                   returned: float) -> int:
    """Launches (count; a launch's several ops, one correlation id, count once) queued on the stream of ops[own] that
    were launched before `launched_before` and had not ended by `returned` (µs): the queue in front of its work."""
    ahead = (stream_id == stream_id[own]) & (ops.launch < launched_before) & (ops.start + ops.dur > returned)
    return int(np.unique(corr[ahead]).size)


def _waits(events: list[dict], ops: _Ops) -> list[tuple[float, int, int]]:
    """Host calls that waited for the device: (orig end, event index, position in ops of the awaited op)."""
    by_corr = {K.correlation(events[i]): k for k, i in enumerate(ops.idx)}
    corr = np.array([c if isinstance(c := K.correlation(events[i]), int) else -1 - k for k, i in enumerate(ops.idx)])
    stream_id = np.unique([str(s) for s in ops.stream], return_inverse=True)[1]
    ends = ops.start + ops.dur
    out = []
    for i, e in enumerate(events):
        if not K.is_runtime(e):
            continue
        name, ts, te = str(e.get("name", "")), float(e["ts"]), K.end(e)
        if K.COPY_CALL_RE.match(name):
            k = by_corr.get(K.correlation(e))
            if k is None or "Pageable" not in str(events[ops.idx[k]].get("name", "")):
                continue  # an async copy between device and pinned memory does not block the host
        elif K.SYNC_CALL_RE.match(name) or (te - ts > BLOCKED_CALL_MIN_US and _enqueues(e, by_corr)):
            cand = np.nonzero((ops.launch < ts) & (ends <= te + 1.0))[0]
            if not cand.size:
                continue
            k = int(cand[np.argmax(ends[cand])])
            if not K.SYNC_CALL_RE.match(name):
                if te - ends[k] > BLOCKED_RETURN_US:
                    continue  # a long call that did not return with a device op: host work, not a wait
                full = QUEUE_FULL_MIN_ENTRIES["hip" if name.startswith("hip") else "cuda"]
                if _entries_ahead(ops, corr, stream_id, by_corr[K.correlation(e)], ts, te) < full:
                    continue  # a free slot: the call's own time is host work
        else:
            continue
        if ts < ends[k] <= te + 1.0:  # it really waited for that op (ended with it)
            out.append((te, i, k))
    return out


def _dependencies(ops: _Ops, latency_us: float) -> list[list[tuple[int, float]]]:
    """Per op (position in launch order): the ops of other streams it waited for in the original,
    each with the lag (µs) from that op's end to its start.

    Only an op that neither its stream (idle for more than DEPENDENCY_GAP_US before it) nor its
    launch (more than latency_us + DEPENDENCY_GAP_US before it) released can be seen waiting; it
    waited for every op of another stream that ended within DEPENDENCY_GAP_US before it started."""
    ends = ops.start + ops.dur
    prev = _previous_on_stream(ops)
    by_end = np.argsort(ends, kind="stable")
    sorted_ends = ends[by_end]
    lo = np.searchsorted(sorted_ends, ops.start - DEPENDENCY_GAP_US, side="left")
    hi = np.searchsorted(sorted_ends, ops.start, side="right")
    free = (ops.start - ops.launch > latency_us + DEPENDENCY_GAP_US) & (
        (prev < 0) | (ops.start - ends[np.maximum(prev, 0)] > DEPENDENCY_GAP_US))
    out: list[list[tuple[int, float]]] = [[] for _ in range(len(ops.idx))]
    for k in np.nonzero(free & (hi > lo))[0]:
        out[k] = [(int(m), float(ops.start[k] - ends[m])) for m in by_end[lo[k]:hi[k]]
                  if ops.stream[m] != ops.stream[k]]
    return out


def _previous_on_stream(ops: _Ops) -> np.ndarray:
    """Position (in launch order) of the op that precedes each op on its stream in start order; -1 if none."""
    prev = np.full(len(ops.idx), -1, dtype=np.int64)
    by_stream: dict = {}
    for k, st in enumerate(ops.stream):
        by_stream.setdefault(st, []).append(k)
    for ks in by_stream.values():
        ks.sort(key=lambda k: ops.start[k])
        prev[ks[1:]] = ks[:-1]
    return prev


# Two instants this close are one (µs): the finest a trace writes is Kineto's ns, and a span's end computed as ts + dur
# on an epoch clock (~4e12 µs, float64's step there ~0.0005 µs) lands that far from the launch that began at it; read
# as after an insertion point there, the span ended after the inserted work and was stretched across it (an allocator
# call 2.5 ms long when host work was inserted at the launch that followed it)
SAME_INSTANT_US = 1e-3


def _in_instant_order(items: list[tuple]) -> list[tuple]:
    """`items` (time µs, tie rank, ...) sorted by time, those within SAME_INSTANT_US of the first of their run taken
    as one instant and ordered there by tie rank: the order `_Shift` reads them in."""
    items = sorted(items, key=lambda x: (x[0], x[1]))
    out, run = [], []
    for item in items:
        if run and item[0] - run[0][0] > SAME_INSTANT_US:
            out += sorted(run, key=lambda x: x[1])
            run = []
        run.append(item)
    return out + sorted(run, key=lambda x: x[1])


class _Shift:
    """Piecewise-constant host shift: shift(t) = value of the last breakpoint at or before t (within
    SAME_INSTANT_US), last in the order the re-timing made them: `points` (orig time, shift from then on) come in that
    order, time order but for an instant's own (_in_instant_order). Sorted by value instead, a wait ending where work
    was inserted kept the work's whole shift on the host while the device ops after it were timed with the smaller one
    the wait left (the GPU's slack absorbed part of it): calls written 100 us after the copies they launched."""

    def __init__(self, points: list[tuple[float, float]]):
        self.t = np.maximum.accumulate([p[0] for p in points]) if points else np.zeros(0)
        self.v = np.concatenate([[0.0], [p[1] for p in points]]) if points else np.zeros(1)

    def at_start(self, t: np.ndarray) -> np.ndarray:
        """Shift of spans starting at t (a breakpoint at t applies)."""
        return self.v[np.searchsorted(self.t, np.asarray(t) + SAME_INSTANT_US, side="right")]

    def at_end(self, t: np.ndarray) -> np.ndarray:
        """Shift of spans ending at t (a breakpoint at t does not apply yet)."""
        return self.v[np.searchsorted(self.t, np.asarray(t) - SAME_INSTANT_US, side="left")]


def insert_host_work(doc: dict, work: list[HostWork], *, main: tuple, stream: tuple, latency_us: float) -> dict:
    """A copy of the trace with `work` inserted on host thread `main` (pid, tid), device ops
    on `stream` (pid, tid); `latency_us`: the device's shortest launch-to-start latency."""
    events = doc["traceEvents"]
    base = _base(events)
    ops, waits = base.ops, base.waits
    # the merged timeline; at an instant, the ends of waits first (the host returns from a wait, then does what it does
    # next), then inserted work, then launches (work inserted at a launch runs before it)
    wait_ends, inserted, launches = 0, 1, 2
    items = _in_instant_order([(te, wait_ends, n) for n, (te, _, _) in enumerate(waits)]
                              + [(w.at_us, inserted, n) for n, w in enumerate(work)]
                              + [(float(t), launches, k) for k, t in enumerate(ops.launch)])
    new_start = ops.start.copy()
    prev = _previous_on_stream(ops)
    done = np.zeros(len(ops.idx), dtype=bool)
    stream_end: dict = {}  # end of the latest inserted op per stream
    busy_end: dict = {}    # end of the latest re-timed op per stream
    drain = -np.inf
    shift = 0.0
    points: list[tuple[float, float]] = []
    wait_end: dict[int, float] = {}
    added: list[tuple[HostWork, float, float, float | None]] = []  # work, host start, host dur, op start
    for t, kind, n in items:
        if kind == launches:
            own = min(max(ops.start[n] - ops.launch[n], 0.0), latency_us)
            p = prev[n]
            s = max(ops.start[n], ops.launch[n] + shift + own if shift else -np.inf,
                    new_start[p] + ops.dur[p] if p >= 0 and done[p] else -np.inf,
                    stream_end.get(ops.stream[n], -np.inf),
                    *(new_start[m] + ops.dur[m] + lag for m, lag in base.deps[n] if done[m]))
            new_start[n] = s
            done[n] = True
            drain = max(drain, s + ops.dur[n])
            busy_end[ops.stream[n]] = max(busy_end.get(ops.stream[n], -np.inf), s + ops.dur[n])
        elif kind == inserted:
            w = work[n]
            host0 = w.at_us + shift
            busy_until = max(host0, drain) if w.drains else host0
            op0 = None
            if w.gpu_op is not None:
                op0 = max(host0 + latency_us, stream_end.get(stream, -np.inf), busy_until,
                          busy_end.get(stream, -np.inf))
                stream_end[stream] = op0 + w.gpu_op[2]
                drain = max(drain, stream_end[stream])
                if w.drains:
                    busy_until = stream_end[stream]
            dur = busy_until - host0 + w.host_us
            added.append((w, host0, dur, op0))
            shift += dur
            points.append((w.at_us, shift))
        else:
            te, i, k = waits[n]
            e = events[i]
            ts = float(e["ts"])
            ok = ops.start[k] + ops.dur[k]
            new_end = max(ts + shift + min(te - ts, 2.0), new_start[k] + ops.dur[k] + max(te - ok, 0.0))
            wait_end[i] = new_end
            shift = new_end - te
            points.append((te, shift))
    return _apply(doc, _Shift(points), ops, new_start, wait_end, added, main, stream)


@dataclass(kw_only=True, frozen=True)
class DeviceWait:
    """A host call inserted at host time `at_us` (orig clock) on `thread` (pid, tid) that blocks
    until device op `op` (event index) has ended: `name`, e.g. a cudaStreamSynchronize after a
    collective. It takes no host time of its own; at_us is at or after the op's original start."""

    at_us: float
    op: int
    thread: tuple
    name: str = "cudaStreamSynchronize"


def insert_device_delays(doc: dict, *, extra: dict[int, float] | None = None,
                         after: dict[int, list[int]] | None = None, syncs: list[DeviceWait] | None = None,
                         hold: dict[int, float] | None = None, latency_us: float) -> dict:
    """A copy of the trace where device ops run longer (extra: event index -> µs added to its
    duration), must wait for other ops (after: event index -> indices of ops it starts after), start
    later than all of that allows (hold: event index -> µs: the device held by work the trace does not
    record, another process's), and the host blocks on device ops (syncs, each written as a runtime
    call on its thread).

    Ops are re-timed in start order: an op starts at the latest of its original start, the end of
    the op before it on its stream, the new waits, the new end of each op it waited for in the
    original (_dependencies; plus the same lag), and its launch moved with the host. The host is
    delayed only where it waited for the device (a sync returns when the op it waited for does),
    so later launches move with it."""
    extra, after, syncs, hold = extra or {}, after or {}, syncs or [], hold or {}
    events = doc["traceEvents"]
    base = _base(events)
    ops, waits = base.ops, base.waits
    pos = {int(i): k for k, i in enumerate(ops.idx)}
    for w in syncs:
        if w.op not in pos or w.at_us < ops.start[pos[w.op]]:
            raise ValueError(f"a sync at {w.at_us} µs on event {w.op}: not a device op, or before it started")
    dur = ops.dur + np.array([extra.get(int(i), 0.0) for i in ops.idx])
    ends = ops.start + ops.dur
    prev = _previous_on_stream(ops)
    deps = {k: list(d) for k, d in enumerate(base.deps) if d}
    for i, js in after.items():
        if i in pos:
            deps.setdefault(pos[i], []).extend((pos[j], 0.0) for j in js if j in pos)
    # at a tie an op is timed before a host wait (a sync waits for what started at its instant)
    op_starts, wait_ends, inserted_syncs = 1, 2, 3
    items = _in_instant_order([(float(ops.start[k]), op_starts, k) for k in range(len(ops.idx))]
                              + [(te, wait_ends, n) for n, (te, _, _) in enumerate(waits)]
                              + [(w.at_us, inserted_syncs, n) for n, w in enumerate(syncs)])
    new_start, done = ops.start.copy(), np.zeros(len(ops.idx), dtype=bool)
    points: list[tuple[float, float]] = []  # (orig time, host shift from then on), in time order
    pt = []
    wait_end: dict[int, float] = {}
    added: list[dict] = []

    def shift_at(t: float) -> float:  # _Shift.at_start of the points made so far: the same instants
        j = bisect.bisect_right(pt, t + SAME_INSTANT_US) - 1
        return points[j][1] if j >= 0 else 0.0

    for t, kind, n in items:
        if kind == op_starts:
            shift = shift_at(float(ops.launch[n]))
            own = min(max(ops.start[n] - ops.launch[n], 0.0), latency_us)
            cands = [ops.start[n], ops.launch[n] + shift + own if shift else -np.inf]
            if prev[n] >= 0 and done[prev[n]]:
                cands.append(new_start[prev[n]] + dur[prev[n]])
            cands += [new_start[m] + dur[m] + lag for m, lag in deps.get(n, []) if done[m]]
            new_start[n] = max(cands) + hold.get(int(ops.idx[n]), 0.0)
            done[n] = True
            continue
        if kind == wait_ends:
            te, i, k = waits[n]
            ts = float(events[i]["ts"])
            new_end = max(ts + shift_at(ts) + min(te - ts, 2.0), new_start[k] + dur[k] + max(te - ends[k], 0.0))
            wait_end[i] = new_end
        else:
            w = syncs[n]
            k = pos[w.op]
            host0 = t + shift_at(t)
            new_end = max(host0, new_start[k] + dur[k])
            added.append({"ph": "X", "cat": "cuda_runtime", "name": w.name, "pid": w.thread[0], "tid": w.thread[1],
                          "ts": host0, "dur": new_end - host0, "args": {}})
        points.append((t, new_end - t))
        pt.append(max(t, pt[-1]) if pt else t)  # as _Shift reads them: a running maximum
    out = _apply(doc, _Shift(points), ops, new_start, wait_end, [], (None, None), (None, None), new_dur=dur)
    out["traceEvents"] += added
    return out


def _apply(doc: dict, sh: _Shift, ops: _Ops, new_start: np.ndarray, wait_end: dict[int, float],
           added: list, main: tuple, stream: tuple, new_dur: np.ndarray | None = None) -> dict:
    events = doc["traceEvents"]
    base = _base(events)
    op_start = {int(i): float(s) for i, s in zip(ops.idx, new_start)}
    op_dur = {int(i): float(d) for i, d in zip(ops.idx, new_dur)} if new_dur is not None else {}
    # device annotations follow the ops they cover: the delta of the first op starting inside them
    order = np.argsort(ops.start)
    o_start, o_delta = ops.start[order], (new_start - ops.start)[order]
    ts = np.nan_to_num(base.ts)
    gpu_ts = ts + o_delta[np.minimum(np.searchsorted(o_start, ts), len(o_start) - 1)] if len(o_start) else ts
    # plain lists: the loop below runs once per event, and numpy scalar access costs ~1 µs each
    new_ts = np.where(base.gpu, gpu_ts, ts + sh.at_start(ts)).tolist()
    new_te = (base.te + sh.at_end(np.nan_to_num(base.te))).tolist()
    timed, gpu = (~np.isnan(base.ts)).tolist(), base.gpu.tolist()
    # the ops around a wait that end at its very instant (aten::item > _local_scalar_dense around a read, as a trace
    # with whole-us stamps or an inserted read writes them) return with it: their end follows the wait's new end, not
    # the shift from before it (which left an .item() stretched over 16 ms of later launches where slower launches
    # were planted after a read: the GPU's slack had absorbed the delay, the read waited less)
    returned_with_wait = {_thread_instant(events[i], base.te[i]): (float(base.ts[i]), end)
                          for i, end in wait_end.items()}
    corr_start: dict = {}
    new_events = []
    for i, e in enumerate(events):
        if not timed[i]:
            new_events.append(e)
            continue
        e = dict(e)
        if i in op_start:
            e["ts"] = op_start[i]
            if i in op_dur:
                e["dur"] = op_dur[i]
            corr_start[K.correlation(e)] = e["ts"]
        else:
            e["ts"] = new_ts[i]
            if "dur" in e and not gpu[i]:
                wait = returned_with_wait.get(_thread_instant(e, base.te[i]))
                around = wait is not None and float(base.ts[i]) <= wait[0]
                e["dur"] = (wait_end[i] if i in wait_end else wait[1] if around else new_te[i]) - e["ts"]
        new_events.append(e)
    for e in new_events:
        if e.get("ph") == "f" and e.get("cat") == "ac2g" and e.get("id") in corr_start:
            e["ts"] = corr_start[e["id"]]
    new_events += _added_events(base, added, main, stream)
    out = copy.copy(doc)
    out["traceEvents"] = new_events
    return out


def _thread_instant(e: dict, t: float) -> tuple:
    """(pid, tid, instant) of an event's time t (µs), instants SAME_INSTANT_US apart: what a wait and the ops that
    return with it share."""
    return e.get("pid"), e.get("tid"), round(float(t) / SAME_INSTANT_US)


def _added_events(base: _Base, added: list, main: tuple, stream: tuple) -> list[dict]:
    """Host spans, device op and launch flow of each inserted piece of work."""
    corr = base.next_correlation
    template = base.op_args.get(stream, {})
    out = []
    for w, host0, dur, op0 in added:
        for name, cat in w.spans:
            ev = {"ph": "X", "cat": cat, "name": name, "pid": main[0], "tid": main[1], "ts": host0, "dur": dur,
                  "args": {"External id": corr}}
            if cat == "cuda_runtime" and op0 is not None:
                ev["args"]["correlation"] = corr
                ev["dur"] = dur if w.drains else max(dur - 1.0, 0.5)
            out.append(ev)
        if op0 is not None:
            name, cat, op_dur = w.gpu_op
            args = {k: template[k] for k in ("device", "context", "stream") if k in template}
            args.update({"correlation": corr, "External id": corr, **w.gpu_args})
            out.append({"ph": "X", "cat": cat, "name": name, "pid": stream[0], "tid": stream[1], "ts": op0,
                        "dur": op_dur, "args": args})
            out.append({"ph": "s", "id": corr, "pid": main[0], "tid": main[1], "ts": host0, "cat": "ac2g",
                        "name": "ac2g"})
            out.append({"ph": "f", "id": corr, "pid": stream[0], "tid": stream[1], "ts": op0, "cat": "ac2g",
                        "name": "ac2g", "bp": "e"})
        corr += 1
    return out
