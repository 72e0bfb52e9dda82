"""Per-step time from the ProfilerStep#N spans (host) and from the device work they launched (GPU), and
memcpy bandwidth.

The GPU runs behind the host: the kernels a step launches may start after the host has moved on to
the next ProfilerStep (by ~27 ms on a ROCm trace we have seen). So a step's GPU window is found on
the GPU timeline through the launch->kernel correlation (every device event carries the step of its
launch call, trace.annotate), never by cutting the GPU timeline at the host's step boundaries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


from trainperf.diagnose.window import Window, union_us
from trainperf.trace.annotate import step_spans
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


def step_times(t: EventTable, w: Window) -> list[StepTime]:
    """Every ProfilerStep of the rank with its host duration, device busy time and GPU window (µs)."""
    steps, starts, ends = step_spans(t)
    out = []
    for s, a, b in zip(steps, starts, ends):
        rows = w.device[t.step[w.device] == s] if w.device.size else w.device
        g0 = float(w.ts_us[rows].min()) if rows.size else float("nan")
        g1 = float(w.end_us[rows].max()) if rows.size else float("nan")
        out.append(StepTime(int(s), a / 1000.0, (b - a) / 1000.0, union_us(w, rows), g0, g1))
    return out


def gpu_step_periods_us(st: list[StepTime]) -> list[float]:
    """Step time on the GPU timeline: from one step's first device event to the next step's (µs)."""
    g = [x.gpu_start_us for x in st if x.gpu_start_us == x.gpu_start_us]
    return [b - a for a, b in zip(g, g[1:])]


_MEMCPY_KIND_RE = re.compile(r"(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD)")


@dataclass
class MemcpyBandwidth:
    """Copies of one direction: count, bytes, time (µs) and achieved bandwidth (GB/s)."""

    direction: str
    count: int
    bytes: int
    time_us: float

    @property
    def gbps(self) -> float:
        return self.bytes / (self.time_us * 1e3) if self.time_us > 0 else 0.0


def memcpy_bandwidth(t: EventTable, w: Window) -> list[MemcpyBandwidth]:
    """Achieved memcpy bandwidth per direction (HtoD, DtoH, DtoD, ...) over the window."""
    rows = w.device[t.kind[w.device] == MEMCPY]
    out: dict[str, MemcpyBandwidth] = {}
    for r in rows:
        m = _MEMCPY_KIND_RE.search(t.names[int(t.name[r])])
        d = m.group(1) if m else "other"
        b = out.setdefault(d, MemcpyBandwidth(d, 0, 0, 0.0))
        b.count += 1
        b.bytes += max(int(t.nbytes[r]), 0)
        b.time_us += float(w.end_us[r] - w.ts_us[r])
    return sorted(out.values(), key=lambda b: -b.time_us)
