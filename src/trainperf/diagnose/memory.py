"""The device's memory as the caching allocator recorded it: the step's peak against the device's capacity.

A trace profiled with profile_memory=True holds one "[memory]" sample per allocation and free
(trace.chunk.MEMORY_COLUMNS: the device, and the allocator's allocated and reserved bytes after it), and Kineto writes
each device's capacity in deviceProperties (totalGlobalMem). Over the analysed window they give the step's peak
(allocated: live tensors; reserved: what the allocator holds from the driver, fragmentation included) and its floor,
the allocated bytes the step never goes under: what it keeps between steps (weights, optimizer state, gradients
kept). The step's transient bytes (peak minus floor: activations, gradients made in the backward, workspaces) are
what a larger micro batch multiplies, so the free memory at the peak says whether "raise the per-GPU batch size"
(a launch-bound loop's fix) fits, and a peak at the device's edge backs the allocator's retries (memory pressure).

The device's capacity is its deviceProperties' totalGlobalMem, else the catalog's (hardware: an "80 GB" part's
80 GiB); its usable memory leaves the runtime's reserve as the planner does (the catalog part's
runtime_reserved_gib, else plan.memory.RESERVED_BYTES: CUDA context, NCCL buffers, library workspaces, none of it in
the allocator's figures), and transient bytes grown by a larger batch fragment as the planner assumes
(plan.memory.FRAGMENTATION): one place states each number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.roofline import device_accelerator
from trainperf.diagnose.window import Window
from trainperf.plan.memory import FRAGMENTATION, RESERVED_BYTES
from trainperf.trace.chunk import CPU_DEVICE_TYPE
from trainperf.trace.events import EventTable

GIB = float(1 << 30)
# a reserved peak within this share of the usable memory is the device's edge: the allocator's next cudaMalloc for a
# new block may fail, and it then frees its cache to retry. 0.9: the planner's fragmentation margin (8 %) and a little;
# stated, not fitted (no labeled trace records an out-of-memory retry with its samples)
NEAR_FULL_SHARE = 0.9
TIMELINE_POINTS = 2000  # the samples a rank's memory chart draws at most


@dataclass(frozen=True, kw_only=True)
class DeviceMemory:
    """One rank's device memory over the analysed window (bytes)."""

    device: int                   # the device index the samples are of: the rank's GPU
    capacity_bytes: int | None    # its deviceProperties totalGlobalMem, else the catalog part's; None: neither known
    peak_allocated_bytes: int     # live tensors at the window's peak
    peak_reserved_bytes: int      # what the allocator held from the driver at its peak
    floor_allocated_bytes: int    # the fewest bytes allocated in the window: what the step keeps between steps
    samples: int                  # allocator samples in the window
    runtime_reserve_bytes: float = RESERVED_BYTES  # what the runtime holds outside the allocator (the planner's)
    # the samples over the window, at most TIMELINE_POINTS rows of (µs, allocated, reserved bytes) for a chart (each
    # row the largest of its share of the samples, so no peak is lost); not in the JSON
    timeline: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def transient_bytes(self) -> int:
        """What the step allocates beyond what it keeps between steps (bytes): activations, fresh gradients."""
        return self.peak_allocated_bytes - self.floor_allocated_bytes

    @property
    def usable_bytes(self) -> float | None:
        """The device's capacity less the runtime's reserve (bytes); None without the capacity."""
        return None if self.capacity_bytes is None else max(self.capacity_bytes - self.runtime_reserve_bytes, 0.0)

    @property
    def near_full(self) -> bool:
        """The reserved peak is within NEAR_FULL_SHARE of the usable memory (False without the capacity)."""
        usable = self.usable_bytes
        return usable is not None and self.peak_reserved_bytes >= NEAR_FULL_SHARE * usable

    @property
    def transient_growth(self) -> float | None:
        """How many times the step's transient bytes fit in the usable memory above the floor, fragmented as the
        planner assumes: about how much larger a micro batch could be on memory alone (None without the capacity or
        without transient bytes; under 1 where even this step's peak would not fit again)."""
        usable = self.usable_bytes
        if usable is None or self.transient_bytes <= 0:
            return None
        return (usable - self.floor_allocated_bytes) / (self.transient_bytes * (1.0 + FRAGMENTATION))

    def text(self) -> str:
        """'peak 6.17 GiB allocated, 11.90 GiB reserved of the device's 31.75 GiB (3.82 GiB kept between steps)'."""
        cap = f" of the device's {self.capacity_bytes / GIB:.2f} GiB" if self.capacity_bytes else ""
        return (f"peak {self.peak_allocated_bytes / GIB:.2f} GiB allocated, {self.peak_reserved_bytes / GIB:.2f} GiB "
                f"reserved{cap} ({self.floor_allocated_bytes / GIB:.2f} GiB kept between steps)")


