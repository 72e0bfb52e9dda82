"""The analysis window of a rank: its steps (one step finder, `find_step_markers`) and the rows inside it.

The window is HTA 0.5.0's: host events that start before the last ProfilerStep starts (the last step is
usually cut short by the profiler stopping) and the device events launched by those host events (matched by
correlation id); with fewer than two steps it keeps everything. Device intervals are in µs; traces with float
timestamps (ns resolution) are rounded as HTA rounds them: start up (ceil), end down (floor).

The steps are found once per rank, by trace.annotate.step_rows (the one step finder: t.step, which every
per-step figure groups by, reads the same rows), and the window carries them (Window.markers): the per-step
figures (steps.step_times), the analysed step list (Window.steps), the replay's anchors and the notes on
missing steps all read them.

Markers, as PyTorch's profiler writes them (torch.profiler.profile(schedule=...) with prof.step() once per
iteration): a record function `ProfilerStep#N` on the host thread that calls prof.step(), with category
"user_annotation" (PyTorch >= 2.0; "cpu_op" before, kineto PR 709). Kineto also mirrors user annotations onto
the GPU timeline as "gpu_user_annotation" events, one per stream, so a modern CUDA trace holds a second
`ProfilerStep#N` per step on the device. Those device copies are markers only, never step boundaries: they
have no correlation to a launch, they start when the step's first kernel starts (after the host has moved on,
by ~27 ms on a ROCm trace we have seen) and they can cover only part of the step's kernels (kineto issue
1022: on backward only the first kernel). Taking one for a host step moves the window's cut to the wrong place.
A span of that name on another host thread (a user's own record function) is not a step either: the steps
are those of the thread with the most of them.

A trace without host ProfilerStep spans (an inference trace, a profile of a few iterations without a
schedule) does not say where a step starts or ends. The step finder then finds no steps and says why
(StepMarkers.note), naming the iteration-like annotations it saw (Optimizer.step) without turning them into
steps: a job with several optimizers steps each once per iteration, a GradScaler skips the step after an
overflow, and where an iteration begins (its data loading) is not recorded at all; a wrong boundary would
price every per-step finding against the wrong length. The whole trace is then the window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.trace.annotate import HOST_STEP_KINDS, STEP_RE, launch_side, step_numbers, step_rows
from trainperf.trace.events import GPU_ANNOTATION, GPU_SYNC, KERNEL, MEMCPY, MEMSET, RUNTIME, EventTable

DEVICE_BUSY_KINDS = (KERNEL, MEMCPY, MEMSET, GPU_SYNC)
ITERATION_HINT_RE = re.compile(r"^Optimizer\.step#")  # torch.optim's record function, one per optimizer step
MIN_WINDOW_STEPS = 2  # HTA: with fewer ProfilerSteps the whole trace is the window
PER_STEP_FIX = ("profile with torch.profiler.profile(schedule=...) and call prof.step() once per iteration for "
                "per-step results")
# the same in Nsight Systems: a range named as the PyTorch profiler names a step is a step (trace/nsys.py), and a
# capture range keeps start-up out of a report that would otherwise hold the whole run
NSYS_PER_STEP_FIX = ("name each iteration with an NVTX range ProfilerStep#N "
                     "(torch.cuda.nvtx.range(f\"ProfilerStep#{i}\")) for per-step results, and capture the training "
                     "steps only (nsys profile "
                     "--capture-range=cudaProfilerApi, torch.cuda.cudart().cudaProfilerStart() / Stop() around them)")


@dataclass(kw_only=True, frozen=True)
class StepMarkers:
    """A rank's ProfilerStep#N markers: the host spans that define its steps, the device copies Kineto mirrors
    onto the streams (markers only), and why there are no steps when there are none (note; "" otherwise)."""

    host_rows: np.ndarray     # rows of the host ProfilerStep#N spans of the stepping thread, by start time
    numbers: np.ndarray       # N of each host row
    device_rows: np.ndarray   # rows of the gpu_user_annotation ProfilerStep#N copies
    ignored_rows: np.ndarray  # host ProfilerStep spans on other threads than the stepping one
    note: str = ""

    @property
    def count(self) -> int:
        """Number of host steps found."""
        return int(self.host_rows.size)


def find_step_markers(t: EventTable) -> StepMarkers:
    """The ProfilerStep#N markers of one rank (see the module docstring): the host steps are
    trace.annotate.step_rows' (the stepping thread's), the one step finder every per-step figure reads."""
    host, ignored = step_rows(t)
    ids = t.ids_matching(STEP_RE.match)
    device = np.flatnonzero(np.isin(t.name, ids) & (t.kind == GPU_ANNOTATION)) if ids.size else host[:0]
    return StepMarkers(host_rows=host, numbers=step_numbers(t, host), device_rows=device, ignored_rows=ignored,
                       note="" if host.size else _no_steps_note(t, device))


def step_runs(numbers: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive step numbers (first, last; inclusive), in the order the steps ran (numbers: a rank's
    StepMarkers.numbers). One run for a trace of one profiling cycle; several when
    torch.profiler.schedule(..., repeat=N) recorded N cycles into one trace, with the steps between them unprofiled."""
    n = [int(x) for x in numbers]
    if not n:
        return []
    runs, first = [], n[0]
    for prev, cur in zip(n, n[1:]):
        if cur != prev + 1:
            runs.append((first, prev))
            first = cur
    return runs + [(first, n[-1])]


