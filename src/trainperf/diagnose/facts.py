"""Every single-rank analysis, run once, in one object the finding rules read (`collect_facts`).

The rules (rules.py) never compute an analysis themselves: they read a RankFacts and ask it for
the what-if gain of a set of changes (replayed once per distinct set and cached).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from trainperf.diagnose.autograd_links import backward_node_mask
from trainperf.diagnose.collectives import (BARRIER_RE, TransferRate, comm_args, scalar_collective_rows,
                                          transfer_rate)
from trainperf.diagnose.crossrank import (P2P_KIND, HostStraggler, collective_rows, compute_per_step, group_kind,
                                         host_step_waits)
from trainperf.diagnose.gpu_time import (CategoryTime, IdleSplit, Overlap, TemporalBreakdown, comm_comp_overlap,
                                         idle_in_span_us, idle_split, kernel_breakdown, temporal_breakdown)
from trainperf.diagnose.host import (HostSpans, allocator_calls, checkpoint_spans, compile_spans, compiled_frames,
                                     dataloader_spans, gc_spans, host_syncs, optimizer_spans, span_rows,
                                     sync_op_counts, sync_ops)
from trainperf.diagnose.launch import (LaunchBoundStretch, LaunchStats, QueueLength, launch_bound_stretches,
                                       launch_stats, launched_inside, launched_rows, queue_length)
from trainperf.diagnose.memory import DeviceMemory, device_memory
from trainperf.diagnose.pipeline import (ScheduleNames, later_stage, opening_receives, opens_on_receive_share,
                                         p2p_group_role, schedule_names)
from trainperf.diagnose.period import (paced_by_device, period_of_sides_us, steady_period_us, step_nodes,
                                       step_sides_us)
from trainperf.diagnose.process_groups import row_roles
from trainperf.diagnose.replay import (BLOCK_QUEUE, BLOCK_SYNC, Change, Graph, Replay, blocked_us, build_graph,
                                      critical_path, replay)
from trainperf.diagnose.roofline import device_accelerator
from trainperf.diagnose.routing import RoutingEvidence, SplitSkew, received_by_step, send_split_skew
from trainperf.diagnose.slow_work import WorkComparison
from trainperf.diagnose.steps import StepTime, step_times
from trainperf.diagnose.sync_causes import SyncCauses, sync_causes
from trainperf.diagnose.window import Window, covered_length, merge_intervals
from trainperf.trace.events import CPU_OP, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import enclosing_span, row_spans, thread_key


@dataclass(kw_only=True)
class StragglerFacts:
    """The cross-rank straggler, decided once for the job (crossrank.py): who, and the wait it caused."""

    rank: int
    caused_us: float
    caused_per_other_us: float
    imbalance_pct: float
    events: list  # (name, start µs from the straggler's first event, dur µs)
    compute_ratio: float = 1.0  # the straggler's compute time / the median of the other ranks' (>= 1)
    host: HostStraggler | None = None  # CPU-only job: the straggler of the ranks' host steps (crossrank.host_straggler)
    extra_compute_us: float = 0.0  # the straggler's compute beyond the other ranks' median, summed over steps
    # ranks whose collectives cannot be matched (crossrank.compute_straggler): the straggler and the ranks computing
    # alike with it (a slow pipeline stage's data- or tensor-parallel copies), each with its compute ratio
    compute_group_ratio: dict = field(default_factory=dict)
    # matched collectives: how many steps each rank was the one the others waited for most (crossrank.laggards);
    # persistent: the straggler was it in most of them (else the waits are load imbalance: stragglers.load_imbalance)
    last_in_steps: dict = field(default_factory=dict)
    persistent: bool = True
    # ... per step with waits, that step's laggard and the waiting it caused (µs, summed over the waiting ranks)
    laggard_waits: list = field(default_factory=list)
    # the group of ranks late step after step, each the last in some steps (a slow node: crossrank.slow_ranks; then
    # persistent is false, whichever rank the laggard count found), and that test's p-value; [] when none
    slow_ranks: list = field(default_factory=list)
    slow_ranks_p_value: float = 1.0
    # how much of the late ranks' lateness their extra computation in those steps accounts for, and how much their
    # GPU's extra idle (waiting for its host) does (0-1 each, crossrank.lateness_share); None where not comparable
    late_work_share: float | None = None
    late_idle_share: float | None = None
    # ... and how much each named host stall of their own in those steps does ({cause: 0-1}: DeviceTiming.
    # stalls_by_step's causes that some rank's trace has; none where no rank's has any)
    late_stall_shares: dict = field(default_factory=dict)
    # ... and what each rank received in its all-to-alls, step by step, with its computation (routing.RoutingEvidence:
    # the tokens routed to its experts, and how much of a late or slow rank's extra computation those account for);
    # None where no all-to-all records its size
    routing: RoutingEvidence | None = None
    # the slow ranks' extra computation operation by operation against the others' (slow_work.compare_work): the same
    # work slower (their device) or more work; None where no rank is slow step after step, or no computation differs
    work: WorkComparison | None = None
    # ... and for ranks taking turns, each step's late rank against the other ranks in that step, a late step on
    # average (slow_work.merge_comparisons): which work the late ones had more of; None where no rank took turns
    late_work: WorkComparison | None = None
    # the straggler's training thread against the other ranks' (slow_work.host_work), where it was late without more
    # device work (or the job has no GPU): what its host does more of; for ranks late in turn, each step's late rank
    # against the others in that step, a late step on average; None otherwise
    host_work: WorkComparison | None = None


@dataclass(kw_only=True)
class SyncSite:
    """The blocking host syncs made from one call site, and what they cost (µs)."""

    site: str
    count: int
    blocking_us: float       # CPU time blocked in them (beyond the call's own cost)
    gpu_idle_after_us: float  # the device idled from each sync's end until its next work started
    gain_us: float           # replayed gain of removing only these syncs
    gain_pct: float
    site_id: int = -1        # index into Graph.site_names


MEMORY_BOUND_ROOFLINE_KINDS = ("elementwise", "norm")  # roofline.OpCost kinds of the memory-bound operators
SYNC_SITES_PRICED = 5  # call sites priced one by one (by blocking time), one replay each


@dataclass(kw_only=True)
class RankFacts:
    """One rank's analyses (times µs). GPU fields are None when the rank has no device events."""

    table: EventTable
    window: Window
    steps: list[int]
    step_times: list[StepTime]
    host_window_us: float         # host span of the window's ProfilerSteps, first start to last end (µs)
    host_window_start_us: float = 0.0  # where that span starts (µs; the kept events' first start without steps)
    dataloader: HostSpans
    optimizer: HostSpans
    checkpoint: HostSpans
    sync_calls: HostSpans
    sync_ops: HostSpans
    allocator: HostSpans
    compile: HostSpans                # torch.compile's compile phases (host.COMPILE_RE)
    gc: HostSpans                     # Python's garbage collections ("Python GC" spans: host.GC_RE)
    compile_steps: list = field(default_factory=list)  # the analysed steps with a compile span in them
    checkpoint_steps: list = field(default_factory=list)  # the analysed steps with a checkpoint span in them
    gc_steps: list = field(default_factory=list)  # the analysed steps that pay the collector (_costly_gc_steps)
    recompiles: int = 0               # compiled regions the steps ran with a compile id above 0 (host.compiled_frames)
    waits: dict | None = None
    straggler: StragglerFacts | None = None
    # a job without GPU events, of several ranks: per DDP forward (in order), the shortest of the ranks' buffer syncs
    # (µs, ddp.buffer_sync_floor_us): the sync's own cost, without a rank's wait for a later one inside it
    ddp_buffer_sync_floor_us: np.ndarray | None = None
    breakdown: TemporalBreakdown | None = None
    overlap: Overlap | None = None
    idle: IdleSplit | None = None
    categories: list[CategoryTime] = field(default_factory=list)
    launch: LaunchStats | None = None
    queue: QueueLength | None = None
    stretches: list[LaunchBoundStretch] = field(default_factory=list)
    graph: Graph | None = None
    span_us: float = 0.0          # replayed makespan of the window (= observed)
    # per analysed step, its host nodes and the device nodes it launched (period.step_nodes); None: gains are shares
    # of the window's makespan instead of its steady-state step period
    period_nodes: list | None = None
    period_us: float = 0.0        # steady-state step period of the replayed window (period.steady_period_us), µs
    paced_by_device: bool = False  # the host ran ahead of a busy device all window (period.paced_by_device)
    step_sides_us: tuple = ()      # (host, device) mean step of the replayed window (period.step_sides_us), µs
    critical_path: dict = field(default_factory=dict)
    step_idle_us: float | None = None  # GPU idle over the host window (host_window_start_us + host_window_us), µs
    # the profiler's overhead taken off the host (diagnose/unprofiled.py): prepended to every what-if; span_us and
    # period_us are then the replay's with it alone
    host_calibration: tuple = ()
    unprofiled_step_us: float | None = None  # the step time measured without the profiler, when one is given (µs)
    sync_sites: list[SyncSite] = field(default_factory=list)
    sync_op_counts: dict = field(default_factory=dict)  # op name -> (count, CPU µs): aten::item, nonzero, ...
    sync_causes: SyncCauses = field(default_factory=SyncCauses)  # the blocking syncs by what made them
    compute_by_step: dict = field(default_factory=dict)  # step -> µs of computation it launched (crossrank)
    # collective type ("all_reduce", "all_to_all", "send_recv", ...) -> its share of communication kernel time
    comm_share_by_collective: dict = field(default_factory=dict)
    # share (0-1) of communication kernel time in all-reduces launched outside the backward pass (forward_all_reduce)
    forward_all_reduce_share: float = 0.0
    # share (0-1) of communication kernel time in collectives of a handful of values: barriers, a loss or metric
    # averaged, a gradient norm (collectives.scalar_collective_rows)
    scalar_comm_share: float = 0.0
    # how fast the collectives moved their data against the links (collectives.transfer_rate); None without sizes
    transfer: TransferRate | None = None
    # what the loop does (loop_kind): "training" (a backward pass or an optimizer step), "inference" (ATen ops and
    # neither), "unknown" (no ATen op recorded to tell)
    loop: str = "unknown"
    # without device events (gloo, CPU only): the training-loop thread's communication over the analysed steps
    # (crossrank.host_step_waits: inside collective calls, or blocked on a collective), µs; None with GPU or no steps
    host_comm_us: float | None = None
    # a pipeline stage (diagnose/pipeline.py): its send/recv's process group is described as the pipeline's, its
    # schedule names itself, or some rank of the job opens its steps waiting for a receive
    # (DeviceTiming.opens_on_receive, set by api), and its process group is not described as context parallelism's;
    # schedule: what its annotations say
    pipeline_stage: bool = False
    schedule: ScheduleNames = field(default_factory=lambda: ScheduleNames(named=False))
    pipeline_stages: int = 0  # the job's stages (the described group's size, or stages_from_openings; api); 0: unknown
    p2p_rows: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))  # send/recv kernel rows
    p2p_overlap: Overlap | None = None  # the send/recv kernels' time and the part computation hides (gpu_time)
    p2p_role: str = ""  # their process group as the trace describes it (DeviceTiming.p2p_role)
    p2p_transfer: TransferRate | None = None  # their own transfer rate (collectives.transfer_rate), when sized
    # the collective kernels' message sizes by correlation id (collectives.comm_args), read where the window has any
    comm_sizes: dict = field(default_factory=dict)
    # where its all-to-all data goes (routing.send_split_skew: "In split size" summed per rank of the group)
    all_to_all_split: SplitSkew | None = None
    # the other collectives' kernel rows and overlap: what exposed_comm prices beside a pipeline's bubble
    other_comm_rows: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    other_comm_overlap: Overlap | None = None
    _gains: dict = field(default_factory=dict, repr=False)
    _analyses: dict = field(default_factory=dict, repr=False)

    @property
    def rank(self) -> int:
        return self.table.rank

    @property
    def origin_us(self) -> float:
        """The rank's first event (µs): evidence times are reported from it."""
        return float(self.window.ts_us.min()) if self.window.ts_us.size else 0.0

    @property
    def has_gpu(self) -> bool:
        return self.graph is not None

    def pct(self, us: float) -> float:
        """µs as % of the replayed span (of the host window without GPU)."""
        whole = self.span_us if self.has_gpu else self.host_window_us
        return 100.0 * us / whole if whole > 0 else 0.0

    @property
    def profiled_step_sides_us(self) -> tuple:
        """step_sides_us where the window has profiler steps, () without: a step-less window priced as one step
        (period.step_nodes) has no per-step figure to report (µs)."""
        return self.step_sides_us if self.step_times else ()

    @property
    def host_step_excess_us(self) -> float:
        """µs a step by which the host's steps outlast the device's where the host sets the steady pace (period.py:
        not paced by the device): what the GPU idles each step in a long run, although work queued before the window
        may keep it busy through the profiled steps (an H200 loop whose host ran 28 ms ahead took 23.9-ms host steps
        against 22.4 ms of GPU work and the GPU never idled in the window). 0 otherwise."""
        if not self.step_sides_us or self.paced_by_device or not self.period_nodes:
            return 0.0
        host_us, device_us = self.step_sides_us
        return max(host_us - device_us, 0.0)

    @property
    def host_excess_us(self) -> float:
        """host_step_excess_us over the analysed steps (µs)."""
        return self.host_step_excess_us * len(self.period_nodes or ())

    @property
    def p2p_comm_share(self) -> float:
        """Share (0-1) of communication kernel time in point-to-point (send/recv) kernels."""
        return self.comm_share_by_collective.get(P2P_KIND, 0.0)

    @property
    def step_idle_pct(self) -> float | None:
        """GPU idle over the analysed steps' host window, % of it (the whole trace without steps); None without
        GPU. HTA's idle (breakdown.idle_pct) is over the device span only: one short kernel in a long step reads
        0 % there and ~100 % here."""
        if self.step_idle_us is None or self.host_window_us <= 0:
            return None
        return 100.0 * self.step_idle_us / self.host_window_us

    @property
    def sync_blocking_us(self) -> float:
        """Host time blocked in syncs beyond the calls' own cost (µs): synchronize calls and copies that returned
        only when the device caught up (the replay graph's BLOCK_SYNC nodes); 0 without GPU. The one number of
        host_sync's evidence and of the summary's host_sync_pct."""
        return blocked_us(self.graph, BLOCK_SYNC) if self.graph is not None else 0.0

    @property
    def queue_wait_us(self) -> float:
        """Host time blocked in calls that waited for a slot in the full launch queue, beyond their own cost (µs;
        replay.queue_waits): the host ran ahead of a busy device. 0 without GPU. The summary's host_queue_wait_pct."""
        return blocked_us(self.graph, BLOCK_QUEUE) if self.graph is not None else 0.0

    def category_share(self, name: str) -> float:
        """% of device busy time in one kernel category."""
        return next((c.pct_of_busy for c in self.categories if c.category == name), 0.0)

    def memory_bound_hbm_pct(self) -> float | None:
        """Achieved bandwidth of the elementwise and norm/reduction operators as % of the device's HBM peak
        (roofline.rank_roofline: bytes from the recorded shapes over their kernels' time), time-weighted;
        None when the trace records no shapes or no known device. Computed on first use (from the shapes the
        loaded table keeps), then cached."""
        if "hbm_pct" not in self._gains:
            from trainperf.diagnose.roofline import rank_roofline

            kinds = [v for k, v in rank_roofline(self.table).by_kind.items()
                     if k in MEMORY_BOUND_ROOFLINE_KINDS and v.get("hbm_pct") is not None and v["time_us"] > 0]
            time = sum(v["time_us"] for v in kinds)
            self._gains["hbm_pct"] = sum(v["hbm_pct"] * v["time_us"] for v in kinds) / time if time > 0 else None
        return self._gains["hbm_pct"]

    @property
    def device_memory(self) -> DeviceMemory | None:
        """The rank's device memory over the window as the allocator's samples record it (memory.device_memory);
        None where the trace has none (profiled without profile_memory=True). Once per rank."""
        return self.once("device_memory", lambda: device_memory(self.table, self.window))

    def launching_op(self) -> np.ndarray:
        """roofline.launching_op of the rank's table (per row: the operator that launched it, or -1), once per rank:
        the GEMM and fusion findings and the step's FLOPs read it."""
        from trainperf.diagnose.roofline import launching_op

        return self.once("launching_op", lambda: launching_op(self.table))

    def once(self, name: str, compute):
        """The rank's analysis `name`: compute() on first use, kept after. For the analyses a rule module does
        itself (diagnose/attention.py, recompute.py, grad_sync.py; they import RankFacts, so collect_facts cannot
        call them): done once per rank, as collect_facts does the others, however often the rules re-run
        (cv_diagnose re-runs them per threshold value)."""
        if name not in self._analyses:
            self._analyses[name] = compute()
        return self._analyses[name]

    def calibrate_host(self, changes: tuple[Change, ...]) -> None:
        """Price every what-if on top of `changes` (unprofiled.HostCalibration.changes; nothing when empty): span_us
        and period_us become the replay's with them alone."""
        if changes:
            self.host_calibration = tuple(changes)
            self._set_base(replay(self.graph, self.host_calibration))

    def _set_base(self, base: Replay) -> None:
        """The window's makespan and step period (µs) every gain is measured from: replay `base`'s."""
        self.span_us = base.makespan_us
        if self.period_nodes:
            self.step_sides_us = step_sides_us(base, self.period_nodes)
            self.paced_by_device = paced_by_device(self.graph, base, self.period_nodes, self.step_sides_us)
            self.period_us = period_of_sides_us(self.step_sides_us, self.paced_by_device)

    def gain(self, changes: tuple[Change, ...]) -> tuple[float, float]:
        """(% of the step, µs over the window's steps) saved by replaying the window with these changes together (on
        the calibrated host, host_calibration, when there is one): of the steady-state step period (period.py)
        where the steps' device work is known, of the window's makespan otherwise."""
        if not self.has_gpu or not changes:
            return 0.0, 0.0
        key = tuple(sorted(self.host_calibration + tuple(changes), key=repr))
        if key not in self._gains:
            r = replay(self.graph, key)
            if self.period_us > 0:
                d = self.period_us - steady_period_us(r, self.period_nodes, self.paced_by_device)
                self._gains[key] = (100.0 * d / self.period_us, d * len(self.period_nodes))
            else:
                d = self.span_us - r.makespan_us
                self._gains[key] = (self.pct(d), d)
        return self._gains[key]


