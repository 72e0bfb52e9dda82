"""The analysis window of a rank, defined exactly as HTA 0.5.0 defines it.

HTA keeps host events that start before the last ProfilerStep starts (the last step is usually
cut short by the profiler stopping) and the device events launched by those host events
(matched by correlation id). With fewer than two ProfilerStep names it keeps everything.
Device intervals are in µs; traces with float timestamps (ns resolution) are rounded as HTA
rounds them: start up (ceil), end down (floor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.trace.events import GPU_SYNC, KERNEL, MEMCPY, MEMSET, EventTable

DEVICE_BUSY_KINDS = (KERNEL, MEMCPY, MEMSET, GPU_SYNC)


@dataclass
class Window:
    """Rows of a rank inside the analysis window and the device intervals in µs."""

    keep: np.ndarray        # bool per row: inside the window
    device: np.ndarray      # row indices of device events (kernels, memcpy, memset, gpu syncs) in the window
    ts_us: np.ndarray       # start of each row (µs, HTA rounding applied)
    end_us: np.ndarray      # end of each row (µs)
    steps_excluded: list[int]
    note: str = ""

    @property
    def start_us(self) -> float:
        """First device event start (µs), nan without device events."""
        return float(self.ts_us[self.device].min()) if self.device.size else float("nan")

    @property
    def stop_us(self) -> float:
        """Last device event end (µs), nan without device events."""
        return float(self.end_us[self.device].max()) if self.device.size else float("nan")


def device_mask(t: EventTable) -> np.ndarray:
    """Rows that run on a device in HTA's sense: a stream and a correlation id, or a device-wide sync."""
    sync_ids = [i for i, s in enumerate(t.names) if s in ("Event Sync", "Context Sync")]
    return ((t.stream >= 0) & (t.correlation >= 0)) | np.isin(t.name, sync_ids)


def ns_to_us(ns: np.ndarray) -> np.ndarray:
    """Epoch ns (int64) to µs (float64) with one rounding: ns / 1000.0 would first round ns to 256 ns."""
    return (ns // 1000).astype(np.float64) + (ns % 1000) / 1000.0


def times_us(t: EventTable) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every row in µs with HTA's rounding of float-timestamp traces."""
    ts = ns_to_us(t.ts_ns)
    end = ns_to_us(t.ts_ns + t.dur_ns)
    if t.ts_was_float:
        ts, end = np.ceil(ts), np.floor(end)
    return ts, end


def analysis_window(t: EventTable, include_last_step: bool = False) -> Window:
    """The HTA analysis window of one rank (see the module docstring)."""
    on_dev = device_mask(t)
    ts_us, end_us = times_us(t)
    step_ids = [i for i, s in enumerate(t.names) if "ProfilerStep" in s]
    excluded: list[int] = []
    if len(step_ids) >= 2:
        host_steps = np.flatnonzero(~on_dev & np.isin(t.name, step_ids))
        if host_steps.size:
            if include_last_step:
                host_keep = ~on_dev & (ts_us <= end_us[host_steps].max())
            else:
                last = host_steps[np.argmax(ts_us[host_steps])]
                host_keep = ~on_dev & (ts_us < ts_us[last])
                excluded = [int(t.step[last])] if t.step is not None else []
            kept_corr = np.unique(t.correlation[host_keep])
            keep = host_keep | (on_dev & np.isin(t.correlation, kept_corr))
        else:
            keep = ~on_dev
    else:
        keep = np.ones(len(t), dtype=bool)
    note = "" if len(step_ids) >= 2 or include_last_step else (
        "fewer than two ProfilerStep annotations: the whole trace is analysed (profile with a "
        "torch.profiler schedule and call prof.step() each iteration for per-step results)")
    device = np.flatnonzero(keep & (t.stream != -1) & np.isin(t.kind, DEVICE_BUSY_KINDS))
    return Window(keep=keep, device=device, ts_us=ts_us, end_us=end_us, steps_excluded=excluded, note=note)


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as disjoint sorted (start, end) arrays (touching intervals stay apart, as HTA)."""
    if start.size == 0:
        return start.astype(float), end.astype(float)
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    cm = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > cm[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], cm[last]


def union_us(w: Window, rows: np.ndarray) -> float:
    """Length of the union of the given rows' intervals (µs): time covered by at least one of them."""
    s, e = merge_intervals(w.ts_us[rows], w.end_us[rows])
    return float((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Total length of the intersection of two merged interval sets (same unit as the inputs)."""
    (s1, e1), (s2, e2) = a, b
    if s1.size == 0 or s2.size == 0:
        return 0.0
    times = np.concatenate([s1, e1, s2, e2])
    delta = np.concatenate([np.ones_like(s1), -np.ones_like(e1), 2 * np.ones_like(s2), -2 * np.ones_like(e2)])
    o = np.lexsort((delta, times))  # at equal times, ends (negative) before starts: touching is no overlap
    times, running = times[o], np.cumsum(delta[o])
    both = running[:-1] == 3
    return float((times[1:][both] - times[:-1][both]).sum())
