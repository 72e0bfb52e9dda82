"""GPU time per `nn.Module`: which layer of the model the device time goes to.

PyTorch's profiler with `with_stack=True` records every module's forward call as a host
`python_function` span named "nn.Module: <Class>_<n>" (n counts the instances of that class in the
order they first run; `with_modules=True` alone records none in eager mode, measured on 2.13).
Module calls nest on the thread that runs the forward, and every operator, runtime launch and kernel
the forward issues falls inside them: a kernel is linked to its launch by the correlation id, and the
launch to the innermost module span around it on the launch's thread (as TraceLens's Trace2Tree does,
by interval nesting per thread).

Attributed: a device event (kernel, memcpy, memset) to the module whose forward launched it, with its
duration; a module's inclusive time holds its submodules', its exclusive time only what it launched
itself. On a trace without device events the basis is the host: the time of each top-level CPU
operator (one not inside another operator on its thread), so nested operators count once.

Backward: autograd runs each backward node ("autograd::engine::evaluate_function: XBackward0") after the
forward spans have closed, on an autograd thread (CUDA) or the caller's. A device event launched inside a
node (or, on the CPU basis, the node itself) is the backward time of the module whose forward ran the op
that made the node (diagnose/autograd_links.py: by sequence number; gradient accumulation by the engine's
order, checked against the recorded shapes). Backward time that cannot be linked is the BACKWARD row
(nodes whose forward op ran before the profiled window, hooks after gradient accumulation such as
DDP's bucketing and all-reduce) or the GRAD_ACCUM row (accumulation whose parameter's module cannot be
told), and a note says how much and why. Backward of an op run outside every module (the loss) is OUTSIDE's backward.
Everything else launched outside any module and any node (optimizer, copies) is OUTSIDE's forward.

Paths: "Sequential_0/Block_1/Linear_1" names one module instance. With by="type" the instance
numbers are dropped ("Sequential/Block/Linear"), so the 32 blocks of a transformer become one row
with 32 calls per step; siblings of one type (q, k and v projections) share that row too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.autograd_links import (ACCUMULATE_UNKNOWN, LINKED_OUTSIDE, NOT_BACKWARD, UNLINKED_WHY,
                                               BackwardLinks, backward_links)
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, PYTHON, EventTable
from trainperf.trace.nesting import Nesting, innermost, nest, outermost, thread_key

MODULE_PREFIX = "nn.Module: "
BACKWARD = "backward (unattributed)"
GRAD_ACCUM = "gradient accumulation (unattributed)"
OUTSIDE = "(outside nn.Module)"
LABELS = (BACKWARD, GRAD_ACCUM, OUTSIDE)  # rows that are no module (depth 0)
_INSTANCE_RE = re.compile(r"_\d+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleTime:
    """One module path's time per step (µs); basis "gpu" (device-event time) or "cpu_op" (top-level
    CPU operator time)."""

    path: str                      # "Sequential_0/Block_0/Linear_0", or BACKWARD / OUTSIDE
    depth: int                     # 1 for a root module, 0 for the BACKWARD / OUTSIDE rows
    inclusive_us_per_step: float   # forward + backward, its own and its submodules'
    exclusive_us_per_step: float   # forward + backward of what it ran itself
    forward_us_per_step: float     # forward part of inclusive
    backward_us_per_step: float    # backward part of inclusive (nodes linked to its forward ops)
    calls_per_step: float          # forward calls of the module(s) on this path
    events_per_step: float         # device events (or top-level CPU ops) counted inclusively
    pct_of_step: float             # inclusive share of all device (or CPU op) time of the steps

    def to_json(self) -> dict:
        """The row as a JSON object (times µs, rounded to 0.001)."""
        r = lambda v: round(float(v), 3)  # noqa: E731
        return {"module": self.path, "depth": self.depth, "inclusive_us_per_step": r(self.inclusive_us_per_step),
                "exclusive_us_per_step": r(self.exclusive_us_per_step), "forward_us_per_step":
                r(self.forward_us_per_step), "backward_us_per_step": r(self.backward_us_per_step),
                "calls_per_step": r(self.calls_per_step), "events_per_step": r(self.events_per_step),
                "pct_of_step": r(self.pct_of_step)}


@dataclass(kw_only=True)
class ModuleBreakdown:
    """Time per module path of one rank: rows sorted by path (a parent before its children)."""

    rank: int
    basis: str                     # "gpu": device kernel/memcpy/memset time; "cpu_op": top-level CPU operators
    steps: int                     # profiler steps the totals are divided by (1 when the trace has none)
    total_us_per_step: float       # all device (or top-level CPU op) time per step, attributed or not
    unlinked_backward_us_per_step: float = 0.0  # backward time no module could be found for (BACKWARD, GRAD_ACCUM)
    backward_us_per_step: float = 0.0  # all backward time (inside autograd nodes), linked or not
    rows: list[ModuleTime] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def attributed_pct(self) -> float:
        """Share of the step's time inside some module's forward (%)."""
        roots = sum(r.forward_us_per_step for r in self.rows if r.depth == 1)
        return 100.0 * roots / self.total_us_per_step if self.total_us_per_step > 0 else 0.0

    @property
    def in_modules_pct(self) -> float:
        """Share of the step's time attributed to some module, forward or backward (%)."""
        roots = sum(r.inclusive_us_per_step for r in self.rows if r.depth == 1)
        return 100.0 * roots / self.total_us_per_step if self.total_us_per_step > 0 else 0.0

    def to_json(self) -> list[dict]:
        """Flat rows for the JSON output: each row with its rank and basis."""
        return [{"rank": self.rank, "basis": self.basis, "steps": self.steps, **r.to_json()} for r in self.rows]


