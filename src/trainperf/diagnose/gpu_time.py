"""Where a rank's device time goes: temporal breakdown, idle split, comm/compute overlap, categories.

Definitions follow HTA 0.5.0 so that the numbers agree with it (benchmarks/compare_hta.py):
- window = first device event start .. last device event end in the analysis window;
- idle = window - union of all device intervals; compute = union of compute kernels (not
  communication, memcpy, memset or syncs); non-compute = the rest of the busy time;
- overlap = |union(comm) ∩ union(compute)| / |union(comm)|;
- idle split, per stream then summed: the gap before a kernel is host wait when its launch
  started after the previous kernel on the stream ended, kernel wait when shorter than 30 µs,
  else other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.window import Window, intersection_length, merge_intervals, uncovered, union_us
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import (CAT_MEMCPY, CAT_MEMSET, CATEGORY_NAMES, COMMUNICATION, GPU_SYNC, KERNEL, MEMCPY,
                                    MEMSET, EventTable)

KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay default


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


@dataclass
class TemporalBreakdown:
    """Window time split into idle, compute and non-compute (µs and % of the window)."""

    window_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float

    @property
    def busy_us(self) -> float:
        """µs of the window with a device event running."""
        return self.window_us - self.idle_us

    @property
    def idle_pct(self) -> float:
        return _pct(self.idle_us, self.window_us)

    @property
    def compute_pct(self) -> float:
        return _pct(self.compute_us, self.window_us)

    @property
    def non_compute_pct(self) -> float:
        return _pct(self.non_compute_us, self.window_us)


def compute_mask(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Which device rows are computation (not communication, memcpy/memset or a sync)."""
    cat = t.category[rows]
    return (t.kind[rows] == KERNEL) & ~np.isin(cat, (COMMUNICATION, CAT_MEMCPY, CAT_MEMSET)) & \
        ~np.isin(t.name[rows], t.ids_matching(lambda s: "Sync" in s or "Memcpy" in s or s.startswith("Memset")))


def temporal_breakdown(t: EventTable, w: Window) -> TemporalBreakdown:
    """Idle / compute / non-compute time of the window (µs)."""
    rows = w.device
    if rows.size == 0:
        return TemporalBreakdown(0.0, 0.0, 0.0, 0.0)
    window = w.stop_us - w.start_us
    compute = union_us(w, rows[compute_mask(t, rows)])
    idle = window - union_us(w, rows)
    return TemporalBreakdown(window, idle, compute, window - compute - idle)


