"""The `idle_with_work_queued` finding: the GPU idle while work launched to it waits to start, for nothing the trace
shows.

A device event starts when its launch (the call, plus the launch latency) and its stream's previous event allow, or
when an event on another stream it waits for ends (replay.build_graph: within EVENT_WAIT_US). Where it starts later
than all of these, the replay keeps the delay as a fixed lag (Graph.lag): something the trace does not record held it.
While the device idles in such a delay, with the work's launch call already returned, the host is not late (the
work is queued) and no recorded device work is in the way: the GPU is held by something outside the trace, such as
another process running on the same GPU (a second job, a data-loading or evaluation process using CUDA, MPS
clients), a stream waiting on an event another process or device records, a peer's copy, or the driver. HTA's
negative_queue_length trace (a 16-rank A100 recommendation job, one rank traced) idles 69 % of its window, 61 % of it
with work queued, once for 147 ms with a copy and a kernel on two streams launched 150 and 138 ms earlier and no
device event anywhere in between; every other real trace at hand (HTA's, the H200 runs) stays at 0.38 % or less
(HTA's MI250 step; simple_add, alexnet: 0 %) but a sampled one, which the rule does not read (below).

Priced by replay with those waits gone (`remove_lags`): an upper bound, since what held the GPU is not in the trace
and may not be removable (a second job the machine must run). Not read on a sampled or filtered trace
(evidence.is_sampled), whose missing events would read as such waits, nor for work queued behind what the GPU ran
before the trace began (Window.queued_until_us), which the trace never recorded, nor for a stream's first event in
the window (its stream may have been busy with such work: an H200 graph replay's first kernel, 3.4 ms after its
launch as the profile opened), nor where a launch whose device work the trace lost (CUPTI drops records when its
buffers fill) came before the waiting work's, whose lost work may have run in the wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.evidence import is_sampled, launch_call_rows
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gpu_time import idle_in_spans_us
from trainperf.diagnose.replay import TOL_US, Change
from trainperf.diagnose.window import merge_intervals

# the idle with work queued, % of the window: 1 %, the stall rules' evidence threshold (rules.DATALOADER_MIN_PCT): a
# wait too. The corpus's cases of this kind (kernels held by the surgery, corpus.inject.inject_gpu_held) hold 2.5 % of
# their window or more, the real traces without it 0.38 % or less (HTA's MI250 step), negative_queue 61 %
QUEUED_IDLE_MIN_PCT = 1.0
# ... in at least this many separate waits: one long wait alone is as likely the trace's cut (a first kernel behind
# work the profile did not record; HTA's call_stack extract: one kernel, one 64-ms wait)
QUEUED_IDLE_MIN_WAITS = 2
EVIDENCE_SHOWN = 3  # the longest waits a finding names


@dataclass(frozen=True, kw_only=True)
class QueuedIdle:
    """The device's idle time while launched work waited for a cause the trace does not show."""

    idle_us: float       # device idle inside those waits (µs)
    waits: int           # separate waits (merged intervals) holding some of it
    rows: np.ndarray     # trace rows of the device events that waited (int64)
    longest: list        # (name, start µs, the wait µs) of the EVIDENCE_SHOWN longest waits, the event that waited


def queued_idle(f: RankFacts) -> QueuedIdle:
    """The window's device idle during waits of launched work (module docstring): for each device event with a
    launch and a lag (Graph.lag), from the later of its launch call's end and its release to its start."""
    g, w = f.graph, f.window
    # a stream's first event in the window does not count: its stream may have been busy with work the trace did not
    # record (launched before it began), as launch_latency_us reads it (an H200 graph replay's first kernel, 3.4 ms)
    dev = np.flatnonzero(~g.is_host & (g.launch >= 0) & (g.lag > TOL_US) & ~g.before_window
                         & (g.start > w.queued_until_us) & (g.stream_prev >= 0))
    # work the trace lost (CUPTI dropping records from a full buffer: launches with no device event) may have run in
    # the wait: not a wait where such a launch came between the stream's previous event's launch and its own
    lost = _unrecorded_launches_us(f)
    if lost.size and dev.size:
        prev = g.stream_prev[dev]
        prev_launch = np.where(prev >= 0, g.launch[np.clip(prev, 0, None)], -1)
        since = np.where(prev_launch >= 0, g.start[np.clip(prev_launch, 0, None)], -np.inf)
        between = np.searchsorted(lost, g.start[g.launch[dev]], "right") - np.searchsorted(lost, since, "right")
        dev = dev[between == 0]
    launch = g.launch[dev]
    begins = np.maximum(g.start[dev] - g.lag[dev], g.start[launch] + g.dur[launch])
    held = begins < g.start[dev]
    dev, begins = dev[held], begins[held]
    s, e = merge_intervals(begins, g.start[dev])
    idle = idle_in_spans_us(w, s, e)
    longest = np.argsort(-(g.start[dev] - begins))[:EVIDENCE_SHOWN]
    return QueuedIdle(idle_us=float(idle.sum()), waits=int((idle > 0).sum()), rows=g.rows[dev].astype(np.int64),
                      longest=[(f.table.name_of(int(g.rows[dev[k]])), float(begins[k]),
                                float(g.start[dev[k]] - begins[k])) for k in longest])


def _unrecorded_launches_us(f: RankFacts) -> np.ndarray:
    """The start times (µs, sorted) of the window's launch calls whose device work the trace does not hold."""
    t, w = f.table, f.window
    rows = launch_call_rows(t, w.keep)
    return np.sort(w.ts_us[rows[~np.isin(t.correlation[rows], t.correlation[t.on_device])]])


def idle_with_work_queued(f: RankFacts) -> F.Finding | None:
    """The GPU idle >= QUEUED_IDLE_MIN_PCT of the window, in QUEUED_IDLE_MIN_WAITS waits or more, while work launched
    to it waited for something the trace does not show (module docstring); priced by replay with those waits gone,
    an upper bound; None where that gains under MIN_GAIN_PCT (a host pacing the step: the idle stays idle_gpu's)."""
    if not f.has_gpu or is_sampled(f):
        return None
    q = f.once("queued_idle", lambda: queued_idle(f))
    share = f.pct(q.idle_us)
    if share < QUEUED_IDLE_MIN_PCT or q.waits < QUEUED_IDLE_MIN_WAITS:
        return None
    gone = Change("remove_lags", rows=tuple(int(r) for r in q.rows))
    if f.gain((gone,))[0] < F.MIN_GAIN_PCT:  # the waits cost the step nothing (the host paces it): idle_gpu's idle
        return None
    metrics = {"idle_with_work_queued": (q.idle_us, "us"), "idle_with_work_queued_share": (share, "%"),
               "waits": (q.waits, "count"), "gpu_idle": (f.breakdown.idle_pct, "%")}
    if f.steps:
        metrics["waits_per_step"] = (q.waits / len(f.steps), "count")
    return F.rank_finding(f, "idle_with_work_queued", metrics, q.longest,
                          (gone,),
                          "the device's waits for what the trace does not show gone (launched work starts as soon as "
                          "its launch and its stream allow)", evidence_pct=share, upper_bound=True)
