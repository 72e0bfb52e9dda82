"""Activation recomputation in the backward pass, and the `recompute_overhead` finding.

Activation checkpointing (torch.utils.checkpoint, FSDP/torchtitan/Megatron "full" recompute) trades memory for a
second forward pass: the forward of each checkpointed segment runs again inside the backward. In a Kineto trace the
re-run operators are forward operators inside an autograd backward node: the profiler gives an operator a
"Sequence number" when it records an autograd node (grad mode on) and a "Fwd thread id" of 0 when it runs forward;
the backward formula's own operators run with grad mode off (no sequence number) or carry the forward thread's
number (>= 1). Reentrant checkpointing re-runs the segment inside its CheckpointFunctionBackward node, the
non-reentrant kind inside the first backward node that unpacks a saved tensor: both are found the same way (real
torch 2.13 profiles in tests/data/recompute).

The fix a user can make is selective recomputation: keep the outputs of the matrix products and attention (the
costly part to recompute) and recompute the cheap elementwise and normalisation ops (PyTorch's
create_selective_checkpoint_contexts, torchtitan's op-level selective AC, Megatron's selective granularity), or
checkpoint fewer layers. Priced as that: the recomputed GEMM and attention kernels removed. It is an upper bound,
since whether the kept outputs fit in memory is not in the trace.
"""

from __future__ import annotations

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask, forward_op_mask
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.launch import launched_inside
from trainperf.diagnose.replay import Change
from trainperf.diagnose.window import row_events
from trainperf.trace.events import ATTENTION, CPU_OP, GEMM, EventTable
from trainperf.trace.nesting import outermost, row_spans, starts_inside

# recomputed work, % of the span, before it is a finding: the stall rules' 1 % would report every checkpointed
# model, whose recompute is a deliberate memory trade; at 3 % the selective fix (its GEMM share, typically
# 60-90 % of a transformer block's forward) is worth the 2 % where a user starts to act. Not fitted: no labeled
# trace has this kind
RECOMPUTE_MIN_PCT = 3.0
RECOMPUTE_REENTRANT = "CheckpointFunctionBackward"


def recomputed_ops(t: EventTable, keep: np.ndarray) -> np.ndarray:
    """Rows of the outermost forward operators (sequence number, "Fwd thread id" 0) that run inside an autograd
    backward node and repeat an operator of the forward pass (the same name and recorded inputs as an operator
    outside every node), among the rows `keep` marks; empty when the trace does not record forward thread ids. A
    double backward (create_graph=True) records its formula's ops as forward ops inside the nodes too
    (aten::gelu_backward, the mm of a linear's gradient): they repeat nothing the forward ran, but for views such
    as the weight's aten::t, which launch no work."""
    ops = np.flatnonzero(t.kind == CPU_OP)
    is_node = backward_node_mask(t, ops)
    nodes, other = ops[is_node], ops[~is_node]
    if not nodes.size or not other.size:
        return other[:0]
    inside = starts_inside(t, nodes, other)
    cand = other[inside & keep[other] & forward_op_mask(t, other)]
    if not cand.size:
        return cand
    # the forward pass: operators outside every node, at any depth (a reentrant checkpoint runs it inside its
    # CheckpointFunction op and without grad: no sequence numbers there)
    forward = other[~inside]
    ran = set(zip(t.name[forward].tolist(), t.args[forward].tolist()))
    rerun = outermost(t, cand)
    return rerun[[(n, a) in ran for n, a in zip(t.name[rerun].tolist(), t.args[rerun].tolist())]]


def recompute_overhead(f: RankFacts) -> F.Finding | None:
    """The backward re-runs a material share of the forward (activation checkpointing; module docstring).

    GPU: the recomputed kernels' time as evidence; priced by replay with the recomputed GEMM and attention kernels
    removed (selective recomputation; an upper bound: the memory for their outputs is not in the trace). Host only:
    the recomputed operators' host time, unpriced."""
    t, w = f.table, f.window
    ops = f.once("recomputed_ops", lambda: recomputed_ops(t, w.keep))
    if not ops.size:
        return None
    reentrant = int((w.keep & (t.kind == CPU_OP)
                     & np.isin(t.name, t.ids_matching(lambda s: s.endswith(RECOMPUTE_REENTRANT)))).sum())
    metrics = {"recomputed_ops": (ops.size, "count")}
    events = row_events(t, w, ops[:3])
    if not f.has_gpu:
        host_us = float(t.dur_ns[ops].sum()) / 1e3
        if f.pct(host_us) <= RECOMPUTE_MIN_PCT:
            return None
        metrics.update({"recompute_host_time": (host_us, "us"), "recompute_host_share": (f.pct(host_us), "%")})
        x = F.make("recompute_overhead", [f.rank], f.steps, metrics, events, severity="low",
                   what_if="not priced: no device work to replay", evidence_pct=f.pct(host_us))
        x.confidence = "low"
        return x
    kernels = f.once("recomputed_kernels", lambda: launched_inside(t, w, *row_spans(t, ops)))
    dur = w.end_us[kernels] - w.ts_us[kernels]
    total = float(dur.sum())
    if f.pct(total) <= RECOMPUTE_MIN_PCT:
        return None
    costly = np.isin(t.category[kernels], (GEMM, ATTENTION))
    kept_us = float(dur[costly].sum())
    metrics.update({"recompute_kernel_time": (total, "us"), "recompute_kernel_share": (f.pct(total), "%"),
                    "recomputed_gemm_attention_time": (kept_us, "us")})
    if kept_us <= 0:
        return None
    x = F.make("recompute_overhead", [f.rank], f.steps, metrics, events,
               changes=(Change("drop_rows", rows=tuple(int(r) for r in kernels[costly])),),
               what_if="selective recomputation: the recomputed GEMM/attention kernels not re-run (their outputs "
                       "kept; an upper bound: memory permitting)", evidence_pct=f.pct(kept_us), upper_bound=True)
    x.confidence = "medium"
    if reentrant:
        x.notes.append(f"{reentrant} recomputed segments are reentrant checkpoints (CheckpointFunctionBackward)")
    return x
