"""torch.compile's graph breaks, and the `graph_breaks` finding.

Dynamo compiles a function up to the first operation it cannot trace (`.item()`, `print`, data-dependent Python
control flow, an unsupported call), runs that operation eagerly, and compiles the rest of the function as a new frame
(a resume function) that the first one calls. Each break adds a compiled graph with its guards (`TorchDynamo Cache
Lookup`), its wrappers (`Torch-Compiled Region: F/C`, `CompiledFunction` in the forward, `CompiledFunctionBackward` in
the backward), and eager operators between the graphs, neither fused nor captured by CUDA graphs. The profile shows
each break: a compiled region that starts inside another compiled region on its thread is a resume frame. Regions
compiled one per module (torchtitan's per-block compile) run one after another, not nested, and are not breaks.
On this machine's CPU an MLP whose forward breaks twice took 1.81 ms a step against 1.25 ms compiled whole (real
profiles, `tests/data/compile/make_traces.py`).

Priced by replay (`remove_spans`): the extra graphs' own cost, what one graph would not pay: the resume regions' time
outside their compiled graphs and outside the eager code in them (their guards and wrappers), the guards checked
before each, and as many `CompiledFunctionBackward` nodes' time outside their graphs. The eager code itself stays, host
and device (compiled, its kernels would fuse into the graph: not counted), and so does fusion across the old
boundaries: on the MLP above it prices 0.27 of the 0.56 ms a step measured. Host-only traces: that time's share of the
step, an estimate.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.host import COMPILED_REGION_RE
from trainperf.diagnose.replay import Change, spans_time_us
from trainperf.diagnose.window import Window, merge_intervals, uncovered
from trainperf.trace.events import CPU_OP, EventTable

GRAPH_CALL_RE = re.compile(r"^## Call CompiledFxGraph")  # Inductor's call of a compiled graph
CACHE_LOOKUP = "TorchDynamo Cache Lookup"
# the wrappers a compiled region runs around its graph: kept once, the region's own cost
WRAPPER_RE = re.compile(r"^(Pregraph bytecode|AOTDispatcher Runtime Wrapper|CompiledFunction$|TorchDynamo Cache "
                        r"Lookup|Torch-Compiled Region:|## Call CompiledFxGraph)")
BACKWARD_NODE_RE = re.compile(r"^autograd::engine::evaluate_function: CompiledFunctionBackward")
# the extra graphs' own cost, % of the span: the medium level of findings. Stated, not fitted: no labeled case has
# this kind
GRAPH_BREAKS_MIN_PCT = 3.0


def _nested(t: EventTable, regions: np.ndarray) -> np.ndarray:
    """Which of the region rows start inside another region on their thread (bool per row): the resume frames."""
    out = np.zeros(regions.size, bool)
    order = np.lexsort((-t.dur_ns[regions], t.ts_ns[regions], t.tid[regions]))
    open_end: dict[int, int] = {}  # thread -> end (ns) of the outermost region open there
    for k in order:
        r = regions[k]
        tid, start = int(t.tid[r]), int(t.ts_ns[r])
        if start < open_end.get(tid, -1):
            out[k] = True
        else:
            open_end[tid] = start + int(t.dur_ns[r])
    return out


def break_spans(t: EventTable, w: Window) -> tuple[list[tuple[int, float, float]], int]:
    """(the (thread id, start µs, end µs) pieces one graph would not pay (module docstring), the graph breaks in the
    window)."""
    ops = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    regions = ops[np.isin(t.name[ops], t.ids_matching(COMPILED_REGION_RE.search))]
    if regions.size < 2:
        return [], 0
    nested = _nested(t, regions)
    if not nested.any():
        return [], 0
    calls = ops[np.isin(t.name[ops], t.ids_matching(GRAPH_CALL_RE.search))]
    lookups = ops[np.isin(t.name[ops], t.ids_matching(lambda s: s == CACHE_LOOKUP))]
    wrappers = t.ids_matching(WRAPPER_RE.search)
    backward = t.ids_matching(BACKWARD_NODE_RE.search)
    eager = ops[~np.isin(t.name[ops], wrappers) & ~np.isin(t.name[ops], backward)]
    pieces: list[tuple[int, float, float]] = []
    for tid in np.unique(t.tid[regions[nested]]):
        on_thread = t.tid[regions] == tid
        outer, resumed = regions[on_thread & ~nested], regions[on_thread & nested]
        # what the extra graphs run outside: their graphs and the eager code in them (the break's code stays)
        kept = np.r_[calls[t.tid[calls] == tid], eager[t.tid[eager] == tid]]
        cut = merge_intervals(w.ts_us[kept], w.end_us[kept])
        spans = [(w.ts_us[r], w.end_us[r]) for r in resumed]
        thread_lookups = lookups[t.tid[lookups] == tid]
        for r in resumed:
            home = outer[(w.ts_us[outer] <= w.ts_us[r]) & (w.end_us[outer] >= w.end_us[r])]
            start = float(w.ts_us[home].min()) if home.size else float(w.ts_us[r])
            before = thread_lookups[(w.end_us[thread_lookups] <= w.ts_us[r]) & (w.ts_us[thread_lookups] >= start)]
            if before.size:  # the guards checked for it: the last lookup before it inside its outermost region
                last = before[np.argmax(w.end_us[before])]
                spans.append((w.ts_us[last], w.end_us[last]))
        s, e = merge_intervals(np.array([x[0] for x in spans]), np.array([x[1] for x in spans]))
        for a, b in zip(s, e):
            pieces += [(int(tid), float(p), float(q)) for p, q in zip(*uncovered(a, b, *cut))]
    pieces += _backward_pieces(t, w, ops, calls, int(nested.sum()))
    return pieces, int(nested.sum())


def _backward_pieces(t: EventTable, w: Window, ops: np.ndarray, calls: np.ndarray, breaks: int
                     ) -> list[tuple[int, float, float]]:
    """The time outside their graphs of `breaks` CompiledFunctionBackward nodes, the shortest ones (the one merged
    graph's backward keeps the longest's), as pieces."""
    nodes = ops[np.isin(t.name[ops], t.ids_matching(BACKWARD_NODE_RE.search))]
    if nodes.size < 2 or breaks < 1:
        return []
    nodes = nodes[np.argsort(t.dur_ns[nodes], kind="stable")][:min(breaks, nodes.size - 1)]
    out = []
    for r in nodes:
        tid = int(t.tid[r])
        mine = calls[t.tid[calls] == tid]
        cut = merge_intervals(w.ts_us[mine], w.end_us[mine])
        outside = uncovered(float(w.ts_us[r]), float(w.end_us[r]), *cut)
        out += [(tid, float(p), float(q)) for p, q in zip(*outside)]
    return out


def graph_breaks(f: RankFacts) -> F.Finding | None:
    """torch.compile's graphs broken inside the steps, their extra graphs' cost >= GRAPH_BREAKS_MIN_PCT of the span
    (module docstring); priced by replay with that cost gone."""
    pieces, breaks = f.once("graph_breaks", lambda: break_spans(f.table, f.window))
    if not breaks:
        return None
    time_us = spans_time_us(pieces)
    share = f.pct(time_us)
    if share < GRAPH_BREAKS_MIN_PCT:
        return None
    steps = max(len(f.step_times), 1)
    metrics = {"graph_breaks": (breaks, "count"), "per_step": (breaks / steps, "count"),
               "their_time": (time_us, "us"), "their_share": (share, "%")}
    what_if = ("one graph a step: the extra graphs' guards and wrappers gone (the eager code and fusion across the "
               "breaks not counted)")
    if not f.has_gpu:
        return F.rank_finding(f, "graph_breaks", metrics, gain_pct=share, evidence_pct=share,
                              what_if=what_if + " (host time, estimated)")
    return F.rank_finding(f, "graph_breaks", metrics, (), (Change("remove_spans", spans=tuple(pieces)),), what_if,
                          evidence_pct=share)
