"""The finding rules: one function per kind, each reading one rank's RankFacts, thresholds beside it.

A rule decides whether its problem is present from the evidence and names the what-if changes of
its fix; it never computes a gain itself. `findings.rank_by_marginal_gain` replays the changes and
credits each finding with its marginal gain. Thresholds are shares of the rank's replayed span
(% of step time) unless named otherwise; they are provisional until `trainperf evaluate` scores
them on the labeled corpus.

RULES, run in that order by run_rules, lists every rule. Here: the host's named waits (DataLoader, checkpoint,
compile, Python's garbage collector, syncs, pageable copies, the allocator), communication (exposed collectives, a
pipeline's bubble), the kernels (memory-bound unfused operators, the optimizer) and what is left (idle GPU). The
others, in modules of their own, are named in the comment above RULES.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import advice
from trainperf.diagnose import findings as F
from trainperf.diagnose.allocator import ALLOCATOR_OFF, CACHE_EMPTIED, MEMORY_PRESSURE, allocator_pattern
from trainperf.diagnose.attention import unfused_attention
from trainperf.diagnose.copies import exposed_memcpy
from trainperf.diagnose.ddp import ddp_buffer_broadcast, ddp_gradient_copies, ddp_unused_parameter_search
from trainperf.diagnose.devices import devices_take_turns, pytorch_process_side_by_side
from trainperf.diagnose.evidence import warmup_us
from trainperf.diagnose.collectives import TransferRate
from trainperf.diagnose.contention import comm_contention, measured_contention
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.fusion import fusion_chains, not_fusable
from trainperf.diagnose.gemm_shapes import misaligned_gemm
from trainperf.diagnose.graph_breaks import graph_breaks
from trainperf.diagnose.gpu_time import Overlap, idle_gaps_us, idle_in_span_us
from trainperf.diagnose.grad_sync import grad_sync_per_microbatch
from trainperf.diagnose.host_bound import (gpu_idle_pct, host_work, launch_bound, launch_cost_us, optimizer_on_host,
                                           small_kernels)
from trainperf.diagnose.host import OPTIMIZER_RE, gc_calls, span_rows
from trainperf.diagnose.host_link import pinned_copy_rate, pinned_copy_us
from trainperf.diagnose.layout import layout_transposes
from trainperf.diagnose.loss import unfused_cross_entropy
from trainperf.diagnose.memory import batch_room_text, headroom_text
from trainperf.diagnose.precision import fp32_matmul
from trainperf.diagnose.queued_idle import idle_with_work_queued
from trainperf.diagnose.pipeline import implied_micro_batches, schedule_bubble_pct
from trainperf.diagnose.recompute import recompute_overhead
from trainperf.diagnose.replay import BLOCK_COMM, BLOCK_PAGEABLE, BLOCK_SYNC, Change, blocked_us
from trainperf.diagnose.routing import SPLIT_SKEW_MIN
from trainperf.diagnose.slow_gemm import slow_gemm
from trainperf.diagnose.stragglers import STRAGGLER_MIN_COMPUTE_RATIO, load_imbalance, straggler
from trainperf.diagnose.sync_causes import SyncCauses
from trainperf.diagnose.unbucketed import unbucketed_gradients
from trainperf.diagnose.window import merge_intervals
from trainperf.trace.categories import copy_direction
from trainperf.trace.events import CPU_OP, ELEMENTWISE, GPU_SYNC, OPTIMIZER, PYTHON, REDUCTION, USER_ANNOTATION
from trainperf.trace.nesting import starts_inside

Finding = F.Finding


# --- host waits -------------------------------------------------------------------------------

DATALOADER_MIN_PCT = 1.0  # DataLoader spans, % of the span


def _stall_metrics(f: RankFacts, spans, what: str, extra: dict | None = None) -> dict:
    """A named host stall's evidence: its time (µs) and share of the span (%), then ``extra``."""
    return {f"{what}_time": (spans.time_us, "us"), f"{what}_share": (f.pct(spans.time_us), "%"), **(extra or {})}


def _host_stall(f: RankFacts, kind: str, spans, change: str, what: str, label: str = "",
                extra: dict | None = None, steps_with: list | None = None) -> Finding:
    """A named host stall (DataLoader, checkpoint): priced by replay over HTA's window (the complete steps; a
    one-off save is worth its cost over the steps the window holds, as the corpus truth counts it); the host
    time itself without GPU (an upper bound). steps_with: the analysed steps the stall is seen in, where that
    decides how often the run pays it: seen in one step of two or more, once, it has no rate (Finding.rate_unknown);
    seen in m of k steps, the window measures its rate, m in k. In a window without steps (fewer than two) a stall
    seen once has no rate either: nothing says how many iterations the window holds."""
    share = f.pct(spans.time_us)
    metrics = _stall_metrics(f, spans, what, extra)
    stepped = len(f.steps) >= 2
    once = steps_with is not None and (len(steps_with) == 1 if stepped else spans.occurrences == 1)
    seen = (f" (seen in 1 of {len(f.steps)} steps)" if stepped else " (seen once, in a window without steps)") \
        if once else ""
    if not f.has_gpu:  # no replay: the host time itself is the upper bound
        return F.rank_finding(f, kind=kind, metrics=metrics, events=spans.longest, gain_pct=share,
                              gain_us=spans.time_us, what_if=f"{change} (host only: upper bound){seen}",
                              evidence_pct=share, rate_unknown=once)
    return F.rank_finding(f, kind, metrics, spans.longest, (Change(change),), f"remove the {label or what} wait{seen}",
                          evidence_pct=share, rate_unknown=once)


# the iterator torch.utils.data.DataLoader names its __next__ span after: no worker processes (num_workers=0), or some
SINGLE_PROCESS_LOADER, WORKER_LOADER = "_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter"


def data_loader_stall(f: RankFacts) -> Finding | None:
    """The training loop waits for batches (DataLoader spans on the host). The fix named follows the loader's iterator
    (its span's name): without workers the batches are made on the training thread, which workers move off it; with
    workers, they do not keep up."""
    if f.pct(f.dataloader.time_us) <= DATALOADER_MIN_PCT:
        return None
    found = _host_stall(f, "data_loader_stall", f.dataloader, "remove_data_wait", "dataloader", "data-loader")
    names = [n for n, _, _ in f.dataloader.longest]
    if any(SINGLE_PROCESS_LOADER in n for n in names):
        found.recommendation = advice.SINGLE_PROCESS_LOADER_RECOMMENDATION
    elif any(WORKER_LOADER in n for n in names):
        found.recommendation = advice.WORKER_LOADER_RECOMMENDATION
    return found


CHECKPOINT_MIN_PCT = 1.0


def checkpoint_stall(f: RankFacts) -> Finding | None:
    """Checkpoint saving blocks the training loop. A save in one of the window's steps is priced over the window's
    steps, and its rate in the run is unknown (a run saving every N steps pays it once in N; that a profile window
    holds one save says nothing of N): an upper bound (Finding.rate_unknown). Rated as measured, a one-off save ranked
    above an all-reduce exposed for two thirds of a DDP rank's GPU time, a judged real trace's bottleneck. Saves in
    several steps give their rate (a run saving every step from its 6th: 6 of the 10 steps)."""
    if f.pct(f.checkpoint.time_us) <= CHECKPOINT_MIN_PCT:
        return None
    extra = {"steps_saving": (len(f.checkpoint_steps), f"of {len(f.steps)} steps")}
    return _host_stall(f, "checkpoint_stall", f.checkpoint, "remove_checkpoint_wait", "checkpoint", extra=extra,
                       steps_with=f.checkpoint_steps)