@dataclass(slots=True)
class _Spans:
    """Module spans of a table: rows in nesting order, their nesting (parent span, -1 for a root), path of each
    (instance names)."""

    rows: np.ndarray
    nesting: Nesting
    paths: list[str]

    @property
    def parent(self) -> np.ndarray:
        """Return each span's enclosing span (nesting-order index, -1 for a root)."""
        return self.nesting.parent


def module_spans(t: EventTable) -> _Spans:
    """The "nn.Module: X_n" spans of a table with each one's enclosing module span and path."""
    ids = t.ids_matching(lambda s: s.startswith(MODULE_PREFIX))
    rows, n = _nesting(t, np.flatnonzero((t.kind == PYTHON) & np.isin(t.name, ids)))
    paths: list[str] = []
    for i, r in enumerate(rows):
        name = t.names[int(t.name[r])][len(MODULE_PREFIX):]
        paths.append(paths[n.parent[i]] + "/" + name if n.parent[i] >= 0 else name)
    return _Spans(rows, n, paths)


def _nesting(t: EventTable, rows: np.ndarray) -> tuple[np.ndarray, Nesting]:
    """(rows in nesting order: by thread, start, longest first; their Nesting, trace.nesting's semantics)."""
    n = nest(thread_key(t.pid[rows], t.tid[rows]), t.ts_ns[rows], t.ts_ns[rows] + t.dur_ns[rows])
    return rows[n.order], n


def _innermost(t: EventTable, spans: Nesting, query: np.ndarray) -> np.ndarray:
    """For each query row: the nesting-order index of the innermost span on its thread holding its start, else -1."""
    return innermost(spans, thread_key(t.pid[query], t.tid[query]), t.ts_ns[query])


def _outermost_ops(t: EventTable) -> np.ndarray:
    """Rows of the CPU operators no other operator on their thread encloses (each op's time once)."""
    return outermost(t, np.flatnonzero(t.kind == CPU_OP))


def _strip(path: str) -> str:
    return "/".join(_INSTANCE_RE.sub("", p) for p in path.split("/"))