@dataclass(kw_only=True, frozen=True)
class DeviceTiming:
    """What the job's straggler needs of each rank before any rank's rules run (api._straggler_facts): the window's
    idle / compute split and the computation each step launched. Light beside RankFacts (no replay graph), so a job
    of many ranks holds these for every rank and the full facts of one rank at a time."""

    table: EventTable
    window: Window
    breakdown: TemporalBreakdown
    compute_by_step: dict  # step -> µs of computation it launched (crossrank.compute_per_step)
    step_times: list       # steps.step_times of the window (every ProfilerStep of the rank)
    # share (0-1) of its steps the rank opens waiting for a receive (pipeline.opens_on_receive_share): a later
    # pipeline stage's, which makes the job a pipeline for every rank's rules; and those receives, as trace rows
    opens_on_receive: float = 0.0
    opening_rows: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    # its communication kernel rows by "<process group>/<collective>" (crossrank.collective_rows), and the send/recv's
    collective_groups: dict = field(default_factory=dict)
    p2p_rows: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    # the process group of its send/recv as the trace describes it (pipeline.p2p_group_role): "pipeline",
    # "context" (ring attention's: no pipeline, whatever the steps open on) or "", and its size
    p2p_role: str = ""
    p2p_group_size: int = 0
    # the named host stalls' spans in the window, by cause (STALL_CAUSES: a DataLoader fetch, a checkpoint save, a
    # compile, a garbage collection), found once for the job's straggler and the rank's own facts
    stall_spans: dict = field(default_factory=dict)

    @cached_property
    def stalls_by_step(self) -> dict:
        """{cause: {step: µs inside the step's host span}} for the causes whose spans the rank's trace has."""
        return {cause: _time_in_steps(self.step_times, spans) for cause, spans in self.stall_spans.items()
                if spans.count}

    @cached_property
    def comm_sizes(self) -> dict:
        """Its collective kernels' message sizes by correlation id (collectives.comm_args), read once for the job's
        straggler and the rank's own facts."""
        return comm_args(self.table)

    @cached_property
    def received_by_step(self) -> dict:
        """step -> bytes its all-to-all collectives received in it (routing.received_by_step: the tokens routed to its
        experts); empty where none records its size."""
        return received_by_step(self.table, self.collective_groups, self.comm_sizes)

    @property
    def idle_by_step(self) -> dict:
        """step -> µs the GPU idled from the step's host start to the end of its device work (StepTime.gpu_idle_us)."""
        return {x.step: x.gpu_idle_us for x in self.step_times if np.isfinite(x.gpu_idle_us)}

    @property
    def has_gpu(self) -> bool:
        """Whether the rank has device events in its window."""
        return bool(self.window.device.size)


