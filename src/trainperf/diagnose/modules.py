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

Not attributed to modules: the backward pass. Autograd runs backward nodes
("autograd::engine::evaluate_function: XBackward0") after the forward spans have closed, on an
autograd thread (CUDA) or the caller's; linking them to their forward module needs each operator's
"Sequence number", which the trace loader does not keep. Backward device time is reported as one row,
BACKWARD, and everything else launched outside any module (loss, optimizer, copies) as OUTSIDE.

Paths: "Sequential_0/Block_1/Linear_1" names one module instance. With by="type" the instance
numbers are dropped ("Sequential/Block/Linear"), so the 32 blocks of a transformer become one row
with 32 calls per step; siblings of one type (q, k and v projections) share that row too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, PYTHON, EventTable

MODULE_PREFIX = "nn.Module: "
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function:"
BACKWARD = "backward (unattributed)"
OUTSIDE = "(outside nn.Module)"
_INSTANCE_RE = re.compile(r"_\d+$")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleTime:
    """One module path's time per step (µs); basis "gpu" (device-event time) or "cpu_op" (top-level
    CPU operator time)."""

    path: str                      # "Sequential_0/Block_0/Linear_0", or BACKWARD / OUTSIDE
    depth: int                     # 1 for a root module, 0 for the BACKWARD / OUTSIDE rows
    inclusive_us_per_step: float   # its own and its submodules'
    exclusive_us_per_step: float   # what it launched itself
    calls_per_step: float          # forward calls of the module(s) on this path
    events_per_step: float         # device events (or top-level CPU ops) counted inclusively
    pct_of_step: float             # inclusive share of all device (or CPU op) time of the steps

    def to_json(self) -> dict:
        """The row as a JSON object (times µs, rounded to 0.001)."""
        r = lambda v: round(float(v), 3)  # noqa: E731
        return {"module": self.path, "depth": self.depth, "inclusive_us_per_step": r(self.inclusive_us_per_step),
                "exclusive_us_per_step": r(self.exclusive_us_per_step), "calls_per_step": r(self.calls_per_step),
                "events_per_step": r(self.events_per_step), "pct_of_step": r(self.pct_of_step)}


@dataclass(kw_only=True)
class ModuleBreakdown:
    """Time per module path of one rank: rows sorted by path (a parent before its children)."""

    rank: int
    basis: str                     # "gpu": device kernel/memcpy/memset time; "cpu_op": top-level CPU operators
    steps: int                     # profiler steps the totals are divided by (1 when the trace has none)
    total_us_per_step: float       # all device (or top-level CPU op) time per step, attributed or not
    rows: list[ModuleTime] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def attributed_pct(self) -> float:
        """Share of the step's time inside some module's forward (%)."""
        roots = sum(r.inclusive_us_per_step for r in self.rows if r.depth == 1)
        return 100.0 * roots / self.total_us_per_step if self.total_us_per_step > 0 else 0.0

    def to_json(self) -> list[dict]:
        """Flat rows for the JSON output: each row with its rank and basis."""
        return [{"rank": self.rank, "basis": self.basis, "steps": self.steps, **r.to_json()} for r in self.rows]


@dataclass(slots=True)
class _Spans:
    """Module spans of a table: rows, parent span (-1 for a root), path of each (instance names)."""

    rows: np.ndarray
    parent: np.ndarray
    paths: list[str]


def module_spans(t: EventTable) -> _Spans:
    """The "nn.Module: X_n" spans of a table with each one's enclosing module span and path."""
    ids = t.ids_matching(lambda s: s.startswith(MODULE_PREFIX))
    rows, parent = _nesting(t, np.flatnonzero((t.kind == PYTHON) & np.isin(t.name, ids)))
    paths: list[str] = []
    for i, r in enumerate(rows):
        name = t.names[int(t.name[r])][len(MODULE_PREFIX):]
        paths.append(paths[parent[i]] + "/" + name if parent[i] >= 0 else name)
    return _Spans(rows, parent, paths)


