"""Dependency graph of a rank's window, replay with one change (what-if), and the critical path.

Nodes are host runtime calls (kernel launches, copies, syncs) per thread and device events per
stream. Edges, all read from the trace:
- host order: a call starts after the previous call on its thread ended plus the CPU work seen
  between them (that gap shrinks when a change removes data-loader time inside it);
- host sync: a synchronize call (or sync copy) ends when the device work it waited for ends;
- launch: a device event starts no earlier than its launch call + the typical launch latency;
- stream order: after the previous event on its stream;
- cross-stream wait: a device event that started late, right after an event on another stream
  ended, waits for that event (event record / wait);
- unexplained delay before a start is kept as a fixed lag, so replaying with no change
  reproduces the trace; a communication kernel's cross-rank wait (crossrank.py) is part of its
  duration and can be removed.
Replaying in observed time order is a topological order (every edge points forward in time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.host import CHECKPOINT_RE, DATALOADER_RE, SYNC_RUNTIME_RE, span_rows
from trainperf.diagnose.window import Window, merge_intervals
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import (CATEGORY_NAMES, COMMUNICATION, CPU_OP, KERNEL, MEMCPY, MEMSET, PYTHON, RUNTIME,
                                    USER_ANNOTATION, EventTable)

TOL_US = 5.0


@dataclass
class Change:
    """One what-if change. kind: none | remove_data_wait | remove_checkpoint_wait | remove_syncs | overlap_comm |
    remove_straggler_wait | speedup (category sped up `factor` times) | host_speedup (CPU work
    between runtime calls `factor` times faster)."""

    kind: str = "none"
    category: int = -1
    factor: float = 1.0

    def label(self) -> str:
        if self.kind == "speedup":
            return f"{CATEGORY_NAMES[self.category]} kernels {self.factor:g}x faster"
        if self.kind == "host_speedup":
            return f"host work between launches {self.factor:g}x faster"
        return self.kind


@dataclass
class Graph:
    """The window's nodes (host calls then device events) and their observed timing (µs)."""

    rows: np.ndarray            # trace row per node
    is_host: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    host_prev: np.ndarray       # previous host call on the same thread (node index) or -1
    host_gap: np.ndarray        # CPU time between host_prev's end and this start (µs)
    gap_dataloader: np.ndarray  # part of host_gap inside data-loader spans (µs)
    gap_checkpoint: np.ndarray  # part of host_gap inside checkpoint-saving spans (µs)
    is_sync: np.ndarray
    sync_on: np.ndarray         # device node a sync waited for, or -1
    sync_base: np.ndarray       # the sync call's own cost without waiting (µs)
    launch: np.ndarray          # launch node of a device node, or -1
    lat: np.ndarray             # launch latency used (µs)
    stream_prev: np.ndarray     # previous device node on the same stream, or -1
    dep: np.ndarray             # inferred cross-stream predecessor, or -1
    lag: np.ndarray             # unexplained delay kept fixed (µs)
    category: np.ndarray
    comm_wait: np.ndarray       # cross-rank wait inside a communication kernel (µs)
    comm_wait_rank: np.ndarray  # the rank that wait was for (-1 none)
    order: np.ndarray           # processing order (observed start)
    names: list = field(default_factory=list)