def one_profiling_cycle(numbers: np.ndarray) -> tuple[tuple[int, int] | None, str]:
    """(the steps to analyse, a note) when a rank's steps (StepMarkers.numbers) hold several profiling cycles: the
    longest run of consecutive steps, the latest of equal ones; (None, "") for one cycle. Between cycles nothing was
    profiled: a window across them reads the unprofiled time as host work or idle."""
    runs = step_runs(numbers)
    if len(runs) < 2:
        return None, ""
    best = max(reversed(runs), key=lambda r: r[1] - r[0])  # reversed: max keeps the first of equals, the latest
    where = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
    return best, (f"the ProfilerStep numbers run in {len(runs)} stretches ({where}): {len(runs)} profiling cycles "
                  f"(torch.profiler.schedule with repeat), nothing profiled between them; steps {best[0]}-{best[1]} "
                  "are analysed (the longest stretch, the latest of equal ones); choose others with --step-window A:B")


def iteration_hint_rows(t: EventTable) -> np.ndarray:
    """Rows of torch.optim's `Optimizer.step#...` record functions on the host (ITERATION_HINT_RE), one per optimizer
    step: what marks the iterations of a trace profiled without prof.step()."""
    opt = t.ids_matching(ITERATION_HINT_RE.match)
    if not opt.size:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.isin(t.name, opt) & np.isin(t.kind, HOST_STEP_KINDS))


def _no_steps_note(t: EventTable, device: np.ndarray) -> str:
    """Why a rank without host ProfilerStep spans gets no per-step figures, and what to do."""
    if device.size:
        return (f"ProfilerStep#N appears only on the GPU timeline ({device.size} device annotations, no host span): "
                f"where each step starts and ends on the host is not recorded, so no per-step figures; {PER_STEP_FIX}")
    n_opt = int(iteration_hint_rows(t).size)
    seen = (f", although {n_opt} Optimizer.step annotations suggest {n_opt} iterations (their boundaries are not "
            "step boundaries: several optimizers, skipped steps and the data loading before each are not told "
            "apart)") if n_opt else ""
    return f"no ProfilerStep#N spans: the trace does not say where a training step starts or ends{seen}; {PER_STEP_FIX}"


@dataclass
class Window:
    """Rows of a rank inside the analysis window, the device intervals in µs, and the steps it was cut by."""

    keep: np.ndarray        # bool per row: inside the window
    device: np.ndarray      # row indices of device events (kernels, memcpy, memset, gpu syncs) in the window
    ts_us: np.ndarray       # start of each row (µs, HTA rounding applied)
    end_us: np.ndarray      # end of each row (µs)
    steps_excluded: list[int]
    markers: StepMarkers    # the rank's steps (find_step_markers), found once
    note: str = ""          # why the window is the whole trace, when it is ("" otherwise)
    # row indices of every device event of the trace, in the window or not: what keeps the device busy during a
    # host span, work launched before the window included (a GPU-bound loop's host runs steps ahead of it)
    device_all: np.ndarray | None = None
    # the device ran work the trace did not record until this time (µs; -inf when none): the first device event of
    # the trace was launched before it started, so it waited in a queue behind earlier work (a GPU-bound loop
    # profiled after warm-up steps whose kernels started before the profiler's active window)
    queued_until_us: float = float("-inf")

    @property
    def start_us(self) -> float:
        """First device event start (µs), nan without device events."""
        return float(self.ts_us[self.device].min()) if self.device.size else float("nan")

    @property
    def stop_us(self) -> float:
        """Last device event end (µs), nan without device events."""
        return float(self.end_us[self.device].max()) if self.device.size else float("nan")

    @property
    def steps(self) -> list[int]:
        """Numbers of the steps analysed: the markers' host steps inside the window, the cut-off one excluded."""
        m = self.markers
        inside = self.keep[m.host_rows] if m.count else np.zeros(0, dtype=bool)
        return [int(n) for n in m.numbers[inside] if int(n) not in self.steps_excluded]


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
        # an event under 1 µs that crosses no whole µs rounds to end < start (756 rows of an H200 trace): kept as an
        # instant, not a negative duration that would subtract from a sum or a percentile of durations
        ts = np.ceil(ts)
        end = np.maximum(np.floor(end), ts)
    return ts, end