COMPILE_MIN_PCT = 1.0  # compile spans, % of the span: the stall rules' one evidence threshold


def compile_stall(f: RankFacts) -> Finding | None:
    """torch.compile compiles inside the analysed steps (Dynamo/Inductor phases on the host): a recompile in
    several steps (a guard that fails each time), priced as a stall; or warm-up, compiling in the first analysed
    step only, which a steady-state step never pays: reported low and unpriced, so that it does not outrank what
    the steady steps show (the fix is to profile after it)."""
    if f.pct(f.compile.time_us) <= COMPILE_MIN_PCT:
        return None
    extra = {"steps_compiling": (len(f.compile_steps), f"of {len(f.steps)} steps"),
             "recompiles": (f.recompiles, "compiled regions")}
    if len(f.steps) >= 2 and f.compile_steps == f.steps[:1]:
        return F.rank_finding(f, "compile_stall", _stall_metrics(f, f.compile, "compile", extra), f.compile.longest,
                              severity="low",
                              what_if=f"warm-up: compilation in the first analysed step ({f.steps[0]}) only, which a "
                                      "steady-state step does not pay; profile after it")
    return _host_stall(f, "compile_stall", f.compile, "remove_compile_wait", "compile", "torch.compile", extra=extra)


GC_MIN_PCT = 1.0  # Python GC spans, % of the span: the stall rules' one evidence threshold
# the share of the collections' time inside gc.collect() calls from which the program's own calls are the cause named
# (stated, not fitted: the larger part, as the stragglers' LATE_WORK_MIN_SHARE)
GC_CALLED_MIN_SHARE = 0.5


def gc_stall(f: RankFacts) -> Finding | None:
    """Python's garbage collector pauses the loop inside the steps (its "Python GC" spans, in a trace profiled with
    with_stack and record_python_gc_info): a named host stall, priced by taking the collections out of the host's
    gaps. The fix (objects of the start-up frozen, automatic collection off, a collection every N steps at one point
    on every rank) keeps one collection in N steps. Evidence: the collections, the longest, the steps holding one."""
    if f.pct(f.gc.time_us) <= GC_MIN_PCT:
        return None
    extra = {"collections": (f.gc.count, "count"), "longest_collection": (f.gc.longest[0][2], "us"),
             "steps_collecting": (len(f.gc_steps), f"of {len(f.steps)} steps")}
    called = f.once("gc_calls", lambda: gc_calls(f.table, f.window))
    asked = called.time_us >= GC_CALLED_MIN_SHARE * f.gc.time_us > 0
    if asked:
        extra.update({"gc_collect_calls": (called.calls, "count"),
                      "in_gc_collect_calls": (100 * called.time_us / f.gc.time_us, "%")})
    found = _host_stall(f, "gc_stall", f.gc, "remove_gc_wait", "gc", "garbage-collection", extra=extra,
                        steps_with=f.gc_steps)
    if asked:
        found.recommendation = advice.GC_CALLED_RECOMMENDATION.format(
            calls=called.calls, steps=len(f.steps), site=called.sites[0] if called.sites else "gc.collect()")
    return found


# time blocked in syncs (or their wait on the critical path) and the reads that made them, % of the span
HOST_SYNC_MIN_PCT = 1.0


def host_sync(f: RankFacts) -> Finding | None:
    """The host blocks until the device drains: synchronize calls, blocking device-to-host copies (aten::item,
    .cpu(), .tolist(), nonzero, ...). Evidence per call site; priced by the GPU idle they cause (replay)."""
    if not f.has_gpu:
        return None
    g = f.graph
    blocked = g.block_class == BLOCK_SYNC
    n_calls = int(blocked.sum())
    time_us = f.sync_blocking_us  # the summary's host_sync_pct reads the same number
    wait_cp = f.critical_path.get("sync_wait", 0.0)
    # the CPU time of the ops that made the blocking reads (aten::item, .cpu(), ...): it goes with the syncs. Where the
    # device is idle when they read, they block for nothing, and this is their whole cost to a host-bound step
    read_us = float(g.gap_syncop[g.syncop_site >= 0].sum() + g.sync_base[blocked & g.in_syncop].sum())
    if not n_calls or f.pct(max(time_us, wait_cp) + read_us) <= HOST_SYNC_MIN_PCT:
        return None
    metrics = {"sync_calls": (n_calls, "count"), "sync_blocking_time": (time_us, "us"),
               "reading_ops_cpu_time": (read_us, "us"),
               "gpu_idle_after_syncs": (sum(x.gpu_idle_after_us for x in f.sync_sites), "us"),
               "sync_wait_on_critical_path": (wait_cp, "us"), "sync_ops": (f.sync_ops.count, "count")}
    for name, (count, cpu_us) in sorted(f.sync_op_counts.items(), key=lambda kv: -kv[1][1])[:4]:
        metrics[f"{name} calls"] = (count, "count")
        metrics[f"{name} cpu_time"] = (cpu_us, "us")
    x = F.rank_finding(f, "host_sync", metrics, f.sync_calls.longest[:3] + f.sync_ops.longest[:2],
                       (Change("remove_syncs"),), "remove host syncs (and the reads that made them)",
                       evidence_pct=f.pct(max(time_us, wait_cp) + read_us))
    x.evidence["call_sites"] = [{"site": s.site, "count": s.count, "blocking_us": round(s.blocking_us, 1),
                                 "gpu_idle_after_us": round(s.gpu_idle_after_us, 1), "gain_us": round(s.gain_us, 1),
                                 "gain_pct": round(s.gain_pct, 2)} for s in f.sync_sites[:5]]
    to_device = _blocked_on_host_to_device_share(f, np.flatnonzero(blocked))
    x.evidence["metrics"]["waiting_for_host_to_device_copies"] = {"value": round(100.0 * to_device, 3), "unit": "%"}
    launches = blocked & g.kernel_launch  # launches that waited for their own kernel (replay.synchronous_launches)
    in_launches = float(g.blocking_us[launches].sum()) / max(float(g.blocking_us[blocked].sum()), 1e-9)
    x.evidence["metrics"]["launches_waiting_for_their_kernel"] = {"value": int(launches.sum()), "unit": "count"}
    if in_launches >= SYNCHRONOUS_LAUNCH_SHARE:
        names = sorted({g.names[int(f.table.name[r])] for r in g.rows[launches]})
        runtime = next((p for p in ("hip", "cu") if all(n.startswith(p) for n in names)), "")
        x.recommendation = advice.SYNCHRONOUS_LAUNCH_RECOMMENDATION.format(
            pct=100.0 * in_launches, calls=", ".join(names[:3]), setting=advice.SYNCHRONOUS_LAUNCH_SETTINGS[runtime])
    elif to_device >= HOST_TO_DEVICE_SYNC_SHARE:
        x.recommendation = (advice.HOST_TO_DEVICE_SYNC_RECOMMENDATION.format(pct=100.0 * to_device) + " "
                            + x.recommendation)
    else:
        x.recommendation = _sync_cause_recommendation(f.sync_causes) or x.recommendation
    causes = f.sync_causes
    for name, us in (("blocking_in_data_dependent_shapes", causes.shape_us),
                     ("blocking_in_reads_before_all_to_all", causes.split_read_us),
                     ("blocking_in_bare_synchronize", causes.bare_us),
                     ("blocking_in_fsdp_rate_limiter", causes.rate_limiter_us)):
        x.evidence["metrics"][name] = {"value": round(100.0 * causes.share(us), 3), "unit": "%"}
    return x


