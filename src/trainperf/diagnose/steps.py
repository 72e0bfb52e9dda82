"""Per-step figures of a rank, read from the steps its window was cut by (window.find_step_markers, found
once per rank and carried by the Window), and memcpy bandwidth.

A step's GPU window is found on the GPU timeline through the launch->kernel correlation (every device event
carries the step of its launch call, trace.annotate), never by cutting the GPU timeline at the host's step
boundaries, nor by Kineto's gpu_user_annotation copies of ProfilerStep#N (window.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.diagnose.window import StepMarkers, Window, union_us
from trainperf.trace.categories import copy_direction
from trainperf.trace.events import MEMCPY, EventTable


@dataclass
class StepTime:
    """One profiler step: host span (µs) and device busy time launched from it (µs)."""

    step: int
    start_us: float
    host_us: float
    device_busy_us: float
    gpu_start_us: float = float("nan")  # first device event the step launched (nan: none)
    gpu_end_us: float = float("nan")    # last end of the device events it launched

    @property
    def gpu_lag_us(self) -> float:
        """How far the step's GPU work starts after its host span starts (µs)."""
        return self.gpu_start_us - self.start_us

    @property
    def gpu_idle_us(self) -> float:
        """GPU idle from the step's host start to the end of the last device work it launched (µs; nan without
        any): the time its device waited for the host, the start-up latency included."""
        return self.gpu_end_us - self.start_us - self.device_busy_us


def step_times(t: EventTable, w: Window, markers: StepMarkers | None = None) -> list[StepTime]:
    """Every host ProfilerStep of the rank (the window's markers unless others are given) with its host
    duration, device busy time and GPU window (µs); [] when the trace has none (the markers' note says why)."""
    m = markers if markers is not None else w.markers
    out = []
    for s, r in zip(m.numbers, m.host_rows):
        rows = w.device[t.step[w.device] == s] if w.device.size else w.device
        g0 = float(w.ts_us[rows].min()) if rows.size else float("nan")
        g1 = float(w.end_us[rows].max()) if rows.size else float("nan")
        out.append(StepTime(int(s), float(t.ts_ns[r]) / 1000.0, float(t.dur_ns[r]) / 1000.0, union_us(w, rows), g0, g1))
    return out


def gpu_step_periods_us(st: list[StepTime]) -> list[float]:
    """Step time on the GPU timeline: from one step's first device event to the next step's (µs)."""
    g = [x.gpu_start_us for x in st if x.gpu_start_us == x.gpu_start_us]
    return [b - a for a, b in zip(g, g[1:])]


@dataclass(kw_only=True)
class MemcpyBandwidth:
    """Copies of one direction: count, time (µs), and the bytes of those whose size the trace records."""

    direction: str
    count: int
    time_us: float = 0.0
    sized_count: int = 0      # copies with a recorded size ("bytes" in the event's args)
    bytes: int = 0            # their bytes
    sized_time_us: float = 0.0  # their time (µs)

    @property
    def gbps(self) -> float | None:
        """Achieved bandwidth of the sized copies (GB/s = bytes per ns); None when no copy's size is known:
        0 would claim the copies moved nothing."""
        return self.bytes / (self.sized_time_us * 1e3) if self.sized_count and self.sized_time_us > 0 else None


def memcpy_bandwidth(t: EventTable, w: Window) -> list[MemcpyBandwidth]:
    """Copies of the window per direction (HtoD, DtoH, DtoD, ...), longest total time first; the bandwidth of
    each is over the copies whose size is known (trace.events: nbytes -1 when unknown)."""
    rows = w.device[t.kind[w.device] == MEMCPY]
    out: dict[str, MemcpyBandwidth] = {}
    for r in rows:
        d = copy_direction(t.names[int(t.name[r])]) or "other"
        b = out.setdefault(d, MemcpyBandwidth(direction=d, count=0))
        dur = float(w.end_us[r] - w.ts_us[r])
        b.count += 1
        b.time_us += dur
        if t.nbytes[r] >= 0:
            b.sized_count += 1
            b.bytes += int(t.nbytes[r])
            b.sized_time_us += dur
    return sorted(out.values(), key=lambda b: -b.time_us)