def analysis_window(t: EventTable, include_last_step: bool = False, markers: StepMarkers | None = None) -> Window:
    """The analysis window of one rank (see the module docstring), cut by its steps (markers, found here when
    not given). include_last_step: keep the last step too (the trace was already cut to chosen steps)."""
    m = markers if markers is not None else find_step_markers(t)
    on_dev = device_mask(t)
    ts_us, end_us = times_us(t)
    excluded: list[int] = []
    if m.count >= MIN_WINDOW_STEPS:
        if include_last_step:
            host_keep = ~on_dev & (ts_us <= end_us[m.host_rows].max())
        else:
            host_keep = ~on_dev & (ts_us < ts_us[m.host_rows[-1]])  # host_rows are sorted by start
            excluded = [int(m.numbers[-1])]
        kept_corr = np.unique(t.correlation[host_keep])
        keep = host_keep | (on_dev & np.isin(t.correlation, kept_corr))
    else:
        keep = np.ones(len(t), dtype=bool)
    busy = np.flatnonzero((t.stream != -1) & np.isin(t.kind, DEVICE_BUSY_KINDS))
    return Window(keep=keep, device=busy[keep[busy]], ts_us=ts_us, end_us=end_us, steps_excluded=excluded,
                  markers=m, note="" if include_last_step else whole_trace_note(m), device_all=busy,
                  queued_until_us=_queued_until_us(t, busy, ts_us))


def _queued_until_us(t: EventTable, busy: np.ndarray, ts_us: np.ndarray) -> float:
    """Start of the trace's first device event when it was launched before the trace began (a correlation id and
    no launch call in a trace that records launches): until then the device ran earlier, unrecorded work; -inf
    otherwise."""
    if not busy.size or not (t.kind == RUNTIME).any():
        return float("-inf")
    first = busy[int(np.argmin(ts_us[busy]))]
    corr = t.correlation[first]
    launched_here = ((t.correlation == corr) & launch_side(t)).any()
    return float("-inf") if corr < 0 or launched_here else float(ts_us[first])


def launched_before_trace(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Which device rows (bool per row) ran work launched before the trace began: a correlation id lower than every
    launch call the trace records, and no launch call of their own (a profile started mid-run finds the device busy
    with earlier steps' work; a sampled trace's unrecorded launches are interleaved with its recorded ones, not
    before them all)."""
    host = launch_side(t) & (t.correlation >= 0) & (t.kind == RUNTIME)
    if not host.any():
        return np.zeros(rows.size, dtype=bool)
    corr = t.correlation[rows]
    return (corr >= 0) & (corr < t.correlation[host].min())


def whole_trace_note(m: StepMarkers) -> str:
    """Why the whole trace is the window (fewer than MIN_WINDOW_STEPS steps), "" when it is not."""
    if m.count >= MIN_WINDOW_STEPS:
        return ""
    if m.count == 0:
        return f"{m.note}; the whole trace is analysed"
    return (f"one ProfilerStep (#{int(m.numbers[0])}): the whole trace is analysed, the host work before and "
            f"after that step included; {PER_STEP_FIX}")


def row_events(t: EventTable, w: Window, rows) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of each table row in the window: a finding's evidence events."""
    return [(t.name_of(int(r)), float(w.ts_us[r]), float(w.end_us[r] - w.ts_us[r])) for r in rows]


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


def uncovered(start: float, end: float, cut_start: np.ndarray, cut_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of [start, end) outside the intervals (cut_start, cut_end), merged and sorted (merge_intervals), as
    (starts, ends) arrays in order; empty pieces left out."""
    inside = (cut_end > start) & (cut_start < end)
    s, e = np.clip(cut_start[inside], start, end), np.clip(cut_end[inside], start, end)
    a, b = np.r_[start, e], np.r_[s, end]
    keep = b > a
    return a[keep], b[keep]


def covered_each(starts: np.ndarray, ends: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Length of each [start, end) covered by the merged spans (merge_intervals' (starts, ends); the inputs' unit)."""
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


def covered_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals (same unit as the inputs): time covered by at least one of them."""
    s, e = merge_intervals(start, end)
    return float((e - s).sum())


def union_us(w: Window, rows: np.ndarray) -> float:
    """Length of the union of the given rows' intervals (µs): time covered by at least one of them."""
    return covered_length(w.ts_us[rows], w.end_us[rows])


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