def _sync_cause_recommendation(causes: SyncCauses) -> str:
    """host_sync's fix for what made most of the blocking (sync_causes.py: a majority, as the other kinds'), or ""
    where nothing holds a majority (the default fix: reads to drop or defer)."""
    if causes.share(causes.split_read_us) > 0.5:
        return advice.SPLIT_SIZES_SYNC_RECOMMENDATION.format(pct=100.0 * causes.share(causes.split_read_us))
    if causes.share(causes.shape_us) > 0.5:
        return advice.SHAPE_SYNC_RECOMMENDATION.format(pct=100.0 * causes.share(causes.shape_us),
                                                       ops=", ".join(causes.shape_ops[:3]))
    if causes.share(causes.rate_limiter_us) > 0.5:
        return advice.RATE_LIMITER_SYNC_RECOMMENDATION.format(pct=100.0 * causes.share(causes.rate_limiter_us))
    if causes.share(causes.bare_us) > 0.5:
        return advice.BARE_SYNC_RECOMMENDATION.format(pct=100.0 * causes.share(causes.bare_us),
                                                      calls=", ".join(causes.bare_calls[:3]))
    return ""


# the share of the host's blocking in launches that waited for their own kernel from which the fix is to make launches
# asynchronous again (advice.SYNCHRONOUS_LAUNCH_RECOMMENDATION) instead of removing reads: a majority, stated, not
# fitted
SYNCHRONOUS_LAUNCH_SHARE = 0.5
# the share of the host's blocking in waits for its own host-to-device copies from which the fix names them first: a
# quarter, stated, not fitted (no labeled case has them; the corpus's syncs are reads back to the host). Below it the
# copies are a detail of the reads' fix; a sync per step after a 2-ms input copy, then a 3.3-ms read of the loss, is 38 %
HOST_TO_DEVICE_SYNC_SHARE = 0.25


def _blocked_on_host_to_device_share(f: RankFacts, blocking: np.ndarray) -> float:
    """Share (0-1) of the host's blocking time (blocked_us' measure) in calls that waited for a host-to-device copy:
    tensor.to(device) with non_blocking=False (cudaMemcpyAsync, then cudaStreamSynchronize on it)."""
    g = f.graph
    time = g.blocking_us[blocking]
    on = g.sync_on[blocking]
    names = [g.names[int(f.table.name[g.rows[k]])] if k >= 0 else "" for k in on]
    to_device = np.array([copy_direction(n) == "HtoD" for n in names], dtype=bool)
    total = float(time.sum())
    return float(time[to_device].sum()) / total if total > 0 else 0.0


PAGEABLE_MIN_PCT = 1.0  # host blocked in host-to-device copies, % of the span


def pageable_copy(f: RankFacts) -> Finding | None:
    """Host-to-device copies from pageable memory block the host until the copy is done."""
    if not f.has_gpu:
        return None
    g = f.graph
    blocked = g.block_class == BLOCK_PAGEABLE
    time_us = blocked_us(g, BLOCK_PAGEABLE)
    if not blocked.any() or f.pct(time_us) <= PAGEABLE_MIN_PCT:
        return None
    dev = np.flatnonzero(g.pageable_copy)  # each copy once: its call and the synchronize after it both wait for it
    copy_us = float(g.dur[dev].sum())
    events = sorted(((g.names[int(f.table.name[g.rows[i]])], g.start[i], g.dur[i]) for i in np.flatnonzero(blocked)),
                    key=lambda e: -e[2])[:3]
    pinned = f.once("pinned_copy_rate", lambda: pinned_copy_rate(f.table, g.rows[dev]))
    metrics = {"blocking_copies": (int(dev.size), "count"), "host_blocked": (time_us, "us"),
               "copy_time": (copy_us, "us"), "on_critical_path": (f.critical_path.get("pageable_copy", 0.0), "us")}
    sized = dev[(g.copy_bytes[dev] >= 0) & (g.dur[dev] > 0)]
    if sized.size:  # their time at the pinned rate is what the fix leaves on the stream, for a prefetch to hide
        metrics["copy_rate"] = (float(g.copy_bytes[sized].sum()) / float(g.dur[sized].sum()) / 1e3, "GB/s")
        metrics["pinned_rate"] = (pinned.gbps, "GB/s")
        metrics["copy_time_pinned"] = (float(pinned_copy_us(g.dur[dev], g.copy_bytes[dev], pinned.gbps).sum()), "us")
    return F.rank_finding(f, "pageable_copy", metrics, events, (Change("unblock_pageable_copies", factor=pinned.gbps),),
                          f"the copies from pinned memory, non_blocking: the host stops blocking, each copy stays on "
                          f"its stream at {pinned.gbps:.3g} GB/s ({pinned.source})", evidence_pct=f.pct(time_us))


ALLOCATOR_MIN_PCT = 1.0  # allocator calls and spans, % of the span


def allocator_stall(f: RankFacts) -> Finding | None:
    """Allocations and frees reach the driver (cudaMalloc/cudaFree, hipMalloc/hipFree) inside the step."""
    if not f.has_gpu:
        return None
    g = f.graph
    time_us = float(g.dur[g.is_alloc].sum() + g.gap_allocator.sum())
    if f.pct(time_us) <= ALLOCATOR_MIN_PCT:
        return None
    pattern = f.once("allocator_pattern", lambda: allocator_pattern(f.table, f.window, len(f.steps)))
    found = F.rank_finding(f, "allocator_stall", {"allocator_calls": (int(g.is_alloc.sum()), "count"),
                                                  "allocator_time": (time_us, "us"),
                                                  "on_critical_path": (f.critical_path.get("allocator", 0.0), "us"),
                                                  "driver_frees": (pattern.frees, "count"),
                                                  "frees_outside_operators": (100.0 * pattern.frees_outside, "%"),
                                                  "free_stretches_per_step": (pattern.stretches_per_step, "count"),
                                                  "frees_before_a_retry": (100.0 * pattern.frees_before_retry, "%")},
                           f.allocator.longest[:3], (Change("remove_allocator"),),
                           "allocator calls cost nothing (cached)", evidence_pct=f.pct(time_us))
    mem = f.device_memory
    if mem is not None and mem.usable_bytes:
        found.evidence["metrics"]["peak_reserved_of_usable_memory"] = {
            "value": round(100.0 * mem.peak_reserved_bytes / mem.usable_bytes, 3), "unit": "%"}
    if pattern.kind == MEMORY_PRESSURE:
        found.recommendation = advice.MEMORY_PRESSURE_RECOMMENDATION.format(pct=100.0 * pattern.frees_before_retry)
        if mem is not None:
            found.recommendation += f" The allocator's samples: {mem.text()}."
    elif not pattern.kind and mem is not None and mem.near_full:
        # no retry pattern in where the frees are made, but the reserved peak at the device's edge: the driver is
        # reached because the cache cannot grow (profile_memory=True shows it)
        text = advice.INFERENCE_NEAR_FULL_RECOMMENDATION if f.loop == "inference" else advice.NEAR_FULL_RECOMMENDATION
        found.recommendation = text.format(memory=mem.text())
    elif pattern.kind == ALLOCATOR_OFF:
        found.recommendation = advice.ALLOCATOR_OFF_RECOMMENDATION.format(stretches=pattern.stretches_per_step)
    elif pattern.kind == CACHE_EMPTIED:
        found.recommendation = advice.CACHE_EMPTIED_RECOMMENDATION.format(
            frees=pattern.frees / max(len(f.steps), 1), stretches=pattern.stretches_per_step)
    return found