def highest_peak(memories: dict[int, DeviceMemory]) -> tuple[int, DeviceMemory] | None:
    """(rank, DeviceMemory) of the rank with the highest reserved peak (the first such rank), or None without any:
    the one a job's memory is shown by (the terminal's line, the HTML's chart, each side of a diff)."""
    return max(memories.items(), key=lambda kv: kv[1].peak_reserved_bytes, default=None)


def accelerator_samples(t: EventTable) -> np.ndarray:
    """The table's allocator samples (rows of trace.chunk.MEMORY_COLUMNS) of accelerators, not the host's CPU."""
    m = t.memory if t.memory is not None else np.zeros((0, 5), dtype=np.int64)
    return m[m[:, 1] != CPU_DEVICE_TYPE]


def device_memory(t: EventTable, w: Window) -> DeviceMemory | None:
    """The DeviceMemory of the rank's GPU over the window's time span (host clock, as the samples), or None when the
    trace has no allocator sample of an accelerator there (memory_between)."""
    if not w.keep.any():
        return None
    return memory_between(t, float(w.ts_us[w.keep].min()), float(w.end_us[w.keep].max()), t.pid[w.device])


def memory_between(t: EventTable, lo_us: float, hi_us: float, device_pids: np.ndarray) -> DeviceMemory | None:
    """The DeviceMemory of the rank's GPU from its allocator samples in [lo_us, hi_us] (µs, the trace's clock), or None
    without a sample of an accelerator there. The rank's GPU: the device its device events ran on (device_pids: their
    pids, Kineto's device index), the most frequent one first; else the accelerator with the most samples."""
    m = accelerator_samples(t)
    ts_us = m[:, 0] / 1e3
    inside = m[(ts_us >= lo_us) & (ts_us <= hi_us)]
    if not inside.size:
        return None
    ids, counts = np.unique(inside[:, 2], return_counts=True)
    own, n = np.unique(device_pids, return_counts=True)
    ran_on = [int(d) for d in own[np.argsort(-n, kind="stable")] if d in ids]
    device = ran_on[0] if ran_on else int(ids[np.argmax(counts)])
    s = inside[inside[:, 2] == device]
    ts = s[:, 0] / 1e3
    timeline = np.column_stack([ts, s[:, 3], s[:, 4]]).astype(float)
    if timeline.shape[0] > TIMELINE_POINTS:  # each chunk's last time and its largest figures: the peaks stay
        cuts = np.linspace(0, timeline.shape[0], TIMELINE_POINTS + 1).astype(int)[:-1]
        timeline = np.column_stack([np.maximum.reduceat(timeline[:, 0], cuts),
                                    np.maximum.reduceat(timeline[:, 1], cuts),
                                    np.maximum.reduceat(timeline[:, 2], cuts)])
    acc = device_accelerator(t)  # the catalog's part: its capacity where the trace gives none, and its runtime reserve
    capacity = _capacity(t, device) or (int(acc.hbm_bytes) if acc is not None else None)
    return DeviceMemory(device=device, capacity_bytes=capacity,
                        peak_allocated_bytes=int(s[:, 3].max()), peak_reserved_bytes=int(s[:, 4].max()),
                        floor_allocated_bytes=int(s[:, 3].min()), samples=int(s.shape[0]),
                        runtime_reserve_bytes=RESERVED_BYTES if acc is None else acc.runtime_reserved_bytes,
                        timeline=timeline)


