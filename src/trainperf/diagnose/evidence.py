"""Insufficient evidence is a result: what in a trace limits how far its findings can be trusted.

Each check returns Caveats: a note for the user, the confidence it leaves ("medium" or "low") and
the finding kinds it touches (None: all). `apply_caveats` lowers each finding's confidence to the
lowest caveat touching it and attaches the notes; the same notes reach the terminal, JSON and HTML.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.devices import device_busy, pytorch_process_side_by_side
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.memory import growth_note
from trainperf.diagnose.replay import NOT_BLOCKING, one_off_first_calls
from trainperf.diagnose.window import NSYS_PER_STEP_FIX, PER_STEP_FIX, launched_before_trace, merge_intervals
from trainperf.trace.annotate import STEP_RE, correlated_host_row
from trainperf.trace.events import CPU_OP, KERNEL, MEMCPY, MEMSET, PYTHON, RUNTIME, USER_ANNOTATION, EventTable

MIN_STEPS = 2                  # fewer analysed ProfilerSteps: a single step may be atypical
MISSING_GPU_PCT = 5.0          # launch calls without their device event, % of launches
UNLAUNCHED_PCT = 5.0           # device events whose launch is not in the trace, % of device events
PY_FRAMES_PER_LAUNCH = 1.0     # with_stack: Python frames per launch call above which host time is inflated
CLOCK_SPREAD_US = 50.0         # rank clocks aligned on collective ends disagree by more than this (IQR)
GPU_LAG_NOTE_SHARE = 0.5       # a step's GPU work ends after its ProfilerStep by more than this share of a step
QUEUE_NOTE_SHARE = 0.10        # the host waited for launch-queue slots this share of the window (stated): a note
SESSION_CUT_NOTE_SHARE = 0.05  # a step cut at the profiling session's end by this share of its recorded length: cut
# the profiler's own host cost per recorded op: "4 us per op on CUDA" (pytorch/pytorch#82793, A100, PyTorch 1.12);
# 4.0-6.0 us per op on an H200 with torch 2.11 (4 loops of run 4, profiled host step against the unprofiled one)
PROFILER_US_PER_OP = 4.0
# that cost, times the ops a step records, as a share of a host-paced step above which host findings are hedged
PROFILER_OVERHEAD_NOTE_SHARE = 0.10
# the findings priced by removing host spans of their own (replay's remove_spans): DDP's own work, a compiler's
# extra graphs, per-gradient collective calls
HOST_SPAN_KINDS = frozenset({"ddp_buffer_broadcast", "ddp_gradient_copies", "ddp_unused_parameter_search",
                             "graph_breaks", "unbucketed_gradients"})
# the findings a profiler's host cost inflates: those priced by the host's own work
PROFILED_HOST_KINDS = frozenset({"launch_bound", "small_kernels", "host_work", "optimizer_slow", "idle_gpu"}
                                ) | HOST_SPAN_KINDS

HOST_TIME_KINDS = frozenset({"launch_bound", "small_kernels", "idle_gpu", "data_loader_stall", "checkpoint_stall",
                             "compile_stall"}) | HOST_SPAN_KINDS
CROSS_RANK_KINDS = frozenset({"straggler", "load_imbalance", "exposed_comm", "pipeline_bubble"})
# runtime calls that put work on a device: CUDA's and HIP's, Level Zero's and SYCL's unified runtime's (XPU:
# urEnqueueKernelLaunch, urEnqueueUSMMemcpy)
_LAUNCH_WORDS = ("LaunchKernel", "KernelLaunch", "LaunchCooperativeKernel", "Memcpy", "Memset", "GraphLaunch")
HOLE_KINDS = (CPU_OP, RUNTIME, PYTHON, USER_ANNOTATION, KERNEL, MEMCPY, MEMSET)  # what fills a stretch of the window


def launch_call_rows(t: EventTable, keep: np.ndarray) -> np.ndarray:
    """The rows of `keep` (bool per row) that are runtime calls putting work on a device (kernel launches, copies,
    memsets, graph launches) with a correlation id to find that work by."""
    return np.flatnonzero(keep & (t.kind == RUNTIME) & (t.correlation >= 0) &
                          np.isin(t.name, t.ids_matching(lambda s: any(x in s for x in _LAUNCH_WORDS))))


@dataclass(kw_only=True, frozen=True)
class Caveat:
    """One limit of the evidence: its note, the confidence it leaves, and the kinds it touches (None: all)."""

    note: str
    confidence: str
    kinds: frozenset | None = None


def rank_caveats(f: RankFacts) -> list[Caveat]:
    """The limits of one rank's evidence (see the module docstring)."""
    t, w = f.table, f.window
    out: list[Caveat] = []
    for check in (truncated_caveat, session_cut_caveat, steps_caveat, counter_mode_caveat, sampled_caveat,
                  host_hole_caveat, warmup_caveat, devices_caveat, profiled_host_caveat):
        c = check(f)
        if c is not None:
            out.append(c)
    launches = launch_call_rows(t, w.keep)
    n_py = int((w.keep & (t.kind == PYTHON)).sum())
    shapes = bool(t.metadata.get("profiler", {}).get("record_shapes"))
    if n_py > PY_FRAMES_PER_LAUNCH * max(launches.size, 1) or shapes:
        per = " per launch" if launches.size else ""
        shapes_by = ("operator ranges naming their input sizes, --pytorch=autograd-shapes-nvtx"
                     if t.metadata.get("producer") == "nsys" else "record_shapes=True")
        what = " and ".join(x for x in ((f"with_stack=True ({n_py / max(launches.size, 1):.0f} Python frames{per})")
                                        if n_py else "", shapes_by if shapes else "") if x)
        out.append(Caveat(note=f"profiler overhead ({what}) adds host time: host-bound findings and their gains "
                               "may be overstated; confirm with a profile without it",
                          confidence="medium", kinds=HOST_TIME_KINDS))
    if not f.has_gpu:
        out.append(Caveat(note="no GPU activity recorded: host-side evidence only, gains are host-time upper bounds",
                          confidence="low"))
        return out
    link = correlated_host_row(t)
    if launches.size:
        dev_corr = t.correlation[w.device]
        missing = 100.0 * float((~np.isin(t.correlation[launches], dev_corr)).mean())
        if missing > MISSING_GPU_PCT:
            out.append(Caveat(note=f"{missing:.0f}% of kernel launches and copies have no GPU event (GPU activity "
                                   "missing, or the GPU trace ends before the host's): device-side figures are "
                                   "incomplete", confidence="medium"))
    # the whole trace: the window keeps only launched device events. Device events without a correlation id were
    # not launched by a recorded call at all (an accelerator's own DMA and event records, MTIA's dma_request):
    # they cannot show a launch cut off by the profile's start (87 % of an MTIA trace read "truncated")
    dev = np.flatnonzero(t.on_device & (t.correlation >= 0))
    # work launched before the trace began (a host running ahead leaves its queue of earlier steps' work on the device
    # as the profile opens) is not a cut step: rank_notes says so, without lowering any confidence
    dev = dev[~launched_before_trace(t, dev)]
    unlaunched = 100.0 * float((link[dev] < 0).mean()) if dev.size else 0.0
    if dev.size and not (t.kind == RUNTIME).any():
        # no runtime call anywhere (profiled with activities=[ProfilerActivity.CUDA] only): nothing is truncated,
        # the host's side was never recorded, so no host-bound kind can be found, only the device timeline's
        out.append(Caveat(note="the trace records GPU activity only (no host call: profiled without "
                               "ProfilerActivity.CPU): launches, host waits and syncs cannot be seen, so no host-bound "
                               "finding can be made and the GPU's idle time stays unexplained; profile with "
                               "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]", confidence="low",
                          kinds=HOST_TIME_KINDS))
    elif unlaunched > UNLAUNCHED_PCT:
        out.append(Caveat(note=f"{unlaunched:.0f}% of GPU events have no launch in the trace (the window is "
                               "truncated: it starts or ends mid-step)", confidence="medium"))
    elif not dev.size and not launches.size:
        # device work with no launch linked to it at all (a JAX/XLA profile): nothing is truncated, but the host
        # time behind each kernel cannot be measured, so host-bound kinds rest on the device timeline alone
        out.append(Caveat(note="no GPU event is linked to a host launch (the profiler records no launch "
                               "correlation, as XLA's does): launch overhead cannot be measured and host-bound "
                               "findings rest on GPU idle time alone", confidence="medium", kinds=HOST_TIME_KINDS))
    return out