# --- communication ----------------------------------------------------------------------------

EXPOSED_COMM_MIN_PCT = 3.0  # communication not under compute, % of the device window


def exposed_comm(f: RankFacts) -> Finding | None:
    """Collectives that no computation hides. The gain of overlapping them is measured where the host blocked on
    them (a sync that waited for a collective: removing that wait needs nothing the trace does not show); where
    only device work waits for them (ops that start when a collective ends, on another stream or the same one),
    it is an upper bound: the waiting op usually consumes what the collective produced (DDP's optimizer the
    reduced gradients, TorchRec's embeddings the all-to-all's features, a pipeline stage what it receives), and
    hiding that needs the collective issued earlier (bucketing, prefetch, pipelining the next batch), which the
    replay cannot confirm. Mostly point-to-point communication (send/recv) is an upper bound either way."""
    # on a pipeline stage pipeline_bubble prices the send/recv: exposed_comm measures and prices the other collectives
    beside_bubble = f.pipeline_stage and f.p2p_rows.size > 0
    ov = f.other_comm_overlap if beside_bubble else f.overlap
    share = _exposed_comm_pct(f, ov)
    if share <= EXPOSED_COMM_MIN_PCT:
        return None
    g = f.graph
    host_waits = g.block_class == BLOCK_COMM  # host syncs that waited for a collective
    # the collectives' shares of the communication exposed_comm is about: beside the bubble, the other collectives'
    rest = max(1.0 - f.p2p_comm_share, 1e-9) if beside_bubble else 1.0
    p2p = not beside_bubble and f.p2p_comm_share > 0.5  # mostly point-to-point: a majority, not a fitted share
    all_to_all = f.comm_share_by_collective.get("all_to_all", 0.0) / rest
    sharded = sum(f.comm_share_by_collective.get(k, 0.0) for k in ("all_gather", "reduce_scatter")) / rest
    forward_all_reduce = f.forward_all_reduce_share / rest
    # one process driving its GPUs side by side, its collectives broadcast and reduce: nn.DataParallel's
    data_parallel = (pytorch_process_side_by_side(f)
                     and sum(f.comm_share_by_collective.get(k, 0.0) for k in ("broadcast", "reduce")) / rest > 0.5)
    scalar = f.scalar_comm_share / rest
    of = "% of comm but send/recv" if beside_bubble else "% of comm"
    bound = p2p or not host_waits.any()
    metrics = {"comm_time": (ov.comm_us, "us"), "exposed_comm": (ov.exposed_us, "us"),
               "point_to_point_share": (100.0 * f.p2p_comm_share, "% of comm"),
               "all_to_all_share": (100.0 * all_to_all, of),
               "all_gather_reduce_scatter_share": (100.0 * sharded, of),
               "forward_all_reduce_share": (100.0 * forward_all_reduce, of),
               "scalar_collectives_share": (100.0 * scalar, of),
               "overlap": (ov.overlap_pct, "%"), "host_syncs_waiting_for_collectives": (int(host_waits.sum()), "count"),
               "host_blocked_on_collectives": (blocked_us(g, BLOCK_COMM), "us")}
    rate = f.transfer
    metrics.update(_rate_metrics(rate))
    split = f.all_to_all_split
    if split is not None:
        metrics["all_to_all_largest_send_share"] = (split.ratio, "x the mean")
        metrics["all_to_all_largest_send_to_rank"] = (split.peer, "")
    overlap = Change("overlap_comm", rows=tuple(int(r) for r in f.other_comm_rows)) if beside_bubble else \
        Change("overlap_comm")
    contention = measured_contention(f)
    slowdown = contention.slowdown if contention is not None and contention.slowed else None
    if slowdown is not None:  # the computation these collectives would hide behind, measured slower beside them
        metrics["computation_slowdown_beside_communication"] = (slowdown, "x")
    found = F.rank_finding(f, "exposed_comm", metrics, (), (overlap,), "overlap exposed collectives with compute"
                           + (" (mostly send/recv: upper bound)" if p2p else
                              " (only device work waits for them: upper bound)" if bound else ""),
                           evidence_pct=share, upper_bound=bound)
    if data_parallel:
        found.recommendation = advice.EXPOSED_DATA_PARALLEL_RECOMMENDATION
    elif scalar > 0.5:  # a majority, as the other kinds'
        found.recommendation = advice.EXPOSED_SCALAR_RECOMMENDATION
    elif p2p:
        found.recommendation = advice.EXPOSED_RING_RECOMMENDATION if f.p2p_role == "context" else \
            advice.EXPOSED_P2P_RECOMMENDATION
    elif all_to_all > 0.5:
        hot = split is not None and split.ratio >= SPLIT_SKEW_MIN
        found.recommendation = (advice.HOT_RANK_PREFIX[split.carries].format(
            ratio=split.ratio, peer=split.peer, peers=split.peers) if hot else "") + \
            advice.EXPOSED_ALL_TO_ALL_RECOMMENDATION
    elif forward_all_reduce > 0.5:
        found.recommendation = advice.EXPOSED_TP_RECOMMENDATION
    elif sharded > 0.5:
        found.recommendation = advice.EXPOSED_SHARDED_RECOMMENDATION
    found.recommendation = _slow_transfer_prefix(rate) + found.recommendation
    if slowdown is not None:
        found.recommendation += " " + advice.OVERLAP_SLOWS_COMPUTATION.format(slowdown=slowdown)
    return found


def _rate_metrics(rate: TransferRate | None) -> dict:
    """The collectives' transfer rate as evidence metrics (none without a rate)."""
    if rate is None:
        return {}
    return {"collective_bus_bandwidth": (rate.busbw_gbps, "GB/s"), f"{rate.link}_link": (rate.link_gbps, "GB/s"),
            "transfer_time_at_link_rate": (100.0 * rate.link_share, "%"),
            "bytes_over_nccl_ll_protocol": (100.0 * rate.ll_share, "%")}


def _slow_transfer_prefix(rate: TransferRate | None) -> str:
    """The slow transport's advice, put before a finding's own fix, when the collectives move their data under
    SLOW_TRANSFER_SHARE of the link's rate; "" otherwise."""
    if rate is None or rate.link_share >= SLOW_TRANSFER_SHARE:
        return ""
    return advice.EXPOSED_SLOW_TRANSFER_RECOMMENDATION.format(
        pct=100.0 * rate.link_share, link=rate.link, busbw=rate.busbw_gbps, link_gbps=rate.link_gbps,
        ll=advice.SLOW_TRANSFER_LL.format(pct=100.0 * rate.ll_share) if rate.ll_share > 0.5 else "",
        alone="" if rate.partners_seen else advice.SLOW_TRANSFER_ONE_RANK) + " "


