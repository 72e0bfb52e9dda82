"""The finding rules: one function per kind, each reading one rank's RankFacts, thresholds beside it.

A rule decides whether its problem is present from the evidence and names the what-if changes of
its fix; it never computes a gain itself. `findings.rank_by_marginal_gain` replays the changes and
credits each finding with its marginal gain. Thresholds are shares of the rank's replayed span
(% of step time) unless named otherwise; they are provisional until `trainperf evaluate` scores
them on the labeled corpus.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.attention import unfused_attention
from trainperf.diagnose.copies import exposed_memcpy
from trainperf.diagnose.collectives import TransferRate
from trainperf.diagnose.evidence import SAMPLED_IDS_PER_CALL, is_sampled
from trainperf.diagnose.facts import RankFacts, StragglerFacts
from trainperf.diagnose.fusion import fusion_chains, not_fusable
from trainperf.diagnose.gemm_shapes import misaligned_gemm
from trainperf.diagnose.gpu_time import Overlap, idle_in_span_us, idle_in_spans_us
from trainperf.diagnose.grad_sync import grad_sync_per_microbatch
from trainperf.diagnose.host import OPTIMIZER_RE, span_rows
from trainperf.diagnose.layout import layout_transposes
from trainperf.diagnose.launch import SMALL_KERNEL_US
from trainperf.diagnose.precision import fp32_matmul
from trainperf.diagnose.pipeline import implied_micro_batches, schedule_bubble_pct
from trainperf.diagnose.recompute import recompute_overhead
from trainperf.diagnose.replay import (BLOCK_COMM, BLOCK_PAGEABLE, BLOCK_SYNC, Change, Graph, blocked_us,
                                       dispatch_taken, host_work_us, one_off_first_calls)
from trainperf.diagnose.slow_gemm import slow_gemm
from trainperf.diagnose.window import covered_length, merge_intervals
from trainperf.trace.annotate import STEP_RE
from trainperf.trace.categories import copy_direction
from trainperf.trace.events import (CPU_OP, ELEMENTWISE, GPU_SYNC, MEMCPY, OPTIMIZER, PYTHON, REDUCTION,
                                    RUNTIME, USER_ANNOTATION)
from trainperf.trace.nesting import outermost, starts_inside, thread_key

Finding = F.Finding


def _make(f: RankFacts, kind: str, metrics: dict, events=(), changes: tuple = (), what_if: str = "",
          evidence_pct: float | None = None, ranks=None, severity: str | None = None, gain_pct: float | None = None,
          gain_us: float = 0.0, upper_bound: bool = False) -> Finding:
    return F.make(kind, ranks if ranks is not None else [f.rank], f.steps, metrics, events, gain_pct, gain_us,
                  what_if, severity=severity, changes=changes, evidence_pct=evidence_pct, upper_bound=upper_bound)


# --- host waits -------------------------------------------------------------------------------

DATALOADER_MIN_PCT = 1.0  # DataLoader spans, % of the span


def _stall_metrics(f: RankFacts, spans, what: str, extra: dict | None = None) -> dict:
    """A named host stall's evidence: its time (µs) and share of the span (%), then ``extra``."""
    return {f"{what}_time": (spans.time_us, "us"), f"{what}_share": (f.pct(spans.time_us), "%"), **(extra or {})}


def _host_stall(f: RankFacts, kind: str, spans, change: str, what: str, label: str = "",
                extra: dict | None = None) -> Finding:
    """A named host stall (DataLoader, checkpoint): priced by replay over HTA's window (the complete steps; a
    one-off save is worth its cost over the steps the window holds, as the corpus truth counts it); the host
    time itself without GPU (an upper bound)."""
    share = f.pct(spans.time_us)
    metrics = _stall_metrics(f, spans, what, extra)
    if not f.has_gpu:  # no replay: the host time itself is the upper bound
        return _make(f, kind=kind, metrics=metrics, events=spans.longest, gain_pct=share, gain_us=spans.time_us,
                     what_if=f"{change} (host only: upper bound)", evidence_pct=share)
    return _make(f, kind, metrics, spans.longest, (Change(change),), f"remove the {label or what} wait",
                 evidence_pct=share)


def data_loader_stall(f: RankFacts) -> Finding | None:
    """The training loop waits for batches (DataLoader spans on the host)."""
    if f.pct(f.dataloader.time_us) <= DATALOADER_MIN_PCT:
        return None
    return _host_stall(f, "data_loader_stall", f.dataloader, "remove_data_wait", "dataloader", "data-loader")


CHECKPOINT_MIN_PCT = 1.0


def checkpoint_stall(f: RankFacts) -> Finding | None:
    """Checkpoint saving blocks the training loop."""
    if f.pct(f.checkpoint.time_us) <= CHECKPOINT_MIN_PCT:
        return None
    return _host_stall(f, "checkpoint_stall", f.checkpoint, "remove_checkpoint_wait", "checkpoint")


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
        return _make(f, "compile_stall", _stall_metrics(f, f.compile, "compile", extra), f.compile.longest,
                     severity="low",
                     what_if=f"warm-up: compilation in the first analysed step ({f.steps[0]}) only, which a "
                             "steady-state step does not pay; profile after it")
    return _host_stall(f, "compile_stall", f.compile, "remove_compile_wait", "compile", "torch.compile", extra=extra)


