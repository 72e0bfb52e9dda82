"""`diagnose(path)`: load a trace, collect every analysis per rank once (facts.py), run the finding
rules (rules.py), price them by marginal gain (findings.rank_by_marginal_gain), merge across ranks."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose import stragglers
from trainperf.diagnose.crossrank import (ComputeStraggler, CrossRank, MatchedCollective, comm_waits,
                                         compute_before_collectives, compute_straggler, cross_rank, host_straggler,
                                         laggards, lateness_by_step, lateness_share, persistent_laggard,
                                         slow_ranks, slowest_rank_min_p_value,
                                         slowest_rank_p_value,
                                         straggler_p_value, straggler_steps_needed)
from trainperf.diagnose.ddp import BUFFER_BROADCASTS, buffer_broadcasts, buffer_sync_floor_us
from trainperf.diagnose.device_clock import with_device_clocks_aligned
from trainperf.diagnose.evidence import (Caveat, apply_caveats, cross_rank_caveats, profiled_wait_notes,
                                         rank_caveats, rank_notes, untraced_ranks_caveat)
from trainperf.diagnose.facts import DeviceTiming, RankFacts, StragglerFacts, collect_facts, device_timing
from trainperf.diagnose.modules import module_breakdown
from trainperf.diagnose.pipeline import later_stage, stages_from_openings
from trainperf.diagnose.step_flops import step_flops
from trainperf.diagnose.steps import gpu_step_periods_us, memcpy_bandwidth
from trainperf.diagnose.routing import routing_evidence
from trainperf.diagnose.rules import idle_left_by_dismissed, run_rules
from trainperf.diagnose.slow_work import (WorkComparison, compare_work, host_step_work, host_work, merge_comparisons,
                                          rank_work, step_work)
from trainperf.diagnose.unprofiled import (RunSteps, host_calibration, run_gc_pause_ms, run_steps,
                                          run_unprofiled_step_ms)
from trainperf.diagnose.window import analysis_window, find_step_markers, one_profiling_cycle
from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable
from trainperf.trace.load import LoadWarning, load_trace, ranks_in_file_order_note


@dataclass(kw_only=True)
class RankSummary:
    """Per-rank figures of the JSON output (times µs, shares %)."""

    rank: int
    source: str
    window_us: float
    # the GPU's shares (%): None (JSON null) on a rank without GPU activity, where they do not apply (not zero)
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    overlap_pct: float | None
    idle_host_pct: float | None
    idle_kernel_pct: float | None
    idle_other_pct: float | None
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    n_events: int = 0
    steps: list[int] = field(default_factory=list)
    step_time_median_us: float | None = None         # None: no complete step (the notes say why)
    step_times: list = field(default_factory=list)  # [{step, host_us, device_busy_us}] per ProfilerStep
    kernel_categories_pct: dict = field(default_factory=dict)
    launch_delay_median_us: float = 0.0
    launch_delay_p95_us: float = 0.0
    small_kernel_count_pct: float = 0.0
    queue_length_max: int = 0
    memcpy_gbps: dict = field(default_factory=dict)  # direction -> GB/s; None where no copy's size is recorded
    dataloader_pct: float = 0.0
    host_sync_pct: float = 0.0
    host_queue_wait_pct: float = 0.0  # the host blocked waiting for slots in the full launch queue, % of the span
    optimizer_pct: float = 0.0
    critical_path_pct: dict = field(default_factory=dict)
    gpu_analyses: str = "ok"
    allocator_pct: float = 0.0
    gpu_step_time_median_us: float | None = None    # step period on the GPU timeline (steps.gpu_step_periods_us)
    gpu_lag_median_us: float | None = None          # GPU work of a step starts this long after its host span
    step_idle_pct: float | None = None              # GPU idle over the analysed steps' host window (idle_pct: HTA's)
    confidence: str = "high"                        # lowest confidence the limits of this rank's evidence leave
    evidence_notes: list = field(default_factory=list)  # those limits, and notes on the per-step figures
    fix_order: list = field(default_factory=list)   # kinds, in the order their marginal gains were priced
    dismissed: list = field(default_factory=list)   # rules that fired but whose fix would gain < 0.5 %
    fix_all_gain_pct: float = 0.0                   # every fix of this rank applied together, % of steady_step_us
    # the step of a long run that every gain is a share of (diagnose/period.py): the larger of the host's and the
    # device's mean step over the analysed steps (the device's alone where the host was paced by it); None where
    # the steps' device work is not known (no steps, no launch correlation): gains are then shares of the window
    steady_step_us: float | None = None
    steady_step_host_us: float | None = None
    steady_step_device_us: float | None = None
    host_paced_by_device: bool = False
    loop: str = "unknown"                           # training | inference (forward-only) | unknown (facts.loop_kind)
    # the device's memory over the window from the allocator's samples (profile_memory=True; diagnose/memory.py):
    # peak allocated and reserved, the fewest bytes allocated (kept between steps), the device's capacity (bytes);
    # None where the trace has no samples (the capacity: where neither the trace nor the catalog gives it)
    memory_peak_allocated_bytes: int | None = None
    memory_peak_reserved_bytes: int | None = None
    memory_kept_bytes: int | None = None
    device_memory_bytes: int | None = None
    # the matrix products', convolutions' and attention's FLOPs from the recorded shapes (record_shapes=True;
    # diagnose/step_flops.py): FLOP a step, TFLOP/s over the window, their time at the peak as % of it (hardware FLOPs
    # utilisation; None without the device's peaks), % of the GEMM and attention kernel time they cover (None on a CPU
    # run), the precision of most of them; None where no such operator's shapes are recorded
    flops_per_step: float | None = None
    achieved_tflops: float | None = None
    flops_utilisation_pct: float | None = None
    flops_covered_pct: float | None = None
    flops_precision: str = ""
    flops_lower_bound: str = ""  # why the figures are a lower bound (step_flops.StepFlops.lower_bound_note); ""


@dataclass(kw_only=True)
class Diagnosis:
    """Everything `trainperf diagnose` reports: per-rank summaries, cross-rank view, ranked findings."""

    path: str
    ranks: list[RankSummary]
    findings: list[F.Finding]
    cross_rank: dict
    notes: list[str] = field(default_factory=list)
    fix_all_gain_pct: float = 0.0  # all fixes together on the rank where they gain most, % of its window
    fix_order: list = field(default_factory=list)  # on that rank
    modules: list = field(default_factory=list)  # modules.ModuleBreakdown per rank, when asked for (--modules)
    # the event tables (per rank, restricted to --steps) the diagnosis was made from; not in the JSON
    tables: dict = field(default_factory=dict, repr=False)
    # rank -> memory.DeviceMemory where the rank's trace has allocator samples (the HTML's chart); not in the JSON
    memory: dict = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        """The documented JSON object: {path, ranks: [...], findings: [...], cross_rank, notes,
        fix_all_gain_pct, fix_order}, and modules: [rows of every rank] when they were asked for."""
        out = {"path": self.path, "ranks": [_round(asdict(r)) for r in self.ranks],
               "findings": [f.to_json() for f in self.findings], "cross_rank": _round(self.cross_rank),
               "notes": self.notes, "fix_all_gain_pct": round(self.fix_all_gain_pct, 2),
               "fix_order": self.fix_order}
        if self.modules:
            out["modules"] = [row for b in self.modules for row in b.to_json()]
        return out


def _round(x):
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return round(float(x), 3)
    if isinstance(x, np.integer):
        return int(x)
    return x


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """'A:B' -> (A, B) inclusive; 'A' -> (A, A); None -> None."""
    if not text:
        return None
    try:
        a, _, b = text.partition(":")
        lo = int(a) if a else -(1 << 31)
        hi = int(b) if b else (1 << 31) if _ else lo
        return lo, hi
    except ValueError:
        raise TrainperfError(f"--steps {text!r}: expected A:B with step numbers, e.g. 3:5") from None


def _unrecorded_gc_note(run: RunSteps | None) -> str:
    """A note where the trainperf run the traces belong to (unprofiled.run_steps) measured Python's garbage collector
    pausing its profiled steps (monitor: gc_pause_s) for at least rules.GC_MIN_PCT of them, which the traces do not
    record (asked only when no rank's window holds a collection); "" otherwise."""
    from trainperf.diagnose.rules import GC_MIN_PCT

    measured = run_gc_pause_ms(run)
    if measured is None or measured[0] < GC_MIN_PCT / 100 * measured[1]:
        return ""
    pause_ms, step_ms = measured
    return (f"the run's monitor measured Python's garbage collector pausing its profiled steps {pause_ms:.2f} ms a "
            f"step ({100 * pause_ms / step_ms:.1f} % of rank 0's {step_ms:.2f} ms, metrics.jsonl's gc_pause_s), which "
            "the traces do not record: host time with no op in them may be the collector's; profile with "
            "--profile-modules (torch 2.9+) to see its collections (gc_stall)")


def _restrict_steps(t: EventTable, steps: tuple[int, int]) -> EventTable:
    sel = (t.step >= steps[0]) & (t.step <= steps[1])
    if not sel.any():
        present = sorted(set(int(s) for s in np.unique(t.step) if s >= 0))
        raise TrainperfError(f"{t.source}: no events in steps {steps[0]}:{steps[1]}; steps present: {present}")
    return t.take(sel)


def diagnose(path: str | Path, rank: int | None = None, steps: str | None = None, top: int = 10,
             progress: bool = False, modules: str | None = None, unprofiled_step_ms: float | None = None) -> Diagnosis:
    """Diagnose the trace(s) at path (a Kineto file or a folder of ranks); return a Diagnosis.
    modules: "instance" or "type" adds the time per nn.Module of each rank (modules.module_breakdown).
    unprofiled_step_ms: the step time measured without the profiler (ms): each rank's host is calibrated to it
    (unprofiled.host_calibration) and every gain priced on that host; by default, the median step of the trainperf
    run the traces belong to, over its steps outside the profiled ones (unprofiled.run_unprofiled_step_ms)."""
    if unprofiled_step_ms is not None and not unprofiled_step_ms > 0:
        raise TrainperfError(f"unprofiled step time {unprofiled_step_ms!r} ms: expected a positive number")
    run = run_steps(path)  # the trainperf run the traces belong to, if any: its metrics read once
    from_run = run_unprofiled_step_ms(run) if unprofiled_step_ms is None else None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", LoadWarning)
        tables = load_trace(path, ranks=None, progress=progress)
    for w in said:  # any other warning shown as loading showed it
        if not issubclass(w.category, LoadWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    step_range = parse_steps(steps)
    # the files loading did not read (not traces, copies, earlier cycles): notes, in the terminal, JSON and HTML
    notes: list[str] = [str(w.message) for w in said if issubclass(w.category, LoadWarning)]
    notes += [n for n in (ranks_in_file_order_note(tables),) if n]
    tables, clock_notes = with_device_clocks_aligned(tables)  # before anything reads a device time
    notes += clock_notes
    if step_range:
        tables = {r: _restrict_steps(t, step_range) for r, t in tables.items()}
    else:  # several profiling cycles in one trace: one of them (each rank's own, the same where they share a schedule)
        for r, t in tables.items():
            cycle, note = one_profiling_cycle(find_step_markers(t).numbers)
            if cycle and ((t.step >= cycle[0]) & (t.step <= cycle[1])).any():
                tables[r] = _restrict_steps(t, cycle)
                notes += [note] if note not in notes else []
            elif cycle:  # a choice made for the user never refuses a trace: steps that hold nothing are no cycle
                notes.append(f"rank {r}: its ProfilerStep numbers run in stretches, but the steps chosen "
                             f"({cycle[0]}-{cycle[1]}) hold no event (steps without length?): the whole trace is "
                             "analysed")
    windows = {r: analysis_window(t, include_last_step=bool(step_range)) for r, t in tables.items()}
    gpu_ranks = [r for r, t in tables.items() if windows[r].device.size]
    xr = None
    if len(gpu_ranks) >= 2:
        # the matching needs only kernels; compute/busy per rank are filled in from the facts
        xr = cross_rank({r: tables[r] for r in gpu_ranks}, {r: windows[r] for r in gpu_ranks}, {}, {})
        notes += xr.notes
    # one rank's full facts at a time (its replay graph is ~2.5x its event table): what the job's straggler needs of
    # every rank first (DeviceTiming), then each rank's facts, rules and gains, released before the next rank's
    timing = {r: device_timing(tables[r], windows[r]) for r in gpu_ranks}
    hs = host_straggler(tables) if not gpu_ranks and len(tables) >= 2 else None
    # a job without GPU events: each rank's DDP buffer syncs, found once, for the job's floor and the rank's rule
    broadcasts = {r: buffer_broadcasts(t, windows[r]) for r, t in tables.items()} \
        if not gpu_ranks and len(tables) >= 2 else {}
    sync_floor = buffer_sync_floor_us(broadcasts, windows)
    straggler = None
    if hs is not None:
        straggler = StragglerFacts(rank=hs.rank, caused_us=hs.gain_us * hs.steps, caused_per_other_us=hs.gain_us,
                                   imbalance_pct=0.0, events=[], host=hs,
                                   host_work=_host_work_comparison(hs.rank, tables, windows))
    if not gpu_ranks:
        notes.append("no kernel/memcpy/memset events in the trace: GPU analyses (breakdown, idle, overlap, "
                     "launches, critical path) are skipped; host-side analyses only")
    if xr is not None:
        for r in gpu_ranks:
            tb = timing[r].breakdown
            xr.compute_by_rank_us[r] = tb.compute_us
            xr.busy_by_rank_us[r] = tb.busy_us
        straggler = _straggler_facts(xr, timing)
    # some rank opens its steps waiting for a receive: a later pipeline stage (diagnose/pipeline.py)
    later_stages = any(later_stage(timing[r].p2p_role, timing[r].opens_on_receive) for r in gpu_ranks)
    openings = [timing[r].opens_on_receive for r in gpu_ranks if timing[r].p2p_rows.size]
    summaries: dict[int, RankSummary] = {}
    memory: dict = {}
    found: list[F.Finding] = []
    collections_seen = False  # Python GC spans in any rank's window
    plans: dict[int, F.FixPlan] = {}
    job_caveats = cross_rank_caveats(xr.clock_offset_us, xr.clock_spread_us) if xr is not None else []
    untraced = untraced_ranks_caveat(tables)
    # the pipeline's process group as the traces describe it: its size is the stages; else counted from the ranks
    described = [timing[r].p2p_group_size for r in gpu_ranks if timing[r].p2p_role == "pipeline"]
    stages = max(described) if described else stages_from_openings(openings) if untraced is None else 0
    job_caveats += [untraced] if untraced else []
    if hs is not None and not stragglers.testable(hs.unstalled.steps, hs.n_ranks):  # the steps without a stall
        needed = straggler_steps_needed(hs.n_ranks, stragglers.STRAGGLER_HOST_ALPHA)
        without = " without a DataLoader or checkpoint stall" if hs.stalled_steps else ""
        job_caveats.append(Caveat(
            note=f"{hs.unstalled.steps} common profiled steps{without} are too few to test a slow rank against load "
                 f"noise (a rank slower in every step would still have p = {hs.unstalled.min_p_value:.3f} > "
                 f"{stragglers.STRAGGLER_HOST_ALPHA}): a straggler is named from how far its extra work recurs, "
                 f"unconfirmed; profile at least {needed} steps{' without one' if hs.stalled_steps else ''}",
            confidence="low", kinds=frozenset({"straggler"})))
    notes += [c.note for c in job_caveats]
    for r, t in tables.items():
        waits = comm_waits(xr, r) if xr is not None and r in gpu_ranks else None
        f = collect_facts(t, windows[r], waits, timing.get(r))  # the window's own note reaches the notes as a caveat
        if hs is not None or r in gpu_ranks:
            f.straggler = straggler
        f.ddp_buffer_sync_floor_us = sync_floor
        if r in broadcasts:
            f.once(BUFFER_BROADCASTS, lambda: broadcasts.pop(r))
        # a later stage anywhere makes the job a pipeline, unless this rank's send/recv is context parallelism's
        f.pipeline_stage = f.pipeline_stage or (later_stages and (r not in timing or timing[r].p2p_role != "context"))
        f.pipeline_stages = stages
        step_ms = unprofiled_step_ms if unprofiled_step_ms is not None else \
            from_run[0] if from_run is not None and r in gpu_ranks else None
        if step_ms is not None:
            f.unprofiled_step_us = step_ms * 1e3
            calibration = host_calibration(f, f.unprofiled_step_us)
            f.calibrate_host(calibration.changes)
            source = "" if unprofiled_step_ms is not None else \
                f" (the unprofiled step, {step_ms:.2f} ms: the run's median over {from_run[1]} steps outside the profiled ones)"
            notes.append(f"rank {r}: {calibration.note}{source}")
        collections_seen = collections_seen or f.gc.count > 0
        summaries[r], ranked, plans[r] = analyse_rank(f, job_caveats)
        if f.device_memory is not None:
            memory[r] = f.device_memory
        found += ranked
        notes += [f"rank {r}: {n}" for n in summaries[r].evidence_notes]
    if not collections_seen:
        notes += [n for n in (_unrecorded_gc_note(run),) if n]
    merged = F.merge_across_ranks(found)
    if rank is not None:
        if rank not in summaries:
            raise TrainperfError(f"{path}: rank {rank} not found; ranks present: {sorted(summaries)}")
        summaries = {rank: summaries[rank]}
        merged = [f for f in merged if rank in f.ranks]
        plans = {rank: plans[rank]}
    xr_json = {}
    if hs is not None:
        # the keys render.py prints, then the host-side evidence (0 collectives: no GPU kernels to match)
        xr_json = {"n_collectives_matched": 0, "straggler_rank": hs.rank,
                   "straggler_caused_wait_us": hs.gain_us * hs.steps, "compute_imbalance_pct": 0.0,
                   "host_straggler_rank": hs.rank, "host_straggler_gain_pct": hs.gain_pct,
                   "host_own_work_us": hs.own_us, "host_wait_us": hs.wait_us, "host_steps": hs.steps,
                   "host_stalled_steps_left_out": hs.stalled_steps,
                   "host_straggler_p_value": hs.recurrence.p_value,
                   "host_straggler_testable": stragglers.testable(hs.steps, hs.n_ranks),
                   "host_straggler_within_noise": stragglers.extra_work_is_noise(hs.recurrence)}
    if xr is not None:
        st = xr.straggler
        xr_json = {"n_collectives_matched": len(xr.collectives), "wait_by_rank_us": xr.wait_by_rank_us,
                   "caused_by_rank_us": xr.caused_by_rank_us, "straggler_rank": st[0] if st else None,
                   "straggler_caused_wait_us": st[1] if st else 0.0, "compute_imbalance_pct": xr.imbalance_pct,
                   "unmatched": xr.unmatched, "clock_offset_us": xr.clock_offset_us,
                   "clock_spread_us": xr.clock_spread_us}
        if straggler is not None and straggler.last_in_steps:
            xr_json["steps_each_rank_was_waited_for"] = straggler.last_in_steps
            xr_json["straggler_persistent"] = straggler.persistent
            if straggler.slow_ranks:
                xr_json["slow_ranks"] = straggler.slow_ranks
                xr_json["slow_ranks_p_value"] = straggler.slow_ranks_p_value
            if straggler.late_work_share is not None:
                xr_json["lateness_from_extra_compute_pct"] = 100.0 * straggler.late_work_share
                xr_json["late_ranks_paused"] = stragglers.paused_not_loaded(straggler)
            if straggler.late_idle_share is not None:
                xr_json["lateness_from_gpu_idle_pct"] = 100.0 * straggler.late_idle_share
    best = max(plans.values(), key=lambda p: p.fix_all_gain_pct, default=None)
    mods = [module_breakdown(tables[r], by=modules) for r in summaries] if modules else []
    notes += [f"rank {b.rank}: modules: {n}" for b in mods for n in b.notes]
    return Diagnosis(path=str(path), ranks=list(summaries.values()), findings=merged[:top], cross_rank=xr_json,
                     notes=notes,
                     fix_all_gain_pct=best.fix_all_gain_pct if best else 0.0, fix_order=best.order if best else [],
                     modules=mods, tables=tables, memory={r: m for r, m in memory.items() if r in summaries})


def analyse_rank(f: RankFacts, job_caveats: list[Caveat] = ()) -> tuple[RankSummary, list[F.Finding], F.FixPlan]:
    """One rank's summary, its findings ranked by marginal gain (evidence times from its first event,
    confidence lowered by the limits of the evidence, evidence.py), and its order of fixes."""
    ranked, plan = F.rank_by_marginal_gain(run_rules(f), f.gain)
    late = idle_left_by_dismissed(f, ranked, plan.dismissed)
    ranked += [late] if late else []
    own = rank_caveats(f)
    caveats = own + list(job_caveats)
    apply_caveats(ranked, caveats)
    profiled_wait_notes(f, ranked)
    s = _summary(f, plan)
    s.confidence = min((c.confidence for c in caveats), key=("low", "medium", "high").index, default="high")
    s.evidence_notes = [c.note for c in own] + rank_notes(f)
    return s, _relative_times(ranked, f), plan


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b > 0 else 0.0


def _summary(f: RankFacts, plan: F.FixPlan) -> RankSummary:
    """The per-rank figures of the JSON output, read from the rank's facts."""
    t = f.table
    st = f.step_times
    sides = f.profiled_step_sides_us
    periods = gpu_step_periods_us(st)
    lags = [x.gpu_lag_us for x in st if x.gpu_lag_us == x.gpu_lag_us]
    common = dict(n_events=len(t), steps=f.steps,
                  step_time_median_us=float(np.median([x.host_us for x in st])) if st else None,
                  step_times=[{"step": x.step, "host_us": x.host_us, "device_busy_us": x.device_busy_us,
                               "gpu_lag_us": x.gpu_lag_us if x.gpu_lag_us == x.gpu_lag_us else None,
                               "gpu_span_us": x.gpu_end_us - x.gpu_start_us if x.gpu_lag_us == x.gpu_lag_us else None}
                              for x in st],
                  fix_order=plan.order, fix_all_gain_pct=plan.fix_all_gain_pct, dismissed=plan.dismissed,
                  gpu_step_time_median_us=float(np.median(periods)) if periods else None,
                  gpu_lag_median_us=float(np.nanmedian(lags)) if lags else None, loop=f.loop)
    flops = step_flops(f)
    if flops is not None:
        common.update(flops_per_step=flops.flops_per_step, achieved_tflops=flops.achieved_tflops,
                      flops_utilisation_pct=flops.utilisation_pct, flops_covered_pct=flops.covered_pct,
                      flops_precision=flops.precision, flops_lower_bound=flops.lower_bound_note)
    if not f.has_gpu:
        hw = f.host_window_us
        # the loop thread computes nothing while it is in or blocked on a collective: all of it is exposed
        comm = f.host_comm_us or 0.0
        return RankSummary(rank=t.rank, source=t.source, window_us=hw, idle_pct=None, compute_pct=None,
                           non_compute_pct=None, overlap_pct=None, idle_host_pct=None, idle_kernel_pct=None,
                           idle_other_pct=None, comm_us=comm,
                           exposed_comm_us=comm,
                           gpu_analyses="skipped: no kernel, memcpy or memset events in this rank's trace",
                           dataloader_pct=_pct(f.dataloader.time_us, hw), optimizer_pct=_pct(f.optimizer.time_us, hw),
                           allocator_pct=_pct(f.allocator.time_us, hw), **common)
    tb, ov, ls = f.breakdown, f.overlap, f.launch
    hp, kp, op = f.idle.pct()
    mem = f.device_memory
    if mem is not None:
        common.update(memory_peak_allocated_bytes=mem.peak_allocated_bytes,
                      memory_peak_reserved_bytes=mem.peak_reserved_bytes, memory_kept_bytes=mem.floor_allocated_bytes,
                      device_memory_bytes=mem.capacity_bytes)
    span = f.span_us
    return RankSummary(
        rank=t.rank, source=t.source, window_us=tb.window_us, idle_pct=tb.idle_pct, compute_pct=tb.compute_pct,
        non_compute_pct=tb.non_compute_pct, overlap_pct=ov.overlap_pct, idle_host_pct=hp, idle_kernel_pct=kp,
        idle_other_pct=op, comm_us=ov.comm_us, exposed_comm_us=ov.exposed_us,
        kernel_categories_pct={c.category: c.pct_of_busy for c in f.categories},
        launch_delay_median_us=ls.delay_median_us, launch_delay_p95_us=ls.delay_p95_us,
        small_kernel_count_pct=ls.small_kernel_count_pct,
        queue_length_max=max((v[1] for v in f.queue.by_stream.values()), default=0),
        memcpy_gbps={b.direction: b.gbps for b in memcpy_bandwidth(t, f.window)},
        dataloader_pct=_pct(f.dataloader.time_us, span), host_sync_pct=_pct(f.sync_blocking_us, span),
        host_queue_wait_pct=_pct(f.queue_wait_us, span),
        optimizer_pct=_pct(f.optimizer.time_us, span), allocator_pct=_pct(f.allocator.time_us, span),
        critical_path_pct={k: _pct(v, span) for k, v in sorted(f.critical_path.items(), key=lambda kv: -kv[1])},
        step_idle_pct=f.step_idle_pct, steady_step_us=(f.period_us or None) if sides else None,
        steady_step_host_us=sides[0] if sides else None, steady_step_device_us=sides[1] if sides else None,
        host_paced_by_device=f.paced_by_device, **common)


def _relative_times(found: list[F.Finding], f: RankFacts) -> list[F.Finding]:
    """Evidence event starts as µs from the rank's first event (as Perfetto shows the trace)."""
    origin = f.origin_us
    for f in found:
        for e in f.evidence.get("events", []):
            e["start_us"] = round(e["start_us"] - origin, 1)
    return found


def _compute_extra_is_noise(cs: ComputeStraggler) -> bool:
    """Whether the rank computing longest per step does so within the noise between steps: a slow stage is the
    slowest in every step by a margin, while with unequal or noisy work per step the longest-computing rank of a
    window is not (pipeline stages +-1 ms per micro-batch: one rank 1.05x the others' median by chance, ranked
    first). With 3 ranks or more, the within-step permutation test of the ranks' computation
    (crossrank.slowest_rank_p_value: is one rank the slowest, by its excess over each step's mean, more
    consistently than shuffled ranks make one); with 2 ranks, that permutation is the sign flip of their
    difference, which crossrank.straggler_p_value tests with its sizes. With too few steps for the test to pass at
    all (3 steps of 4 stages: >= 1/16; 4 steps of 2: >= 1/8), the slowest rank of every step must be it or a rank
    computing alike with it (ComputeStraggler.group_ratio), the most the test could ask: the recurrence heuristic
    (crossrank.recurring_over_opposite), which the slowest of N noisy ranks passes about N / 2^k of the time, named
    a straggler in 6 of 12 balanced 4-stage pipelines of 3 steps at +-1 ms, and in 4 of 12 balanced 2-stage ones of
    4 steps. A trace without steps (one window) has no steps to judge by: the ratio alone decides, as before."""
    if cs.steps < 2:
        return False
    n_ranks = cs.by_step_us.shape[1]
    if n_ranks >= 3 and slowest_rank_min_p_value(cs.steps, n_ranks) <= stragglers.STRAGGLER_HOST_ALPHA:
        return slowest_rank_p_value(cs.by_step_us) > stragglers.STRAGGLER_HOST_ALPHA
    if n_ranks == 2 and stragglers.testable(cs.steps, n_ranks):
        return straggler_p_value(cs.extra_by_step_us, n_ranks) > stragglers.STRAGGLER_HOST_ALPHA
    slowest = {cs.ranks[i] for i in np.argmax(cs.by_step_us, axis=1)}
    return not slowest <= set(cs.group_ratio or [cs.rank])


def _straggler_facts(xr: CrossRank, facts: dict[int, DeviceTiming]) -> StragglerFacts | None:
    """The job's straggler: the rank the others wait for inside matched collectives when it makes them wait
    >= STRAGGLER_MIN_WAIT_PCT of the window each (or, when no rank is the one waited for in most steps, when the
    ranks wait that much on average: load imbalance, StragglerFacts.persistent false); else (collectives that
    cannot be matched, e.g. point-to-point with partners outside the trace) the rank whose computation per step
    is longest against the other ranks' median (crossrank.compute_straggler; the rule decides whether the ratio
    is large enough)."""
    st = xr.straggler
    window = max(f.breakdown.window_us for f in facts.values() if f.has_gpu)
    others = max(len(xr.wait_by_rank_us) - 1, 1)
    floor = stragglers.STRAGGLER_MIN_WAIT_PCT / 100 * window
    def step_of(c: MatchedCollective):
        return _collective_step(c, facts)

    last = laggards(xr.collectives, step_of)
    last_in_steps = {r: sum(1 for x, _ in last.values() if x == r) for r in sorted({x for x, _ in last.values()})}
    # a straggler keeps the others waiting step after step: it must be the rank they waited for most in more of the
    # steps with waits than ranks taking turns at random would make it (crossrank.persistent_laggard, at the host
    # straggler's alpha). When that rank changes from step to step, no rank is slow: the ranks get unequal work per
    # step (lengths, routing), and stragglers.load_imbalance names that instead. Its bar is the ranks' mean wait, not
    # one rank's caused wait: with N ranks taking turns, each causes ~1/N of it
    persistent = st is not None and persistent_laggard(last_in_steps.get(st[0], 0), len(last),
                                                       len(xr.wait_by_rank_us), stragglers.STRAGGLER_HOST_ALPHA)
    # a group of ranks late step after step, each the last in some steps (a slow node): not one rank taking turns
    # with the others (load imbalance), nor one straggler (the laggard test can pass for one of 64 ranks last in 3 of
    # 7 steps when 4 are slow); a group of one is the straggler that rank is
    group, group_p = (([], 1.0) if st is None else
                      slow_ranks(lateness_by_step(xr.collectives, step_of), last, stragglers.STRAGGLER_HOST_ALPHA))
    if group == [st[0]] and persistent:
        group = []
    persistent = persistent and not group
    # the laggards' extra work per step; without steps (collectives keyed (kind, seq)), per collective: the work
    # each rank did since its previous one
    stepped = any(isinstance(k, int) for k in last)
    per_step = {r: (f.compute_by_step if stepped else compute_before_collectives(f.table, f.window, xr.collectives, r))
                for r, f in facts.items() if f.has_gpu}
    work_share = lateness_share(last, per_step, len(xr.wait_by_rank_us))
    # and how much the GPU's extra idle (waiting for its host) does, per step (without steps: not measured)
    idle_share = lateness_share(last, {r: f.idle_by_step for r, f in facts.items() if f.has_gpu},
                                len(xr.wait_by_rank_us)) if stepped else None
    # and how much each named host stall of their own does (a DataLoader fetch, a save, a compile, a garbage
    # collection), where some rank's trace has its spans (a rank without any stalled none: 0 in each step)
    causes = sorted({c for f in facts.values() for c in f.stalls_by_step}) if stepped else []
    stall_shares = {c: lateness_share(last, {r: f.stalls_by_step.get(c) or {x.step: 0.0 for x in f.step_times}
                                             for r, f in facts.items() if f.has_gpu}, len(xr.wait_by_rank_us))
                    for c in causes}
    mean_wait = sum(xr.wait_by_rank_us.values()) / max(len(xr.wait_by_rank_us), 1)
    straggling = st is not None and st[1] >= floor * others
    matched_waits = straggling or (not persistent and mean_wait >= floor)
    # what the matched collectives' waits say (who was last in each step and what explains their lateness): on the
    # matched straggler's facts, and beside a compute straggler whose waits are load_imbalance's
    waits_seen = {"last_in_steps": last_in_steps, "laggard_waits": list(last.values()),
                  "late_work_share": work_share, "late_idle_share": idle_share,
                  "late_stall_shares": {c: v for c, v in stall_shares.items() if v is not None},
                  "routing": routing_evidence(last, {r: f.received_by_step for r, f in facts.items() if f.has_gpu},
                                              per_step) if stepped else None,
                  # ranks taking turns: what each step's late rank had more of (a persistent straggler's is `work`)
                  "late_work": _late_work(last, facts) if stepped and not persistent and not group else None,
                  } if matched_waits else {}
    # the rank computing longest per step, where matched collectives cannot show it: there are none with waits, or
    # (pipeline stages) the slow stage's copies wait for each other in none of them, equally slow, while the other
    # stages wait for it in send/recv; beside matched waits that name no one rank (the copies' jitter:
    # load_imbalance's), the slow stage is a straggler of its own
    cs = None
    # ... and where the late rank of a job with send/recv (a pipeline) did no more work and paused no longer: late by
    # its place in the schedule (stragglers.schedule_drain), not the slow stage, which computes longest
    drain = persistent and stragglers.late_by_queued_work(work_share, idle_share)
    if not matched_waits or (xr.point_to_point and (not persistent or drain)):
        cs = compute_straggler({r: f.compute_by_step for r, f in facts.items() if f.has_gpu})
        # under the ratio's bar it is no straggler whatever the noise (stragglers.straggler says so too): the test,
        # whose draws cost ~1 s on 64 ranks x 20 steps, is run only for a candidate
        if cs is not None and (cs.ratio < stragglers.STRAGGLER_MIN_COMPUTE_RATIO or _compute_extra_is_noise(cs)):
            cs = None
    if cs is not None:
        return StragglerFacts(rank=cs.rank, caused_us=0.0, caused_per_other_us=0.0, imbalance_pct=xr.imbalance_pct,
                              events=[], compute_ratio=cs.ratio, extra_compute_us=cs.extra_us,
                              compute_group_ratio=cs.group_ratio, persistent=not matched_waits,
                              work=_work_comparison(sorted(cs.group_ratio) or [cs.rank], facts), **waits_seen)
    if not matched_waits:
        return None
    srank, caused = st
    worst = sorted((c for c in xr.collectives if c.last_rank == srank), key=lambda c: -sum(c.wait_us.values()))[:3]
    w = facts[srank].window
    origin = float(w.ts_us.min())
    events = [(f"{c.kind} #{c.seq} (rank {srank} arrived last)", float(w.ts_us[c.rows[srank]]) - origin,
               sum(c.wait_us.values())) for c in worst]
    rest = [v for r, v in xr.compute_by_rank_us.items() if r != srank]
    mine = xr.compute_by_rank_us.get(srank, 0.0)
    ratio = mine / float(np.median(rest)) if rest and np.median(rest) > 0 else 1.0
    # its computation beyond the other ranks' median is evidence too (as in the unmatched case): a rank that
    # arrives last at one collective a step causes one wait, however much longer it computed before it
    extra = max(mine - float(np.median(rest)), 0.0) if rest else 0.0
    slow = group or ([srank] if persistent else [])  # ranks taking turns: no rank is slow to compare
    # late with no more device work: the host was late, what does it do more of (one rank step after step, or each
    # step's late rank in that step)
    host_work = None
    if not group and work_share is not None and work_share < stragglers.LATE_WORK_MIN_SHARE and (persistent or stepped):
        tables, windows = {r: f.table for r, f in facts.items()}, {r: f.window for r, f in facts.items()}
        host_work = (_host_work_comparison(srank, tables, windows) if persistent else
                     _late_comparison(last, sorted(tables), lambda r: host_step_work(tables[r], windows[r]),
                                      waits_untraced=True))
    return StragglerFacts(rank=srank, caused_us=caused, caused_per_other_us=caused / others,
                          imbalance_pct=xr.imbalance_pct, events=events, compute_ratio=max(ratio, 1.0),
                          extra_compute_us=extra, persistent=persistent, slow_ranks=group, slow_ranks_p_value=group_p,
                          work=_work_comparison(slow, facts) if slow else None,
                          host_work=host_work, **waits_seen)


# the other ranks a slow rank is compared with, operation by operation: at most this many, evenly spaced over them
# (keying a rank's kernels by their operators' shapes costs ~0.1 s a rank of 20k kernels; the median of 8 ranks is
# the typical rank as well as that of 63). Stated, not fitted
WORK_REFERENCE_RANKS = 8


def _reference_ranks(ranks: list[int]) -> list[int]:
    """At most WORK_REFERENCE_RANKS of `ranks`, evenly spaced over them."""
    if len(ranks) <= WORK_REFERENCE_RANKS:
        return ranks
    return [ranks[int(i)] for i in np.unique(np.linspace(0, len(ranks) - 1, WORK_REFERENCE_RANKS).round())]


def _work_comparison(slow: list[int], facts: dict[int, DeviceTiming]) -> WorkComparison | None:
    """The slow ranks' computation against the other GPU ranks' (_reference_ranks of them), operation by operation
    (slow_work.compare_work); None where it is no more than theirs."""
    others = _reference_ranks([r for r, f in facts.items() if f.has_gpu and r not in slow])
    cmp = compare_work([_rank_work(facts[r]) for r in slow if r in facts and facts[r].has_gpu],
                       [_rank_work(facts[r]) for r in others])
    return cmp if cmp is not None and cmp.extra_us > 0 else None


def _host_work_comparison(rank: int, tables: dict[int, EventTable], windows: dict) -> WorkComparison | None:
    """The training thread of `rank` against the other ranks' (_reference_ranks of them), operator by operator
    (slow_work.host_work); None without steps on either side."""
    mine = host_work(tables[rank], windows[rank])
    others = [w for w in (host_work(tables[r], windows[r]) for r in _reference_ranks([r for r in tables if r != rank]))
              if w is not None]
    return compare_work([mine], others, waits_untraced=True) if mine is not None else None


def _late_comparison(last: dict, ranks: list[int], step_work_of, waits_untraced: bool = False) -> WorkComparison | None:
    """Each step's late rank (last: step -> (rank, wait it caused), crossrank.laggards) against the other ranks
    (_reference_ranks of `ranks`, the late one left out) in that step, their work a step as step_work_of(rank) gives
    it (step -> RankWork: slow_work.step_work, host_step_work), operation by operation, a late step on average
    (slow_work.merge_comparisons; waits_untraced: training threads, as compare_work says); None without any step to
    compare."""
    sample = _reference_ranks(ranks)
    work = {r: step_work_of(r) for r in sorted(set(sample) | {rank for rank, _ in last.values()}) if r in ranks}
    parts = [compare_work([work[rank][step]], [work[r][step] for r in sample if r != rank and step in work[r]],
                          waits_untraced=waits_untraced)
             for step, (rank, _) in last.items() if step in work.get(rank, {})]
    return merge_comparisons([c for c in parts if c is not None])


def _late_work(last: dict, facts: dict[int, DeviceTiming]) -> WorkComparison | None:
    """The late ranks' computation kernels in the steps they were late (_late_comparison over the GPU ranks); None
    where they computed no more."""
    merged = _late_comparison(last, [r for r, f in facts.items() if f.has_gpu],
                              lambda r: step_work(facts[r].table, facts[r].window))
    return merged if merged is not None and merged.extra_us > 0 else None


def _rank_work(f: DeviceTiming):
    """slow_work.rank_work of a rank's window, over the steps that launched computation."""
    return rank_work(f.table, f.window, len(f.compute_by_step))


def _collective_step(c: MatchedCollective, facts: dict[int, DeviceTiming]):
    """The ProfilerStep a matched collective belongs to (its launch's, on the first rank that has it); a collective
    of a trace without steps is a step of its own."""
    r = min(c.rows)
    step = int(facts[r].table.step[c.rows[r]])
    return step if step >= 0 else (c.kind, c.seq)