def _covered(starts: np.ndarray, ends: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Length of each [start, end) covered by the merged spans (µs)."""
    s, e = spans
    out = np.zeros(starts.size)
    if s.size == 0:
        return out
    cum = np.r_[0.0, np.cumsum(e - s)]

    def covered_upto(x):  # total span length before x
        i = np.searchsorted(s, x, side="right")
        prev_end = np.where(i > 0, e[np.clip(i - 1, 0, None)], -np.inf)
        partial = np.where(i > 0, np.clip(np.minimum(x, prev_end) - s[np.clip(i - 1, 0, None)], 0, None), 0.0)
        return cum[np.clip(i - 1, 0, None)] * (i > 0) + partial

    return np.maximum(covered_upto(ends) - covered_upto(starts), 0.0)


def build_graph(t: EventTable, w: Window, comm_wait_us: dict[int, tuple[float, int]] | None = None) -> Graph:
    """Dependency graph of the window (see the module docstring).

    comm_wait_us: trace row of a collective kernel -> (µs it waited for another rank, that rank)."""
    host_rows = np.flatnonzero(w.keep & (t.kind == RUNTIME))
    dev_rows = w.device[np.isin(t.kind[w.device], (KERNEL, MEMCPY, MEMSET))]
    rows = np.r_[host_rows, dev_rows]
    n_h = host_rows.size
    n = rows.size
    is_host = np.r_[np.ones(n_h, bool), np.zeros(dev_rows.size, bool)]
    start = w.ts_us[rows].astype(float)
    dur = np.maximum(w.end_us[rows] - w.ts_us[rows], 0.0)
    end = start + dur
    node_of_row = {int(r): i for i, r in enumerate(rows)}

    # host chains per thread
    host_prev = np.full(n, -1)
    host_gap = np.zeros(n)
    tids = t.tid[host_rows]
    for tid in np.unique(tids):
        idx = np.flatnonzero(tids == tid)
        idx = idx[np.argsort(start[idx], kind="stable")]
        host_prev[idx[1:]] = idx[:-1]
        host_gap[idx[1:]] = np.maximum(start[idx[1:]] - end[idx[:-1]], 0.0)
    has_prev = host_prev >= 0
    gap_dl, gap_ck = np.zeros(n), np.zeros(n)
    for pattern, out in ((DATALOADER_RE, gap_dl), (CHECKPOINT_RE, gap_ck)):
        rows_p = span_rows(t, w, pattern, (USER_ANNOTATION, CPU_OP, PYTHON))
        spans = merge_intervals(w.ts_us[rows_p], w.end_us[rows_p])
        out[has_prev] = _covered(end[host_prev[has_prev]], start[has_prev], spans)

    # device: launch links, stream order
    link = correlated_host_row(t)
    launch = np.full(n, -1)
    for i in range(n_h, n):
        lr = int(link[rows[i]])
        if lr >= 0:
            launch[i] = node_of_row.get(lr, -1)
    stream_prev = np.full(n, -1)
    dev_idx = np.arange(n_h, n)
    streams = t.pid[dev_rows] * 1_000_003 + t.stream[dev_rows]  # (device, stream): ids repeat across GPUs
    for s in np.unique(streams):
        idx = dev_idx[streams == s]
        idx = idx[np.argsort(start[idx], kind="stable")]
        stream_prev[idx[1:]] = idx[:-1]
    has_launch = launch >= 0
    obs_lat = np.where(has_launch, start - start[np.clip(launch, 0, None)], np.nan)
    lat_min = float(np.nanpercentile(obs_lat[has_launch], 5)) if has_launch.any() else 0.0
    lat_min = max(lat_min, 0.0)
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
    for i in range(n_h, n):
        c = -np.inf
        if launch[i] >= 0:
            c = start[launch[i]] + lat[i]
        if stream_prev[i] >= 0:
            c = max(c, end[stream_prev[i]])
        if c == -np.inf:
            continue
        if start[i] - c > TOL_US:
            k = int(np.searchsorted(d_ends, start[i] + 1e-6, side="right")) - 1
            if k >= 0 and d_streams[k] == streams[i - n_h]:
                k = prev_other[k]
            if k >= 0 and start[i] - d_ends[k] <= TOL_US and d_ends[k] > c:
                dep[i] = d_end_order[k]
                c = d_ends[k]
        lag[i] = max(start[i] - c, 0.0)

    # host syncs: wait for the latest-ending device work launched before them
    sync_ids = t.ids_matching(SYNC_RUNTIME_RE.search)
    is_sync = np.zeros(n, bool)
    is_sync[:n_h] = np.isin(t.name[host_rows], sync_ids)
    sync_on = np.full(n, -1)
    sync_base = dur.copy()
    launched = dev_idx[launch[dev_idx] >= 0]
    if launched.size:
        lo = launched[np.argsort(start[launch[launched]], kind="stable")]
        l_starts = start[launch[lo]]
        ends_lo = end[lo]
        prefix_arg = np.zeros(lo.size, dtype=np.int64)
        best = 0
        for j in range(lo.size):
            if ends_lo[j] > ends_lo[best]:
                best = j
            prefix_arg[j] = best
        typical = float(np.median(dur[:n_h])) if n_h else 0.0
        for i in np.flatnonzero(is_sync):
            j = int(np.searchsorted(l_starts, start[i], side="left")) - 1
            if j < 0:
                continue
            k = lo[prefix_arg[j]]
            if start[i] <= end[k] <= end[i] + TOL_US:
                sync_on[i] = k
                sync_base[i] = min(dur[i], typical)
    cw = np.zeros(n)
    cw_rank = np.full(n, -1)
    if comm_wait_us:
        for r, (v, other) in comm_wait_us.items():
            i = node_of_row.get(int(r))
            if i is not None:
                cw[i] = min(v, dur[i])
                cw_rank[i] = other
    cat = np.full(n, -1, dtype=np.int64)
    cat[n_h:] = t.category[dev_rows]
    order = np.lexsort((~is_host, start))  # host calls first at equal times
    return Graph(rows, is_host, start, dur, host_prev, host_gap, gap_dl, gap_ck, is_sync, sync_on, sync_base, launch, lat,
                 stream_prev, dep, lag, cat, cw, cw_rank, order, names=t.names)


@dataclass
class Replay:
    """Replayed timing (µs) of every node and the binding predecessor of each."""

    start: np.ndarray
    end: np.ndarray
    binding: np.ndarray  # node whose end/start set this node's start (-1: anchored)

    @property
    def makespan_us(self) -> float:
        return float(self.end.max() - self.start.min()) if self.end.size else 0.0


def replay(g: Graph, change: Change = Change()) -> Replay:
    """Replay the graph with one change applied; return the new timing."""
    n = g.start.size
    S = g.start.copy()
    E = g.start + g.dur
    bind = np.full(n, -1)
    dur = g.dur.copy()
    dev = ~g.is_host
    if change.kind == "speedup":
        sel = dev & (g.category == change.category)
        dur[sel] = dur[sel] / change.factor
    if change.kind == "remove_straggler_wait":
        dur = dur - g.comm_wait
    gap = g.host_gap - (g.gap_dataloader if change.kind == "remove_data_wait" else 0.0)
    if change.kind == "remove_checkpoint_wait":
        gap = gap - g.gap_checkpoint
    if change.kind == "host_speedup":
        gap = gap / change.factor
    comm = g.category == COMMUNICATION
    pending = np.zeros(n, bool)  # syncs whose end waits for device work not yet replayed

    def finish_sync(i: int) -> None:
        # a sync ends when the device work it waited for ends; by the time anything needs its end
        # (the next call on its thread, observed after the sync ended) that work has been replayed
        k = g.sync_on[i]
        E[i] = S[i] + g.sync_base[i] if change.kind == "remove_syncs" else max(S[i] + g.sync_base[i], E[k])
        pending[i] = False

    for i in g.order:
        if g.is_host[i]:
            p = g.host_prev[i]
            if p >= 0:
                if pending[p]:
                    finish_sync(p)
                S[i] = E[p] + gap[i]
                bind[i] = p
            E[i] = S[i] + dur[i]
            if g.is_sync[i] and g.sync_on[i] >= 0:
                pending[i] = True
        else:
            c, b = -np.inf, -1
            L = g.launch[i]
            if L >= 0:
                c, b = S[L] + g.lat[i], L
            p = g.stream_prev[i]
            if p >= 0 and E[p] > c:
                c, b = E[p], p
            d = g.dep[i]
            if d >= 0 and not (change.kind == "overlap_comm" and comm[d]) and E[d] > c:
                c, b = E[d], d
            if c > -np.inf:
                S[i] = c + g.lag[i]
                bind[i] = b
            E[i] = S[i] + dur[i]
    for i in np.flatnonzero(pending):
        finish_sync(int(i))
    return Replay(S, E, bind)


def critical_path(g: Graph, r: Replay) -> dict[str, float]:
    """Time on the critical path (walked back from the last end) by kind of work, µs.

    Buckets: cpu (host work between calls), dataloader, runtime (launch/API calls), sync_wait,
    launch_latency, kernel:<category>, wait_for_rank_<r> (inside a collective, waiting for rank r),
    lag (start delays the trace shows but no dependency explains)."""
    out: dict[str, float] = {}

    def add(k, v):
        if v > 0:
            out[k] = out.get(k, 0.0) + float(v)

    def before_host_call(j: int) -> int:
        # the host time between call j and its binding predecessor: data loading, the rest CPU work
        p = int(r.binding[j])
        if p >= 0:
            dl = min(g.gap_dataloader[j], r.start[j] - r.end[p])
            add("dataloader", dl)
            add("cpu", r.start[j] - r.end[p] - dl)
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
            if g.is_sync[i] and g.sync_on[i] >= 0 and r.end[g.sync_on[i]] >= r.end[i] - 1e-9 and \
                    r.end[g.sync_on[i]] > r.start[i] + g.sync_base[i]:
                add("sync_wait", r.end[i] - max(r.start[i], r.start[g.sync_on[i]]))
                t_cursor = max(r.start[i], r.start[g.sync_on[i]])
                i = int(g.sync_on[i])  # follow the device work the host waited for
            else:
                add("runtime", own)
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