COUNTER_RANGE_CAT = "cuda_profiler_range"  # Kineto's category for CUPTI range-profiler (counter) records


def counter_mode_caveat(f: RankFacts) -> Caveat | None:
    """Kernels recorded by CUPTI's range profiler (counter metrics, e.g. experimental_config with profiler_metrics):
    each kernel is replayed to collect its counters, so the trace has counter ranges, not kernel timings, and the
    launch calls last the replays (67 ms each on HTA's cupti_profiler trace)."""
    t = f.table
    ids = t.ids_matching(lambda s: s == COUNTER_RANGE_CAT)
    n = int(np.isin(t.cat, ids).sum()) if ids.size else 0
    if not n:
        return None
    return Caveat(note=f"{n} kernels were recorded as CUPTI counter ranges (the range profiler replays each kernel "
                       "to read its metrics): the trace has no kernel timings and its launch calls include the "
                       "replays; profile without profiler metrics for timing findings", confidence="low")


SAMPLED_IDS_PER_CALL = 30.0  # correlation ids per runtime call kept (95 % smallest steps): 1-10.5 in whole traces
SAMPLED_TRIM = 0.95          # the largest 5 % of the id steps (a profile's start, a few dropped calls) left out


def correlation_ids_per_call(f: RankFacts) -> float:
    """How many correlation ids the window's runtime calls use per call kept (the mean step between consecutive
    ids, the largest SAMPLED_TRIM share of steps left out); 1.0 with fewer than 20 calls. CUPTI gives every runtime
    call it sees the next id, and Kineto drops a few kinds of call (cudaGetDevice, ...): 1-10.5 in whole traces
    (HTA's), 73-74 on HTA's trace_filter samples. Computed once per rank (RankFacts.once): the sampled caveat and
    host_work's gate both read it."""
    def compute() -> float:
        t, w = f.table, f.window
        c = np.sort(t.correlation[w.keep & (t.kind == RUNTIME) & (t.correlation >= 0)])
        if c.size < 20:
            return 1.0
        steps = np.sort(np.diff(c))
        return float(steps[:max(1, int(SAMPLED_TRIM * steps.size))].mean())
    return f.once("correlation_ids_per_call", compute)


