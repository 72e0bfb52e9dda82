"""DistributedDataParallel's own work every step that one of its constructor arguments removes: the buffers it
broadcasts before each forward (`ddp_buffer_broadcast`), the gradients it copies out of their buckets after each
backward (`ddp_gradient_copies`) and its search of the autograd graph for unused parameters after each forward
(`ddp_unused_parameter_search`).

DDP records each (torch/nn/parallel/distributed.py, torch/csrc/distributed/c10d/reducer.cpp and comm.cpp):
- `broadcast_buffers=True`, the default: before every forward, inside its `DistributedDataParallel.forward` span and
  before the module's own operators, it broadcasts every registered buffer from rank 0 with c10d's
  broadcast_coalesced: the buffers flattened into buckets (`aten::flatten_dense_tensors`), a `c10d::broadcast_` per
  bucket, the result unflattened (`aten::unflatten_dense_tensors`) and copied back into each buffer (an
  `aten::copy_` each). BatchNorm holds 3 buffers a layer (running mean, variance, batches seen): HTA's ResNet-50
  traces copy 159 a forward, 35 ms of the A100 rank's 222-ms host-bound step (nccl_parser_config). Constant buffers
  (rotary embeddings' cos/sin tables, causal masks) are broadcast as well, to no effect.
- `gradient_as_bucket_view=False`, the default: once a bucket's all-reduce is done, the reducer copies each
  parameter's reduced gradient out of the bucket into its `.grad` (`torch.distributed.ddp.reducer::
  copy_bucket_to_grad`, a device-to-device copy per parameter, at the end of the backward). With True the
  gradients are views of the buckets and the copy is not made (PyTorch's documentation of the argument: it "avoids
  the overhead of copying between gradients and allreduce communication buckets" and saves the gradients' memory).
Priced by replay with those spans not run (`remove_spans`): their host time, the calls made inside them and the
device work those calls launched, but for a collective's measured wait for a late rank. Host-only traces (gloo), an
estimate: the spans' time, but a buffer sync's at the job's shortest per forward (`buffer_sync_floor_us`: its
broadcasts hold a rank's wait for the others), or its operators alone where one rank's trace is read.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.host import span_rows
from trainperf.diagnose.replay import Change, spans_time_us
from trainperf.diagnose.window import Window
from trainperf.trace.events import CPU_OP, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import enclosing_span, outermost, row_spans, thread_key

DDP_FORWARD_RE = re.compile(r"^DistributedDataParallel\.forward$")
# what broadcast_coalesced records at the top level of the forward span, as DDP's buffer sync calls it
BUFFER_SYNC_OP_RE = re.compile(r"^(aten::(flatten_dense_tensors|unflatten_dense_tensors|cat|copy_|narrow|view|detach"
                               r"|empty|split_with_sizes)|c10d::broadcast_|c10d::_broadcast_coalesced"
                               r"|record_param_comms|nccl:broadcast|gloo:broadcast)$")
BROADCAST_RE = re.compile(r"^(c10d::broadcast_|c10d::_broadcast_coalesced|nccl:broadcast|gloo:broadcast)$")
GRADIENT_COPY_RE = re.compile(r"^torch\.distributed\.ddp\.reducer::copy_bucket_to_grad$")
UNUSED_SEARCH_RE = re.compile(r"^torch\.distributed\.ddp\.reducer::search_unused_parameters$")
# the spans' time, % of the span: work with a one-argument fix, measured, at the stall rules' 1 % (DATALOADER_MIN_PCT,
# GRAD_SYNC_MIN_PCT). Stated, not fitted: no labeled case has these kinds
DDP_OWN_WORK_MIN_PCT = 1.0


# the name RankFacts.once keeps a rank's buffer_broadcasts under (found before the facts on jobs without GPU events)
BUFFER_BROADCASTS = "ddp_buffer_broadcasts"


def buffer_broadcasts(t: EventTable, w: Window) -> list[np.ndarray]:
    """The window's buffer broadcasts, one per DDP forward that makes one: the rows of the run of broadcast_coalesced's
    operators (BUFFER_SYNC_OP_RE) among the forward span's top-level operators that holds a broadcast, in time order."""
    named = span_rows(t, w, DDP_FORWARD_RE, (CPU_OP, USER_ANNOTATION))
    if not named.size:
        return []
    forwards = outermost(t, named)  # PyTorch records the span twice, as an annotation and as an operator
    ops = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    ops = ops[~np.isin(ops, named)]
    owner = enclosing_span(*row_spans(t, forwards), thread_key(t.pid[ops], t.tid[ops]), t.ts_ns[ops])
    sync_ids, broadcast_ids = t.ids_matching(BUFFER_SYNC_OP_RE.search), t.ids_matching(BROADCAST_RE.search)
    out = []
    for k in range(forwards.size):
        top = ops[owner == k]
        if not top.size:
            continue
        top = outermost(t, top)
        top = top[np.argsort(t.ts_ns[top], kind="stable")]
        is_sync = np.isin(t.name[top], sync_ids)
        # maximal runs of the sync's operators; the one holding a broadcast is the buffer sync
        edges = np.flatnonzero(np.diff(np.r_[0, is_sync.astype(np.int8), 0]))
        for a, b in zip(edges[::2], edges[1::2]):
            if np.isin(t.name[top[a:b]], broadcast_ids).any():
                out.append(top[a:b])
    return out