def _nesting(t: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows sorted by thread and start, index of each one's enclosing span among them or -1).

    A hand-written stack walk per (pid, tid): host calls nest exactly (Python and record functions);
    a span that overlaps an open span's end (a clock artefact) goes under the innermost one holding it."""
    rows = _by_thread_then_start(t, rows)
    parent = np.full(rows.size, -1, dtype=np.int64)
    key = _thread_key(t, rows)
    starts = t.ts_ns[rows]
    ends = starts + t.dur_ns[rows]
    stack: list[int] = []
    for i in range(rows.size):
        if i and key[i] != key[i - 1]:
            stack = []
        # close the spans that ended, and those it outlasts (not nested in them: a clock artefact)
        while stack and (ends[stack[-1]] <= starts[i] or ends[i] > ends[stack[-1]]):
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return rows, parent


def _innermost(t: EventTable, spans: np.ndarray, parent: np.ndarray, query: np.ndarray) -> np.ndarray:
    """For each query row: the index (into spans, sorted by thread then start) of the innermost span on
    the query's thread whose [start, end) holds the query's start, else -1. Climbs the parent chain from
    the last span that started before it: O(depth) per query."""
    out = np.full(query.size, -1, dtype=np.int64)
    if spans.size == 0 or query.size == 0:
        return out
    skey = _thread_key(t, spans)
    sts = t.ts_ns[spans]
    send = sts + t.dur_ns[spans]
    qkey = _thread_key(t, query)
    qts = t.ts_ns[query]
    for k in np.unique(qkey):
        lo, hi = np.searchsorted(skey, k, side="left"), np.searchsorted(skey, k, side="right")
        if lo == hi:
            continue
        q = np.flatnonzero(qkey == k)
        pos = lo + np.searchsorted(sts[lo:hi], qts[q], side="right") - 1
        pos[pos < lo] = -1
        ended = (pos >= 0) & (send[np.maximum(pos, 0)] <= qts[q])
        while ended.any():  # vectorized climb, one tree level per pass
            pos[ended] = parent[pos[ended]]
            ended = (pos >= 0) & (send[np.maximum(pos, 0)] <= qts[q])
        out[q] = pos
    return out


def _thread_key(t: EventTable, rows: np.ndarray) -> np.ndarray:
    return t.pid[rows] * 1_000_003 + t.tid[rows]


def _by_thread_then_start(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """rows sorted by thread, start, then longest first (an enclosing span before the spans it holds)."""
    return rows[np.lexsort((-t.dur_ns[rows], t.ts_ns[rows], _thread_key(t, rows)))]


def _outermost_ops(t: EventTable) -> np.ndarray:
    """Rows of the CPU operators no other operator on their thread encloses (each op's time once)."""
    rows = _by_thread_then_start(t, np.flatnonzero(t.kind == CPU_OP))
    key = _thread_key(t, rows)
    top = np.ones(rows.size, dtype=bool)
    for k in np.unique(key):
        sel = np.flatnonzero(key == k)
        ts = t.ts_ns[rows[sel]]
        run_end = np.maximum.accumulate(ts + t.dur_ns[rows[sel]])
        top[sel[1:]] = ts[1:] >= run_end[:-1]  # starts after every earlier op ended
    return rows[top]


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
    inner, in_bwd = _attribute(t, sp, anchors)
    name_of = sp.paths if by == "instance" else [_strip(p) for p in sp.paths]
    totals = _path_totals(sp, name_of, inner, dur)
    span_counted, _ = _steps(t, sp.rows)
    calls: dict[str, int] = {}
    for s in np.flatnonzero(span_counted):
        calls[name_of[s]] = calls.get(name_of[s], 0) + 1
    pct = (lambda us: 100.0 * us / total) if total > 0 else (lambda us: 0.0)
    rows = []
    for p in sorted(set(calls) | set(totals)):
        incl, excl, n = totals.get(p, (0.0, 0.0, 0.0))
        rows.append(ModuleTime(path=p, depth=p.count("/") + 1, inclusive_us_per_step=incl / n_steps,
                               exclusive_us_per_step=excl / n_steps, calls_per_step=calls.get(p, 0) / n_steps,
                               events_per_step=n / n_steps, pct_of_step=pct(incl)))
    outside = inner < 0
    for label, mask in ((BACKWARD, outside & in_bwd), (OUTSIDE, outside & ~in_bwd)):
        if mask.any():
            us = float(dur[mask].sum())
            rows.append(ModuleTime(path=label, depth=0, inclusive_us_per_step=us / n_steps,
                                   exclusive_us_per_step=us / n_steps, calls_per_step=0.0,
                                   events_per_step=int(mask.sum()) / n_steps, pct_of_step=pct(us)))
    if (outside & in_bwd).any():
        notes.append("backward time is not attributed to modules (the loader keeps no operator sequence "
                     "numbers to link a backward node to its forward module): shown as one row")
    if n_steps == 1 and not (t.step >= 0).any():
        notes.append("no ProfilerStep spans: totals are over the whole trace")
    return ModuleBreakdown(rank=t.rank, basis=basis, steps=n_steps, total_us_per_step=total / n_steps, rows=rows,
                           notes=notes)


def _attribute(t: EventTable, sp: _Spans, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(innermost module span of each anchor row or -1, whether an anchor outside every module sits in an
    autograd engine node, i.e. is backward work); an anchor of -1 (no launch in the trace) is in neither."""
    has = anchors >= 0
    inner = np.full(anchors.size, -1, dtype=np.int64)
    inner[has] = _innermost(t, sp.rows, sp.parent, anchors[has])
    in_bwd = np.zeros(anchors.size, dtype=bool)
    q = np.flatnonzero((inner < 0) & has)
    bwd_ids = t.ids_matching(lambda s: s.startswith(BACKWARD_OP_PREFIX))
    bwd_rows = np.flatnonzero((t.kind == CPU_OP) & np.isin(t.name, bwd_ids))
    if bwd_rows.size and q.size:
        bwd_rows, bwd_parent = _nesting(t, bwd_rows)
        in_bwd[q] = _innermost(t, bwd_rows, bwd_parent, anchors[q]) >= 0
    return inner, in_bwd


def _path_totals(sp: _Spans, name_of: list[str], inner: np.ndarray, dur: np.ndarray) -> dict[str, tuple]:
    """{path: (inclusive µs, exclusive µs, events)} summed over the spans of each path. A kernel's chain of
    spans has distinct paths (each a prefix of the next), so summing spans per path counts it once."""
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
    return {p: tuple(v) for p, v in out.items()}


def modules_for_trace(path, by: str = "type") -> dict[int, ModuleBreakdown]:
    """{rank: ModuleBreakdown} of a trace file or a folder of ranks (each rank's table loaded once)."""
    from trainperf.trace.load import load_trace

    return {r: module_breakdown(t, by=by) for r, t in load_trace(path).items()}
