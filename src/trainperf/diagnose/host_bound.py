"""The GPU waits for the host: `launch_bound` (launching itself paces the GPU), `host_work` (host work between
launches that launches nothing: a CPU optimizer step, metrics, preprocessing, a checkpoint copied without a name) and
`small_kernels` (kernels too short to cover their own launch). Each priced by replaying its fix on the rank's host
chain (replay.py); thresholds beside the rules that read them.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import advice
from trainperf.diagnose import findings as F
from trainperf.diagnose.evidence import SAMPLED_IDS_PER_CALL, is_sampled
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gpu_time import idle_in_spans_us
from trainperf.diagnose.host import OPTIMIZER_RE, compiled_frames, span_rows
from trainperf.diagnose.launch import SMALL_KERNEL_US, graph_launched
from trainperf.diagnose.replay import (Change, Graph, dispatch_taken, fused_fixed_cost_us, host_work_us,
                                       one_off_first_calls)
from trainperf.diagnose.window import covered_each, covered_length, merge_intervals
from trainperf.trace.annotate import STEP_RE
from trainperf.trace.categories import copy_direction
from trainperf.trace.events import CPU_OP, KERNEL, MEMCPY, PYTHON, RUNTIME, USER_ANNOTATION
from trainperf.trace.nesting import outermost, starts_inside, thread_key


# the GPU idle the host causes (waiting for it in the window, or the host step's excess over the device's), % of the
# span: what the launches can cost, not how idle the GPU is otherwise, decides, as for host work (HOST_WORK_MIN_PCT).
# 3 %, the medium bar (findings.MEDIUM_GAIN_PCT). It was 15 % of all GPU idle: a V100 loop whose slower launches
# left its GPU waiting 8 % of the window for the host (6.7 % slower) idled 10.2 % and read as nothing
LAUNCH_BOUND_HOST_IDLE_MIN_PCT = 3.0
LAUNCH_BOUND_HOST_WAIT_SHARE = 0.5  # share of the idle time spent waiting for a launch
LAUNCH_BOUND_HOST_CP_SHARE = 0.3   # host work (cpu + runtime calls) on the critical path, share of the span
# A launch call's own time in its usual range: HTA's get_cuda_kernel_launch_stats, "the launch time on the CPU side
# is between 5-20 microseconds" (the bases' and the H200 loops' median calls 4-10 us, MI250's hipLaunchKernel 5)
LAUNCH_CALL_USUAL_MAX_US = 20.0
# A host whose median kernel-launch call takes this long is slow at launching itself (a contended or throttled CPU,
# a tracing or debug layer, an older driver), whatever its kernels: its fix is the usual call, measured against that
# range, not a CUDA graph that may not capture the step (an upper bound). Twice the range's top, so that at least
# half of the median call is the excess. The corpus's slower launches (13-270 us a call against the bases' 4-10) on
# the MI250, whose kernels are mostly tiny, were priced as small_kernels (13 % of 20 %), the fusion priced first as
# the narrower fix, and the launches' bound after it at half of what was left (4 %), below a 4.8 % DataLoader wait.
# Only CUDA's and HIP's per-kernel launch calls (not a graph's launch, which starts a whole graph; not another
# device's runtime: MTIA's calls take ~300 us each in HTA's trace). Stated; cross-validated (docs/benchmarks.md)
SLOW_LAUNCH_CALL_US = 40.0
SLOW_LAUNCH_CALL_MIN_CALLS = 10  # a median over fewer launches is one op's, not the host's launch path
KERNEL_LAUNCH_CALL_RE = re.compile(r"^(?!.*Graph)(cuda|cu|hip)\w*Launch")


def gpu_idle_pct(f: RankFacts) -> float:
    """GPU idle (%) the idle gates read: the larger of HTA's (over the device span, first to last device event) and
    the one over the analysed steps' host window (RankFacts.step_idle_pct). A step whose only kernel is 45 µs
    long is ~0 % idle over its device span and ~100 % over the step the job pays for (audit P1)."""
    return max(f.breakdown.idle_pct, f.step_idle_pct or 0.0)


def launch_cost_us(f: RankFacts, launches: np.ndarray) -> float:
    """What launching costs the host (µs): each launch call's own time (an outlier call's wait excluded,
    Graph.launch_call_us) plus the usual op dispatch before it (Graph.dispatch_us, at most the CPU work the trace
    shows since the thread's previous launch: replay.dispatch_taken), summed over the given launch nodes (a mask).
    This is the host time a CUDA graph (or fusion into fewer kernels) removes: the same amount the what-if replay
    takes off the host chain."""
    g = f.graph
    return float(dispatch_taken(g, g.cpu_work_us, launches).sum() + g.launch_call_us[launches].sum())


def kernel_launch_calls(f: RankFacts) -> tuple[np.ndarray, float]:
    """(trace rows, median own time in µs) of the rank's CUDA/HIP per-kernel launch calls in the window (no graph
    launch; an outlier's wait excluded, Graph.launch_call_us); nan with none."""
    g, t = f.graph, f.table
    launches = np.flatnonzero(g.kernel_launch & (g.launch_call_us > 0))
    launches = launches[np.isin(t.name[g.rows[launches]], t.ids_matching(KERNEL_LAUNCH_CALL_RE.match))]
    return g.rows[launches], float(np.median(g.launch_call_us[launches])) if launches.size else float("nan")


def launch_bound(f: RankFacts) -> F.Finding | None:
    """The GPU waits for the host to launch work, and host work between launches is on the critical path.
    Priced by its concrete fix: every kernel launch costs the host nothing (the step captured as a CUDA
    graph), i.e. launches x per-launch cost (launch_cost_us) taken off the host chain and replayed; where the host's
    launch calls are themselves slow (SLOW_LAUNCH_CALL_US), each call at the top of its usual range instead."""
    if not f.has_gpu:
        return None
    idle, tb, ls = f.idle, f.breakdown, f.launch
    hp, _, _ = idle.pct()
    host_cp = f.critical_path.get("cpu", 0.0) + f.critical_path.get("runtime", 0.0)
    # the GPU idle the host causes, % of the span: in the window, where the idle is mostly waiting for the host and
    # the host is on the critical path; and in a long run, where the host sets the steady pace, by the host step's
    # excess over the device's, although work queued before the window kept the GPU busy (and off the host) through
    # the profiled steps (as host_work and small_kernels read it: an H200 loop whose launches each took 150 us more
    # idled 6.8 % in the window, 20 % a step in the run). The replay prices what graphing the launches gives back
    on_host = (idle.host_wait_us > LAUNCH_BOUND_HOST_WAIT_SHARE * max(idle.total_us, 1e-9)
               and host_cp > LAUNCH_BOUND_HOST_CP_SHARE * f.span_us)
    # (idle's categories are over every stream's gaps: their shares, not their µs, are of the window)
    idle_in_window_pct = gpu_idle_pct(f) * idle.host_wait_us / idle.total_us if on_host and idle.total_us > 0 else 0.0
    idle_in_run_pct = f.pct(f.host_excess_us)
    if max(idle_in_window_pct, idle_in_run_pct) <= LAUNCH_BOUND_HOST_IDLE_MIN_PCT:
        return None
    g = f.graph
    n = int(g.kernel_launch.sum())
    cost = launch_cost_us(f, g.kernel_launch)
    # what the step cannot go under however fast the host: the profiler slows the host (2x on an H200's launch-bound
    # loop), so a loop whose unprofiled step is no longer than this is not launch-bound without the profiler
    busy_per_step = {"gpu_busy_per_step": (tb.busy_us / len(f.steps) / 1e3, "ms")} if f.steps else {}
    if idle_in_run_pct > idle_in_window_pct:  # the window's queue hid it
        busy_per_step["host_step_over_device_step"] = (f.host_step_excess_us, "us")
    call_rows, call_median = kernel_launch_calls(f)
    slow = call_rows.size >= SLOW_LAUNCH_CALL_MIN_CALLS and call_median >= SLOW_LAUNCH_CALL_US
    if slow:
        fix = (Change("usual_launch_calls", factor=LAUNCH_CALL_USUAL_MAX_US, rows=tuple(call_rows.tolist())),)
        what_if = f"every kernel launch call takes at most {LAUNCH_CALL_USUAL_MAX_US:g} us, a usual call's time"
    else:
        fix, what_if = (Change("graph_launches"),), "kernel launches cost the host nothing (CUDA graphs)"
    found = F.rank_finding(f, "launch_bound", {
        "gpu_idle": (tb.idle_pct, "%"), "gpu_idle_over_steps": (f.step_idle_pct or 0.0, "%"),
        "idle_waiting_on_host": (hp, "%"),
        "host_on_critical_path": (f.pct(host_cp), "%"), "launch_bound_stretches": (len(f.stretches), "count"),
        "launch_delay_median": (ls.delay_median_us, "us"), "kernel_launches": (n, "count"),
        "per_launch_cost": (cost / n if n else 0.0, "us"), "launch_cost": (cost, "us"),
        **({"launch_call_median": (call_median, "us")} if call_rows.size else {}), **busy_per_step},
        [("launch-bound stretch (stream %d, %d kernels)" % (x.stream, x.n_kernels), x.start_us, x.end_us - x.start_us)
         for x in f.stretches[:3]], fix, what_if,
        evidence_pct=f.pct(min(cost, max(host_cp, f.host_excess_us))))
    graphed, compiled = f.once("graphs_and_compiled_regions", lambda: _graphs_and_compiled_regions(f))
    per_step = max(len(f.steps), 1)
    if graphed:  # part of the step replays as CUDA graphs already: what is left is launched one by one
        found.recommendation = advice.PARTLY_GRAPHED_RECOMMENDATION.format(graphed=graphed / per_step,
                                                                           launches=n / per_step)
    elif compiled:  # compiled, but without CUDA graphs
        found.recommendation = advice.COMPILED_WITHOUT_GRAPHS_RECOMMENDATION.format(launches=n / per_step)
    if slow:
        found.recommendation = (advice.SLOW_LAUNCH_CALLS_RECOMMENDATION.format(us=call_median) + " "
                                + found.recommendation)
    return found


def _graphs_and_compiled_regions(f: RankFacts) -> tuple[int, int]:
    """(kernels the window's CUDA/HIP graph replays launched, the compiled frames it ran: torch.compile's
    "Torch-Compiled Region" spans, host.compiled_frames)."""
    t, w = f.table, f.window
    kernels = w.device[t.kind[w.device] == KERNEL]
    return int(graph_launched(t, kernels).sum()), compiled_frames(t, w)[0]


# host_work: a gap in which the launching thread works this much beyond the usual dispatch before a launch is work
# that launches nothing (a CPU optimizer step, metrics, preprocessing, the garbage collector), not the Python glue
# between two ops, which takes tens of µs (the usual dispatch itself, Graph.dispatch_us: 10-60 µs on HTA's traces).
# 1 ms: a stated scale (tens of dispatches), not fitted.
HOST_WORK_MIN_GAP_US = 1000.0
# ... or this share of a step, where that is less: 1 ms is 1 % of a 100-ms step but 10 % of a 10-ms one (a decode
# step, a small model's training step), where work half as long already costs what a 1-ms gap costs a 100-ms step.
# 5 %: twice the longest gap of MI250's healthy 9.3-ms step (251 µs, 2.7 %). Stated: every cross-validation fold
# kept it, but only that one short-step base reacts to it, so no fold validates it across bases (docs/benchmarks.md).
# Never under 100 µs: the Python glue between two ops takes tens of µs whatever the step (a 200-µs step's 16-µs gaps
# are dispatch, not work)
HOST_WORK_MIN_GAP_STEP_SHARE = 0.05
HOST_WORK_MIN_GAP_FLOOR_US = 100.0
# the GPU idle during that work, % of the span: what the work costs, not how idle the GPU is otherwise, decides (a
# GPU-bound step whose host is far ahead absorbs 20 ms of host work for a 1.8 % slower step: HTA's ns_resolution).
# 3 %, the medium bar (findings.MEDIUM_GAIN_PCT), not the 1 % of the stalls with a rule of their own
# (DATALOADER_MIN_PCT, HOST_SYNC_MIN_PCT): host work is what is left of the host chain once they and launch_bound
# are named, unnamed, so under it the evidence is too thin to act on. Cross-validated (leave one base out, the
# host_work thresholds alone, 2026-12-04): 6 of 8 folds moved it from 1 to 2.8 (plateau 2.5-3.9), out-of-sample
# host_work precision 0.21 -> 0.26 at the same recall (0.92) and top-1; at 3, 8 of 8 folds kept it (2.5-3.7)
# (docs/benchmarks.md)
HOST_WORK_MIN_PCT = 3.0


def _spans_at(f: RankFacts, row: int, at_us: float) -> np.ndarray:
    """Rows of the annotations, ops and Python frames the thread of trace row `row` was inside at at_us
    (ProfilerStep spans aside)."""
    t, w = f.table, f.window
    on = np.flatnonzero(w.keep & np.isin(t.kind, (CPU_OP, USER_ANNOTATION, PYTHON)) & (t.tid == t.tid[row])
                        & (t.pid == t.pid[row]) & (w.ts_us <= at_us) & (w.end_us >= at_us))
    return on[~np.isin(t.name[on], t.ids_matching(STEP_RE.match))]


def _enclosing_op(f: RankFacts, on: np.ndarray) -> str:
    """Name of what a thread was inside (on: _spans_at): the outermost annotation and the outermost op,
    'annotation > op' (an op's children, e.g. the 424 views of one aten::unflatten_dense_tensors, are its own
    work); a note when nothing holds it."""
    t, w = f.table, f.window
    if not on.size:
        return "(no op recorded: Python outside ops, the garbage collector or untraced work)"
    names = []
    for kinds in ((USER_ANNOTATION,), (CPU_OP, PYTHON)):
        held = on[np.isin(t.kind[on], kinds)]
        if held.size:
            names.append(t.names[int(t.name[held[np.argmax(w.end_us[held] - w.ts_us[held])]])])
    return " > ".join(names)


def _block_name(f: RankFacts, row: int, start_us: float, end_us: float) -> str:
    """What held the thread of trace row `row` over the block [start_us, end_us): the annotation and op around its
    middle (_enclosing_op) when one of them spans at least half of it; else, when many short ops fill it (a serving
    loop's input preparation: the Python between them is the work), those ops by name and count, 'N ops (a xK, b
    xL): P % of it inside them'."""
    t, w = f.table, f.window
    around = _spans_at(f, row, (start_us + end_us) / 2.0)
    spans = float((w.end_us[around] - w.ts_us[around]).max()) if around.size else 0.0
    ops = np.flatnonzero(w.keep & (t.kind == CPU_OP) & (t.tid == t.tid[row]) & (t.pid == t.pid[row])
                         & (w.ts_us >= start_us) & (w.end_us <= end_us))
    ops = ops[~np.isin(t.name[ops], t.ids_matching(STEP_RE.match))]
    if spans >= 0.5 * (end_us - start_us) or ops.size < 2:
        return _enclosing_op(f, around)
    ops = outermost(t, ops)
    names, counts = np.unique(t.name[ops], return_counts=True)
    top = np.argsort(-counts, kind="stable")[:2]
    inside = covered_length(w.ts_us[ops], w.end_us[ops]) / max(end_us - start_us, 1e-9)
    return (f"{ops.size} ops (" + ", ".join(f"{t.names[int(names[i])]} x{int(counts[i])}" for i in top)
            + f"{', ...' if names.size > 2 else ''}): {100.0 * inside:.0f} % of it inside them")


def _inside_first_call(f: RankFacts, rows: np.ndarray, at_us: np.ndarray) -> np.ndarray:
    """Per host call row (bool): whether its thread was, at at_us, inside an op that is one-off initialisation (the
    first call of its name on that thread, replay.one_off_first_calls: a first allocation, a library's set-up), as
    the warm-up caveat says of runtime calls; a steady step does not pay it again (HTA's with_gpu_user_annotation:
    its first aten::empty_strided 2.2 ms, the later ones ~8 us)."""
    t, w = f.table, f.window
    ops = np.flatnonzero(w.keep & np.isin(t.kind, (CPU_OP, PYTHON)))
    out = np.zeros(rows.size, dtype=bool)
    if not rows.size or not ops.size:
        return out
    key = np.unique(np.c_[thread_key(t.pid[ops], t.tid[ops]), t.name[ops]], axis=0, return_inverse=True)[1].ravel()
    first = ops[one_off_first_calls(key, w.ts_us[ops], w.end_us[ops] - w.ts_us[ops])]
    for i, (row, at) in enumerate(zip(rows, at_us)):
        out[i] = bool(((t.tid[first] == t.tid[row]) & (t.pid[first] == t.pid[row]) & (w.ts_us[first] <= at)
                       & (w.end_us[first] >= at)).any())
    return out


# host work whose GPU idle falls in one step (this share of it) of at least this many analysed steps is periodic work
# done every N steps (a checkpoint save, an evaluation, a metrics flush), not every step's: 3 steps, the fewest in
# which one can stand out from the others; 90 %, nearly all of it. Stated, not fitted (the corpus's checkpoint
# cases are named by their spans)
ONE_OFF_MIN_STEPS = 3
ONE_OFF_SHARE = 0.9
# host work at least this share of which (by what it costs) lies inside optimizer steps that launch no kernel is the
# optimizer's update on the CPU (_host_side_optimizer_share): optimizer_slow with the offload's fix. Half: most of it,
# the midpoint the other "which cause holds most" tests use; stated, not fitted (no labeled offload case)
HOST_OPTIMIZER_MIN_SHARE = 0.5
# ... and a checkpoint save when that step also copied the model's state to the host, as a synchronous save of device
# tensors does before it writes (torch.save moves each storage to the CPU; DCP stages each shard): at least this many
# device-to-host copies more than any other analysed step makes (a state dict holds several tensors per layer; a
# metrics flush or an evaluation's .cpu() makes a few), of at least this many bytes in all where the trace records
# them (16 MiB: the weights of a model of 4 M fp32 parameters, far below any worth profiling). Stated, not fitted:
# the corpus's injected saves copy nothing; the file write itself records no op
CHECKPOINT_MIN_COPIES = 16
CHECKPOINT_MIN_COPY_BYTES = 16 * 2**20


def _sum_by_step(f: RankFacts, starts_us: np.ndarray, idle_us: np.ndarray) -> dict[int, float]:
    """{step: µs of idle_us whose block starts (starts_us) inside that analysed ProfilerStep's host span}; blocks
    outside every step are left out; {} without steps."""
    out: dict[int, float] = {}
    for x in f.step_times:
        inside = (starts_us >= x.start_us) & (starts_us < x.start_us + x.host_us)
        if inside.any():
            out[x.step] = float(idle_us[inside].sum())
    return out


def _call_correlation(f: RankFacts, g: Graph) -> np.ndarray:
    """Per node: its call's correlation id; for the anchor that closes a thread's chain at the end of the window's
    last step (replay._closing_anchors), the id of that thread's next runtime call in the trace (the next step's
    first): a gap up to the step's end skips ids where events were lost, as any gap does. -1 where none."""
    t = f.table
    corr = t.correlation[g.rows].copy()
    closing = np.flatnonzero(g.is_host & (g.host_prev >= 0) & np.isin(g.rows, f.window.markers.host_rows))
    for i in closing:
        row = int(g.rows[i])
        after = np.flatnonzero((t.kind == RUNTIME) & (t.tid == t.tid[row]) & (t.pid == t.pid[row])
                               & (t.ts_ns >= t.ts_ns[row] + t.dur_ns[row]) & (t.correlation >= 0))
        corr[i] = t.correlation[after[np.argmin(t.ts_ns[after])]] if after.size else -1
    return corr


def _skips_ids(g: Graph, corr: np.ndarray) -> np.ndarray:
    """Per node: whether events were lost across the gap before it, as its thread's correlation ids (corr:
    _call_correlation) tell. Ids are handed out as calls are made, so a step forward of more than SAMPLED_IDS_PER_CALL
    from the call before is a hole. A step backward means a call was added out of sequence (written into the trace
    afterwards, numbered past its largest id): compared with the call before that one instead, and a hole only if the
    ids skip forward from there (host work after a blocking copy added so was not read at all)."""
    def step(prev: np.ndarray) -> np.ndarray:
        p = np.clip(prev, 0, None)
        ok = (prev >= 0) & (corr >= 0) & (corr[p] >= 0)
        return np.where(ok, corr - corr[p], 0)

    before = np.where(g.host_prev >= 0, g.host_prev[np.clip(g.host_prev, 0, None)], -1)
    from_prev = step(g.host_prev)
    back = from_prev < -SAMPLED_IDS_PER_CALL
    return (from_prev > SAMPLED_IDS_PER_CALL) | (back & (np.abs(step(before)) > SAMPLED_IDS_PER_CALL))


def _drained_at_us(g: Graph, at_us: np.ndarray) -> np.ndarray:
    """Per time in at_us: when the device work launched before it has all ended (µs; -inf when none was)."""
    dev = np.flatnonzero(~g.is_host & (g.launch >= 0))
    if not dev.size:
        return np.full(np.shape(at_us), -np.inf)
    launched = g.start[g.launch[dev]]
    order = np.argsort(launched, kind="stable")
    ended = np.maximum.accumulate((g.start + g.dur)[dev][order])
    k = np.searchsorted(launched[order], at_us, side="left")  # launched strictly before
    return np.where(k > 0, ended[np.maximum(k - 1, 0)], -np.inf)


def host_work_min_gap_us(f: RankFacts) -> float:
    """The shortest gap of host work the host_work rule reads (µs): HOST_WORK_MIN_GAP_US, or
    HOST_WORK_MIN_GAP_STEP_SHARE of the mean analysed step where that is less (the whole window is one step
    without ProfilerSteps), never under HOST_WORK_MIN_GAP_FLOOR_US."""
    share_us = HOST_WORK_MIN_GAP_STEP_SHARE * f.span_us / max(len(f.step_times), 1)
    return min(HOST_WORK_MIN_GAP_US, max(HOST_WORK_MIN_GAP_FLOOR_US, share_us))


def host_work(f: RankFacts) -> F.Finding | None:
    """The GPU waits while the thread that launches its work does something else for milliseconds at a time: CPU
    work that launches nothing (a CPU optimizer under ZeRO-Offload, metrics or logging, preprocessing outside the
    DataLoader, Python's garbage collector, untraced Python). launch_bound prices the launches' own cost (the call
    and the usual dispatch before it); this is the rest of the host chain, in gaps of at least host_work_min_gap_us
    beyond that dispatch (replay.host_work_us). Priced as that work gone from the training loop (moved
    to another thread or process, done less often, or onto the device): an upper bound. Not on a sampled or filtered
    trace, whose host gaps are missing events (evidence.is_sampled). Work in one step of several after that step
    copied a model's state to the host (_state_copied_to_host) is a checkpoint save no span names: checkpoint_stall.
    Work mostly inside optimizer steps that launch no kernel (optimizer_on_host) is the optimizer's update on the
    CPU: optimizer_slow, with the offload's fix."""
    if not f.has_gpu or is_sampled(f):
        return None
    g = f.graph
    work = host_work_us(g)
    # a gap across which the thread's calls skip many correlation ids forward lost its events (a trace filtered or
    # sampled in parts): missing events, not work (as evidence.is_sampled says of a whole trace); ids run backwards
    # only where calls were added, and such a gap is judged from the call before the added one (_skips_ids)
    corr = f.once("call_correlation", lambda: _call_correlation(f, g))  # a table scan: once per rank
    holed = _skips_ids(g, corr)
    long = np.flatnonzero(g.is_host & (work >= host_work_min_gap_us(f)) & ~holed)
    long = long[~_inside_first_call(f, g.rows[long], g.start[long] - work[long] / 2)]
    # what it costs is the time the GPU runs dry during it: a gap while long kernels run costs nothing, and neither
    # does device idle before the device has run what was launched before the block ends (work queued and waiting
    # on something else: another stream, an event), which no host work delays
    ends = g.start[long]
    begins = np.maximum(ends - g.host_gap[long], _drained_at_us(g, ends))
    starved = np.minimum(idle_in_spans_us(f.window, begins, np.maximum(begins, ends)), work[long])
    # a host that sets the steady pace starves the GPU of its excess over the device's step in a long run, although
    # a queue launched before the window may keep the GPU busy through the profiled steps: as much of the work as that
    steady_us = min(float(work[long].sum()), f.host_excess_us)
    cost_us = max(float(starved.sum()), steady_us)
    if f.pct(cost_us) < HOST_WORK_MIN_PCT:
        return None
    weight = starved if starved.sum() >= steady_us else work[long]  # what each gap costs, or its share of it
    top = long[np.argsort(-weight)[:3]]
    events = [(_block_name(f, int(g.rows[i]), float(g.start[i] - work[i]), float(g.start[i])),
               float(g.start[i] - work[i]), float(work[i])) for i in top]
    metrics = {"host_work": (float(work[long].sum()), "us"), "gpu_idle_during_it": (float(starved.sum()), "us"),
               "gpu_idle_during_it_share": (f.pct(float(starved.sum())), "%"), "gaps": (int(long.size), "count"),
               "gpu_idle": (gpu_idle_pct(f), "%"), "usual_dispatch_per_launch": (g.dispatch_us, "us")}
    if steady_us > starved.sum():  # the window's queue hid it
        metrics["host_step_over_device_step"] = (f.host_step_excess_us, "us")
    by_step = _sum_by_step(f, g.start[long] - work[long], weight)
    if by_step:
        metrics["steps_with_it"] = (len(by_step), f"of {len(f.step_times)} steps")
    one_off = len(f.step_times) >= ONE_OFF_MIN_STEPS and max(by_step.values(), default=0.0) >= ONE_OFF_SHARE * weight.sum()
    saved = _state_copied_to_host(f, max(by_step, key=by_step.get)) if one_off and f.checkpoint.time_us <= 0 else None
    if saved is not None:
        metrics["copies_to_host_in_that_step"] = (saved[0], "count")
        metrics["bytes_to_host_in_that_step"] = (saved[1], "bytes")
    # most of it inside an optimizer step that launches no kernel: the optimizer's update on the CPU
    on_host = _host_side_optimizer_share(f, g.start[long] - work[long], g.start[long], weight) if saved is None else 0.0
    if on_host >= HOST_OPTIMIZER_MIN_SHARE:
        metrics["inside_optimizer_steps_launching_no_kernel"] = (100.0 * on_host, "%")
    kind = "checkpoint_stall" if saved else "optimizer_slow" if on_host >= HOST_OPTIMIZER_MIN_SHARE else "host_work"
    found = F.rank_finding(f, kind, metrics, events,
                           (Change("remove_host_work", rows=tuple(int(r) for r in g.rows[long])),),
                           "the optimizer's update on the CPU gone from the loop (on the GPU, its states there)"
                           if kind == "optimizer_slow" else "the host work that launches nothing gone from the loop",
                           evidence_pct=f.pct(cost_us), upper_bound=True)
    if saved is not None:
        found.recommendation = advice.UNNAMED_CHECKPOINT_RECOMMENDATION.format(n=len(f.step_times), copies=saved[0],
                                                                               mib=saved[1] / 2**20)
    elif kind == "optimizer_slow":
        found.recommendation = advice.HOST_OPTIMIZER_RECOMMENDATION
    elif one_off:
        found.recommendation = advice.ONE_OFF_HOST_WORK_RECOMMENDATION.format(n=len(f.step_times))
    return found


def optimizer_on_host(f: RankFacts) -> bool:
    """Whether the window has optimizer step / zero_grad spans and they launch no kernel at all: an optimizer whose
    update runs on the CPU, its states offloaded to host memory (ZeRO-Offload's DeepSpeedCPUAdam, FSDP's CPU
    offload). Copies and memsets made inside them do not count. Once per rank (host_work and optimizer_slow ask)."""
    return f.once("optimizer_on_host", lambda: _optimizer_launches_nothing(f))


def _optimizer_launches_nothing(f: RankFacts) -> bool:
    """optimizer_on_host, computed."""
    spans = span_rows(f.table, f.window, OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))
    launches = f.graph.rows[f.graph.is_host & f.graph.kernel_launch]
    return bool(spans.size) and not (launches.size and starts_inside(f.table, spans, launches).any())


