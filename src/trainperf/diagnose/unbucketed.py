"""Gradients all-reduced one small message at a time, and the `unbucketed_gradients` finding.

An all-reduce costs a fixed latency (NCCL's kernel start, its protocol's handshakes: ~10-30 us within a node, more
across nodes) and a host call (c10d's bookkeeping and the launch), whatever its size: a small message pays almost
nothing else. DistributedDataParallel therefore gathers gradients into buckets (`bucket_cap_mb`, 25 MB) and
all-reduces each bucket once it is full; a hand-written loop that all-reduces every parameter's gradient (`for p in
model.parameters(): dist.all_reduce(p.grad)`), or a compiled graph that issues one collective per gradient, pays the
latency and the call once per parameter. HTA's V100 rank of a compiled model (df_index_resolver) all-reduces 404
gradients a step inside its compiled backward, one per parameter (as many as its AccumulateGrad nodes), each a
latency-bound kernel (NCCL's LL protocol, median 11 us) after a ~90-us host call.

Found from the trace: all-reduce kernels launched inside autograd backward nodes (gradients, not a forward's
tensor-parallel activations), at least UNBUCKETED_MIN_PER_STEP a step, small: a median message of at most
SMALL_MESSAGE_BYTES where the kernels carry sizes (PyTorch >= 2.1), else most run NCCL's LL protocol (named in the
kernel, `..._LL_...`: chosen for small messages). Priced by replay: coalesced into buckets of BUCKET_BYTES (one a
step without sizes), the last ones of each step kept, the others' host calls not made and their kernels not run
(`remove_spans`; a measured wait for a late rank stays): an upper bound, their transfers, small but not nothing, taken
as free and the buckets' own calls as no longer.
"""

from __future__ import annotations

import math
import re
from statistics import median

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask
from trainperf.diagnose.crossrank import COLLECTIVE_CALL_RE
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.grad_sync import collectives_launched_inside
from trainperf.diagnose.host import span_rows
from trainperf.diagnose.replay import Change, spans_time_us
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import CPU_OP
from trainperf.trace.nesting import enclosing_span, outermost, row_spans, thread_key

# all-reduces of gradients a step before they count as unbucketed: DDP's 25-MB buckets make one per 12.5 M bf16
# parameters, so a 400 M-parameter model makes 32. Stated, not fitted: no labeled case has this kind
UNBUCKETED_MIN_PER_STEP = 32
SMALL_MESSAGE_BYTES = 1 << 20  # a median message this small is latency-bound on every link (nccl-tests' curves)
BUCKET_BYTES = 25 << 20        # DistributedDataParallel's bucket_cap_mb default, the coalescing priced
LOW_LATENCY_PROTOCOL_RE = re.compile(r"_LL_")  # NCCL's LL protocol in a kernel's name (not LL128)
# their host calls and kernel time beyond the fastest, % of the span: the medium level of findings
UNBUCKETED_MIN_PCT = 3.0


def gradient_all_reduces(f: RankFacts) -> np.ndarray:
    """The window's all-reduce kernels launched inside autograd backward nodes (device rows, in time order)."""
    t, w = f.table, f.window
    ops = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    nodes = ops[backward_node_mask(t, ops)]
    if not nodes.size:
        return nodes
    rows = collectives_launched_inside(t, w, outermost(t, nodes), ("all_reduce",))
    return rows[np.argsort(w.ts_us[rows], kind="stable")]


def _call_spans(f: RankFacts, rows: np.ndarray) -> list[tuple[int, float, float]]:
    """Per kernel row: the host span that issued it, the outermost collective call (COLLECTIVE_CALL_RE) around its
    launch, else the launch call itself, as (thread id, start µs, end µs)."""
    t, w = f.table, f.window
    launch = correlated_host_row(t)[rows]
    calls = span_rows(t, w, COLLECTIVE_CALL_RE, (CPU_OP,))
    calls = outermost(t, calls) if calls.size else calls
    ok = launch >= 0
    held = np.full(rows.size, -1)
    if calls.size and ok.any():
        held[ok] = enclosing_span(*row_spans(t, calls), thread_key(t.pid[launch[ok]], t.tid[launch[ok]]),
                                  t.ts_ns[launch[ok]])
    out = []
    for k in range(rows.size):
        r = calls[held[k]] if held[k] >= 0 else launch[k] if ok[k] else -1
        if r >= 0:
            out.append((int(t.tid[r]), float(w.ts_us[r]), float(w.end_us[r])))
    return out


def unbucketed_gradients(f: RankFacts) -> F.Finding | None:
    """Gradients all-reduced one small message at a time (module docstring), their calls and fixed costs >=
    UNBUCKETED_MIN_PCT of the span; priced by replay as coalesced into buckets."""
    if not f.has_gpu:
        return None
    t, w = f.table, f.window
    rows = f.once("gradient_all_reduces", lambda: gradient_all_reduces(f))
    steps = max(len(f.step_times), 1)
    if rows.size < UNBUCKETED_MIN_PER_STEP * steps:
        return None
    sizes = f.comm_sizes
    nbytes = np.array([sizes[int(c)].nbytes if int(c) in sizes else -1 for c in t.correlation[rows]])
    sized = bool((nbytes > 0).mean() > 0.5)
    low_latency = np.isin(t.name[rows], t.ids_matching(LOW_LATENCY_PROTOCOL_RE.search))
    if sized:
        if median(nbytes[nbytes > 0]) > SMALL_MESSAGE_BYTES:
            return None
    elif low_latency.mean() <= 0.5:
        return None
    dur = w.end_us[rows] - w.ts_us[rows]
    removed = []
    for step in np.unique(t.step[rows]):
        mine = np.flatnonzero(t.step[rows] == step)
        buckets = max(math.ceil(float(nbytes[mine].clip(0).sum()) / BUCKET_BYTES), 1) if sized else 1
        removed.append(mine[:-buckets])  # the last ones of the step carry the buckets
    if not sum(x.size for x in removed):
        return None
    gone = np.concatenate(removed)
    spans = _call_spans(f, rows[gone])
    host_us = spans_time_us(spans)
    fixed_us = float(np.minimum(dur[gone], dur.min()).sum())
    share = f.pct(host_us + fixed_us)
    if share < UNBUCKETED_MIN_PCT:
        return None
    metrics = {"gradient_all_reduces": (rows.size, "count"), "per_step": (rows.size / steps, "count"),
               "median_kernel": (float(np.median(dur)), "us"), "their_host_calls": (host_us, "us"),
               "their_fixed_device_cost": (fixed_us, "us"), "their_share": (share, "%")}
    if sized:
        metrics["median_message"] = (float(median(nbytes[nbytes > 0])) / 1024, "KiB")
    else:
        metrics["low_latency_protocol_share"] = (100.0 * float(low_latency.mean()), "%")
    events = [(t.name_of(int(rows[k])), float(w.ts_us[rows[k]]), float(dur[k])) for k in range(min(3, rows.size))]
    what_if = (f"coalesced into {BUCKET_BYTES >> 20}-MB buckets" if sized else "coalesced into one all-reduce a step") \
        + ": the other calls not made and their kernels not run (their small transfers taken as free)"
    return F.rank_finding(f, "unbucketed_gradients", metrics, events, (Change("remove_spans", spans=tuple(spans)),),
                          what_if, evidence_pct=share, upper_bound=True)
