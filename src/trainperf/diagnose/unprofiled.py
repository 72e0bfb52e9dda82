"""The profiler's own cost taken off the host, from the step time measured without it.

The profiler slows the host: each recorded op and each runtime call costs extra CPU time (CUPTI's callbacks, the
op records). On an H200 a launch-bound loop took 4.3-5.4 ms a step unprofiled and 7.8-9.5 ms profiled, so its trace
reads host-bound where the job is closer to GPU-bound, and every host-side what-if is priced on a host that is not
the job's (docs/benchmarks.md, "GPU (H200)"). One trace cannot tell the profiler's overhead from the host's own
work; the step time measured without the profiler (the monitor's, a training log's) can.

Calibration: the factor s by which the host's own work (its CPU time between calls and its calls' own time, not
waits and not the allocator's driver calls) is divided so that the replayed host period, the median time between
the starts of consecutive analysed steps, equals the unprofiled step time. Every what-if is then replayed on that
host (RankFacts.host_calibration). Only where the host can explain the difference: when even a host MAX_FACTOR
times faster leaves the replayed period above the unprofiled step, the difference is not the profiler's (a wait,
the device, a step unlike the profiled ones) and nothing is changed; a profiled period at or under the unprofiled
step (a GPU-bound loop, whose host runs ahead) needs nothing either.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.replay import Change, replay
from trainperf.trace.events import RUNTIME

# The largest slowdown of the host's own work taken as the profiler's: 8x. Stated, not fitted: the H200 loops
# needed 2.3-5.9x on their host work alone (their whole step 1.4-2.2x slower profiled).
MAX_FACTOR = 8.0
BISECTION_STEPS = 12  # the factor to within 0.05 % (8 ** (1 / 2 ** 12)): 14 replays a rank
# a trainperf run's traces (monitor/profiler.trace_path): <run>/traces/rank<R>.step<A>-<B>.json, its steps' times in
# <run>/metrics.jsonl
RUN_TRACE_RE = re.compile(r"^rank\d+\.step(\d+)-(\d+)\.json(\.gz)?$")
RUN_SKIP_FIRST = 2       # the trainer's monitor leaves its first 2 steps out of its medians (compile, warm-up)
RUN_MIN_STEPS = 3        # unprofiled steps needed for a median


@dataclass(kw_only=True, frozen=True)
class HostCalibration:
    """The host speed-up found (1.0: none applied), the profiled and unprofiled periods (µs) and why."""

    factor: float
    profiled_period_us: float
    unprofiled_step_us: float
    note: str

    @property
    def changes(self) -> tuple[Change, ...]:
        """The replay change every what-if is priced on top of (empty when none applies)."""
        return (Change("unprofiled_host", factor=self.factor),) if self.factor > 1.0 else ()


def _step_first_nodes(f: RankFacts) -> np.ndarray:
    """The graph's first host call of each analysed step (by the host step spans; not the step anchors), in order."""
    g = f.graph
    host = np.flatnonzero(g.is_host)
    host = host[f.table.kind[g.rows[host]] == RUNTIME]
    out = []
    for x in f.step_times:
        inside = host[(g.start[host] >= x.start_us) & (g.start[host] < x.start_us + x.host_us)]
        if inside.size:
            out.append(int(inside[np.argmin(g.start[inside])]))
    return np.array(out, dtype=np.int64)


def _period_us(f: RankFacts, nodes: np.ndarray, factor: float) -> float:
    """Median time between consecutive steps' first host nodes in the replay with the host `factor` times faster."""
    r = replay(f.graph, (Change("unprofiled_host", factor=factor),) if factor > 1.0 else ())
    return float(np.median(np.diff(r.start[nodes])))