def _host_side_optimizer_share(f: RankFacts, starts_us: np.ndarray, ends_us: np.ndarray, weight: np.ndarray) -> float:
    """The share (0-1) of the host work's weight inside the optimizer's step / zero_grad spans (each block [starts_us,
    ends_us) weighs its weight times the part of it inside them) where the optimizer runs on the host
    (optimizer_on_host); else 0."""
    if weight.sum() <= 0 or not optimizer_on_host(f):
        return 0.0
    part = covered_each(starts_us, ends_us, merge_intervals(f.optimizer.starts_us, f.optimizer.ends_us))
    return float((weight * part / np.maximum(ends_us - starts_us, 1e-9)).sum() / weight.sum())


def _state_copied_to_host(f: RankFacts, step: int) -> tuple[int, int] | None:
    """(device-to-host copies, their bytes) of the analysed step `step` when they are a model state's
    (CHECKPOINT_MIN_COPIES more than any other analysed step, CHECKPOINT_MIN_COPY_BYTES in all where the trace records
    sizes), else None. A copy belongs to the step its launch is in (EventTable.step)."""
    t, w = f.table, f.window
    rows = np.flatnonzero(w.keep & (t.kind == MEMCPY)
                          & np.isin(t.name, t.ids_matching(lambda s: copy_direction(s) == "DtoH")))
    steps = t.step[rows]
    count = int((steps == step).sum())
    others = max((int((steps == x.step).sum()) for x in f.step_times if x.step != step), default=0)
    sized = t.nbytes[rows[steps == step]]
    nbytes = int(sized[sized > 0].sum())
    if count - others < CHECKPOINT_MIN_COPIES or ((sized > 0).any() and nbytes < CHECKPOINT_MIN_COPY_BYTES):
        return None
    return count, nbytes


