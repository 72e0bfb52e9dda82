"""Per-step time from the ProfilerStep#N spans, and memcpy bandwidth."""

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


def step_times(t: EventTable, w: Window) -> list[StepTime]:
    """Every ProfilerStep of the rank with its host duration and device busy time (µs)."""
    steps, starts, ends = step_spans(t)
    out = []
    for s, a, b in zip(steps, starts, ends):
        rows = w.device[t.step[w.device] == s] if w.device.size else w.device
        out.append(StepTime(int(s), a / 1000.0, (b - a) / 1000.0, union_us(w, rows)))
    return out


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
