"""The step finder: where a rank's training steps are, per-step time from them, and memcpy bandwidth.

Markers, as PyTorch's profiler writes them (torch.profiler.profile(schedule=...) with prof.step() once per
iteration): a record function `ProfilerStep#N` on the host thread that calls prof.step(), with category
"user_annotation" (PyTorch >= 2.0; "cpu_op" before, kineto PR 709). Kineto also mirrors user annotations onto
the GPU timeline as "gpu_user_annotation" events, one per stream, so a modern CUDA trace holds a second
`ProfilerStep#N` per step on the device. Those device copies are markers only, never step boundaries: they
have no correlation to a launch, they start when the step's first kernel starts (after the host has moved on,
by ~27 ms on a ROCm trace we have seen) and they can cover only part of the step's kernels (kineto issue
1022: on backward only the first kernel). Taking one for a host step moves the window's cut (the last step is
left out, as HTA does) to the wrong place.

A step's GPU window is found on the GPU timeline through the launch->kernel correlation (every device event
carries the step of its launch call, trace.annotate), never by cutting the GPU timeline at the host's step
boundaries.

A trace without host ProfilerStep spans does not say where a step starts or ends. The step finder then finds
no steps and says why (StepMarkers.note), naming the iteration-like annotations it saw (Optimizer.step) without
turning them into steps: a job with several optimizers steps each once per iteration, a GradScaler skips the
step after an overflow, and where an iteration begins (its data loading) is not recorded at all; a wrong
boundary would price every per-step finding against the wrong length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.window import Window, union_us
from trainperf.trace.annotate import STEP_RE
from trainperf.trace.events import CPU_OP, GPU_ANNOTATION, MEMCPY, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import thread_key

HOST_STEP_KINDS = (USER_ANNOTATION, CPU_OP)  # "user_annotation" since PyTorch 2.0, "cpu_op" before
ITERATION_HINT_RE = re.compile(r"^Optimizer\.step#")  # torch.optim's record function, one per optimizer step


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
    """The ProfilerStep#N markers of one rank (see the module docstring). The stepping thread is the host
    thread with the most ProfilerStep spans (ties: the one whose first span starts first)."""
    ids = t.ids_matching(STEP_RE.match)
    named = np.isin(t.name, ids) if ids.size else np.zeros(len(t), dtype=bool)
    host = np.flatnonzero(named & np.isin(t.kind, HOST_STEP_KINDS) & (t.stream < 0))
    device = np.flatnonzero(named & (t.kind == GPU_ANNOTATION))
    ignored = np.zeros(0, dtype=np.int64)
    if host.size:
        thread = thread_key(t.pid[host], t.tid[host])
        keys, counts = np.unique(thread, return_counts=True)
        first = np.array([t.ts_ns[host[thread == k]].min() for k in keys])
        best = keys[np.lexsort((first, -counts))[0]]
        ignored, host = host[thread != best], host[thread == best]
        host = host[np.argsort(t.ts_ns[host], kind="stable")]
    numbers = np.array([int(STEP_RE.match(t.names[int(n)]).group(1)) for n in t.name[host]], dtype=np.int64)
    return StepMarkers(host_rows=host, numbers=numbers, device_rows=device, ignored_rows=ignored,
                       note="" if host.size else _no_steps_note(t, device))


def _no_steps_note(t: EventTable, device: np.ndarray) -> str:
    """Why a rank without host ProfilerStep spans gets no per-step figures, and what to do."""
    fix = ("profile with torch.profiler.profile(schedule=...) and call prof.step() once per iteration for "
           "per-step results")
    if device.size:
        return (f"ProfilerStep#N appears only on the GPU timeline ({device.size} device annotations, no host span): "
                f"where each step starts and ends on the host is not recorded, so no per-step figures; {fix}")
    opt = t.ids_matching(ITERATION_HINT_RE.match)
    n_opt = int((np.isin(t.name, opt) & np.isin(t.kind, HOST_STEP_KINDS)).sum()) if opt.size else 0
    seen = (f", although {n_opt} Optimizer.step annotations suggest {n_opt} iterations (their boundaries are not "
            "step boundaries: several optimizers, skipped steps and the data loading before each are not told "
            "apart)") if n_opt else ""
    return f"no ProfilerStep#N spans: the trace does not say where a training step starts or ends{seen}; {fix}"


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


def step_times(t: EventTable, w: Window, markers: StepMarkers | None = None) -> list[StepTime]:
    """Every host ProfilerStep of the rank (find_step_markers) with its host duration, device busy time and GPU
    window (µs); [] when the trace has none (the markers' note says why)."""
    m = markers if markers is not None else find_step_markers(t)
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