def host_calibration(f: RankFacts, unprofiled_step_us: float) -> HostCalibration:
    """The calibration of one rank's host to its unprofiled step time (µs); factor 1.0 where none applies (see the
    module docstring), with the reason in its note."""
    nodes = _step_first_nodes(f) if f.has_gpu and f.graph is not None else np.array([], dtype=np.int64)
    if nodes.size < 2:
        return HostCalibration(factor=1.0, profiled_period_us=float("nan"), unprofiled_step_us=unprofiled_step_us,
                               note="the unprofiled step time is not used: it needs two analysed steps and GPU events")
    profiled = _period_us(f, nodes, 1.0)
    u_ms, p_ms = unprofiled_step_us / 1e3, profiled / 1e3

    def result(factor: float, note: str) -> HostCalibration:
        return HostCalibration(factor=factor, profiled_period_us=profiled, unprofiled_step_us=unprofiled_step_us,
                               note=note)

    if profiled <= unprofiled_step_us:
        return result(1.0, f"the profiled host step ({p_ms:.2f} ms) is not slower than the unprofiled step ({u_ms:.2f} ms): "
                           "no profiler overhead is taken off")
    if _period_us(f, nodes, MAX_FACTOR) > unprofiled_step_us:
        return result(1.0, f"the profiled host step ({p_ms:.2f} ms) stays above the unprofiled step ({u_ms:.2f} ms) with the "
                           f"host {MAX_FACTOR:g}x faster: the difference is not the profiler's, nothing is taken off")
    lo, hi = 1.0, MAX_FACTOR
    for _ in range(BISECTION_STEPS):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if _period_us(f, nodes, mid) > unprofiled_step_us else (lo, mid)
    return result(hi, f"the profiler's overhead taken off: the host's own work {hi:.2f}x faster replays the "
                      f"{p_ms:.2f}-ms profiled step in the {u_ms:.2f} ms measured without the profiler; every gain "
                      "is priced on that host")


RunSteps = tuple[list[dict], set[int]]  # a trainperf run's metrics.jsonl records, the steps its traces recorded


def run_steps(path: str | Path) -> RunSteps | None:
    """(the metrics.jsonl records of the trainperf run whose traces/ folder holds `path`, the steps its traces
    recorded), read once for run_unprofiled_step_ms and run_gc_pause_ms; None when `path` is not in such a run or its
    metrics cannot be read (being written, damaged)."""
    p = Path(path)
    traces = p if p.is_dir() else p.parent
    metrics = traces.parent / "metrics.jsonl"
    if traces.name != "traces" or not metrics.is_file():
        return None
    windows = [m for m in (RUN_TRACE_RE.match(x.name) for x in traces.iterdir()) if m]
    if not windows:
        return None
    try:
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None  # a metrics file being written or damaged: diagnose goes on without it
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)], \
        {s for m in windows for s in range(int(m.group(1)), int(m.group(2)) + 1)}


def run_unprofiled_step_ms(run: RunSteps | None) -> tuple[float, int] | None:
    """(median step time in ms, steps it is over) of a trainperf run (run_steps), over the steps its profiler did not
    touch (neither recorded nor warming up, the step before each window) after the monitor's first RUN_SKIP_FIRST;
    None without a run or when fewer than RUN_MIN_STEPS are left."""
    if run is None:
        return None
    records, recorded = run
    touched = recorded | {s - 1 for s in recorded}
    times = [(r["step"], float(r["step_time_s"])) for r in records if isinstance(r.get("step_time_s"), (int, float))]
    kept = [t for step, t in times[RUN_SKIP_FIRST:] if step not in touched]
    return (1e3 * statistics.median(kept), len(kept)) if len(kept) >= RUN_MIN_STEPS else None


def run_gc_pause_ms(run: RunSteps | None) -> tuple[float, float] | None:
    """(mean garbage-collector pause a step, mean step time; ms) of a trainperf run (run_steps), over the steps its
    traces recorded, as its monitor measured them (rank 0's metrics.jsonl: gc_pause_s, step_time_s); None without a
    run or when its records have no collector pauses."""
    if run is None:
        return None
    records, recorded = run
    pairs = [(float(r["gc_pause_s"]), float(r["step_time_s"])) for r in records if r["step"] in recorded
             and isinstance(r.get("gc_pause_s"), (int, float)) and isinstance(r.get("step_time_s"), (int, float))]
    if not pairs:
        return None
    return 1e3 * sum(g for g, _ in pairs) / len(pairs), 1e3 * sum(t for _, t in pairs) / len(pairs)