HOST_SYNC_MIN_PCT = 1.0  # time blocked in syncs, or sync wait on the critical path, % of the span


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
    if not n_calls or max(f.pct(time_us), f.pct(wait_cp)) <= HOST_SYNC_MIN_PCT:
        return None
    # the CPU time of the ops that made the blocking reads (aten::item, .cpu(), ...): it goes with the syncs
    read_us = float(g.gap_syncop[g.syncop_site >= 0].sum() + g.sync_base[blocked & g.in_syncop].sum())
    metrics = {"sync_calls": (n_calls, "count"), "sync_blocking_time": (time_us, "us"),
               "reading_ops_cpu_time": (read_us, "us"),
               "gpu_idle_after_syncs": (sum(x.gpu_idle_after_us for x in f.sync_sites), "us"),
               "sync_wait_on_critical_path": (wait_cp, "us"), "sync_ops": (f.sync_ops.count, "count")}
    for name, (count, cpu_us) in sorted(f.sync_op_counts.items(), key=lambda kv: -kv[1][1])[:4]:
        metrics[f"{name} calls"] = (count, "count")
        metrics[f"{name} cpu_time"] = (cpu_us, "us")
    x = _make(f, "host_sync", metrics, f.sync_calls.longest[:3] + f.sync_ops.longest[:2], (Change("remove_syncs"),),
              "remove host syncs (and the reads that made them)", evidence_pct=f.pct(max(time_us, wait_cp) + read_us))
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
        x.recommendation = F.SYNCHRONOUS_LAUNCH_RECOMMENDATION.format(
            pct=100.0 * in_launches, calls=", ".join(names[:3]), setting=F.SYNCHRONOUS_LAUNCH_SETTINGS[runtime])
    elif to_device >= HOST_TO_DEVICE_SYNC_SHARE:
        x.recommendation = F.HOST_TO_DEVICE_SYNC_RECOMMENDATION.format(pct=100.0 * to_device) + " " + x.recommendation
    return x


# the share of the host's blocking in launches that waited for their own kernel from which the fix is to make launches
# asynchronous again (F.SYNCHRONOUS_LAUNCH_RECOMMENDATION) instead of removing reads: a majority, stated, not fitted
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
    dev = np.unique(g.sync_on[blocked])  # each copy once: its call and the synchronize after it both wait for it
    copy_us = float(g.dur[dev].sum())
    events = sorted(((g.names[int(f.table.name[g.rows[i]])], g.start[i], g.dur[i]) for i in np.flatnonzero(blocked)),
                    key=lambda e: -e[2])[:3]
    return _make(f, "pageable_copy", {"blocking_copies": (int(dev.size), "count"),
                                      "host_blocked": (time_us, "us"), "copy_time": (copy_us, "us"),
                                      "on_critical_path": (f.critical_path.get("pageable_copy", 0.0), "us")},
                 events, (Change("unblock_pageable_copies"),), "host-to-device copies stop blocking the host",
                 evidence_pct=f.pct(time_us))


ALLOCATOR_MIN_PCT = 1.0  # allocator calls and spans, % of the span


def allocator_stall(f: RankFacts) -> Finding | None:
    """Allocations and frees reach the driver (cudaMalloc/cudaFree, hipMalloc/hipFree) inside the step."""
    if not f.has_gpu:
        return None
    g = f.graph
    time_us = float(g.dur[g.is_alloc].sum() + g.gap_allocator.sum())
    if f.pct(time_us) <= ALLOCATOR_MIN_PCT:
        return None
    return _make(f, "allocator_stall", {"allocator_calls": (int(g.is_alloc.sum()), "count"),
                                        "allocator_time": (time_us, "us"),
                                        "on_critical_path": (f.critical_path.get("allocator", 0.0), "us")},
                 f.allocator.longest[:3], (Change("remove_allocator"),), "allocator calls cost nothing (cached)",
                 evidence_pct=f.pct(time_us))


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
    overlap = Change("overlap_comm", rows=tuple(int(r) for r in f.other_comm_rows)) if beside_bubble else \
        Change("overlap_comm")
    found = _make(f, "exposed_comm", metrics, (), (overlap,), "overlap exposed collectives with compute"
                  + (" (mostly send/recv: upper bound)" if p2p else
                     " (only device work waits for them: upper bound)" if bound else ""),
                  evidence_pct=share, upper_bound=bound)
    if scalar > 0.5:  # a majority, as the other kinds'
        found.recommendation = F.EXPOSED_SCALAR_RECOMMENDATION
    elif p2p:
        found.recommendation = F.EXPOSED_RING_RECOMMENDATION if f.p2p_role == "context" else \
            F.EXPOSED_P2P_RECOMMENDATION
    elif all_to_all > 0.5:
        found.recommendation = F.EXPOSED_ALL_TO_ALL_RECOMMENDATION
    elif forward_all_reduce > 0.5:
        found.recommendation = F.EXPOSED_TP_RECOMMENDATION
    elif sharded > 0.5:
        found.recommendation = F.EXPOSED_SHARDED_RECOMMENDATION
    found.recommendation = _slow_transfer_prefix(rate) + found.recommendation
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
    return F.EXPOSED_SLOW_TRANSFER_RECOMMENDATION.format(
        pct=100.0 * rate.link_share, link=rate.link, busbw=rate.busbw_gbps, link_gbps=rate.link_gbps,
        ll=F.SLOW_TRANSFER_LL.format(pct=100.0 * rate.ll_share) if rate.ll_share > 0.5 else "",
        alone="" if rate.partners_seen else F.SLOW_TRANSFER_ONE_RANK) + " "


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
            law = F.BUBBLE_LAW.format(p=f.pipeline_stages, m=sc.micro_batches, law=law_pct, share=share,
                                      chunks=F.BUBBLE_CHUNKS.format(v=sc.chunks) if sc.chunks > 1 else "")
        else:
            implied = implied_micro_batches(f.pipeline_stages, share)
            metrics["implied_micro_batches"] = (implied, "count")
            law = F.BUBBLE_IMPLIED.format(p=f.pipeline_stages, m=implied, share=share, p4=4 * f.pipeline_stages)
    metrics.update(_rate_metrics(f.p2p_transfer))  # the send/recv's own rate: a stage's transfers between nodes
    s = f.straggler
    slow_stage = s is not None and any(r >= STRAGGLER_MIN_COMPUTE_RATIO for r in s.compute_group_ratio.values())
    found = _make(f, "pipeline_bubble", metrics, (),
                 (Change("shrink_bubble", factor=BUBBLE_SHRINK, rows=tuple(int(r) for r in f.p2p_rows)),),
                 f"the bubble {BUBBLE_SHRINK:g}x smaller: twice the micro-batches per step, or an interleaved "
                 "schedule with 2 model chunks per rank" + (" (with the slow stage's waits in it: upper bound)"
                                                            if slow_stage else ""),
                 evidence_pct=share, upper_bound=slow_stage)
    found.recommendation = _slow_transfer_prefix(f.p2p_transfer) + law + found.recommendation
    return found