def _exposed_comm_pct(f: RankFacts, overlap: Overlap | None = None) -> float:
    """Communication no computation hides (all of it, or the given overlap's), % of the device window (0 without
    device events or communication)."""
    ov = overlap or f.overlap
    if not f.has_gpu or ov is None or ov.comm_us <= 0 or f.breakdown.window_us <= 0:
        return 0.0
    return 100.0 * ov.exposed_us / f.breakdown.window_us


# the bubble's what-if: it shrinks by this factor (twice the micro-batches per step: each micro-batch's forward and
# backward take half as long and the stages wait half as long for them; or two model chunks per rank, interleaved
# 1F1B, whose bubble is (p - 1) / (2 m): Narayanan et al. 2021, eq. 1-2)
BUBBLE_SHRINK = 2.0


def pipeline_bubble(f: RankFacts) -> Finding | None:
    """A pipeline stage waits inside its send/recv for its neighbours' activations and gradients: the schedule's
    bubble (and unequal stages, which the straggler rule names and prices first). Priced as every send/recv kernel
    of the rank BUBBLE_SHRINK times shorter (replayed), a wait removed by a schedule setting, as the schedule's law
    gives it (within 0.3 pp of (p - 1) / (m + p - 1) halved on simulated GPipe jobs, benchmarks/pipeline_bubble.py);
    smaller micro-batches running less efficiently are not priced, nor overlapping the transfers themselves. Beside
    a slow stage (the job's compute straggler) the other stages' send/recv also holds their wait for it, which no
    schedule setting halves: the gain is then an upper bound, ranked after the slow stage's. The send/recv's own
    exposed time decides (> EXPOSED_COMM_MIN_PCT), beside other collectives' (exposed_comm's, priced after it:
    findings.BROADER_FIX) when those take most of the communication time."""
    share = _exposed_comm_pct(f, f.p2p_overlap)
    if share <= EXPOSED_COMM_MIN_PCT or not f.pipeline_stage or not f.p2p_rows.size:
        return None
    ov, w = f.p2p_overlap, f.window
    metrics = {"exposed_send_recv": (ov.exposed_us, "us"), "exposed_send_recv_share": (share, "% of window"),
               "send_recv_time": (float((w.end_us[f.p2p_rows] - w.ts_us[f.p2p_rows]).sum()), "us"),
               "point_to_point_share": (100.0 * f.p2p_comm_share, "% of comm"), "overlap": (ov.overlap_pct, "%")}
    sc = f.schedule
    if sc.micro_batches:
        metrics["micro_batches_per_step"] = (sc.micro_batches, "count")
    if sc.chunks > 1:
        metrics["model_chunks_per_rank"] = (sc.chunks, "count")
    law = ""
    # what a balanced schedule of these stages would idle (the rest is unequal stages, transfers); not for a
    # zero-bubble schedule (backwards split in halves), whose idle the law overstates
    if f.pipeline_stages and not sc.split_backward:
        metrics["pipeline_stages"] = (f.pipeline_stages, "count")
        if sc.micro_batches:
            law_pct = schedule_bubble_pct(f.pipeline_stages, sc.micro_batches, sc.chunks)
            metrics["schedule_bubble"] = (law_pct, "% of step")
            law = advice.BUBBLE_LAW.format(p=f.pipeline_stages, m=sc.micro_batches, law=law_pct, share=share,
                                           chunks=advice.BUBBLE_CHUNKS.format(v=sc.chunks) if sc.chunks > 1 else "")
        else:
            implied = implied_micro_batches(f.pipeline_stages, share)
            metrics["implied_micro_batches"] = (implied, "count")
            law = advice.BUBBLE_IMPLIED.format(p=f.pipeline_stages, m=implied, share=share, p4=4 * f.pipeline_stages)
    metrics.update(_rate_metrics(f.p2p_transfer))  # the send/recv's own rate: a stage's transfers between nodes
    s = f.straggler
    slow_stage = s is not None and any(r >= STRAGGLER_MIN_COMPUTE_RATIO for r in s.compute_group_ratio.values())
    shrink = Change("shrink_bubble", factor=BUBBLE_SHRINK, rows=tuple(int(r) for r in f.p2p_rows))
    what_if = (f"the bubble {BUBBLE_SHRINK:g}x smaller: twice the micro-batches per step, or an interleaved schedule "
               "with 2 model chunks per rank")
    if slow_stage:
        what_if += " (with the slow stage's waits in it: upper bound)"
    found = F.rank_finding(f, "pipeline_bubble", metrics, (), (shrink,), what_if, evidence_pct=share,
                           upper_bound=slow_stage)
    found.recommendation = _slow_transfer_prefix(f.p2p_transfer) + law + found.recommendation
    return found


# the share of the links' rate below which the collectives' transfer is named slow (collectives.transfer_rate:
# their time at the links' rates, plus NCCL's fixed cost, over the time they took): a third, stated, not fitted (no
# labeled case has a slow transport). NCCL's large messages reach ~0.8 of the link (nccl-tests' bus bandwidth on
# NVLink and InfiniBand) and the fixed cost covers small ones; HTA's 2-GPU A100 all-reduces of 26 MB over the LL
# protocol (NVLink 300 GB/s) take 1.7-6 ms where 0.1 ms would do: 6 %
SLOW_TRANSFER_SHARE = 1.0 / 3.0


# --- kernels ----------------------------------------------------------------------------------

MEMORY_BOUND_BUSY_PCT = 25.0  # elementwise + reduction kernels, % of device busy time


def _not_fusable_share(f: RankFacts) -> float:
    """% of device time (the denominator of RankFacts.category_share) in elementwise and reduction kernels no fusion
    removes (fusion.not_fusable)."""
    t, w = f.table, f.window
    rows = w.device[t.kind[w.device] != GPU_SYNC]
    dur = w.end_us[rows] - w.ts_us[rows]
    kept = np.isin(t.name[rows], t.ids_matching(not_fusable)) & np.isin(t.category[rows], (ELEMENTWISE, REDUCTION))
    total = float(dur.sum())
    return 100.0 * float(dur[kept].sum()) / total if total > 0 else 0.0


