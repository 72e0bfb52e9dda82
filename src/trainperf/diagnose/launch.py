"""Kernel launches: launch delay, small kernels, queue length and launch-bound stretches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.window import Window
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import COMMUNICATION, KERNEL, MEMCPY, MEMSET, EventTable
from trainperf.trace.nesting import enclosing_span, thread_key

SMALL_KERNEL_US = 10.0
# A small kernel is a compute or copy kernel: a short collective is not fused into its neighbours by foreach
# ops or torch.compile (its fix is fewer, larger buckets), so communication kernels never count as small.
# Nor does a kernel that already serves many tensors in one launch (multi_tensor_apply: foreach ops, fused
# optimizers, Apex): it is the fusion small_kernels recommends, so counting it would recommend what is done.
FUSED_ACROSS_TENSORS = ("multi_tensor_apply",)
LAUNCH_BOUND_MIN_KERNELS = 20
# A launch call longer than this is not launch overhead but an outlier (HTA's get_cuda_kernel_launch_stats
# runtime_cutoff default; HTA: "the launch time on the CPU side is between 5-20 microseconds"): a launch that
# loads the kernel's code on first use (HTA's MI250 step: one 6.5-ms hipLaunchKernel beside 5-12 µs ones).
# Graphing or fusing the launch does not remove that wait. (A launch that waited for a slot in the full queue, or
# for its own kernel, is found as such and costs what it costs unblocked: replay.build_graph.)
LAUNCH_CALL_OUTLIER_US = 50.0
# ... or this many times the trace's usual launch call (the median of those that did not block), where that is
# longer: a host whose every launch is slow (a contended or slower CPU, a heavier driver call: 70-270 µs a launch
# where 5-20 is usual) pays that on every launch, and a CUDA graph removes it; an absolute cutoff read all of it as
# outliers and priced such a loop's launches at nothing (a launch-bound loop 20 % slower for it: launch_bound 1.8 %).
# 10: HTA's cutoff over the low end of its usual range (50 over 5 µs); the first-use load stands 1,000x over its
# step's usual 6 µs. Stated, not fitted.
LAUNCH_CALL_OUTLIER_RATIO = 10.0


def launch_call_cutoff_us(usual_launch_us: float) -> float:
    """The longest a launch call may take and still be launch overhead, not an outlier (µs): LAUNCH_CALL_OUTLIER_US
    or LAUNCH_CALL_OUTLIER_RATIO times the trace's usual launch call (usual_launch_us), whichever is longer."""
    return max(LAUNCH_CALL_OUTLIER_US, LAUNCH_CALL_OUTLIER_RATIO * usual_launch_us)