# the share of the links' rate below which the collectives' transfer is named slow (collectives.transfer_rate:
# their time at the links' rates, plus NCCL's fixed cost, over the time they took): a third, stated, not fitted (no
# labeled case has a slow transport). NCCL's large messages reach ~0.8 of the link (nccl-tests' bus bandwidth on
# NVLink and InfiniBand) and the fixed cost covers small ones; HTA's 2-GPU A100 all-reduces of 26 MB over the LL
# protocol (NVLink 300 GB/s) take 1.7-6 ms where 0.1 ms would do: 6 %
SLOW_TRANSFER_SHARE = 1.0 / 3.0


STRAGGLER_MIN_WAIT_PCT = 2.0  # wait the straggler causes each other rank, % of the window (crossrank decides)


# CPU-only jobs (crossrank.host_straggler) whose window is too short for the test below: the others' per-step
# wait, % of the step, that the recurrence heuristic needs besides. The clean 2-rank gloo run of the corpus
# (healthy-real) waited ~4% per step from ordinary imbalance; the smallest injected straggler (straggler-low-real)
# ~7.5%: in-sample only, 4 cases, not cross-validated. With the steps for the test, the test alone decides
# whether there is a straggler, and its size only how severe it is: a rank late by 4.9 % in every step
# (straggler-low-real-fsdp, p 0.02) is a straggler, one late by 4 % in some steps and early in others is not.
STRAGGLER_HOST_MIN_PCT = 5.0
# ... and its extra work must recur step after step more than load noise makes it (crossrank.straggler_p_value,
# a sign-flip test over the window or its last steps: under "no straggler" each step's extra is as likely
# negative). 0.05: the usual false-alarm rate, stated, not fitted. On a shared machine either rank is slower in
# some steps by the load alone (corpus healthy-real-fsdp, 2026-12-02: +5, +4, -12, +21 ms). The GPU straggler's
# test (crossrank.persistent_laggard: is it the laggard in more steps than ranks taking turns would make it) uses
# the same rate.
STRAGGLER_HOST_ALPHA = 0.05
# With too few steps for the test to pass at all (4 steps of 2 ranks: p >= 0.125), the recurring extra work must
# outweigh the other ranks' opposite excess (crossrank.recurring_over_opposite >= this; 1: as large; not fitted),
# and a caveat says the straggler is unconfirmed (api): a persistent straggler in a short profile stays named.
STRAGGLER_HOST_MIN_SNR = 1.0

# the straggler computes this much longer than the other ranks' median (per step, crossrank.compute_straggler).
# Untouched HTA trace_filter: rank 1 computes 1.28x rank 0, and making it as fast gains < MIN_GAIN_PCT (the
# GPU idles ~80 %): the replayed gain, not this ratio, keeps natural imbalance from being a finding.
STRAGGLER_MIN_COMPUTE_RATIO = 1.05


def extra_work_is_noise(p_value: float, testable: bool, snr: float) -> bool:
    """Whether a CPU-only job's slowest rank's extra work per step is within load noise, so no straggler: the
    sign-flip test (crossrank.straggler_p_value above STRAGGLER_HOST_ALPHA) when the window has the steps for it,
    else the recurrence heuristic (crossrank.recurring_over_opposite below STRAGGLER_HOST_MIN_SNR). GPU ranks whose
    collectives cannot be matched are judged by their computation per step (api._compute_extra_is_noise)."""
    return p_value > STRAGGLER_HOST_ALPHA if testable else snr < STRAGGLER_HOST_MIN_SNR


