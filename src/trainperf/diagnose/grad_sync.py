"""Gradients synchronised after every micro-batch of gradient accumulation, and the `grad_sync_per_microbatch`
finding.

With gradient accumulation a step runs several backward passes and one optimizer step. The optimizer needs the
synchronised gradients once, so only the last backward pass before it needs to all-reduce (DDP) or reduce-scatter
(FSDP) them: the sum of the micro-batches' gradients reduced once equals the sum of their reductions. DDP
synchronises after every backward unless the earlier ones run under `model.no_sync()` (FSDP2:
`set_requires_gradient_sync(False)`; DeepSpeed and Lightning do it themselves), a common and costly omission: k
micro-batches move k times the gradient bytes.

How it is found, from the trace alone:
- a backward pass is a run of autograd backward nodes (`autograd::engine::evaluate_function: ...`) with no forward
  operator (a sequence number, "Fwd thread id" 0, outside every node; in a trace whose exporter dropped the
  operator ids, an op of the stepping thread outside every node) starting between two of them;
- a pass's gradient collectives are the all-reduce and reduce-scatter kernels launched inside its nodes (GPU), or
  the all-reduce and reduce-scatter calls (`c10d::allreduce_`, `c10d::_reduce_scatter_base_`, ...) made inside
  them (host only, gloo); FSDP's all-gathers of parameters for the backward are not gradient synchronisation;
  the synchronisation's own spans inside them (SYNC_PATH_RE: FSDP2's `FSDP::post_backward_reduce`, which holds the
  reduce-scatter, its copy-in and the division of the result; DDP's reducer copies and scaling) are the work the
  skipped synchronisation does not do either: their kernels too (GPU), their host time (host only);
- a pass is followed by another pass before the next optimizer step (an `Optimizer.step`/`zero_grad` span) or
  the end of the profiler step: its collectives are redundant. The last pass before each optimizer step keeps them.
Priced by replay with the redundant passes' gradient collectives and the device ops of their synchronisation spans
not run (remove_wasted_rows, ranked with the stalls and before overlapping the collectives: findings.BROADER_FIX):
measured, not assumed, since nothing uses their result and the last pass still reduces the accumulated gradients.
Host only (gloo): the largest of their calls' host time, gloo's transfers for them and their synchronisation spans on
the training thread, an estimate.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask, forward_op_mask
from trainperf.diagnose.crossrank import COLLECTIVE_CALL_RE, GLOO_SPAN_PREFIX, launch_collectives
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.host import OPTIMIZER_RE
from trainperf.diagnose.launch import launched_inside
from trainperf.diagnose.replay import Change
from trainperf.diagnose.window import Window, covered_length, row_events
from trainperf.trace.annotate import step_rows
from trainperf.trace.categories import collective_type
from trainperf.trace.events import COMMUNICATION, CPU_OP, KERNEL, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import outermost, row_spans, starts_inside, thread_key

GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")
# record functions of the gradient synchronisation path, which a pass without synchronisation skips whole (FSDP2
# runs FSDP::post_backward_accumulate instead of FSDP::post_backward_reduce; DDP under no_sync no reducer work)
SYNC_PATH_RE = re.compile(r"^FSDP::post_backward_reduce|reducer::(copy_bucket_to_grad|mul_out)")
# the redundant gradient collectives' time, % of the span. Wasted work with a one-line fix: at the stall rules'
# 1 % (DATALOADER_MIN_PCT, HOST_SYNC_MIN_PCT). Not fitted: no labeled case has this kind
GRAD_SYNC_MIN_PCT = 1.0


def backward_passes(t: EventTable, keep: np.ndarray) -> list[np.ndarray]:
    """The rank's backward passes among the rows `keep` marks, in time order: each the rows of its outermost
    backward nodes (module docstring)."""
    ops = np.flatnonzero((t.kind == CPU_OP) & keep)
    is_node = backward_node_mask(t, ops)
    nodes = outermost(t, ops[is_node]) if is_node.any() else ops[:0]
    if not nodes.size:
        return []
    forward = forward_op_mask(t, ops)
    if not (t.seq[ops] >= 0).any():
        # an exporter that drops the operator ids (sequence number, forward thread id) marks no forward op: the
        # stepping thread's own ops outside every node are then the forward's (the nodes are the autograd engine's;
        # another thread's ops, the DataLoader's pin-memory thread's, may run during a pass)
        steps, _ = step_rows(t)
        if steps.size:
            forward = thread_key(t.pid[ops], t.tid[ops]) == thread_key(t.pid[steps[:1]], t.tid[steps[:1]])[0]
    other = ops[~is_node & forward]
    inside = starts_inside(t, nodes, other)
    forward_starts = np.sort(t.ts_ns[other[~inside]])
    nodes = nodes[np.argsort(t.ts_ns[nodes], kind="stable")]
    pass_of = np.searchsorted(forward_starts, t.ts_ns[nodes])  # forward ops started before each node
    return [nodes[pass_of == p] for p in np.unique(pass_of)]


def _boundaries_ns(t: EventTable, keep: np.ndarray) -> np.ndarray:
    """Sorted times (ns) that close a round of accumulation: optimizer step / zero_grad spans' starts and the
    profiler steps' ends."""
    opt = np.flatnonzero(keep & np.isin(t.name, t.ids_matching(OPTIMIZER_RE.search))
                         & np.isin(t.kind, (USER_ANNOTATION, CPU_OP)))
    steps, _ = step_rows(t)
    return np.sort(np.r_[t.ts_ns[opt], t.ts_ns[steps] + t.dur_ns[steps]])