SMALL_KERNEL_COUNT_PCT = 50.0  # small kernels (launch.small_kernel_mask), % of kernels
# where the host never makes the device wait, the tiny kernels still cost the device their fixed cost each (start-up
# and tail, Graph.kernel_floor_us): worth a finding from the stall rules' evidence threshold on (1 % of the window)
SMALL_KERNEL_DEVICE_MIN_PCT = 1.0


def small_kernels(f: RankFacts) -> F.Finding | None:
    """Most kernels are tiny, so launching them costs more than running them, or, on a device that sets the pace,
    their fixed device cost adds up."""
    if not f.has_gpu:
        return None
    ls, g = f.launch, f.graph
    if ls.small_kernel_count_pct <= SMALL_KERNEL_COUNT_PCT:
        return None
    launch_cost = launch_cost_us(f, g.small_launch)  # the calls and the usual op dispatch before each
    # the GPU idled before them; or, where the host sets the steady pace, it will in a long run by the host step's
    # excess over the device's, which a queue launched before the window hid (as host_work reads it)
    waited_us = max(ls.small_kernel_host_wait_us, min(launch_cost, f.host_excess_us))
    small_dev = ~g.is_host & (g.launch >= 0) & g.small_launch[np.clip(g.launch, 0, None)]
    # fused into their neighbours, they stop paying a kernel's fixed device cost and the device's gap before each, as
    # the replay prices it: in a device-bound loop that is all they cost, hundreds a step adding to the step the host
    # runs ahead of
    device_us = float(sum(part.sum() for part in fused_fixed_cost_us(g, g.dur, g.lag, small_dev)))
    if waited_us <= 0 and f.pct(device_us) < SMALL_KERNEL_DEVICE_MIN_PCT:
        return None
    evidence_us = min(launch_cost, waited_us) + device_us
    metrics = {"small_kernels": (ls.small_kernel_count_pct, "% of kernels"),
               "their_time": (ls.small_kernel_time_pct, "% of kernel time"),
               "gpu_idle_before_them": (ls.small_kernel_host_wait_us, "us"),
               "host_cost_of_their_launches": (launch_cost, "us"), "their_fixed_device_cost": (device_us, "us"),
               "threshold": (SMALL_KERNEL_US, "us")}
    if waited_us > ls.small_kernel_host_wait_us:  # the window's queue hid it
        metrics["host_step_over_device_step"] = (f.host_step_excess_us, "us")
    found = F.rank_finding(f, "small_kernels", metrics,
                           (), (Change("graph_small_kernels"),),
                           "small kernels fused: their launches cost the host nothing and their own device time goes",
                           evidence_pct=f.pct(evidence_us))
    if waited_us <= 0:
        found.recommendation = advice.DEVICE_PACED_SMALL_KERNELS_RECOMMENDATION
    return found