def straggler(f: RankFacts) -> Finding | None:
    """A rank arrives late at collectives and the others wait for it (decided across ranks). Priced on the
    waiting ranks as their waits removed, and on the straggler itself as its computation as fast as the
    other ranks' median (the job runs at the pace of its slowest rank); the merge keeps the larger."""
    s = f.straggler
    if s is None:
        return None
    if s.host_gain_pct is not None:  # CPU-only job: priced from the other ranks' per-step wait, no replay
        noise = extra_work_is_noise(s.host_p_value, s.host_testable, s.host_snr)
        small = not s.host_testable and s.host_gain_pct < STRAGGLER_HOST_MIN_PCT
        if f.rank != s.rank or noise or small:
            return None
        metrics = {"others_wait_per_step": (s.host_gain_us, "us"), "others_wait_share": (s.host_gain_pct, "%"),
                   "p_value_load_noise": (s.host_p_value, ""), "extra_work_over_opposite": (min(s.host_snr, 1e6), "x")}
        stalls = ""
        if s.host_stalled_steps:  # priced marginal to the DataLoader/checkpoint stalls' fixes (crossrank.host_straggler)
            metrics["steps_with_stall_left_out"] = (s.host_stalled_steps, "count")
            stalls = ", in the steps without a DataLoader or checkpoint stall"
        return _make(f, kind="straggler", metrics=metrics, gain_pct=s.host_gain_pct, gain_us=s.host_gain_us,
                     ranks=[s.rank], evidence_pct=s.host_gain_pct,
                     what_if=f"no rank waits for rank {s.rank} (host only: the others' wait per step{stalls})")
    if s.compute_group_ratio and not s.persistent:
        # a slow pipeline stage beside matched waits that name no one rank: its ranks are the straggler (below), the
        # waits load_imbalance's, and no other rank is named a straggler
        if f.rank not in s.compute_group_ratio:
            return None
    elif not s.persistent:  # the rank the others wait for changes from step to step
        if s.slow_ranks:  # among a group of ranks late in every step: a slow node
            return _slow_ranks(f)
        if paused_not_loaded(s):
            return _paused_hosts(f)
        # one rank's extra work, recurring, holds the waiting (a rank-0 evaluation every few steps): that rank, else
        # load_imbalance
        return _extra_work_rank(f) if _one_recurring_late_rank(s) else None
    metrics = {"caused_wait": (s.caused_us, "us"), "caused_wait_per_other_rank": (s.caused_per_other_us, "us"),
               "compute_imbalance": (s.imbalance_pct, "%"), "compute_vs_other_ranks": (s.compute_ratio, "x"),
               "extra_compute": (s.extra_compute_us, "us")}
    if not s.compute_group_ratio:  # the matched collectives' laggard (the compute straggler's are load_imbalance's)
        if s.last_in_steps:  # in how many of the steps with waits it was the one waited for
            metrics["steps_it_was_waited_for"] = (s.last_in_steps.get(s.rank, 0), "count")
            metrics["steps_with_waits"] = (sum(s.last_in_steps.values()), "count")
        metrics |= _lateness_metrics(s)
    # the straggler computes longer; where collectives cannot be matched, so may the ranks computing alike with it
    # (a slow stage's copies), each priced as its own computation at the other ranks' pace
    ratio = s.compute_group_ratio.get(f.rank, s.compute_ratio if f.rank == s.rank else None)
    if ratio is not None:
        if ratio < STRAGGLER_MIN_COMPUTE_RATIO:
            return None
        metrics["compute_vs_other_ranks"] = (ratio, "x")
        found = _make(f, "straggler", metrics, [], (Change("compute_speedup", factor=ratio),),
                      f"rank {f.rank} computes as fast as the other ranks ({ratio:.2f}x faster)",
                      evidence_pct=f.pct(max(s.caused_per_other_us, s.extra_compute_us)), ranks=[f.rank])
    elif not f.waits:
        return None
    else:
        found = _make(f, "straggler", metrics,
                      # the events are on the straggler's timeline, from its first event: shift them so that
                      # api._relative_times (which subtracts this rank's first event) leaves them as they are
                      [(n, t0 + f.origin_us, d) for n, t0, d in s.events], (Change("remove_straggler_wait"),),
                      f"no rank waits for rank {s.rank} inside collectives",
                      evidence_pct=f.pct(s.caused_per_other_us), ranks=[s.rank])
    if f.p2p_comm_share > 0.5:  # pipeline stages (a majority, as exposed_comm's)
        found.recommendation = F.STRAGGLER_STAGE_RECOMMENDATION
    elif late_without_more_work(s):  # the same computation started late: by its host, or by work queued ahead
        found.recommendation = (F.LATE_HOST_STRAGGLER_RECOMMENDATION if paused_not_loaded(s)
                                else F.QUEUED_WORK_STRAGGLER_RECOMMENDATION).format(rank=s.rank)
    return found


# the late ranks' extra computation accounts for less than this share of their lateness (crossrank.lateness_share):
# they had the same work and started it late; their GPU's extra idle at least this share: their host started it late.
# Half: the midpoint between the two readings, not fitted (no labeled case of either kind)
LATE_WORK_MIN_SHARE = 0.5


def late_without_more_work(s: StragglerFacts) -> bool:
    """Whether the late ranks had no more computation than the others in the steps they were late."""
    return s.late_work_share is not None and s.late_work_share < LATE_WORK_MIN_SHARE


