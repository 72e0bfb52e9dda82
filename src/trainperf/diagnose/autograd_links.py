"""Which forward op, and so which module, each autograd backward node belongs to.

A backward node ("autograd::engine::evaluate_function: XBackward0") carries the "Sequence number" of the
forward operator that made it (as TraceLens links them): the node is the backward of the module whose
forward ran the op with that number in the same process (of ops sharing a number, such as aten::linear and
the aten::t inside it, the last to start: the one that made the node). Where numbers collide across
forward threads, the node's "Fwd thread id" picks the thread, learnt from the unambiguous links.

Gradient accumulation ("torch::autograd::AccumulateGrad") has no sequence number: PyTorch gives these nodes
the largest one (UINT64_MAX, torch/csrc/autograd/node.h "NOTE [ Sequence Number]") so that the engine runs
each one as soon as it is ready, before any other ready node. An AccumulateGrad node has one input, the
gradient of its parameter, so it is ready the moment the node that produced that gradient finishes, and
runs next on that thread: its producer is the last other node before it among its siblings (same thread,
same enclosing node; several AccumulateGrad nodes of one producer run back to back). The producer is the
backward of the op that took the parameter as an input (aten::t of a Linear's weight, aten::addmm of its
bias), so with recorded shapes the gradient's shape (the input of the "torch::autograd::AccumulateGrad"
record inside the node) must be one of that forward op's input shapes: a mismatch leaves the node
unlinked (its own row), and a link by engine order alone (no shapes recorded) is counted in a note. Work in
an AccumulateGrad node outside its inner record runs in the node's post hooks (DDP copies each gradient
into its bucket there and launches a full bucket's all-reduce, for many modules' parameters at once):
that belongs to no module.

A node that cannot be linked takes its enclosing node's link (a reentrant backward, as activation
checkpointing runs, inside the node that started it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.roofline import is_shape
from trainperf.trace.events import CPU_OP, EventTable
from trainperf.trace.nesting import Nesting, innermost, nest, thread_key

BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function:"
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"

# how an item inside a backward node links to a module: not in a node; linked to a forward op inside a module
# or outside every module; or not linked, and why
NOT_BACKWARD, LINKED, LINKED_OUTSIDE, NO_SEQ, NO_FORWARD, AMBIGUOUS, ACCUMULATE_UNKNOWN, HOOK = range(8)
UNLINKED_WHY = {NO_SEQ: "in nodes without a sequence number",
                NO_FORWARD: "in nodes whose forward op is not in the trace (it ran before the profiled window)",
                AMBIGUOUS: "in nodes whose sequence number several forward threads used",
                ACCUMULATE_UNKNOWN: "in gradient accumulation (AccumulateGrad) whose parameter's module could not "
                                    "be told (no producing node before it, or the gradient's shape is no input of "
                                    "that node's forward op)",
                HOOK: "in hooks run after gradient accumulation (outside the AccumulateGrad record: DDP's copies "
                      "into its gradient buckets and their all-reduce, and the like)"}


@dataclass(frozen=True, kw_only=True, slots=True)
class BackwardLinks:
    """Per queried item: the module span (an index into the module nesting) whose backward it is, or -1; its
    state (the constants above); whether it sits in an AccumulateGrad node linked by engine order alone."""

    span: np.ndarray
    state: np.ndarray
    by_order_only: np.ndarray


def backward_links(t: EventTable, modules: Nesting, anchors: np.ndarray) -> BackwardLinks:
    """Links of the anchor rows (a launch, or a top-level operator itself) to the module whose backward they
    run in (module docstring); modules: the nesting of the module spans of t (rows in its `order`)."""
    span = np.full(anchors.size, -1, dtype=np.int64)
    state = np.full(anchors.size, NOT_BACKWARD, dtype=np.int64)
    order_only = np.zeros(anchors.size, dtype=bool)
    node_rows = np.flatnonzero((t.kind == CPU_OP) & backward_node_mask(t, np.arange(len(t))))
    if not node_rows.size or not anchors.size:
        return BackwardLinks(span=span, state=state, by_order_only=order_only)
    nodes = nest(_key(t, node_rows), t.ts_ns[node_rows], t.ts_ns[node_rows] + t.dur_ns[node_rows])
    node_rows = node_rows[nodes.order]
    node_span, node_state, node_op = _link_by_sequence(t, modules, node_rows, nodes)
    acc = np.isin(t.name[node_rows], t.ids_matching(lambda s: s.endswith(ACCUMULATE_GRAD)))
    node_order_only = _link_accumulation(t, node_rows, nodes, acc, node_span, node_state, node_op)
    for i in range(node_rows.size):  # an enclosing node sorts before the nodes it holds
        p = nodes.parent[i]
        if p >= 0 and node_state[i] in UNLINKED_WHY:
            node_span[i], node_state[i] = node_span[p], node_state[p]
    node = innermost(nodes, _key(t, anchors), t.ts_ns[anchors])
    inside = node >= 0
    span[inside] = node_span[node[inside]]
    state[inside] = node_state[node[inside]]
    order_only[inside] = node_order_only[node[inside]]
    hook = _in_accumulate_hooks(t, node_rows, nodes, acc, anchors, node)
    span[hook], state[hook], order_only[hook] = -1, HOOK, False
    return BackwardLinks(span=span, state=state, by_order_only=order_only)


def node_function(name: str) -> str:
    """The function a backward node runs: "XBackward0" of "autograd::engine::evaluate_function: XBackward0" (the
    name PyTorch also records the function's own operator under, inside the node)."""
    return name[len(BACKWARD_OP_PREFIX):].strip()


def backward_node_mask(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows` (bool): whether it is an autograd backward node (BACKWARD_OP_PREFIX)."""
    return np.isin(t.name[rows], t.ids_matching(lambda s: s.startswith(BACKWARD_OP_PREFIX)))


def forward_op_mask(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows` (bool): whether it is an operator recorded as the forward pass runs it under autograd: a
    sequence number and "Fwd thread id" 0 (a backward node's own ops carry the forward thread's id)."""
    return (t.seq[rows] >= 0) & (t.fwd_tid[rows] == 0)


def _key(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Return the thread key (trace.nesting.thread_key) of each row."""
    return thread_key(t.pid[rows], t.tid[rows])


def _link_by_sequence(t: EventTable, modules: Nesting, nodes: np.ndarray, nesting: Nesting
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(module span of each node's forward op or -1, link state, the forward op's row or -1) by sequence number
    and forward thread."""
    # forward ops: "Fwd thread id" 0 (a backward op inside a node carries its forward thread's number, >= 1);
    # where a trace lacks that arg (-1), an op inside a node is taken for backward
    fwd_ops = np.flatnonzero((t.kind == CPU_OP) & (t.seq >= 0) & (t.fwd_tid <= 0) & ~np.isin(t.name, t.name[nodes]))
    unsure = fwd_ops[t.fwd_tid[fwd_ops] < 0]
    if unsure.size:
        fwd_ops = np.setdiff1d(fwd_ops, unsure[innermost(nesting, _key(t, unsure), t.ts_ns[unsure]) >= 0])
    fwd_ops = fwd_ops[np.lexsort((t.ts_ns[fwd_ops], t.seq[fwd_ops], t.pid[fwd_ops]))]
    op_span = innermost(modules, _key(t, fwd_ops), t.ts_ns[fwd_ops])
    # {(pid, seq): {forward thread: (module span, row) of the last op with that number on it}}
    by_seq: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}
    for pid, seq, tid, s, r in zip(t.pid[fwd_ops].tolist(), t.seq[fwd_ops].tolist(), t.tid[fwd_ops].tolist(),
                                   op_span.tolist(), fwd_ops.tolist()):
        by_seq.setdefault((pid, seq), {})[tid] = (s, r)
    keys = list(zip(t.pid[nodes].tolist(), t.seq[nodes].tolist(), t.fwd_tid[nodes].tolist()))
    # the profiler's forward-thread number -> OS thread, from the numbers only one thread used
    votes: dict[tuple[int, int], dict[int, int]] = {}
    for pid, seq, ftid in keys:
        cand = by_seq.get((pid, seq))
        if seq >= 0 and cand and len(cand) == 1:
            v = votes.setdefault((pid, ftid), {})
            tid = next(iter(cand))
            v[tid] = v.get(tid, 0) + 1
    thread_of = {k: max(v, key=v.get) for k, v in votes.items()}
    span = np.full(nodes.size, -1, dtype=np.int64)
    op = np.full(nodes.size, -1, dtype=np.int64)
    state = np.full(nodes.size, NO_SEQ, dtype=np.int64)
    for i, (pid, seq, ftid) in enumerate(keys):
        if seq < 0:
            continue
        cand = by_seq.get((pid, seq))
        if not cand:
            state[i] = NO_FORWARD
            continue
        tid = next(iter(cand)) if len(cand) == 1 else thread_of.get((pid, ftid))
        if tid not in cand:
            state[i] = AMBIGUOUS
            continue
        span[i], op[i] = cand[tid]
        state[i] = LINKED if span[i] >= 0 else LINKED_OUTSIDE
    return span, state, op


def _link_accumulation(t: EventTable, nodes: np.ndarray, nesting: Nesting, acc: np.ndarray, span: np.ndarray,
                       state: np.ndarray, op: np.ndarray) -> np.ndarray:
    """Link each AccumulateGrad node (acc) to its producer's module in place (span, state; op: each node's forward
    op row or -1); returns which were linked by engine order alone. The producer: the last other node before it
    with the same thread and parent."""
    order_only = np.zeros(nodes.size, dtype=bool)
    if not acc.any():
        return order_only
    grad = _gradient_shapes(t, nodes, nesting, acc)
    key = _key(t, nodes).tolist()
    last: dict[tuple[int, int], int] = {}
    for i in range(nodes.size):
        k = (key[i], int(nesting.parent[i]))
        if not acc[i]:
            last[k] = i
            continue
        state[i] = ACCUMULATE_UNKNOWN
        p = last.get(k)
        if p is None or state[p] not in (LINKED, LINKED_OUTSIDE):
            continue
        shape, inputs = grad.get(i), _input_shapes(t, int(op[p]))
        if shape is not None and inputs is not None and shape not in inputs:
            continue
        span[i], state[i] = span[p], state[p]
        order_only[i] = shape is None or inputs is None
    return order_only


def _gradient_shapes(t: EventTable, nodes: np.ndarray, nesting: Nesting, acc: np.ndarray) -> dict[int, tuple]:
    """{AccumulateGrad node index: the shape of the gradient it accumulates}, from the input of the
    "torch::autograd::AccumulateGrad" record inside it, where recorded (a defined tensor)."""
    inner = np.flatnonzero((t.kind == CPU_OP) & (t.name == t.name_id(ACCUMULATE_GRAD)) & (t.args >= 0))
    if not inner.size:
        return {}
    node = innermost(nesting, _key(t, inner), t.ts_ns[inner])
    kept = t.kept_args()
    out: dict[int, tuple] = {}
    for r, i in zip(inner.tolist(), node.tolist()):
        if i < 0 or not acc[i]:
            continue
        a = kept[int(t.args[r])]
        dims, types = a.get("Input Dims"), a.get("Input type")
        if (isinstance(dims, list) and dims and is_shape(dims[0]) and isinstance(types, list) and types
                and types[0]):
            out[i] = tuple(dims[0])
    return out


def _input_shapes(t: EventTable, row: int) -> set | None:
    """The tensor shapes an operator row took ("Input Dims": a tensor's shape, or a tensor list's shapes), or None
    when not recorded."""
    if row < 0 or t.args[row] < 0:
        return None
    dims = t.kept_args()[int(t.args[row])].get("Input Dims")
    if not isinstance(dims, list):
        return None
    shapes = set()
    for d in dims:
        if is_shape(d):
            shapes.add(tuple(d))
        elif isinstance(d, list):
            shapes.update(tuple(x) for x in d if is_shape(x))
    return shapes


def _in_accumulate_hooks(t: EventTable, nodes: np.ndarray, nesting: Nesting, acc: np.ndarray,
                         anchors: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Mask of the anchors inside an AccumulateGrad node that has an inner AccumulateGrad record, but outside that
    record (the node's post hooks); an anchor that is the node itself (a top-level operator) is not."""
    in_acc = (node >= 0) & acc[np.maximum(node, 0)] & (anchors != nodes[np.maximum(node, 0)])
    if not in_acc.any():
        return in_acc
    inner = np.flatnonzero((t.kind == CPU_OP) & (t.name == t.name_id(ACCUMULATE_GRAD)))
    if not inner.size:
        return np.zeros_like(in_acc)
    inner_n = nest(_key(t, inner), t.ts_ns[inner], t.ts_ns[inner] + t.dur_ns[inner])
    holder = innermost(nesting, _key(t, inner), t.ts_ns[inner])  # the node around each inner record
    has_inner = np.zeros(nodes.size, dtype=bool)
    has_inner[holder[holder >= 0]] = True
    q = np.flatnonzero(in_acc)
    in_record = innermost(inner_n, _key(t, anchors[q]), t.ts_ns[anchors[q]]) >= 0
    out = np.zeros_like(in_acc)
    out[q] = has_inner[node[q]] & ~in_record
    return out