def _capacity(t: EventTable, device: int) -> int | None:
    """The device's totalGlobalMem from the trace's deviceProperties (bytes), or None."""
    props = t.metadata.get("deviceProperties")
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict) and p.get("id") == device:
            cap = p.get("totalGlobalMem")
            return int(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    return None


# a micro batch at least this many times larger fitting on memory: room to raise it (twice the batch, the smallest
# step worth proposing); under it, memory leaves the batch where it is
BATCH_ROOM_MIN_GROWTH = 2.0


def batch_room_text(m: DeviceMemory) -> str | None:
    """What the samples say of raising the per-GPU batch size (a sentence), or None when they cannot say (no
    capacity, no transient bytes)."""
    growth = m.transient_growth
    if growth is None:
        return None
    if growth >= BATCH_ROOM_MIN_GROWTH and not m.near_full:
        return (f"Memory has room for a larger micro batch: {m.text()}; the {m.transient_bytes / GIB:.2f} GiB the "
                f"step allocates beyond what it keeps could grow ~{growth:.1f}x before the device is full.")
    return (f"Memory leaves little room for a larger micro batch: {m.text()}; the {m.transient_bytes / GIB:.2f} GiB "
            f"the step allocates beyond what it keeps could grow {growth:.1f}x at most: prefer CUDA graphs or fusion.")


def headroom_text(m: DeviceMemory) -> str | None:
    """What the samples say of the memory headroom activation checkpointing trades for time (a sentence), or None
    without the device's capacity."""
    usable = m.usable_bytes
    if usable is None:
        return None
    if m.near_full:
        return (f"The allocator's samples answer it: {m.text()}: no headroom, recomputing is what lets this step fit; "
                "a cheaper recompute (selective) must keep the peak where it is.")
    free = max(usable - m.peak_reserved_bytes, 0.0)
    return (f"The allocator's samples answer it: {m.text()}: {free / GIB:.2f} GiB free at the peak (the runtime's "
            f"{m.runtime_reserve_bytes / GIB:.1f}-GiB reserve aside) for the activations kept instead of recomputed.")


# memory kept from each step: the allocated floor (a step's fewest bytes allocated) must rise in every analysed step,
# over at least GROWTH_MIN_STEPS of them, by at least GROWTH_MIN_BYTES_PER_STEP. A healthy loop's floor is the same
# to the byte step after step (HTA's df_index_resolver: 3,906.84 MiB in each of its 4 steps); an optimizer's state
# made in the first step is one rise, not one a step. Stated, not fitted: a tensor's worth, over three steps
GROWTH_MIN_BYTES_PER_STEP = 1 << 20
GROWTH_MIN_STEPS = 3
MIB = float(1 << 20)


def growth_note(t: EventTable, m: DeviceMemory, spans: list[tuple[float, float]]) -> str | None:
    """A note where the memory kept between steps grows step after step (GROWTH_MIN_*): the allocated floor of each
    analysed step (spans: (start, end) µs, in order) on m's device, its rise a step and, with the capacity, the steps
    left before the free memory at the peak is used; None otherwise."""
    if len(spans) < GROWTH_MIN_STEPS:
        return None
    s = accelerator_samples(t)
    s = s[s[:, 2] == m.device]
    at = s[:, 0] / 1e3
    floors = [s[(at >= a) & (at <= b), 3] for a, b in spans]
    if any(not x.size for x in floors):
        return None
    floors = np.array([x.min() for x in floors], dtype=float)
    rises = np.diff(floors)
    if (rises < GROWTH_MIN_BYTES_PER_STEP).any():
        return None
    per_step = float(rises.mean())
    left = ""
    if m.usable_bytes:
        free = max(m.usable_bytes - m.peak_reserved_bytes, 0.0)
        left = f"; at this rate the {free / GIB:.2f} GiB free at the peak are used in ~{free / per_step:.0f} steps"
    return (f"the memory kept between steps grows {per_step / MIB:.1f} MiB a step over {len(spans)} steps "
            f"({floors[0] / GIB:.2f} -> {floors[-1] / GIB:.2f} GiB allocated at each step's lowest): something is kept "
            "from every step (a loss or output appended to a list without .item() or .detach(), a cache that grows)"
            + left)