def paused_not_loaded(s: StragglerFacts) -> bool:
    """Whether late ranks started the same work late because their host did: no more computation, and (where the
    steps tell) their GPU's extra idle, waiting for the host, accounts for at least half the lateness (else other
    device work queued ahead delayed them)."""
    return late_without_more_work(s) and (s.late_idle_share is None or s.late_idle_share >= LATE_WORK_MIN_SHARE)


def _lateness_metrics(s: StragglerFacts) -> dict:
    """How much of the late ranks' lateness their extra computation and their GPU's extra idle account for (%)."""
    out = {}
    if s.late_work_share is not None:
        out["lateness_from_extra_compute"] = (100.0 * s.late_work_share, "%")
    if s.late_idle_share is not None:
        out["lateness_from_gpu_idle"] = (100.0 * s.late_idle_share, "%")
    return out


def late_ranks_that_cost(s: StragglerFacts) -> list[int]:
    """The ranks the others waited for, among those that were the last in some step, that caused at least half the
    mean wait caused per such rank (StragglerFacts.laggard_waits): ranks taking turns cause alike and are all
    named; one rank's 6-ms pause in one step, beside jitter laggards of 0.1 ms in the others, is named alone. Half
    the mean: a stated margin for turns that are not even (not fitted; no labeled case of either kind)."""
    caused: dict[int, float] = {}
    for rank, us in s.laggard_waits:
        caused[rank] = caused.get(rank, 0.0) + us
    if not caused:
        return sorted(s.last_in_steps)
    bar = 0.5 * sum(caused.values()) / len(caused)
    return sorted(r for r, us in caused.items() if us >= bar)


def _one_recurring_late_rank(s: StragglerFacts) -> bool:
    """Whether one rank alone caused the waiting that costs (late_ranks_that_cost), and did so in two steps or more
    (steps whose wait for it is at least the mean wait of a step with waits, not jitter): a straggler must recur (as
    the CPU-only test asks, crossrank.straggler_p_value); one long step of one rank is as likely the largest draw of
    unequal work (a long sequence) as work only that rank does."""
    costly = late_ranks_that_cost(s)
    if len(costly) != 1 or not s.laggard_waits:
        return False
    mean = sum(us for _, us in s.laggard_waits) / len(s.laggard_waits)
    return sum(1 for rank, us in s.laggard_waits if rank == costly[0] and us >= mean) >= 2


def _turn_waits(f: RankFacts, kind: str, what_if: str, ranks: list[int] | None = None,
                extra: dict | None = None) -> Finding:
    """The waits of this rank inside matched collectives for ranks that take turns being late, as a finding of
    `kind` naming `ranks` (default: the late ranks whose waits cost, late_ranks_that_cost), with `extra` metrics:
    priced as those waits removed (every rank at the step's mean pace instead of its slowest)."""
    s = f.straggler
    waited = float(sum(v for v, _ in f.waits.values()))
    metrics = {"waited_in_collectives": (waited, "us"), "waited_share": (f.pct(waited), "%"),
               "steps_with_waits": (sum(s.last_in_steps.values()), "count"),
               "compute_imbalance": (s.imbalance_pct, "%")}
    metrics |= _lateness_metrics(s)
    metrics |= {f"steps_rank_{r}_was_waited_for": (n, "count") for r, n in sorted(s.last_in_steps.items())}
    metrics |= extra or {}
    longest = sorted(f.waits.items(), key=lambda kv: -kv[1][0])[:3]
    return _make(f, kind, metrics,
                 [(f"{f.table.names[int(f.table.name[row])][:60]} (waited for rank {other})",
                   float(f.window.ts_us[row]), us) for row, (us, other) in longest],
                 (Change("remove_straggler_wait"),), what_if, evidence_pct=f.pct(waited),
                 ranks=late_ranks_that_cost(s) if ranks is None else ranks)


def _paused_hosts(f: RankFacts) -> Finding | None:
    """Ranks take turns arriving late at collectives with no more computation than the others in those steps: each
    started its work late, its host paused (Python's garbage collector at a different moment on each rank, CPU
    contention, a slow read on that rank). Transient stragglers (the kind a job-wide GC schedule fixes), not
    unequal work."""
    if not f.waits:
        return None
    found = _turn_waits(f, "straggler", "no rank's host pauses before its work: nobody waits in collectives")
    # one rank's pauses hold the waiting (a rank-0 evaluation or log write in one step): what only it does
    found.recommendation = (F.LATE_HOST_STRAGGLER_RECOMMENDATION.format(rank=found.ranks[0]) if len(found.ranks) == 1
                            else F.PAUSED_HOSTS_RECOMMENDATION)
    return found


def _slow_ranks(f: RankFacts) -> Finding | None:
    """A group of ranks late at the collectives step after step, each the last in some steps (StragglerFacts.
    slow_ranks: a slow node, not unequal work per step). Priced, as load imbalance, as this rank's waits inside
    collectives removed: the group as fast as the others."""
    if not f.waits:
        return None
    s = f.straggler
    group = s.slow_ranks
    found = _turn_waits(f, "straggler", f"rank(s) {F.rank_list(group)} as fast as the others: nobody waits in "
                        "collectives",
                        ranks=list(group), extra={"p_value_arrival_order_random": (s.slow_ranks_p_value, "")})
    cause = F.SLOW_RANKS_HOST_CAUSE if paused_not_loaded(s) else F.SLOW_RANKS_DEVICE_CAUSE
    who = f"Ranks {F.rank_list(group)}" if len(group) > 1 else f"Rank {group[0]}"
    found.recommendation = F.SLOW_RANKS_RECOMMENDATION.format(who=who, cause=cause)
    return found