def device_timing(t: EventTable, w: Window) -> DeviceTiming:
    """The rank's DeviceTiming (µs)."""
    groups = collective_rows(t, w)
    p2p = _rows_of(groups, lambda kind: kind == P2P_KIND)
    role, size = p2p_group_role(t, p2p)
    st = step_times(t, w)
    opening, with_p2p = opening_receives(t, w, p2p)
    return DeviceTiming(table=t, window=w, breakdown=temporal_breakdown(t, w), compute_by_step=compute_per_step(t, w),
                        step_times=st, opens_on_receive=opens_on_receive_share(opening, with_p2p), opening_rows=opening,
                        collective_groups=groups, p2p_rows=p2p, p2p_role=role, p2p_group_size=size,
                        stall_spans=stall_spans(t, w))


def _base_ends(g: Graph, base: Replay, rows: np.ndarray) -> np.ndarray:
    """Per node, the base replay's end of the nodes of trace rows `rows`, -inf for the others (µs): a
    Graph.arrival_floor."""
    floor = np.full(g.rows.size, -np.inf)
    at = np.flatnonzero(~g.is_host & np.isin(g.rows, rows))
    floor[at] = base.end[at]
    return floor


def _rows_of(groups: dict[str, np.ndarray], kinds) -> np.ndarray:
    """The sorted kernel rows of the collective groups whose collective `kinds` accepts (a predicate on it)."""
    rows = [r for k, r in groups.items() if kinds(group_kind(k))]
    return np.sort(np.concatenate(rows)) if rows else np.array([], dtype=np.int64)