def concurrent_compute_us(t: EventTable, w: Window, rows: np.ndarray) -> np.ndarray:
    """For each device row of `rows`, how long (µs) computation kernels (compute_mask) of the device's other streams
    ran during it: kernels sharing the device's SMs each run slower, so a duration then measures less than the
    kernel's own speed."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(rows.size)
    comp = w.device[compute_mask(t, w.device)]
    if not rows.size or not comp.size:
        return out
    lanes, lane_of = np.unique(np.stack([t.pid[comp], t.stream[comp]], axis=1), axis=0, return_inverse=True)
    lane_of = lane_of.ravel()
    for k, (pid, stream) in enumerate(lanes):
        lane = comp[lane_of == k]
        busy = merge_intervals(w.ts_us[lane], w.end_us[lane])
        other = (t.pid[rows] == pid) & (t.stream[rows] != stream)
        out += np.where(other, _busy_until(busy, w.end_us[rows]) - _busy_until(busy, w.ts_us[rows]), 0.0)
    return out


def _busy_until(busy: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """How much of the disjoint sorted intervals `busy` (starts, ends; µs) lies before each time of x (µs)."""
    s, e = busy
    before = np.concatenate([[0.0], np.cumsum(e - s)])  # their length before each interval
    i = np.searchsorted(s, x, side="right")  # the intervals starting at or before x
    return before[i] - np.where(i > 0, np.maximum(e[np.maximum(i - 1, 0)] - x, 0.0), 0.0)


@dataclass
class Overlap:
    """Communication time and the share of it hidden under computation."""

    comm_us: float
    overlapped_us: float

    @property
    def overlap_pct(self) -> float:
        return _pct(self.overlapped_us, self.comm_us)

    @property
    def exposed_us(self) -> float:
        return self.comm_us - self.overlapped_us


def comm_comp_overlap(t: EventTable, w: Window, comm_rows: np.ndarray | None = None) -> Overlap:
    """Union of communication kernels (all of the window's, or the given rows), and how much of it overlaps the union
    of compute kernels (µs)."""
    rows = w.device
    if comm_rows is None:
        comm_rows = rows[(t.category[rows] == COMMUNICATION) & (t.kind[rows] == KERNEL)]
    comp_rows = rows[compute_mask(t, rows)]
    comm = merge_intervals(w.ts_us[comm_rows], w.end_us[comm_rows])
    comp = merge_intervals(w.ts_us[comp_rows], w.end_us[comp_rows])
    comm_us = float((comm[1] - comm[0]).sum())
    return Overlap(comm_us, intersection_length(comm, comp))


@dataclass
class IdleSplit:
    """Idle time between device events on each stream, by cause (µs), summed over streams."""

    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    by_stream: dict[int, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us

    def pct(self) -> tuple[float, float, float]:
        """(host wait, kernel wait, other) in % of the total idle time."""
        tot = self.total_us
        return _pct(self.host_wait_us, tot), _pct(self.kernel_wait_us, tot), _pct(self.other_us, tot)


def idle_split(t: EventTable, w: Window, kernel_wait_us: float = KERNEL_WAIT_US) -> IdleSplit:
    """Classify each gap between consecutive device events of a stream (µs)."""
    rows = w.device[np.isin(t.kind[w.device], (KERNEL, MEMCPY, MEMSET))]
    link = correlated_host_row(t)
    launch = link[rows]
    launch_ts = np.where(launch >= 0, w.ts_us[np.clip(launch, 0, None)], -np.inf)
    totals = np.zeros(3)
    by_stream: dict[int, tuple[float, float, float]] = {}
    streams = t.stream[rows]
    for s in np.unique(streams):
        sel = np.flatnonzero(streams == s)
        o = sel[np.argsort(w.ts_us[rows[sel]], kind="stable")]
        ts, end, lts = w.ts_us[rows[o]], w.end_us[rows[o]], launch_ts[o]
        if ts.size < 2:
            by_stream[int(s)] = (0.0, 0.0, 0.0)
            continue
        # the latest end so far, not the previous kernel's: kernels that overlap by a few µs (common in
        # real traces) or nest would otherwise give negative gaps, i.e. negative idle shares (issue 14)
        prev_end = np.maximum.accumulate(end)[:-1]
        gap = np.maximum(ts[1:] - prev_end, 0.0)
        host = lts[1:] > prev_end
        kern = ~host & (gap < kernel_wait_us)
        other = ~host & ~kern
        v = (float(gap[host].sum()), float(gap[kern].sum()), float(gap[other].sum()))
        by_stream[int(s)] = v
        totals += v
    return IdleSplit(*map(float, totals), by_stream=by_stream)


@dataclass
class CategoryTime:
    """Device time of one kernel category in the window."""

    category: str
    time_us: float
    count: int
    pct_of_busy: float
    top_kernels: list[tuple[str, float, int, float]]  # (name, total µs, count, first start µs)


def kernel_breakdown(t: EventTable, w: Window, top: int = 3) -> list[CategoryTime]:
    """Device time per kernel category (sum of durations, µs), largest first, with top kernels."""
    rows = w.device[t.kind[w.device] != GPU_SYNC]
    dur = w.end_us[rows] - w.ts_us[rows]
    total = float(dur.sum())
    out = []
    for c in np.unique(t.category[rows]):
        if c < 0:
            continue
        sel = t.category[rows] == c
        names, inv = np.unique(t.name[rows][sel], return_inverse=True)
        per = np.bincount(inv, weights=dur[sel])
        cnt = np.bincount(inv)
        o = np.argsort(-per)[:top]
        out.append(CategoryTime(CATEGORY_NAMES[c], float(dur[sel].sum()), int(sel.sum()),
                                _pct(float(dur[sel].sum()), total),
                                [(t.names[int(names[i])], float(per[i]), int(cnt[i]),
                                  float(w.ts_us[rows][sel][inv == i].min())) for i in o]))
    return sorted(out, key=lambda c: -c.time_us)


def idle_gaps_us(w: Window, start_us: float | None = None, end_us: float | None = None) -> np.ndarray:
    """The lengths (µs) of the device's idle gaps in time order: over the window's device span (HTA's idle, first to
    last device event) by default, else over [start_us, end_us) with the device events counted as idle_in_span_us
    counts them (the idle before the first and after the last included: the analysed steps' host window)."""
    if start_us is None or end_us is None:
        s, e = merge_intervals(w.ts_us[w.device], w.end_us[w.device])
        return s[1:] - e[:-1]
    a, b = uncovered(start_us, end_us, *_busy_intervals(w))
    return b - a


def _busy_intervals(w: Window) -> tuple[np.ndarray, np.ndarray]:
    """The device's busy intervals (µs, merged, in order) as idle_in_span_us counts them: every device event of the
    trace (Window.device_all), and the work queued before the trace from its start (Window.queued_until_us)."""
    rows = w.device if w.device_all is None else w.device_all
    starts, ends = w.ts_us[rows], w.end_us[rows]
    if w.queued_until_us > float("-inf"):  # busy with work launched before the trace from its start
        starts, ends = np.r_[w.ts_us.min(), starts], np.r_[w.queued_until_us, ends]
    return merge_intervals(starts, ends)


def idle_in_span_us(w: Window, start_us: float, end_us: float) -> float:
    """Time in [start_us, end_us) with no device event running (µs): the GPU idle over a host-side span (the
    analysed steps), where HTA's breakdown measures idle only between the first and the last device event. A
    413-ms step holding one 45-µs kernel is ~100 % idle over the step and 0 % over its device span. Every device
    event of the trace counts (Window.device_all), the window's or not: work launched before the window keeps
    the device busy while the host, steps ahead in a GPU-bound loop, launches the window's; so does the work the
    trace did not record before its first device event, when that event was queued before the trace began
    (Window.queued_until_us)."""
    return float(idle_in_spans_us(w, np.array([start_us]), np.array([end_us]))[0])


def idle_in_spans_us(w: Window, starts_us: np.ndarray, ends_us: np.ndarray) -> np.ndarray:
    """idle_in_span_us of each span [starts_us[i], ends_us[i]) (µs; 0 for an empty span), at one merge of the
    device events for all of them."""
    s, e = _busy_intervals(w)
    done = np.r_[0.0, np.cumsum(e - s)]  # device busy time before each merged interval starts

    def busy_before(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, x, side="right")  # merged intervals that start at or before x
        return done[k] - np.where(k > 0, np.maximum(e[np.maximum(k - 1, 0)] - x, 0.0), 0.0)

    a, b = np.asarray(starts_us, dtype=float), np.asarray(ends_us, dtype=float)
    b = np.maximum(a, b)
    return (b - a) - (busy_before(b) - busy_before(a))