def _steps(t: EventTable, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """(mask of rows to count, number of steps): rows inside profiler steps when the trace has steps."""
    steps = np.unique(t.step[t.step >= 0])
    if steps.size == 0:
        return np.ones(rows.size, dtype=bool), 1
    return t.step[rows] >= 0, int(steps.size)


def module_breakdown(t: EventTable, by: str = "type") -> ModuleBreakdown:
    """Time per nn.Module path per step of one rank's table (module docstring).

    by: "instance" keeps the recorded instance names (one row per module instance); "type" drops the
    instance numbers so repeated layers share a row. Returns rows sorted by path, then BACKWARD and
    OUTSIDE."""
    if by not in ("instance", "type"):
        raise ValueError(f"by must be 'instance' or 'type', not {by!r}")
    sp = module_spans(t)
    device = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & (t.stream >= 0))
    basis = "gpu" if device.size else "cpu_op"
    notes: list[str] = []
    if basis == "gpu":  # a device event is anchored at its launch
        link = correlated_host_row(t)[device]
        counted, n_steps = _steps(t, device)
        items, anchors = device[counted], link[counted]
    else:  # a top-level operator is its own anchor
        ops = _outermost_ops(t)
        counted, n_steps = _steps(t, ops)
        items = anchors = ops[counted]
        notes.append("no device events: times are CPU operator time (top-level operators on each thread), "
                     "not GPU time")
    if not sp.rows.size:
        notes.append("no 'nn.Module:' spans in the trace: profile with with_stack=True to attribute time to "
                     "modules")
    dur = t.dur_ns[items].astype(np.float64) / 1e3
    total = float(dur.sum())
    fwd, links = _attribute(t, sp, anchors)
    bwd, state = links.span, links.state
    name_of = sp.paths if by == "instance" else [_strip(p) for p in sp.paths]
    span_counted, _ = _steps(t, sp.rows)
    calls: dict[str, int] = {}
    for s in np.flatnonzero(span_counted):
        calls[name_of[s]] = calls.get(name_of[s], 0) + 1
    in_node = state != NOT_BACKWARD
    free = (fwd < 0) & (bwd < 0)
    unlinked = free & in_node & (state != LINKED_OUTSIDE)
    accumulate = unlinked & (state == ACCUMULATE_UNKNOWN)
    paths = {p: (f, b, calls.get(p, 0)) for p, (f, b) in _path_totals(sp, name_of, fwd, bwd, dur).items()}
    none = np.zeros_like(free)
    for label, f_mask, b_mask in ((BACKWARD, none, unlinked & ~accumulate), (GRAD_ACCUM, none, accumulate),
                                  (OUTSIDE, free & ~in_node, free & (state == LINKED_OUTSIDE))):
        if f_mask.any() or b_mask.any():
            f_us, b_us = float(dur[f_mask].sum()), float(dur[b_mask].sum())
            paths[label] = ((f_us, f_us, int(f_mask.sum())), (b_us, b_us, int(b_mask.sum())), 0)
    rows = [_row(p, *v, n_steps=n_steps, total_us=total) for p, v in paths.items()]
    bwd_us, unlinked_us = float(dur[in_node].sum()), float(dur[unlinked].sum())
    if unlinked.any():
        notes.append(_unlinked_note(dur / n_steps, unlinked, state, bwd_us / n_steps))
    order_only = links.by_order_only & (bwd >= 0)
    if order_only.any():
        notes.append(f"{float(dur[order_only].sum()) / n_steps:.1f} µs per step of gradient accumulation "
                     "attributed by the autograd engine's order alone (no recorded shapes to check the parameter "
                     "against: profile with record_shapes=True)")
    if n_steps == 1 and not (t.step >= 0).any():
        notes.append("no ProfilerStep spans: totals are over the whole trace")
    return ModuleBreakdown(rank=t.rank, basis=basis, steps=n_steps, total_us_per_step=total / n_steps,
                           unlinked_backward_us_per_step=unlinked_us / n_steps, backward_us_per_step=bwd_us / n_steps,
                           rows=rows, notes=notes)


def _row(path: str, fwd: tuple, bwd: tuple, calls: int, *, n_steps: int, total_us: float) -> ModuleTime:
    """A row from its forward and backward (inclusive µs, exclusive µs, events) over the steps, and its calls;
    a label row (BACKWARD, GRAD_ACCUM, OUTSIDE) has depth 0."""
    depth = 0 if path in LABELS else path.count("/") + 1
    incl = fwd[0] + bwd[0]
    return ModuleTime(path=path, depth=depth, inclusive_us_per_step=incl / n_steps,
                      exclusive_us_per_step=(fwd[1] + bwd[1]) / n_steps, forward_us_per_step=fwd[0] / n_steps,
                      backward_us_per_step=bwd[0] / n_steps, calls_per_step=calls / n_steps,
                      events_per_step=(fwd[2] + bwd[2]) / n_steps,
                      pct_of_step=100.0 * incl / total_us if total_us > 0 else 0.0)