def _pass_spans(t: EventTable, passes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(start ns, end ns) of each backward pass: its first node's start, its last node's end."""
    return (np.array([t.ts_ns[p].min() for p in passes]),
            np.array([(t.ts_ns[p] + t.dur_ns[p]).max() for p in passes]))


def accumulating_passes(t: EventTable, keep: np.ndarray) -> tuple[list[np.ndarray], int]:
    """(the backward passes whose gradients another pass accumulates into: followed by another before the next
    optimizer step or profiler-step end; the number of passes). A trace without profiler steps or optimizer spans
    has no boundary to tell accumulation by: none."""
    passes = backward_passes(t, keep)
    bounds = _boundaries_ns(t, keep)
    if len(passes) < 2 or not bounds.size:
        return [], len(passes)
    starts, ends = _pass_spans(t, passes)
    nxt = np.searchsorted(bounds, ends)  # the first boundary after each pass
    closes = np.where(nxt < bounds.size, bounds[np.minimum(nxt, bounds.size - 1)], np.iinfo(np.int64).max)
    out = [p for i, p in enumerate(passes) if i + 1 < len(passes) and starts[i + 1] < closes[i]]
    return out, len(passes)


def grad_sync_per_microbatch(f: RankFacts) -> F.Finding | None:
    """Gradient collectives of backward passes whose gradients another pass accumulates into before the optimizer
    step (module docstring)."""
    t, w = f.table, f.window
    early, n_passes = f.once("accumulating_passes", lambda: accumulating_passes(t, w.keep))
    if not early:
        return None
    nodes = np.concatenate(early)
    metrics = {"backward_passes": (n_passes, "count"), "accumulating_passes": (len(early), "count")}
    if not f.has_gpu:
        return _host_only(f, nodes, early, metrics)
    kernels, path = f.once("early_gradient_kernels", lambda: _gradient_kernels(t, w, nodes))
    time_us = float((w.end_us[kernels] - w.ts_us[kernels]).sum())
    if not kernels.size or f.pct(time_us) <= GRAD_SYNC_MIN_PCT:
        return None
    metrics.update({"early_gradient_collectives": (kernels.size, "count"), "early_collective_time": (time_us, "us"),
                    "early_sync_path_ops": (path.size, "count"),
                    "early_sync_path_op_time": (float((w.end_us[path] - w.ts_us[path]).sum()), "us")})
    events = row_events(t, w, kernels[:3])
    return F.make("grad_sync_per_microbatch", [f.rank], f.steps, metrics, events,
                  changes=(Change("remove_wasted_rows", rows=tuple(int(r) for r in np.r_[kernels, path])),),
                  what_if="gradients synchronised once per optimizer step (the earlier passes under no_sync)",
                  evidence_pct=f.pct(time_us))


def sync_path_spans(t: EventTable, w: Window, nodes: np.ndarray) -> np.ndarray:
    """The outermost gradient-synchronisation spans (SYNC_PATH_RE) that start inside the backward nodes `nodes`."""
    spans = np.flatnonzero(w.keep & np.isin(t.kind, (USER_ANNOTATION, CPU_OP))
                           & np.isin(t.name, t.ids_matching(SYNC_PATH_RE.search)))
    inside = starts_inside(t, nodes, spans)
    return outermost(t, spans[inside]) if inside.any() else spans[:0]


def collectives_launched_inside(t: EventTable, w: Window, nodes: np.ndarray, collectives: tuple[str, ...]
                                ) -> np.ndarray:
    """The window's communication kernels of the given collective types (crossrank.launch_collectives) launched inside
    the host spans `nodes` (table rows: backward nodes), as device rows."""
    kernels = launched_inside(t, w, *row_spans(t, nodes))
    kernels = kernels[(t.kind[kernels] == KERNEL) & (t.category[kernels] == COMMUNICATION)]
    if kernels.size:
        kernels = kernels[np.isin(launch_collectives(t, kernels), collectives)]
    return kernels


def _gradient_kernels(t: EventTable, w: Window, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the window's all-reduce and reduce-scatter kernels launched inside the backward nodes `nodes`, the other
    device ops launched inside their synchronisation spans: sync_path_spans' copies and scaling) as device rows."""
    kernels = collectives_launched_inside(t, w, nodes, GRADIENT_COLLECTIVES)
    spans = sync_path_spans(t, w, nodes) if kernels.size else kernels[:0]  # no collective: no synchronisation
    path = launched_inside(t, w, *row_spans(t, spans)) if spans.size else kernels[:0]
    return kernels, np.setdiff1d(path, kernels)


def _gradient_calls(t: EventTable, w: Window, nodes: np.ndarray, early: list[np.ndarray]
                    ) -> tuple[np.ndarray, float, float]:
    """(the outermost all-reduce and reduce-scatter calls made inside the backward nodes `nodes`, their host time
    µs, the time µs of gloo's transfers for them: `gloo:` spans of those collectives starting inside the passes
    `early`, merged)."""
    calls = np.flatnonzero(w.keep & (t.kind == CPU_OP) & np.isin(t.name, t.ids_matching(COLLECTIVE_CALL_RE.search)))
    inside = starts_inside(t, nodes, calls)
    calls = outermost(t, calls[inside]) if inside.any() else calls[:0]
    named = np.where(t.collective[calls] >= 0, t.collective[calls], t.name[calls])  # its arg, else its name
    calls = calls[np.isin([collective_type(t.names[int(n)]) for n in named], GRADIENT_COLLECTIVES)]
    gloo = np.flatnonzero(w.keep & np.isin(t.name, t.ids_matching(lambda s: s.startswith(GLOO_SPAN_PREFIX)))
                          & np.isin(t.name, t.ids_matching(lambda s: collective_type(s) in GRADIENT_COLLECTIVES)))
    starts, ends = _pass_spans(t, early)
    in_pass = ((t.ts_ns[gloo][:, None] >= starts) & (t.ts_ns[gloo][:, None] < ends)).any(axis=1) if gloo.size else \
        np.zeros(0, dtype=bool)
    transfers = gloo[in_pass]
    transfer_ns = covered_length(t.ts_ns[transfers].astype(float), (t.ts_ns + t.dur_ns)[transfers].astype(float))
    return calls, float(t.dur_ns[calls].sum()) / 1e3, transfer_ns / 1e3


def _host_only(f: RankFacts, nodes: np.ndarray, early: list[np.ndarray], metrics: dict) -> F.Finding | None:
    """Host only (gloo): the early passes' gradient collective calls, the transfers gloo runs for them on its own
    threads (`gloo:` spans starting inside those passes) and their synchronisation spans on the training thread
    (sync_path_spans: the calls with their copies and scaling), as time; the largest, unpriced by replay."""
    t, w = f.table, f.window
    calls, call_us, transfer_us = f.once("early_gradient_calls", lambda: _gradient_calls(t, w, nodes, early))
    if not calls.size:
        return None
    spans = sync_path_spans(t, w, nodes)
    path_us = float(t.dur_ns[spans].sum()) / 1e3
    time_us = max(call_us, transfer_us, path_us)
    if f.pct(time_us) <= GRAD_SYNC_MIN_PCT:
        return None
    metrics.update({"early_collective_calls": (calls.size, "count"), "early_collective_call_time": (call_us, "us"),
                    "early_gloo_transfer_time": (transfer_us, "us"), "early_sync_path_time": (path_us, "us")})
    events = row_events(t, w, calls[:3])
    return F.make("grad_sync_per_microbatch", [f.rank], f.steps, metrics, events, gain_pct=f.pct(time_us),
                  gain_us=time_us, what_if="the early passes' synchronisation not run (host only: the larger of its "
                  "calls, gloo's transfers and its spans on the training thread; an estimate)",
                  evidence_pct=f.pct(time_us))