# the named host stalls a late rank's lateness is measured against (crossrank.lateness_share, per step), by cause
STALL_CAUSES = {"dataloader": dataloader_spans, "checkpoint": checkpoint_spans, "compile": compile_spans,
                "gc": gc_spans}


def _time_in_steps(step_times: list, spans: HostSpans) -> dict:
    """{step: µs the spans cover inside the step's host span} over step_times (nested spans counted once)."""
    return {x.step: covered_length(np.clip(spans.starts_us, x.start_us, x.start_us + x.host_us),
                                   np.clip(spans.ends_us, x.start_us, x.start_us + x.host_us)) for x in step_times}


def stall_spans(t: EventTable, w: Window) -> dict[str, HostSpans]:
    """{cause: its spans in the window} for every cause of STALL_CAUSES (µs)."""
    return {cause: spans_of(t, w) for cause, spans_of in STALL_CAUSES.items()}


# a step pays the garbage collector when its collections take at least this share of their mean per analysed step:
# the steps of the full collections, where the young generation's short ones run in every step (a real CPU loop: two
# of 148-153 ms among 0.2-1 ms ones, in 9 steps). Half: the midpoint; stated, not fitted (no labeled case)
GC_COSTLY_STEP_SHARE = 0.5


def _costly_gc_steps(step_times: list, spans: HostSpans) -> list[int]:
    """The analysed steps (of step_times) that pay the collector (GC_COSTLY_STEP_SHARE): the steps the rate of its
    cost is read from (gc_stall's steps_with)."""
    per = _time_in_steps(step_times, spans)
    mean = sum(per.values()) / max(len(per), 1)
    return [s for s, us in per.items() if us > 0 and us >= GC_COSTLY_STEP_SHARE * mean]