def memory_bound_unfused(f: RankFacts) -> Finding | None:
    """Elementwise and reduction kernels (memory-bound, fusable) take a large share of the GPU; kernels a compiler
    already fused and a convolution's layout conversions (layout_transposes') are not counted (fusion.not_fusable).

    Priced by its own evidence, an upper bound: each chain of them back to back on a stream fused (fusion.
    fusion_chains: the chain's reductions, or its longest kernel, kept; the others neither launched nor run), and,
    with the recorded shapes and a known device, the kernels left moving their bytes at the HBM peak instead of the
    bandwidth they achieve (roofline), i.e. sped up 100 / hbm_pct times. With neither, unpriced (low)."""
    if not f.has_gpu:
        return None
    share = f.category_share("elementwise") + f.category_share("reduction_norm") - _not_fusable_share(f)
    if share <= MEMORY_BOUND_BUSY_PCT:
        return None
    top = [(f"[{k} launches] {n}", t0, d) for c in f.categories if c.category in ("elementwise", "reduction_norm")
           for n, d, k, t0 in c.top_kernels if not not_fusable(n)]
    busy_pct = 100.0 - f.breakdown.idle_pct
    metrics = {"elementwise_and_reduction": (share, "% of busy")}
    fused = fusion_chains(f)
    changes, what = [], []
    if fused.removed.size:
        metrics.update(fusable_chains=(fused.chains, "count"), kernels_in_chains=(fused.kernels, "count"),
                       kernels_fusion_removes=(int(fused.removed.size), "count"),
                       their_time=(fused.removed_us, "us"))
        changes.append(Change("fuse_kernels", rows=tuple(int(r) for r in fused.removed)))
        top = fused.largest + top  # the chains fusion folds most of, then the longest kernels
        what.append(f"each chain of elementwise and reduction kernels fused into its reductions or its longest "
                    f"kernel ({fused.removed.size} of {fused.kernels} kernels gone)")
    hbm = f.memory_bound_hbm_pct()
    factor = max(100.0 / hbm, 1.0) if hbm else 1.0
    if hbm:
        metrics["achieved_bandwidth"] = (hbm, "% of HBM peak")
        changes += [Change("speedup", ELEMENTWISE, factor), Change("speedup", REDUCTION, factor)]
        what.append(f"elementwise and reduction kernels at the HBM peak ({factor:.2g}x faster)")
    if not changes:
        return F.rank_finding(f, "memory_bound_unfused", metrics, top[:4],
                              what_if="not priced: no chain of kernels to fuse, and the achieved bandwidth needs the "
                                      "operators' shapes (record_shapes=True) and the device (deviceProperties)",
                              evidence_pct=share * busy_pct / 100.0)
    # the kernels fusion removes, and the rest of the memory-bound time at the HBM peak
    gone_pct = f.pct(fused.removed_us)
    left_pct = max(share * busy_pct / 100.0 - gone_pct, 0.0)
    return F.rank_finding(f, "memory_bound_unfused", metrics, top[:4], tuple(changes), "; ".join(what),
                          evidence_pct=gone_pct + left_pct * (1.0 - 1.0 / factor))


OPTIMIZER_BUSY_PCT = 10.0  # unfused optimizer kernels, % of device busy time
# a foreach optimizer's update in one fused kernel: AdamW's foreach path makes ~7 passes over its tensors (lerp, mul,
# addcmul, sqrt, div, add, addcdiv), each reading and writing, where one fused pass reads p, g, m, v once
OPTIMIZER_SPEEDUP = 3.0
# kernels that already do an optimizer's whole update in one pass, memory-bound: nothing left to fuse. PyTorch's
# fused=True (FusedAdamMathFunctor, FusedSgdMathFunctor, ... over FusedOptimizerTensorListMetadata), apex / DeepSpeed /
# Transformer Engine FusedAdam and FusedLAMB (multi_tensor_adam.cu: AdamFunctor, LAMBStage1Functor), and Inductor's
# compiled optimizer (triton_*fused* kernels)
FUSED_OPTIMIZER_RE = re.compile(r"Fused\w*Functor|FusedOptimizer|multi_tensor_(adam|lamb|sgd|novograd)|AdamFunctor"
                                r"|LAMBStage|triton_\w*fused", re.I)
# PyTorch's foreach kernels (torch.optim's default on CUDA, foreach=True): one multi_tensor_apply launch per pass over
# a chunk of tensors (multi_tensor_apply_kernel<...>), several passes a step
FOREACH_OPTIMIZER_RE = re.compile(r"multi_tensor_apply_kernel", re.I)
OPTIMIZER_PHASE_PCT = 10.0        # optimizer step / zero_grad spans, % of the span ...
OPTIMIZER_PHASE_IDLE_SHARE = 0.5  # ... in which the device idles for most of the time: a host-bound optimizer


def _optimizer_phase_us(f: RankFacts) -> tuple[float, float]:
    """(time inside the optimizer's step / zero_grad spans, the device's idle time inside them), µs."""
    t, w = f.table, f.window
    rows = span_rows(t, w, OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))
    s, e = merge_intervals(w.ts_us[rows], w.end_us[rows])
    return float((e - s).sum()), float(sum(idle_in_span_us(w, a, b) for a, b in zip(s, e)))


def _optimizer_small_launches(f: RankFacts) -> np.ndarray:
    """Host nodes (bool per graph node) that launch a small kernel (launch.small_kernel_mask) inside the optimizer's
    step / zero_grad spans on its thread: a per-parameter optimizer's per-tensor kernels (a foreach or fused one launches
    multi_tensor_apply kernels, which are not small kernels)."""
    g = f.graph
    spans = span_rows(f.table, f.window, OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))
    nodes = np.flatnonzero(g.is_host & g.small_launch)
    out = np.zeros(g.start.size, bool)
    out[nodes[starts_inside(f.table, spans, g.rows[nodes])]] = True
    return out


# optimizers that precondition the gradient with per-layer matrices (roots or inverses of second-moment statistics,
# Newton-Schulz orthogonalisation), whose step is matrix work that a fused elementwise kernel does not touch; named by
# the optimizer class in PyTorch's step span ("Optimizer.step#Shampoo.step")
PRECONDITIONED_OPTIMIZER_RE = re.compile(r"Shampoo|SOAP|K-?FAC|Muon|Sophia|AdaHessian|PSGD", re.I)


def _preconditioned_optimizer(f: RankFacts) -> bool:
    """Whether one of the window's optimizer spans names a preconditioned optimizer (PRECONDITIONED_OPTIMIZER_RE)."""
    t = f.table
    rows = span_rows(t, f.window, OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))
    return bool(np.isin(t.name[rows], t.ids_matching(PRECONDITIONED_OPTIMIZER_RE.search)).any())


def optimizer_slow(f: RankFacts) -> Finding | None:
    """optimizer_slow's finding (_optimizer_slow), its fix the preconditioned optimizers' where the step span names one
    (PRECONDITIONED_OPTIMIZER_RE: computing preconditioners less often and across ranks, not fusing elementwise
    kernels)."""
    found = _optimizer_slow(f)
    if found is not None and _preconditioned_optimizer(f):
        found.recommendation = advice.PRECONDITIONED_OPTIMIZER_RECOMMENDATION
    return found