def buffer_sync_floor_us(broadcasts: dict[int, list[np.ndarray]], windows: dict[int, Window]) -> np.ndarray | None:
    """Per DDP forward, in order: the shortest of the ranks' buffer syncs (µs, from its first operator's start to its
    last one's end), over the forwards every rank has; None unless two ranks or more sync. broadcasts: each rank's
    syncs (buffer_broadcasts). In a collective, the rank that arrives last waits least: its sync is the sync's own
    cost, transfer included, and the others' excess is their wait for it, which the next collective would wait out
    without the sync."""
    if len(broadcasts) < 2:
        return None
    per_rank = [np.array([windows[r].end_us[x].max() - windows[r].ts_us[x].min() for x in runs])
                for r, runs in broadcasts.items()]
    if len(per_rank) < 2 or min(x.size for x in per_rank) == 0:
        return None
    n = min(x.size for x in per_rank)
    return np.min([x[:n] for x in per_rank], axis=0)


def reducer_spans(t: EventTable, w: Window, pattern: re.Pattern) -> np.ndarray:
    """The window's outermost spans of the reducer's record function `pattern` (rows)."""
    rows = span_rows(t, w, pattern, (CPU_OP, USER_ANNOTATION))
    return outermost(t, rows) if rows.size else rows


def _removed(t: EventTable, w: Window, spans: list[np.ndarray]) -> tuple[tuple, float]:
    """(the remove_spans spans of each group of rows, from its first row's start to its last end; their time µs,
    overlaps once)."""
    hulls = tuple((int(t.tid[r[0]]), float(w.ts_us[r].min()), float(w.end_us[r].max())) for r in spans)
    return hulls, spans_time_us(hulls)


def _finding(f: RankFacts, kind: str, spans: list[np.ndarray], label: str, metrics: dict, what_if: str
             ) -> F.Finding | None:
    """The finding of the groups of rows `spans` (each removed from its first row's start to its last end), their
    longest three as its events named `label`; None under DDP_OWN_WORK_MIN_PCT."""
    hulls, time_us = _removed(f.table, f.window, spans)
    share = f.pct(time_us)
    if share < DDP_OWN_WORK_MIN_PCT:
        return None
    metrics = {**metrics, "their_time": (time_us, "us"), "their_share": (share, "%")}
    longest = sorted(range(len(hulls)), key=lambda k: hulls[k][1] - hulls[k][2])[:3]
    events = [(label.format(n=len(spans[k])), hulls[k][1], hulls[k][2] - hulls[k][1]) for k in longest]
    if not f.has_gpu:
        gain_us = _buffer_sync_gain_us(f, spans, hulls) if kind == "ddp_buffer_broadcast" else time_us
        return F.rank_finding(f, kind, metrics, events, gain_pct=f.pct(gain_us),
                              evidence_pct=share, what_if=what_if + " (host time, estimated)")
    return F.rank_finding(f, kind, metrics, events, (Change("remove_spans", spans=hulls),), what_if,
                          evidence_pct=share)