def _steps_holding(step_times: list, spans: HostSpans) -> list[int]:
    """The steps (of step_times, each a host step's start and length) in which one of the spans starts."""
    return [x.step for x in step_times
            if ((spans.starts_us >= x.start_us) & (spans.starts_us < x.start_us + x.host_us)).any()]


def collect_facts(t: EventTable, w: Window, waits: dict | None = None, timing: DeviceTiming | None = None) -> RankFacts:
    """Run every analysis of one rank once. waits: crossrank.comm_waits of this rank, or None; timing: its
    device_timing when already computed (not computed again)."""
    steps = w.steps  # the window's steps (window.find_step_markers), the one step finder
    st = [s for s in (timing.step_times if timing is not None else step_times(t, w)) if s.step in steps]
    # the analysed ProfilerSteps' time (as the replay is anchored at the first), not the kept events' extent: host
    # work before the steps (start-up) and spans running on past the last step (a thread's lifetime) are not steps
    if st:
        start = min(x.start_us for x in st)
        host_window = max(x.start_us + x.host_us for x in st) - start
    else:
        start = float(w.ts_us[w.keep].min()) if w.keep.any() else 0.0
        host_window = float(w.end_us[w.keep].max()) - start if w.keep.any() else 0.0
    stalls = timing.stall_spans if timing is not None else stall_spans(t, w)  # the pre-pass's, where it ran
    f = RankFacts(table=t, window=w, steps=steps, step_times=st, host_window_us=host_window, host_window_start_us=start,
                  dataloader=stalls["dataloader"], optimizer=optimizer_spans(t, w),
                  checkpoint=stalls["checkpoint"], sync_calls=host_syncs(t, w), sync_ops=sync_ops(t, w),
                  allocator=allocator_calls(t, w), compile=stalls["compile"], gc=stalls["gc"], waits=waits)
    if f.compile.count:
        f.compile_steps = _steps_holding(st, f.compile)
        f.recompiles = compiled_frames(t, w)[1]
    if f.checkpoint.count:
        f.checkpoint_steps = _steps_holding(st, f.checkpoint)
    if f.gc.count:
        f.gc_steps = _costly_gc_steps(st, f.gc)
    f.sync_op_counts = sync_op_counts(t, w)  # host-side: the reads' CPU time is evidence without GPU events too
    ops = window_ops(t, w)
    f.loop = loop_kind(t, ops, f.optimizer)
    if not w.device.size:
        waits_by_step = host_step_waits(t, w.keep) if steps else {}
        if waits_by_step:
            f.host_comm_us = float(sum(v[1] for k, v in waits_by_step.items() if k in steps))
        return f
    timing = timing if timing is not None else device_timing(t, w)
    f.breakdown = timing.breakdown
    f.step_idle_us = idle_in_span_us(w, start, start + host_window)
    f.overlap = comm_comp_overlap(t, w)
    f.idle = idle_split(t, w)
    f.categories = kernel_breakdown(t, w)
    f.launch = launch_stats(t, w)
    f.queue = queue_length(t, w)
    f.stretches = launch_bound_stretches(t, w)
    f.graph = build_graph(t, w, waits)
    base = replay(f.graph)
    if later_stage(timing.p2p_role, timing.opens_on_receive):
        # a later pipeline stage's steps open on data from the stage before: whatever this rank changes, it arrives
        # when it did (that stage's own replay prices what the change does there; replay.FLOOR_EXEMPT)
        f.graph.arrival_floor = _base_ends(f.graph, base, timing.opening_rows)
    f.period_nodes = step_nodes(f.graph, st, behind_earlier_work=w.queued_until_us > float("-inf"))
    f._set_base(base)
    f.critical_path = critical_path(f.graph, base)
    f.sync_sites = _sync_sites(f)
    f.compute_by_step = timing.compute_by_step
    f.schedule = schedule_names(t, w)
    f.pipeline_stage = later_stage(timing.p2p_role, timing.opens_on_receive) or (
        timing.p2p_role != "context" and (f.schedule.named or timing.p2p_role == "pipeline"))
    comm: dict[str, float] = {}
    groups = timing.collective_groups
    for k, r in groups.items():  # keys "<process group>/<collective>": summed over groups
        comm[group_kind(k)] = comm.get(group_kind(k), 0.0) + float((w.end_us[r] - w.ts_us[r]).sum())
    f.p2p_rows, f.p2p_role = timing.p2p_rows, timing.p2p_role
    f.sync_causes = sync_causes(t, w, f.graph, _rows_of(groups, lambda kind: kind == "all_to_all"),
                                _rows_of(groups, lambda kind: True))
    f.p2p_overlap = comm_comp_overlap(t, w, f.p2p_rows)
    f.other_comm_rows = _rows_of(groups, lambda kind: kind != P2P_KIND)
    f.other_comm_overlap = comm_comp_overlap(t, w, f.other_comm_rows)
    total = sum(comm.values())
    f.comm_share_by_collective = {k: v / total for k, v in comm.items()} if total > 0 else {}
    if total > 0:
        sizes = f.comm_sizes = timing.comm_sizes
        f.all_to_all_split = send_split_skew(t, w) if "all_to_all" in comm else None
        barriers = launched_inside(t, w, *row_spans(t, span_rows(t, w, BARRIER_RE, (CPU_OP, USER_ANNOTATION))))
        scalar = scalar_collective_rows(t, groups, sizes, barriers)
        f.scalar_comm_share = float((w.end_us[scalar] - w.ts_us[scalar]).sum()) / total
        f.forward_all_reduce_share = forward_all_reduce_us(t, w, groups, ops, scalar) / total
        waited = {r: us for r, (us, _) in waits.items()} if waits is not None else None
        f.transfer = transfer_rate(t, groups, waited, device_accelerator(t), sizes)
        if f.p2p_rows.size:  # the send/recv's own rate: a pipeline's transfers between nodes
            f.p2p_transfer = transfer_rate(t, {k: r for k, r in groups.items() if group_kind(k) == P2P_KIND},
                                           waited, device_accelerator(t), sizes)
    return f