def _extra_work_rank(f: RankFacts) -> Finding | None:
    """One rank, late in some steps with more computation, caused the waiting that costs, in two steps or more
    (_one_recurring_late_rank): work only it does in those steps, a straggler of those steps rather than ranks
    taking turns."""
    if not f.waits:
        return None
    found = _turn_waits(f, "straggler", "no rank does more work than the others in a step: nobody waits in "
                        "collectives")
    found.recommendation = F.EXTRA_WORK_STRAGGLER_RECOMMENDATION.format(rank=found.ranks[0])
    return found


def load_imbalance(f: RankFacts) -> Finding | None:
    """Ranks wait for each other inside matched collectives, but the rank they wait for changes from step to step
    (StragglerFacts.persistent false) and computes more in the steps it is late (or the steps cannot be compared):
    no rank is slow, the ranks get unequal work per step (sequence lengths without packing, MoE routing, uneven
    shards). Priced, like a straggler's waiting ranks, as this rank's waits inside collectives removed."""
    s = f.straggler
    if (s is None or s.persistent or s.slow_ranks or s.host_gain_pct is not None or not f.waits
            or paused_not_loaded(s) or _one_recurring_late_rank(s)):
        return None
    return _turn_waits(f, "load_imbalance", "every rank's work per step balanced: nobody waits in collectives")


# --- host speed -------------------------------------------------------------------------------

LAUNCH_BOUND_IDLE_PCT = 15.0       # GPU idle, % of the device window
LAUNCH_BOUND_HOST_WAIT_SHARE = 0.5  # share of the idle time spent waiting for a launch
LAUNCH_BOUND_HOST_CP_SHARE = 0.3   # host work (cpu + runtime calls) on the critical path, share of the span


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


def launch_bound(f: RankFacts) -> Finding | None:
    """The GPU waits for the host to launch work, and host work between launches is on the critical path.
    Priced by its concrete fix: every kernel launch costs the host nothing (the step captured as a CUDA
    graph), i.e. launches x per-launch cost (launch_cost_us) taken off the host chain and replayed."""
    if not f.has_gpu:
        return None
    idle, tb, ls = f.idle, f.breakdown, f.launch
    hp, _, _ = idle.pct()
    host_cp = f.critical_path.get("cpu", 0.0) + f.critical_path.get("runtime", 0.0)
    if not (idle.host_wait_us > LAUNCH_BOUND_HOST_WAIT_SHARE * max(idle.total_us, 1e-9)
            and gpu_idle_pct(f) > LAUNCH_BOUND_IDLE_PCT and host_cp > LAUNCH_BOUND_HOST_CP_SHARE * f.span_us):
        return None
    g = f.graph
    n = int(g.kernel_launch.sum())
    cost = launch_cost_us(f, g.kernel_launch)
    # what the step cannot go under however fast the host: the profiler slows the host (2x on an H200's launch-bound
    # loop), so a loop whose unprofiled step is no longer than this is not launch-bound without the profiler
    busy_per_step = {"gpu_busy_per_step": (tb.busy_us / len(f.steps) / 1e3, "ms")} if f.steps else {}
    return _make(f, "launch_bound", {
        "gpu_idle": (tb.idle_pct, "%"), "gpu_idle_over_steps": (f.step_idle_pct or 0.0, "%"),
        "idle_waiting_on_host": (hp, "%"),
        "host_on_critical_path": (f.pct(host_cp), "%"), "launch_bound_stretches": (len(f.stretches), "count"),
        "launch_delay_median": (ls.delay_median_us, "us"), "kernel_launches": (n, "count"),
        "per_launch_cost": (cost / n if n else 0.0, "us"), "launch_cost": (cost, "us"), **busy_per_step},
        [("launch-bound stretch (stream %d, %d kernels)" % (x.stream, x.n_kernels), x.start_us, x.end_us - x.start_us)
         for x in f.stretches[:3]], (Change("graph_launches"),),
        "kernel launches cost the host nothing (CUDA graphs)", evidence_pct=f.pct(min(cost, host_cp)))


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