def graph_launched(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Which of the device rows were launched by a call that launched other device work too (bool per row): a
    CUDA/HIP graph replay, where one cudaGraphLaunch starts every kernel of the graph and each carries its
    correlation id. Such a kernel is not launched one by one: it pays no launch of its own."""
    link = correlated_host_row(t)
    per_call = np.bincount(link[link >= 0], minlength=len(t))
    mine = link[rows]
    return (mine >= 0) & (per_call[np.clip(mine, 0, None)] > 1)


def small_kernel_mask(t: EventTable, rows: np.ndarray, dur_us: np.ndarray, replayed: np.ndarray | None = None
                      ) -> np.ndarray:
    """Which of the device rows are small kernels (bool per row): kernels shorter than SMALL_KERNEL_US (dur_us,
    per row) that are neither communication, nor already fused across tensors (FUSED_ACROSS_TENSORS), nor
    replayed from a graph (graph_launched, or `replayed` when the caller has it: their launches are already one
    call). The one definition the small-kernel statistics (launch_stats), the GPU idle before them and the what-if
    (replay.Graph.small_launch) share."""
    fused = t.ids_matching(lambda s: any(m in s for m in FUSED_ACROSS_TENSORS))
    replayed = graph_launched(t, rows) if replayed is None else replayed
    return ((t.kind[rows] == KERNEL) & (dur_us < SMALL_KERNEL_US) & (t.category[rows] != COMMUNICATION)
            & ~np.isin(t.name[rows], fused) & ~replayed)


def launched_rows(t: EventTable, w: Window) -> tuple[np.ndarray, np.ndarray]:
    """(device rows, their launch rows) for window kernels/memcpys/memsets that have a host launch."""
    rows = w.device[np.isin(t.kind[w.device], (KERNEL, MEMCPY, MEMSET))]
    link = correlated_host_row(t)[rows]
    ok = link >= 0
    return rows[ok], link[ok]


def launched_inside(t: EventTable, w: Window, key: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray
                    ) -> np.ndarray:
    """The window's kernels, memcpys and memsets whose launch call starts inside one of the host spans (thread
    key, start and end ns each; nested or disjoint), as device rows."""
    rows, link = launched_rows(t, w)
    if not rows.size or not key.size:
        return rows[:0]
    hit = enclosing_span(key, start_ns, end_ns, thread_key(t.pid[link], t.tid[link]), t.ts_ns[link])
    return rows[hit >= 0]


@dataclass(kw_only=True)
class LaunchStats:
    """Launch delay (kernel start - launch call start, µs) and small-kernel share."""

    n_kernels: int
    delay_median_us: float
    delay_p95_us: float
    delay_max_us: float
    small_kernel_count_pct: float   # kernels shorter than SMALL_KERNEL_US, % of kernels
    small_kernel_time_pct: float    # their time, % of kernel time
    launch_overhead_us: float       # median duration of the launch call itself
    small_kernel_host_wait_us: float = 0.0  # device idle right before small kernels, waiting for their launch


def launch_stats(t: EventTable, w: Window) -> LaunchStats:
    """Launch delays and small-kernel share over the window."""
    rows, link = launched_rows(t, w)
    krows = w.device[t.kind[w.device] == KERNEL]
    kdur = w.end_us[krows] - w.ts_us[krows]
    small = small_kernel_mask(t, krows, kdur)
    if rows.size == 0:
        d = np.zeros(1)
        over = 0.0
    else:
        d = w.ts_us[rows] - w.ts_us[link]
        over = float(np.median(w.end_us[link] - w.ts_us[link]))
    tot = float(kdur.sum())
    return LaunchStats(n_kernels=int(krows.size), delay_median_us=float(np.median(d)),
                       delay_p95_us=float(np.percentile(d, 95)), delay_max_us=float(d.max()),
                       small_kernel_count_pct=100.0 * small.mean() if krows.size else 0.0,
                       small_kernel_time_pct=100.0 * float(kdur[small].sum()) / tot if tot > 0 else 0.0,
                       launch_overhead_us=over, small_kernel_host_wait_us=_small_kernel_host_wait(t, w, rows, link))


def _by_stream(t: EventTable, w: Window, rows: np.ndarray, link: np.ndarray):
    """Yield, per stream with >= 2 launched device events, (stream, positions into rows in time order,
    their start µs, end µs, their launch calls' start µs)."""
    for s in np.unique(t.stream[rows]):
        sel = np.flatnonzero(t.stream[rows] == s)
        o = sel[np.argsort(w.ts_us[rows[sel]], kind="stable")]
        if o.size >= 2:
            yield int(s), o, w.ts_us[rows[o]], w.end_us[rows[o]], w.ts_us[link[o]]


def _small_kernel_host_wait(t: EventTable, w: Window, rows: np.ndarray, link: np.ndarray) -> float:
    """Idle device time (µs) before small kernels whose launch call started after the stream went idle."""
    total = 0.0
    small_rows = small_kernel_mask(t, rows, w.end_us[rows] - w.ts_us[rows])
    for _, o, ts, end, lts in _by_stream(t, w, rows, link):
        small = small_rows[o][1:]
        waited = lts[1:] > end[:-1]
        total += float(np.maximum(ts[1:] - end[:-1], 0.0)[small & waited].sum())
    return total


@dataclass
class QueueLength:
    """Kernels launched but not finished, sampled at each launch (per stream, mean and max)."""

    by_stream: dict[int, tuple[float, int]]


def queue_length(t: EventTable, w: Window) -> QueueLength:
    """Outstanding (launched, not yet finished) device events on each stream, at each launch."""
    rows, link = launched_rows(t, w)
    out: dict[int, tuple[float, int]] = {}
    for s in np.unique(t.stream[rows]):
        sel = t.stream[rows] == s
        launch = np.sort(w.ts_us[link[sel]])
        end = np.sort(w.end_us[rows[sel]])
        q = np.arange(1, launch.size + 1) - np.searchsorted(end, launch, side="right")
        q = np.maximum(q, 0)  # clock skew between host and device can make it negative
        out[int(s)] = (float(q.mean()), int(q.max()))
    return QueueLength(out)


@dataclass
class LaunchBoundStretch:
    """A run of consecutive kernels on one stream each launched after the previous one ended."""

    stream: int
    start_us: float
    end_us: float
    n_kernels: int
    idle_us: float


def launch_bound_stretches(t: EventTable, w: Window, min_kernels: int = LAUNCH_BOUND_MIN_KERNELS
                           ) -> list[LaunchBoundStretch]:
    """Stretches where the device waited on the host for >= min_kernels consecutive kernels."""
    rows, link = launched_rows(t, w)
    out = []
    for s, o, ts, end, lts in _by_stream(t, w, rows, link):
        host_wait = np.r_[False, lts[1:] > end[:-1]]
        gaps = np.r_[0.0, ts[1:] - end[:-1]]
        edges = np.diff(np.r_[0, host_wait.astype(np.int8), 0])
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            if b - a >= min_kernels:
                out.append(LaunchBoundStretch(s, float(ts[a - 1] if a > 0 else ts[a]), float(end[b - 1]),
                                              int(b - a), float(gaps[a:b].sum())))
    return sorted(out, key=lambda x: -x.idle_us)