def _buffer_sync_gain_us(f: RankFacts, spans: list[np.ndarray], hulls: tuple) -> float:
    """The host time (µs) removing the buffer syncs `spans` (their hulls `hulls`) saves on a trace without GPU, the
    host being the whole step: not their whole time, since their broadcasts hold the rank's wait for the others
    (gloo), but the job's floor per forward (ddp_buffer_sync_floor_us) where several ranks were read, else the syncs'
    operators alone. (The other kinds save their spans' whole time.)"""
    t, w = f.table, f.window
    floor = f.ddp_buffer_sync_floor_us
    if floor is not None:
        own = np.array([h[2] - h[1] for h in hulls])
        n = min(own.size, floor.size)
        return float(np.minimum(own[:n], floor[:n]).sum() + np.minimum(own[n:], floor.mean()).sum())
    rows = np.concatenate(spans)
    rows = rows[~np.isin(t.name[rows], t.ids_matching(BROADCAST_RE.search))]
    return _removed(t, w, [rows[k:k + 1] for k in range(rows.size)])[1]


def ddp_buffer_broadcast(f: RankFacts) -> F.Finding | None:
    """DDP broadcasting the module's buffers before every forward take >= DDP_OWN_WORK_MIN_PCT of the span (module
    docstring); priced by replay with those spans not run."""
    t = f.table
    runs = f.once(BUFFER_BROADCASTS, lambda: buffer_broadcasts(t, f.window))
    if not runs:
        return None
    rows = np.concatenate(runs)
    copies = int(np.isin(t.name[rows], t.ids_matching(lambda s: s == "aten::copy_")).sum())
    metrics = {"forwards_broadcasting": (len(runs), "count"), "buffer_copies": (copies, "count"),
               "broadcasts": (int(np.isin(t.name[rows], t.ids_matching(BROADCAST_RE.search)).sum()), "count")}
    return _finding(f, "ddp_buffer_broadcast", runs, "DDP buffer broadcast ({n} ops)", metrics,
                    "the buffers not broadcast before each forward (DDP broadcast_buffers=False)")


def _reducer_finding(f: RankFacts, kind: str, pattern: re.Pattern, what_if: str) -> F.Finding | None:
    rows = f.once(kind, lambda: reducer_spans(f.table, f.window, pattern))
    if not rows.size:
        return None
    metrics = {"spans": (rows.size, "count"), "per_step": (rows.size / max(len(f.step_times), 1), "count")}
    return _finding(f, kind, [rows[k:k + 1] for k in range(rows.size)], f.table.name_of(int(rows[0])), metrics,
                    what_if)


def ddp_gradient_copies(f: RankFacts) -> F.Finding | None:
    """DDP copying each reduced gradient out of its bucket takes >= DDP_OWN_WORK_MIN_PCT of the span (module
    docstring); priced by replay with those copies not made."""
    return _reducer_finding(f, "ddp_gradient_copies", GRADIENT_COPY_RE,
                            "gradients kept as views of their buckets (DDP gradient_as_bucket_view=True)")


def ddp_unused_parameter_search(f: RankFacts) -> F.Finding | None:
    """DDP searching the autograd graph for unused parameters after each forward takes >= DDP_OWN_WORK_MIN_PCT of
    the span (module docstring); priced by replay with those searches not made."""
    return _reducer_finding(f, "ddp_unused_parameter_search", UNUSED_SEARCH_RE,
                            "no search for unused parameters (DDP find_unused_parameters=False, or static_graph=True)")