def is_sampled(f: RankFacts) -> bool:
    """Whether the trace lost most of its runtime calls (sampled or filtered: correlation_ids_per_call above
    SAMPLED_IDS_PER_CALL): its host gaps are then missing events, not work or waits."""
    return correlation_ids_per_call(f) > SAMPLED_IDS_PER_CALL


def sampled_caveat(f: RankFacts) -> Caveat | None:
    """A sampled or filtered trace (is_sampled): such a trace has lost most of its events, and the host gaps
    between those left are missing events, not work or waits."""
    per_call = correlation_ids_per_call(f)
    if per_call <= SAMPLED_IDS_PER_CALL:
        return None
    return Caveat(note=f"the trace keeps about 1 runtime call in {per_call:.0f} (its correlation ids grow by "
                       f"{per_call:.0f} per call; whole traces: 1-11): it is sampled or filtered, and the gaps between "
                       "the events left are missing events; every finding rests on what survived; profile without "
                       "filtering", confidence="low")


HOLE_SHARE = 0.25  # a stretch with no event at all (host or device) longer than this share of the window


def host_hole_caveat(f: RankFacts) -> Caveat | None:
    """A stretch of the window where nothing was recorded, on the host or the device (ProfilerStep spans, which
    enclose everything, aside): events cut out of the trace, or work the profiler did not see. HTA's
    cuda_event_sync_multi_stream has 18.5 ms of its 20 ms with no event (its correlation ids jump 62 -> 1385)."""
    t, w = f.table, f.window
    steps = t.ids_matching(STEP_RE.match)
    rows = np.flatnonzero(w.keep & np.isin(t.kind, HOLE_KINDS) & ~np.isin(t.name, steps))
    if rows.size < 2:
        return None
    s, e = merge_intervals(w.ts_us[rows], w.end_us[rows])
    gaps = s[1:] - e[:-1]
    span = float(e.max() - s.min())
    if not gaps.size or span <= 0 or gaps.max() <= HOLE_SHARE * span:
        return None
    return Caveat(note=f"{gaps.max() / 1e3:.1f} ms of the {span / 1e3:.1f}-ms window has no event at all, on the host "
                       "or the device (events cut out, or work the profiler did not record): the findings cover "
                       "the rest only", confidence="medium")