def _optimizer_slow(f: RankFacts) -> Finding | None:
    """A per-parameter optimizer whose per-tensor tiny kernels, launched one by one, cost the host a large share of
    the span (priced as fused: fuse_optimizer); or the optimizer's unfused kernels take a large share of the GPU
    (a foreach optimizer's passes, a per-parameter one's kernels; a fused optimizer's, FUSED_OPTIMIZER_RE, have
    nothing left to fuse); or the optimizer's phase is a large share of the step and the device idles through
    most of it: its host work (a Python loop, Shampoo's or a sharded optimizer's bookkeeping) paces the step (audit
    P10: MTIA training 4.36 s of a 13.3-s step at 20 % device busy; trace_filter's Shampoo ~200 of 607 ms). That
    last case is not priced: no what-if replays only the host work inside the optimizer's spans."""
    if not f.has_gpu:
        return None
    # a per-parameter optimizer: its per-tensor tiny kernels cost the host a large share of the span (their launches,
    # the call and the usual dispatch: launch_cost_us); priced as fused (fuse_optimizer), before small_kernels
    per_tensor = _optimizer_small_launches(f)
    cost = launch_cost_us(f, per_tensor) if per_tensor.any() else 0.0
    if f.pct(cost) > OPTIMIZER_PHASE_PCT:
        phase_us, idle_us = _optimizer_phase_us(f)
        metrics = {"optimizer_small_kernel_launches": (int(per_tensor.sum()), "count"),
                   "their_host_cost": (cost, "us"), "their_host_cost_share": (f.pct(cost), "%"),
                   "optimizer_phase": (f.pct(phase_us), "%"),
                   "optimizer_phase_gpu_idle": (100.0 * idle_us / max(phase_us, 1e-9), "% of it")}
        fused = Change("fuse_optimizer", rows=tuple(int(r) for r in f.graph.rows[per_tensor]))
        return F.rank_finding(f, "optimizer_slow", metrics, f.optimizer.longest[:3], (fused,),
                              "the optimizer's per-tensor kernels fused (foreach / fused=True: a few launches per "
                              "step)", evidence_pct=f.pct(cost))
    g = f.graph
    optimizer = np.flatnonzero(~g.is_host & ~g.before_window & (g.category == OPTIMIZER))
    unfused = optimizer[~np.isin(f.table.name[g.rows[optimizer]], f.table.ids_matching(FUSED_OPTIMIZER_RE.search))]
    optimizer_us = float(g.dur[optimizer].sum())
    share = f.category_share("optimizer") * float(g.dur[unfused].sum()) / optimizer_us if optimizer_us > 0 else 0.0
    if share <= OPTIMIZER_BUSY_PCT:
        phase_us, idle_us = _optimizer_phase_us(f)
        if f.pct(phase_us) <= OPTIMIZER_PHASE_PCT or idle_us <= OPTIMIZER_PHASE_IDLE_SHARE * phase_us:
            return None
        metrics = {"optimizer_phase": (f.pct(phase_us), "%"),
                   "optimizer_phase_gpu_idle": (100.0 * idle_us / phase_us, "% of it"),
                   "optimizer_kernels": (share, "% of busy")}
        found = F.rank_finding(f, "optimizer_slow", metrics, f.optimizer.longest[:3],
                               what_if="not priced: the optimizer's host work paces the step (the device idles "
                                       "through most of its phase); a fused or foreach optimizer cuts it",
                               evidence_pct=f.pct(idle_us))
        if optimizer_on_host(f):  # its update on the CPU: fusing GPU kernels is no fix
            found.what_if = "not priced: the optimizer's update runs on the CPU (its step launches no kernel) while " \
                            "the device idles through most of its phase"
            found.recommendation = advice.HOST_OPTIMIZER_RECOMMENDATION
        return found
    top = [(f"[{k} launches] {n}", t0, d) for c in f.categories if c.category == "optimizer"
           for n, d, k, t0 in c.top_kernels if not FUSED_OPTIMIZER_RE.search(n)]
    busy_pct = 100.0 - f.breakdown.idle_pct
    metrics = {"optimizer_kernels": (share, "% of busy"),
               "fused_optimizer_kernels": (f.category_share("optimizer") - share, "% of busy"),
               "optimizer_host_spans": (f.pct(f.optimizer.time_us), "%")}
    faster = Change("speedup_rows", factor=OPTIMIZER_SPEEDUP, rows=tuple(int(r) for r in g.rows[unfused]))
    # upper bound: a factor chosen, not measured (misaligned_gemm's speedup_rows is measured)
    found = F.rank_finding(f, "optimizer_slow", metrics, top, (faster,),
                           f"unfused optimizer kernels {OPTIMIZER_SPEEDUP:g}x faster (fused)",
                           evidence_pct=share * busy_pct / 100, upper_bound=True)
    names = f.table.name[g.rows[unfused]]
    foreach = float(g.dur[unfused][np.isin(names, f.table.ids_matching(FOREACH_OPTIMIZER_RE.search))].sum())
    if foreach > 0.5 * float(g.dur[unfused].sum()):  # mostly foreach already: "use foreach" is no fix
        found.recommendation = advice.FOREACH_OPTIMIZER_RECOMMENDATION
    return found


# --- what is left -----------------------------------------------------------------------------

IDLE_GPU_PCT = 30.0
# a device idle gap no launch pace makes (µs): a launch costs the host 5-30 us (per-launch cost 9-32 us on the H200
# and HTA traces), so 1 ms or more between device events is the host away from launching (a data fetch, a read that
# synchronises, logging, a checkpoint), not its launching falling behind. Stated, not fitted: no labeled idle_gpu case
LONG_IDLE_GAP_US = 1000.0
# the host causes of a GPU's idle: the host-bound kinds (small_kernels' launches among them: the host launching tiny
# kernels one after another is what leaves the GPU idle) and the stalls that block the host
_IDLE_EXPLAINED_BY = ("launch_bound", "host_work", "small_kernels", "data_loader_stall", "host_sync", "allocator_stall",
                      "pageable_copy", "checkpoint_stall", "compile_stall", "gc_stall")


def _explains_idle(x: Finding) -> bool:
    # a host-bound optimizer phase (optimizer_slow's evidence of device idle inside it) explains idle too
    return x.kind in _IDLE_EXPLAINED_BY or "optimizer_phase_gpu_idle" in x.evidence["metrics"]


def idle_gpu(f: RankFacts, found: list[Finding]) -> Finding | None:
    """The GPU idles for a large share of the window and no other rule explains why. Warm-up calls inside the window
    (evidence.warmup_calls: a first launch loading its kernel, a library's initialisation) explain as much idle as
    they last: a steady step does not pay them, and the warm-up caveat names them (HTA's MI250 step: 63 % idle, 6.5
    ms of its 9.7 in one first hipLaunchKernel). Its evidence and fix say where the idle lies: mostly in gaps of
    LONG_IDLE_GAP_US or more (the host away from launching), or in the short gaps between kernels (its launching
    behind the GPU), what a trace without host activity can still tell."""
    if not f.has_gpu:
        return None
    idle_pct = gpu_idle_pct(f)
    if idle_pct <= IDLE_GPU_PCT or any(_explains_idle(x) for x in found):
        return None
    warm_pct = f.pct(warmup_us(f))
    # the idle with work queued, where that finding was made, is explained by it
    queued_pct = sum(x.evidence["metrics"]["idle_with_work_queued_share"]["value"] for x in found
                     if x.kind == "idle_with_work_queued")
    if idle_pct - warm_pct - queued_pct <= IDLE_GPU_PCT:
        return None
    hp, kp, op = f.idle.pct()
    # over the span whose idle passed the gate: the steps' host window where more of it idles than the device span
    over_steps = (f.step_idle_pct or 0.0) > f.breakdown.idle_pct
    gaps = idle_gaps_us(f.window, f.host_window_start_us, f.host_window_start_us + f.host_window_us) if over_steps \
        else idle_gaps_us(f.window)
    long = gaps[gaps >= LONG_IDLE_GAP_US]
    long_share = 100.0 * float(long.sum()) / float(gaps.sum()) if gaps.sum() > 0 else 0.0
    metrics = {"gpu_idle": (f.breakdown.idle_pct, "%"), "gpu_idle_over_steps": (f.step_idle_pct or 0.0, "%"),
               "host_wait": (hp, "% of idle"), "kernel_wait": (kp, "% of idle"), "other": (op, "% of idle"),
               "idle_in_gaps_of_1_ms_or_more": (long_share, "% of idle"), "gaps_of_1_ms_or_more": (long.size, "count")}
    where = ""
    if f.steps:
        metrics["gaps_of_1_ms_or_more_per_step"] = (long.size / len(f.steps), "count")
        where = f", {long.size / len(f.steps):.3g} a step"
    if warm_pct > 0:
        metrics["warm_up_calls"] = (warm_pct, "% of window")
    x = F.rank_finding(f, "idle_gpu", metrics, severity="medium")
    n = "one gap" if long.size == 1 else f"{long.size} gaps"
    x.recommendation = (advice.IDLE_LONG_GAPS.format(n=n, where=where, share=long_share) if long_share >= 50.0
                        else advice.IDLE_SHORT_GAPS.format(share=100.0 - long_share)) + x.recommendation
    return x