def host_work(f: RankFacts) -> Finding | None:
    """The GPU waits while the thread that launches its work does something else for milliseconds at a time: CPU
    work that launches nothing (a CPU optimizer under ZeRO-Offload, metrics or logging, preprocessing outside the
    DataLoader, Python's garbage collector, untraced Python). launch_bound prices the launches' own cost (the call
    and the usual dispatch before it); this is the rest of the host chain, in gaps of at least host_work_min_gap_us
    beyond that dispatch (replay.host_work_us). Priced as that work gone from the training loop (moved
    to another thread or process, done less often, or onto the device): an upper bound. Not on a sampled or filtered
    trace, whose host gaps are missing events (evidence.is_sampled). Work in one step of several after that step
    copied a model's state to the host (_state_copied_to_host) is a checkpoint save no span names: checkpoint_stall."""
    if not f.has_gpu or is_sampled(f):
        return None
    g = f.graph
    work = host_work_us(g)
    # a gap across which the thread's calls skip many correlation ids lost its events (a trace filtered or sampled
    # in parts, calls added to a sampled one with ids of their own): missing events, not work (as
    # evidence.is_sampled says of a whole trace); ids run backwards only where calls were added
    corr = f.once("call_correlation", lambda: _call_correlation(f, g))  # a table scan: once per rank
    prev = np.clip(g.host_prev, 0, None)
    holed = (g.host_prev >= 0) & (corr >= 0) & (corr[prev] >= 0) & (np.abs(corr - corr[prev]) > SAMPLED_IDS_PER_CALL)
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
    found = _make(f, "checkpoint_stall" if saved else "host_work", metrics, events,
                  (Change("remove_host_work", rows=tuple(int(r) for r in g.rows[long])),),
                  "the host work that launches nothing gone from the loop",
                  evidence_pct=f.pct(cost_us), upper_bound=True)
    if saved is not None:
        found.recommendation = F.UNNAMED_CHECKPOINT_RECOMMENDATION.format(n=len(f.step_times), copies=saved[0],
                                                                          mib=saved[1] / 2**20)
    elif one_off:
        found.recommendation = F.ONE_OFF_HOST_WORK_RECOMMENDATION.format(n=len(f.step_times))
    return found


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