def devices_caveat(f: RankFacts) -> Caveat | None:
    """One process drove several GPUs (devices.device_busy): the breakdown, idle and overlap figures are over their
    union, where a GPU idle while another works counts as busy. The note gives each device's busy share of the
    window; when the devices take turns, the devices_take_turns finding says so and prices it; side by side in a
    PyTorch process (devices.pytorch_process_side_by_side), the note names DataParallel's replacement (no what-if:
    what its replication and reduction cost the trace does not separate). No real trace here has two (HTA's all
    have one)."""
    d = device_busy(f)
    if d is None or d.window_us <= 0:
        return None
    shares = ", ".join(f"GPU {k} {100.0 * b / d.window_us:.0f}%" for k, b in d.busy_us.items())
    note = (f"this process drove {len(d.busy_us)} GPUs: the breakdown, idle and overlap are over their union (a GPU "
            f"idle while another works counts as busy); busy per GPU: {shares} of the window")
    if pytorch_process_side_by_side(f):
        note += ("; side by side, as nn.DataParallel's replicas run: DistributedDataParallel, one process per GPU, "
                 "is the replacement PyTorch recommends")
    return Caveat(note=note, confidence="medium")


# a first call over ONE_OFF_MIN_US and ONE_OFF_FACTOR times the median of its kind is one-off initialisation: the
# replay's allocation_traffic leaves such allocator calls out of allocator_stall by the same two numbers
WARMUP_SHARE_PCT = 5.0  # those calls together above this share of the window: warm-up is inside it