def gpu_analyses_skipped(f: RankFacts) -> Finding | None:
    """The rank has no device events: only host-side rules ran. In a file cut before its end (kineto.read_kineto's
    "truncated"), the device events may be in the part lost (Kineto writes them after the host's operators)."""
    if f.has_gpu:
        return None
    x = F.rank_finding(f, "gpu_analyses_skipped", {"device_events": (0, "count")}, severity="low")
    if f.table.metadata.get("truncated"):
        x.recommendation = advice.CUT_FILE_RECOMMENDATION
    return x


# misaligned_gemm (diagnose/gemm_shapes.py): 16-bit GEMMs whose row lengths break the tensor cores' alignment;
# slow_gemm (diagnose/slow_gemm.py): aligned ones far slower than the planner's model of their shape on the device;
# layout_transposes (diagnose/layout.py): NCHW <-> NHWC conversions around the convolutions (channels_last);
# fp32_matmul (diagnose/precision.py): fp32 GEMMs/convolutions on a tensor-core accelerator, and unfused_attention
# (diagnose/attention.py): attention written out of separate operators, and unfused_cross_entropy (diagnose/loss.py):
# a cross-entropy's log-softmax and NLL as separate kernels, both before the general fusion rule;
# recompute_overhead (diagnose/recompute.py): the forward re-run in the backward (activation checkpointing);
# exposed_memcpy (diagnose/copies.py): host-link copies no computation hides and no host call blocked on;
# grad_sync_per_microbatch (diagnose/grad_sync.py): gradients synchronised before more are accumulated into them;
# ddp_buffer_broadcast, ddp_gradient_copies and ddp_unused_parameter_search (diagnose/ddp.py): DDP's own per-step
# work a constructor argument removes; unbucketed_gradients (diagnose/unbucketed.py): gradients all-reduced one small
# message at a time;
# straggler and load_imbalance (diagnose/stragglers.py): ranks waiting for others at collectives;
# launch_bound, host_work and small_kernels (diagnose/host_bound.py): the GPU waiting for the host;
# graph_breaks (diagnose/graph_breaks.py): torch.compile's graph broken inside the step;
# devices_take_turns (diagnose/devices.py): the GPUs one process drives running one after another;
# idle_with_work_queued (diagnose/queued_idle.py): the GPU idle while launched work waits for what the trace lacks;
# comm_contention (diagnose/contention.py): computation slowed by the communication beside it
RULES = (data_loader_stall, checkpoint_stall, compile_stall, gc_stall, host_sync, pageable_copy, allocator_stall,
         exposed_memcpy, grad_sync_per_microbatch, ddp_buffer_broadcast, ddp_gradient_copies,
         ddp_unused_parameter_search, unbucketed_gradients, exposed_comm, comm_contention, pipeline_bubble,
         devices_take_turns,
         straggler, load_imbalance, idle_with_work_queued,
         launch_bound, host_work, small_kernels, graph_breaks, fp32_matmul, misaligned_gemm, slow_gemm,
         layout_transposes, unfused_attention, unfused_cross_entropy, memory_bound_unfused, recompute_overhead,
         optimizer_slow, gpu_analyses_skipped)


def run_rules(f: RankFacts) -> list[Finding]:
    """Every rule on one rank's facts (idle_gpu last: it names idle time no other finding explains); in a
    forward-only loop a kind's default fix is the inference one (advice.INFERENCE_RECOMMENDATIONS), also after a
    prefix a rule put before it (HOST_TO_DEVICE_SYNC_RECOMMENDATION); a host-bound kind's fix in one PyTorch process
    driving several GPUs side by side starts with a process per GPU (advice.ONE_HOST_FOR_SEVERAL_GPUS); the advice to
    name unnamed host work is the trace's profiler's (advice.NAMING_ADVICE)."""
    found = [x for x in (rule(f) for rule in RULES) if x is not None]
    rest = idle_gpu(f, found)
    found += [rest] if rest else []
    return _adapted(f, found)


def idle_left_by_dismissed(f: RankFacts, kept: list[Finding], dismissed: list[str]) -> Finding | None:
    """idle_gpu over the findings that outlived the pricing (kept), where only a finding dismissed as gaining under
    MIN_GAIN_PCT (dismissed: kinds) had explained the idle: a host sync whose removal gains 0.03 % does not explain
    why the GPU idles 60 % of the window. None where idle_gpu was already found or a kept finding explains the idle."""
    if not any(k in _IDLE_EXPLAINED_BY for k in dismissed) or any(x.kind == "idle_gpu" for x in kept):
        return None
    x = idle_gpu(f, kept)
    return _adapted(f, [x])[0] if x is not None else None


def _adapted(f: RankFacts, found: list[Finding]) -> list[Finding]:
    """found with each fix told for this loop and trace (run_rules' docstring says how)."""
    if f.loop == "inference":
        for x in found:
            default = advice.RECOMMENDATIONS.get(x.kind, "")
            # after a rule's prefix too
            if x.kind in advice.INFERENCE_RECOMMENDATIONS and x.recommendation.endswith(default):
                x.recommendation = x.recommendation[:-len(default)] + advice.INFERENCE_RECOMMENDATIONS[x.kind]
    if pytorch_process_side_by_side(f):  # one host for every GPU: the host-bound fixes start with a host per GPU
        for x in found:
            if x.kind in F.HOST_BOUND_KINDS:
                x.recommendation = advice.ONE_HOST_FOR_SEVERAL_GPUS + " " + x.recommendation
    mem = f.device_memory
    if mem is not None and f.loop != "inference":  # a training loop's memory headroom, where its fix asks for it
        for x in found:
            said = (batch_room_text(mem) if x.kind in F.HOST_BOUND_KINDS and "batch size" in x.recommendation
                    else headroom_text(mem) if x.kind == "recompute_overhead" else None)
            x.recommendation += " " + said if said else ""
    naming = advice.NAMING_ADVICE.get(f.table.metadata.get("producer", ""))
    if naming:  # the way to name unnamed host work in this profiler
        for x in found:
            x.recommendation = x.recommendation.replace(advice.DEFAULT_NAMING_ADVICE, naming)
    return found