@dataclass(frozen=True, kw_only=True)
class WindowOps:
    """The window's operator rows (cpu_op) and which of them are autograd backward nodes."""

    rows: np.ndarray
    is_backward_node: np.ndarray


def window_ops(t: EventTable, w: Window) -> WindowOps:
    """The window's cpu_op rows, each marked backward node or not (autograd_links.backward_node_mask)."""
    ops = np.flatnonzero((t.kind == CPU_OP) & w.keep)
    return WindowOps(rows=ops, is_backward_node=backward_node_mask(t, ops))


def loop_kind(t: EventTable, ops: WindowOps, optimizer: HostSpans) -> str:
    """"training" when the window holds an autograd backward node or an optimizer step / zero_grad span (optimizer:
    host.optimizer_spans), "inference" when it holds PyTorch's ATen ops and neither (a forward-only loop: serving,
    generation, evaluation), "unknown" without ATen ops (device activity only, or a profiler that records no autograd
    node to tell by: JAX's, rocprofv3's)."""
    if optimizer.count or ops.is_backward_node.any():
        return "training"
    aten = np.isin(t.name[ops.rows], t.ids_matching(lambda s: s.startswith("aten::")))
    return "inference" if aten.any() else "unknown"


def forward_all_reduce_us(t: EventTable, w: Window, groups: dict[str, np.ndarray], operators: WindowOps,
                          scalar: np.ndarray) -> float:
    """µs of tensor parallelism's all-reduce kernels (groups: collective_rows): those of a process group the trace
    describes as tensor-parallel (process_groups.row_roles: Megatron's TENSOR_MODEL_PARALLEL_GROUP, a mesh's "tp"),
    wherever issued; none of a group described otherwise (a data-parallel group's, launched outside the nodes by
    compiled autograd as well); and of undescribed groups, those whose launch the trace shows outside every autograd
    backward node (operators: window_ops): issued by the forward pass (or an inference step). Data parallelism reduces
    gradients in the backward (DDP's reducer launches its buckets from hooks inside the nodes: HTA's nccl_parser,
    negative_queue, trace_filter and df_index_resolver traces, 1,636 of 1,636 all-reduces), FSDP reduce-scatters them
    there; an all-reduce in the forward is tensor parallelism's (the row-parallel layers' outputs), whose next layer
    needs its result. Not the all-reduces of a handful of values (scalar: collectives.scalar_collective_rows), which a
    barrier, a loss or metric average or a gradient norm makes outside the backward too. Undescribed, 0 when the
    window records no operator (a profile of CUDA activity only): then no node is seen because none is recorded."""
    rows = _rows_of(groups, lambda kind: kind == "all_reduce")
    rows = np.setdiff1d(rows, scalar)
    roles = row_roles(t, rows)
    described = float((w.end_us[rows] - w.ts_us[rows])[roles == "tensor"].sum())
    rows = rows[roles == ""]
    launched, link = launched_rows(t, w)
    keep = np.isin(launched, rows)
    rows, link = launched[keep], link[keep]
    ops, is_node = operators.rows, operators.is_backward_node
    if not rows.size or not ops.size:
        return described
    nodes = ops[is_node]
    launcher = thread_key(t.pid[link], t.tid[link])
    backward = enclosing_span(*row_spans(t, nodes), launcher, t.ts_ns[link]) >= 0
    # a GPU job's autograd engine runs the nodes on threads of its own: what those threads launch between nodes
    # (FSDP's and DDP's callbacks at the end of the pass) is the backward's too. The forward's thread is the one
    # running the most ops outside nodes (on CPU the engine runs on it: its launches outside nodes stay forward)
    if nodes.size and (~is_node).any():
        keys = thread_key(t.pid[ops], t.tid[ops])
        threads, counts = np.unique(keys[~is_node], return_counts=True)
        engine = np.setdiff1d(np.unique(keys[is_node]), threads[np.argmax(counts)])
        backward |= np.isin(launcher, engine)
    rows = rows[~backward]
    return described + float((w.end_us[rows] - w.ts_us[rows]).sum())