def small_kernels(f: RankFacts) -> Finding | None:
    """Most kernels are tiny, so launching them costs more than running them."""
    if not f.has_gpu:
        return None
    ls, g = f.launch, f.graph
    if ls.small_kernel_count_pct <= SMALL_KERNEL_COUNT_PCT:
        return None
    launch_cost = launch_cost_us(f, g.small_launch)  # the calls and the usual op dispatch before each
    # the GPU idled before them; or, where the host sets the steady pace, it will in a long run by the host step's
    # excess over the device's, which a queue launched before the window hid (as host_work reads it)
    waited_us = max(ls.small_kernel_host_wait_us, min(launch_cost, f.host_excess_us))
    if waited_us <= 0:
        return None
    small_dev = ~g.is_host & (g.launch >= 0) & g.small_launch[np.clip(g.launch, 0, None)]
    # fused into their neighbours, they stop paying a kernel's fixed device cost (Graph.kernel_floor_us)
    device_us = float(np.minimum(g.dur[small_dev], g.kernel_floor_us).sum())
    evidence_us = min(launch_cost, waited_us) + device_us
    metrics = {"small_kernels": (ls.small_kernel_count_pct, "% of kernels"),
               "their_time": (ls.small_kernel_time_pct, "% of kernel time"),
               "gpu_idle_before_them": (ls.small_kernel_host_wait_us, "us"),
               "host_cost_of_their_launches": (launch_cost, "us"), "threshold": (SMALL_KERNEL_US, "us")}
    if waited_us > ls.small_kernel_host_wait_us:  # the window's queue hid it
        metrics["host_step_over_device_step"] = (f.host_step_excess_us, "us")
    return _make(f, "small_kernels", metrics,
                 (), (Change("graph_small_kernels"),),
                 "small kernels fused: their launches cost the host nothing and their own device time goes",
                 evidence_pct=f.pct(evidence_us))


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
        return _make(f, "memory_bound_unfused", metrics, top[:4],
                     what_if="not priced: no chain of kernels to fuse, and the achieved bandwidth needs the operators' "
                             "shapes (record_shapes=True) and the device (deviceProperties)",
                     evidence_pct=share * busy_pct / 100.0)
    # the kernels fusion removes, and the rest of the memory-bound time at the HBM peak
    gone_pct = f.pct(fused.removed_us)
    left_pct = max(share * busy_pct / 100.0 - gone_pct, 0.0)
    return _make(f, "memory_bound_unfused", metrics, top[:4], tuple(changes), "; ".join(what),
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


def optimizer_slow(f: RankFacts) -> Finding | None:
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
        return _make(f, "optimizer_slow", metrics, f.optimizer.longest[:3], (fused,),
                     "the optimizer's per-tensor kernels fused (foreach / fused=True: a few launches per step)",
                     evidence_pct=f.pct(cost))
    g = f.graph
    optimizer = np.flatnonzero(~g.is_host & ~g.before_window & (g.category == OPTIMIZER))
    unfused = optimizer[~np.isin(f.table.name[g.rows[optimizer]], f.table.ids_matching(FUSED_OPTIMIZER_RE.search))]
    optimizer_us = float(g.dur[optimizer].sum())
    share = f.category_share("optimizer") * float(g.dur[unfused].sum()) / optimizer_us if optimizer_us > 0 else 0.0
    if share <= OPTIMIZER_BUSY_PCT:
        phase_us, idle_us = _optimizer_phase_us(f)
        if f.pct(phase_us) <= OPTIMIZER_PHASE_PCT or idle_us <= OPTIMIZER_PHASE_IDLE_SHARE * phase_us:
            return None
        return _make(f, "optimizer_slow", {"optimizer_phase": (f.pct(phase_us), "%"),
                                           "optimizer_phase_gpu_idle": (100.0 * idle_us / phase_us, "% of it"),
                                           "optimizer_kernels": (share, "% of busy")},
                     f.optimizer.longest[:3], what_if="not priced: the optimizer's host work paces the step (the "
                     "device idles through most of its phase); a fused or foreach optimizer cuts it",
                     evidence_pct=f.pct(idle_us))
    top = [(f"[{k} launches] {n}", t0, d) for c in f.categories if c.category == "optimizer"
           for n, d, k, t0 in c.top_kernels if not FUSED_OPTIMIZER_RE.search(n)]
    busy_pct = 100.0 - f.breakdown.idle_pct
    return _make(f, "optimizer_slow", {"optimizer_kernels": (share, "% of busy"),
                                       "fused_optimizer_kernels": (f.category_share("optimizer") - share, "% of busy"),
                                       "optimizer_host_spans": (f.pct(f.optimizer.time_us), "%")},
                 top, (Change("speedup_rows", factor=OPTIMIZER_SPEEDUP, rows=tuple(int(r) for r in g.rows[unfused])),),
                 f"unfused optimizer kernels {OPTIMIZER_SPEEDUP:g}x faster (fused)", evidence_pct=share * busy_pct / 100,
                 upper_bound=True)  # a factor chosen, not measured (misaligned_gemm's speedup_rows is measured)


# --- what is left -----------------------------------------------------------------------------

IDLE_GPU_PCT = 30.0
_IDLE_EXPLAINED_BY = ("launch_bound", "host_work", "data_loader_stall", "host_sync", "allocator_stall",
                      "pageable_copy", "checkpoint_stall", "compile_stall")


def _explains_idle(x: Finding) -> bool:
    # a host-bound optimizer phase (optimizer_slow's evidence of device idle inside it) explains idle too
    return x.kind in _IDLE_EXPLAINED_BY or "optimizer_phase_gpu_idle" in x.evidence["metrics"]


def idle_gpu(f: RankFacts, found: list[Finding]) -> Finding | None:
    """The GPU idles for a large share of the window and no other rule explains why."""
    if not f.has_gpu or gpu_idle_pct(f) <= IDLE_GPU_PCT or any(_explains_idle(x) for x in found):
        return None
    hp, kp, op = f.idle.pct()
    return _make(f, "idle_gpu", {"gpu_idle": (f.breakdown.idle_pct, "%"),
                                 "gpu_idle_over_steps": (f.step_idle_pct or 0.0, "%"), "host_wait": (hp, "% of idle"),
                                 "kernel_wait": (kp, "% of idle"), "other": (op, "% of idle")}, severity="medium")


def gpu_analyses_skipped(f: RankFacts) -> Finding | None:
    """The rank has no device events: only host-side rules ran."""
    if f.has_gpu:
        return None
    return _make(f, "gpu_analyses_skipped", {"device_events": (0, "count")}, severity="low")


# misaligned_gemm (diagnose/gemm_shapes.py): 16-bit GEMMs whose row lengths break the tensor cores' alignment;
# slow_gemm (diagnose/slow_gemm.py): aligned ones far slower than the planner's model of their shape on the device;
# layout_transposes (diagnose/layout.py): NCHW <-> NHWC conversions around the convolutions (channels_last);
# fp32_matmul (diagnose/precision.py): fp32 GEMMs/convolutions on a tensor-core accelerator, and unfused_attention
# (diagnose/attention.py): attention written out of separate operators, before the general fusion rule;
# recompute_overhead (diagnose/recompute.py): the forward re-run in the backward (activation checkpointing);
# exposed_memcpy (diagnose/copies.py): host-link copies no computation hides and no host call blocked on;
# grad_sync_per_microbatch (diagnose/grad_sync.py): gradients synchronised before more are accumulated into them
RULES = (data_loader_stall, checkpoint_stall, compile_stall, host_sync, pageable_copy, allocator_stall, exposed_memcpy,
         grad_sync_per_microbatch, exposed_comm, pipeline_bubble, straggler, load_imbalance, launch_bound, host_work,
         small_kernels, fp32_matmul, misaligned_gemm, slow_gemm, layout_transposes, unfused_attention,
         memory_bound_unfused, recompute_overhead, optimizer_slow, gpu_analyses_skipped)


def run_rules(f: RankFacts) -> list[Finding]:
    """Every rule on one rank's facts (idle_gpu last: it names idle time no other finding explains); in a
    forward-only loop a kind's default fix is the inference one (F.INFERENCE_RECOMMENDATIONS), also after a prefix a
    rule put before it (HOST_TO_DEVICE_SYNC_RECOMMENDATION); the advice to name unnamed host work is the trace's
    profiler's (F.NAMING_ADVICE)."""
    found = [x for x in (rule(f) for rule in RULES) if x is not None]
    rest = idle_gpu(f, found)
    found += [rest] if rest else []
    if f.loop == "inference":
        for x in found:
            default = F.RECOMMENDATIONS.get(x.kind, "")
            if x.kind in F.INFERENCE_RECOMMENDATIONS and x.recommendation.endswith(default):  # after a rule's prefix
                x.recommendation = x.recommendation[:-len(default)] + F.INFERENCE_RECOMMENDATIONS[x.kind]
    advice = F.NAMING_ADVICE.get(f.table.metadata.get("producer", ""))
    if advice:  # the way to name unnamed host work in this profiler
        for x in found:
            x.recommendation = x.recommendation.replace(F.DEFAULT_NAMING_ADVICE, advice)
    return found