def warmup_calls(f: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """The window's warm-up runtime calls: (their trace rows, what they launched per row: a kernel's name id, -1
    for none). First calls that cost far more than the later calls of their kind (the runtime's context creation, a
    library's first-call initialisation, lazy loading of a kernel on its first launch, a first allocation); a kind
    is a runtime call's name, and for launches the kernel's. A call that waited for device work is not one. Found
    once per rank (idle_gpu and the warm-up caveat both read them)."""
    return f.once("warmup_calls", lambda: _warmup_calls(f))


def _warmup_calls(f: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """warmup_calls, computed."""
    t, w = f.table, f.window
    rows = np.flatnonzero(w.keep & (t.kind == RUNTIME))
    if rows.size < 2:
        return rows[:0], rows[:0]
    launched = np.full(len(t), -1, dtype=np.int64)
    link = correlated_host_row(t)
    dev = np.flatnonzero(link >= 0)
    launched[link[dev]] = t.name[dev]
    key = t.name[rows].astype(np.int64) * (len(t.names) + 1) + launched[rows] + 1
    dur = w.end_us[rows] - w.ts_us[rows]
    one_off = one_off_first_calls(key, w.ts_us[rows], dur, fallback_us=float(np.median(dur)))
    if f.graph is not None:
        # a call that returned when the device work it waited for ended (a sync, a blocking copy, a full launch
        # queue: replay's block classes) spent its time waiting, not initialising: the first pageable copy of an
        # H200 step waited 13.1 ms for the previous step's kernels, its later ones of other sizes 10 us
        g = f.graph
        one_off &= ~np.isin(rows, g.rows[g.is_host & (g.block_class != NOT_BLOCKING)])
    return rows[one_off], launched[rows[one_off]]


def warmup_us(f: RankFacts) -> float:
    """Time (µs) the window's warm-up calls (warmup_calls) take: what a steady-state step does not pay."""
    rows, _ = warmup_calls(f)
    return float((f.window.end_us[rows] - f.window.ts_us[rows]).sum())


def warmup_caveat(f: RankFacts) -> Caveat | None:
    """Warm-up inside the window (warmup_calls) worth more than WARMUP_SHARE_PCT of it. A steady-state step does
    not pay it; the MI250 trace's one 6.5-ms hipLaunchKernel (the first launch of its kernel) is 70 % of its
    step."""
    t, w = f.table, f.window
    rows, launched = warmup_calls(f)
    dur = w.end_us[rows] - w.ts_us[rows]
    total = float(dur.sum())
    if f.pct(total) <= WARMUP_SHARE_PCT:
        return None
    top_at = int(np.argmax(dur))
    top = int(rows[top_at])
    first_of = f" (first launch of {t.names[int(launched[top_at])][:60]})" if launched[top_at] >= 0 else ""
    name = t.names[int(t.name[top])] + first_of
    return Caveat(note=f"warm-up inside the window: {rows.size} first call(s) cost {total / 1e3:.1f} ms "
                       f"({f.pct(total):.0f}% of it) against far less for the later calls of their kind, the longest "
                       f"{name} {dur[top_at] / 1e3:.1f} ms (initialisation, lazy loading, first "
                       "allocations): a steady step does not pay them; profile after warm-up iterations "
                       "(torch.profiler.schedule(wait=1, warmup=1, active=3))", confidence="medium")


@dataclass(frozen=True, kw_only=True)
class ProfiledHost:
    """A host-paced profiled window's step (µs): the host's, the GPU's busy time in it, the recorded ops and their
    estimated cost to the profiler (PROFILER_US_PER_OP each)."""

    host_us: float
    busy_us: float
    ops: float
    cost_us: float


def profiled_host(f: RankFacts) -> ProfiledHost | None:
    """The window's step as profiled_host_caveat reads it, where the host sets the pace and its recorded ops would cost
    the profiler PROFILER_OVERHEAD_NOTE_SHARE of its step or more; None with an unprofiled step time (the host is
    calibrated to it or shown not to need it), without steps or GPU, where the device sets the pace or the cost is
    less. Once per rank: the caveat and profiled_wait_notes both read it."""
    return f.once("profiled_host", lambda: _profiled_host(f))


def _profiled_host(f: RankFacts) -> ProfiledHost | None:
    if f.unprofiled_step_us is not None or not f.profiled_step_sides_us:
        return None
    host_us, device_us = f.profiled_step_sides_us
    if host_us <= device_us:
        return None
    t, w = f.table, f.window
    start, end = f.host_window_start_us, f.host_window_start_us + f.host_window_us  # the analysed steps' host span
    ops = int((w.keep & (t.kind == CPU_OP) & (w.ts_us >= start) & (w.ts_us < end)).sum()) / len(f.step_times)
    cost_us = PROFILER_US_PER_OP * ops
    if cost_us < PROFILER_OVERHEAD_NOTE_SHARE * host_us:
        return None
    return ProfiledHost(host_us=host_us, busy_us=f.breakdown.busy_us / len(f.step_times), ops=ops, cost_us=cost_us)


def profiled_host_caveat(f: RankFacts) -> Caveat | None:
    """A host-paced window whose recorded ops cost the profiler PROFILER_US_PER_OP each, PROFILER_OVERHEAD_NOTE_SHARE
    of the host's step or more (profiled_host): the host's own findings may be the profiler's (an H200 loop that ran
    GPU-bound without the profiler read launch-bound with it). None where profiled_host is."""
    p = profiled_host(f)
    if p is None:
        return None
    host_us, busy_us, ops, cost_us = p.host_us, p.busy_us, p.ops, p.cost_us
    without_us = host_us - cost_us
    stands = without_us > busy_us
    verdict = (f"without it the host would still take ~{without_us / 1e3:.2f} ms, above the GPU's work: host-bound "
               "findings stand, their gains may be overstated" if stands else
               f"without it the host's ~{without_us / 1e3:.2f} ms may be under the GPU's work: host-bound findings "
               "may be the profiler's own")
    return Caveat(note=f"the host sets this window's pace ({host_us / 1e3:.2f} ms a step, the GPU busy "
                       f"{busy_us / 1e3:.2f} ms of it) and records {ops:.0f} ops a step: at ~{PROFILER_US_PER_OP:g} us "
                       f"each the profiler's own cost is ~{cost_us / 1e3:.2f} ms of it ({100 * cost_us / host_us:.0f} %); "
                       f"{verdict}; give the step time measured without the profiler (diagnose --unprofiled-step-ms) "
                       "to price them on the job's own host",
                  confidence="medium" if stands else "low", kinds=PROFILED_HOST_KINDS)


# fixes that remove a wait for the device or the driver, whose length the profiler does not set (a sync's wait for
# the GPU's work, a pageable copy's transfer, the allocator's driver calls): on a host-paced profiled step the
# profiler's own cost is in the step before and after such a fix
WAIT_CHANGES = frozenset({"remove_syncs", "unblock_pageable_copies", "remove_allocator"})


def profiled_wait_notes(f: RankFacts, found: list[F.Finding]) -> None:
    """On a host-paced window the profiler slows (profiled_host), a note on each finding whose fix removes a wait
    (WAIT_CHANGES) and leaves the step still paced by the host without the profiler's cost: that cost stays in the
    step the fix leaves, so the fix's share of the job's own, shorter step is larger than the one priced here. The
    real H200 loops: CUDA_LAUNCH_BLOCKING priced 29.3 % for 55.6 measured without the profiler, the allocator off
    56.3 % for 78.0 (empty_cache 30.9 for 30.1)."""
    p = profiled_host(f)
    if p is None:
        return
    for x in found:
        if not x.changes or not all(c.kind in WAIT_CHANGES for c in x.changes) or x.gain_alone_pct is None:
            continue
        left_us = p.host_us * (1.0 - x.gain_alone_pct / 100.0) - p.cost_us  # the fixed step, the profiler's cost off
        if left_us > p.busy_us:
            x.notes.append(f"the profiler's own cost (~{p.cost_us / 1e3:.2f} ms a step, {p.ops:.0f} recorded ops at "
                           f"~{PROFILER_US_PER_OP:g} us) stays in the step this fix leaves, still paced by the host "
                           f"(~{left_us / 1e3:.2f} ms without it, the GPU busy {p.busy_us / 1e3:.2f}): on the job's own "
                           "host the fix is likely worth a larger share of a step than priced here; give the step "
                           "time measured without the profiler (diagnose --unprofiled-step-ms) to price it there")


def truncated_caveat(f: RankFacts) -> Caveat | None:
    """The trace file ends inside its events (kineto.read_kineto: metadata "truncated"): what was written after the
    cut is lost, and a writer's file order is not time order (Kineto writes each host thread's operators, then
    the runtime calls and device work), so any part of the window may miss its launches or its kernels."""
    cut = f.table.metadata.get("truncated")
    if not cut:
        return None
    return Caveat(note=f"the trace file ends inside its events (cut: an export or a copy stopped early): "
                       f"{cut.get('events_read', 0):,} complete events read, the rest lost, from any part of the "
                       "window (the profiler does not write in time order): GPU idle time may be overstated and "
                       "host calls or kernels missing; re-export the trace or copy the whole file", confidence="low")


def cut_steps(f: RankFacts) -> dict[int, int]:
    """{step: ns cut} of the rank's analysed steps that ran past the end of the profiling session and were cut there
    (trace.annotate.clip_steps_to_session) by at least SESSION_CUT_NOTE_SHARE of what the session recorded of them:
    a clock's rounding at the session's end leaves a step as good as whole."""
    cut = f.table.metadata.get("steps_cut_at_session_end") or {}
    kept_us = {x.step: x.host_us for x in f.step_times}
    return {n: ns for n, ns in cut.items() if n in kept_us and ns / 1e3 >= SESSION_CUT_NOTE_SHARE * kept_us[n]}


def session_cut_caveat(f: RankFacts) -> Caveat | None:
    """An analysed step ran past the end of the profiling session (cut there at load): the part after the session's
    end was not recorded, so the step is incomplete and its share of the window only what the session holds."""
    cut = cut_steps(f)
    if not cut:
        return None
    n, ns = max(cut.items(), key=lambda x: x[1])
    more = f" (and {len(cut) - 1} more)" if len(cut) > 1 else ""
    return Caveat(note=f"ProfilerStep#{n}{more} ends {ns / 1e6:,.1f} ms after the profiling session (\"PyTorch "
                       "Profiler\" span) ends: nothing after the session was recorded, so the step is cut at its end "
                       "and is incomplete; profile whole steps (torch.profiler schedule, prof.step() once per "
                       "iteration)", confidence="medium")


def steps_caveat(f: RankFacts) -> Caveat | None:
    """Fewer than MIN_STEPS complete steps analysed: with none, every finding and gain is over the whole trace
    (the step finder's note says why there are no steps); with one, that step may not be typical. A step cut at
    the profiling session's end (cut_steps) is not complete."""
    n_steps, w = len(f.step_times) - len(cut_steps(f)), f.window
    if n_steps >= MIN_STEPS:
        return None
    if n_steps == 0:
        why = w.markers.note or w.note or "no complete profiler step in the chosen range"
        if f.table.metadata.get("producer") == "nsys":  # how to mark steps in that profiler
            why = why.replace(PER_STEP_FIX, NSYS_PER_STEP_FIX)
        return Caveat(note="no complete profiler step: findings and gains are over the whole trace (start-up and "
                           f"partial iterations included), not per step; {why}", confidence="medium")
    why = w.note or ("the last step, cut short by the profiler, is left out; " if w.steps_excluded else "") + \
        "profile more steps (torch.profiler schedule with active>=3)"
    return Caveat(note=f"1 complete profiler step analysed (fewer than {MIN_STEPS}): one step may not be typical; "
                       f"{why}", confidence="medium")


def rank_notes(f: RankFacts) -> list[str]:
    """Observations that qualify the per-step figures without lowering any finding's confidence."""
    out = []
    other = f.window.markers.ignored_rows.size
    if other:
        out.append(f"{other} ProfilerStep span(s) on another host thread than the one that calls prof.step() are "
                   "not taken as steps")
    queued = f.queue_wait_us
    if f.span_us > 0 and queued >= QUEUE_NOTE_SHARE * f.span_us:
        out.append(f"the host waited {queued / 1e3:.1f} ms ({100.0 * queued / f.span_us:.0f} % of the window) inside "
                   "its launches for a slot in the full launch queue: it ran ahead of the GPU, which sets the pace; "
                   "those launches' durations are the GPU's, not host overhead")
    t, w = f.table, f.window
    dev = np.flatnonzero(t.on_device & (t.correlation >= 0))
    # work launched before the trace began still running once the analysed steps have begun (the caveat of truncated
    # windows leaves it out: evidence.rank_caveats)
    earlier = dev[launched_before_trace(t, dev) & (w.end_us[dev] > f.host_window_start_us)]
    if dev.size and 100.0 * earlier.size / dev.size > UNLAUNCHED_PCT:
        out.append(f"{100.0 * earlier.size / dev.size:.0f} % of the GPU events ran work launched before the trace began "
                   f"for {(w.end_us[earlier].max() - f.host_window_start_us) / 1e3:.1f} ms into the analysed steps (the GPU "
                   "was still running the steps before the profile): not the window's steps' work, left out of them")
    mem = f.device_memory
    grows = growth_note(t, mem, [(x.start_us, x.start_us + x.host_us) for x in f.step_times]) if mem else None
    out += [grows] if grows else []
    failed = t.metadata.get("out_of_memory_events")
    if failed:  # a failed allocation raises torch.OutOfMemoryError: a trace that goes on had the job catch it
        out.append(f"{failed} device allocation(s) failed in the trace ([OutOfMemory] events: torch.OutOfMemoryError "
                   "raised and caught by the job, which went on)" + (f"; {mem.text()}" if mem else "")
                   + ": the job runs at the device's edge, and a step that hits it does its work again (a batch "
                   "retried smaller, or skipped)")
    st = [x for x in f.step_times if x.gpu_end_us == x.gpu_end_us]
    if not st:
        return out
    overrun = float(np.median([x.gpu_end_us - (x.start_us + x.host_us) for x in st]))
    step = float(np.median([x.host_us for x in st]))
    if step > 0 and overrun > GPU_LAG_NOTE_SHARE * step:
        # behind by the job's own steps: the steady-state step, the slower side's (the GPU's, where the host is ahead)
        period = f.period_us if f.period_us > 0 else step
        out.append(f"the GPU work of a step ends {overrun / 1e3:.1f} ms after its ProfilerStep ends on the host "
                   f"({overrun / period:.1f} steps behind): per-step GPU figures follow the launches, not the host "
                   "windows")
    return out


def cross_rank_caveats(clock_offset_us: dict, clock_spread_us: dict) -> list[Caveat]:
    """Clock offsets between ranks: waits across ranks rest on aligning the clocks on collective ends."""
    if not clock_spread_us:
        return []
    worst = max(clock_spread_us, key=clock_spread_us.get)
    if clock_spread_us[worst] <= CLOCK_SPREAD_US:
        return []
    off = max(abs(v) for v in clock_offset_us.values())
    return [Caveat(note=f"rank clocks differ by up to {off / 1e3:.2f} ms and the alignment on collective ends "
                        f"varies by {clock_spread_us[worst]:.0f} µs (IQR, rank {worst}): cross-rank waits are "
                        "approximate", confidence="medium", kinds=CROSS_RANK_KINDS)]


def untraced_ranks_caveat(tables: dict) -> Caveat | None:
    """The job had more ranks than were traced (distributedInfo.world_size, from any rank's trace; tables: rank ->
    EventTable): a collective's time can be waiting for a rank that is not in the traces, and a straggler among
    those reads as communication."""
    infos = [t.metadata.get("distributedInfo") for t in tables.values()]
    known = [int(w) for w in (i.get("world_size") for i in infos if isinstance(i, dict))
             if isinstance(w, (int, float)) and w > 0]
    world, traced = max(known, default=0), len(tables)
    if world <= traced:
        return None
    return Caveat(note=f"{traced} of the job's {world} ranks traced (distributedInfo.world_size): time inside "
                       "collectives may be waiting for an untraced rank, and a straggler among them reads as exposed "
                       "communication; diagnose every rank's trace (or one rank of each node) together to tell",
                  confidence="medium", kinds=CROSS_RANK_KINDS)


_LEVEL = {"high": 2, "medium": 1, "low": 0}


def apply_caveats(found: list[F.Finding], caveats: list[Caveat]) -> None:
    """Lower each finding's confidence to the lowest caveat touching its kind, and attach the notes."""
    for x in found:
        for c in caveats:
            if c.kinds is None or x.kind in c.kinds:
                if _LEVEL[c.confidence] < _LEVEL[x.confidence]:
                    x.confidence = c.confidence
                if c.note not in x.notes:
                    x.notes.append(c.note)