def _unlinked_note(us: np.ndarray, unlinked: np.ndarray, state: np.ndarray, backward_us: float) -> str:
    """The note saying how much backward time (µs per step) no module could be found for, and why."""
    total = float(us[unlinked].sum())
    parts = [f"{float(us[unlinked & (state == st)].sum()):.1f} µs {why}" for st, why in UNLINKED_WHY.items()
             if (unlinked & (state == st)).any()]
    return (f"{total:.1f} µs per step of backward ({100 * total / backward_us:.1f}% of backward time) not "
            f"attributed to a module, shown as '{BACKWARD}' or '{GRAD_ACCUM}': " + "; ".join(parts))


def _attribute(t: EventTable, sp: _Spans, anchors: np.ndarray) -> tuple[np.ndarray, BackwardLinks]:
    """(forward module span of each anchor row or -1, the backward links of those outside every module's forward:
    the module span whose backward they run in, how they link). An anchor of -1 (no launch in the trace) is in
    none of them."""
    has = anchors >= 0
    fwd = np.full(anchors.size, -1, dtype=np.int64)
    fwd[has] = _innermost(t, sp.nesting, anchors[has])
    q = np.flatnonzero((fwd < 0) & has)
    links = backward_links(t, sp.nesting, anchors[q])
    bwd = BackwardLinks(span=np.full(anchors.size, -1, dtype=np.int64),
                        state=np.full(anchors.size, NOT_BACKWARD, dtype=np.int64),
                        by_order_only=np.zeros(anchors.size, dtype=bool))
    bwd.span[q], bwd.state[q], bwd.by_order_only[q] = links.span, links.state, links.by_order_only
    return fwd, bwd


def _path_totals(sp: _Spans, name_of: list[str], fwd: np.ndarray, bwd: np.ndarray, dur: np.ndarray) -> dict:
    """{path: (forward, backward)}, each (inclusive µs, exclusive µs, events) summed over the spans of the path,
    sorted by path (a parent before its children); fwd / bwd: the span each item counts for in that pass, or -1.
    A kernel's chain of spans has distinct paths (each a prefix of the next), so summing spans per path counts
    it once."""
    return {p: (f, b) for (p, f), b in zip(_pass_totals(sp, name_of, fwd, dur).items(),
                                           _pass_totals(sp, name_of, bwd, dur).values())}


def _pass_totals(sp: _Spans, name_of: list[str], inner: np.ndarray, dur: np.ndarray) -> dict[str, tuple]:
    """{path: (inclusive µs, exclusive µs, events)} of one pass, every path of the spans, sorted by path."""
    m = sp.rows.size
    hit = inner >= 0
    own_us = np.bincount(inner[hit], weights=dur[hit], minlength=m)
    own_n = np.bincount(inner[hit], minlength=m).astype(np.float64)
    all_us, all_n = own_us.copy(), own_n.copy()
    for s in range(m - 1, -1, -1):  # a parent sorts before its children: one pass up the tree
        p = sp.parent[s]
        if p >= 0:
            all_us[p] += all_us[s]
            all_n[p] += all_n[s]
    out: dict[str, list] = {}
    for s in range(m):
        acc = out.setdefault(name_of[s], [0.0, 0.0, 0.0])
        acc[0] += float(all_us[s])
        acc[1] += float(own_us[s])
        acc[2] += float(all_n[s])
    return {p: tuple(out[p]) for p in sorted(out)}


def modules_for_trace(path, by: str = "type") -> dict[int, ModuleBreakdown]:
    """{rank: ModuleBreakdown} of a trace file or a folder of ranks (each rank's table loaded once)."""
    from trainperf.trace.load import load_trace

    return {r: module_breakdown(t, by=by) for r, t in load_trace(path).items()}