def _sync_sites(f: RankFacts) -> list[SyncSite]:
    """Blocking syncs grouped by call site; the SYNC_SITES_PRICED sites blocking longest, each priced by replay."""
    g, w = f.graph, f.window
    sync = np.flatnonzero(g.block_class == BLOCK_SYNC)
    if not sync.size:
        return []
    starts, ends = merge_intervals(w.ts_us[w.device], w.end_us[w.device])
    e = g.start[sync] + g.dur[sync]
    k = np.searchsorted(starts, e, side="right")  # first busy interval starting after the sync ended
    inside = (k > 0) & (ends[np.clip(k - 1, 0, None)] > e)
    idle_after = np.where(~inside & (k < starts.size), starts[np.clip(k, 0, starts.size - 1)] - e, 0.0)
    blocking = g.blocking_us[sync]
    out = []
    for site in np.unique(g.sync_site[sync]):
        sel = g.sync_site[sync] == site
        out.append(SyncSite(site=g.site_names[int(site)], count=int(sel.sum()), blocking_us=float(blocking[sel].sum()),
                            gpu_idle_after_us=float(idle_after[sel].sum()), gain_us=0.0, gain_pct=0.0,
                            site_id=int(site)))
    out.sort(key=lambda x: -x.blocking_us)
    for x in out[:SYNC_SITES_PRICED]:
        x.gain_pct, x.gain_us = f.gain((Change("remove_syncs", site=x.site_id),))
    return out
