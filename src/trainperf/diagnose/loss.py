"""A cross-entropy loss run as separate kernels over the logits, and the `unfused_cross_entropy` finding.

PyTorch's cross-entropy (`aten::cross_entropy_loss`: an `aten::log_softmax`, then an `aten::nll_loss_nd`), or the
two written out (`F.nll_loss(F.log_softmax(logits, -1), labels)`), passes over the [N, V] logits one kernel at a
time. Forward, the log-softmax reads them and writes N x V log-probabilities (kept for the backward) and the NLL
gathers N of those; backward, the NLL's gradient is an N x V tensor filled with zeros and N values scattered into
it, and the log-softmax's backward reads that and the saved output and writes the N x V gradient of the logits.
Over a language model's vocabulary (32k-256k entries) each is a pass over the largest activation of the step. A
fused cross-entropy (Liger Kernel's, `trainperf.kernels.CrossEntropyLoss`) reads the logits and writes their
gradient in one kernel; a fused linear cross-entropy (`trainperf.kernels.FusedLinearCrossEntropyLoss`, Liger's
FLCE) also never holds the N x V logits, chunking the projection onto the vocabulary: their memory buys a larger
micro-batch.

A region (`loss_regions`), on every thread: an `aten::cross_entropy_loss` not inside another, or an
`aten::log_softmax` outside one whose NLL (`aten::nll_loss_nd`, `nll_loss`, `nll_loss2d`) follows it among its
siblings, at most MAX_OPS_BETWEEN operators later. With recorded shapes it also holds the copies of its logits
between it and the product that made them (COPY_OPS over the logits' elements: Hugging Face's `logits.float()`
upcast, the shift's `.contiguous()`), which a fused kernel on the model's own logits does without, forward and
backward (ToCopyBackward0 casts the gradient back). Its backward is the autograd nodes made by its operators
(regions.region_work), or, in a trace without sequence numbers, the first NllLossBackward0 and LogSoftmaxBackward0
run after it (the loss is the autograd graph's root: its nodes run first).

Priced (GPU) by replay: the region's kernels, forward and backward, sped up to one fused kernel, whose time is taken
as that of the region's forward log-softmax kernels: one read and one write of N x V, the traffic of a kernel that
reads the logits and writes their gradient, measured on the trace's own device (no shapes or catalog needed). Where
the recorded types show 16-bit logits upcast to fp32 for the loss (a copy before it, autocast's inner loss), the
fused kernel moves the model's 16-bit logits: half the log-softmax's bytes, so half its time
(LossRegion.fused_traffic_share). Without recorded shapes the copies before the loss are not confirmed and not
counted, and the log-softmax's time is taken whole. Host-only traces: the regions' host time as evidence, unpriced.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask, node_function
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.launch import launched_inside
from trainperf.diagnose.regions import RegionWork, own_function_spans, region_spans, region_work, with_backward_spans
from trainperf.diagnose.replay import Change
from trainperf.diagnose.roofline import DTYPE_BYTES, is_shape, op_shape
from trainperf.trace.events import CPU_OP, EventTable
from trainperf.trace.nesting import nest, row_spans, thread_key

CROSS_ENTROPY_OP = "aten::cross_entropy_loss"
LOG_SOFTMAX_OPS = ("aten::log_softmax", "aten::_log_softmax")
NLL_OPS = ("aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss2d")
# the loss's own backward nodes, read by name where a trace records no sequence numbers
LOSS_BACKWARD_NODES = ("NllLossBackward0", "LogSoftmaxBackward0")
# copies of the logits before the loss: an upcast (logits.float()), the shift's .contiguous(); one of them copies
# when it is, or holds, one of COPYING_OPS (aten::to of a tensor already of its type returns it, as .contiguous() of
# a contiguous one does)
COPY_OPS = ("aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::copy_", "aten::type_as")
COPYING_OPS = ("aten::_to_copy", "aten::clone", "aten::copy_")
VIEW_OPS = ("aten::view", "aten::reshape", "aten::_unsafe_view", "aten::slice", "aten::flatten", "aten::select",
            "aten::transpose", "aten::permute", "aten::expand", "aten::as_strided")
# siblings between a written-out log-softmax and its NLL (a view or reshape of the log-probabilities, a cast)
MAX_OPS_BETWEEN = 4
# siblings looked through before the loss for copies of its logits, back to the matrix product that made them (the
# projection onto the vocabulary): Hugging Face's loss pads, shifts and flattens the labels between the upcast and
# the loss, 6 siblings in transformers 4.57; 16 leaves room for more without reaching far into the model
MAX_OPS_BEFORE = 16
PRODUCT_OPS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::einsum")
# a copy before the loss is of its logits when its input has their element count within this share: the shift
# drops one position of each sequence (1 / 128 of a 128-token one)
SAME_LOGITS_SHARE = 0.02
# the regions' kernel time (forward and backward), % of the span, before it is a finding. Not fitted: no labeled
# trace has this kind; 3 % as unfused_attention's (a fused kernel's 2-3x saving reaches the stall rules' 1-2 %)
UNFUSED_LOSS_MIN_PCT = 3.0


@dataclass(frozen=True, kw_only=True)
class LossRegion:
    """One cross-entropy over logits: the loss operator (or the written-out log-softmax through its NLL)."""

    key: int                 # thread key (trace.nesting.thread_key)
    start_ns: int
    end_ns: int
    row: int                 # trace row of the loss operator, or of the written-out log-softmax
    log_softmax_row: int     # trace row of its (outermost) log-softmax
    tokens: int | None       # N: rows of logits (the recorded shape's elements over the vocabulary); None unknown
    vocab: int | None        # V: the class dimension's size
    dtype: str               # the logits' recorded type ("" unknown)
    copies: int = 0          # copies of the logits just before the loss taken into the region (start_ns: the first)
    model_dtype: str = ""    # the logits' type as the model made them: the first copy's input's ("" unknown)
    log_softmax_dtype: str = ""  # the type its log-softmax ran in ("" unknown)

    @property
    def fused_traffic_share(self) -> float:
        """The bytes a fused kernel on the model's logits moves, as a share of what the log-softmax moved (1 where
        a type is unknown; never above 1): 0.5 for bf16 logits upcast to fp32 before the loss."""
        model, ran = DTYPE_BYTES.get(self.model_dtype), DTYPE_BYTES.get(self.log_softmax_dtype)
        return min(model / ran, 1.0) if model and ran else 1.0


def _first_input(t: EventTable, row: int) -> tuple[list | None, str]:
    """(dims, recorded type) of the first tensor an operator takes; (None, "") without recorded shapes."""
    s = op_shape(t, row)
    if s is None or not s.dims or not is_shape(s.dims[0]):
        return None, ""
    return s.dims[0], (s.types[0] if s.types else "")


def _logits_shape(t: EventTable, row: int, class_dim: int) -> tuple[int | None, int | None, str]:
    """(N, V, dtype) of the logits an operator takes first, V along class_dim; (None, None, "") without shapes."""
    dims, dtype = _first_input(t, row)
    if not dims:
        return None, None, ""
    vocab = int(dims[class_dim if len(dims) > 1 else 0])
    n = int(np.prod(dims)) // vocab if vocab else 0
    return n, vocab, dtype


def loss_regions(t: EventTable) -> list[LossRegion]:
    """Every cross-entropy region of a rank's trace (module docstring), in thread and time order."""
    ops = np.flatnonzero(t.kind == CPU_OP)
    ce_ids = t.ids_matching(lambda s: s == CROSS_ENTROPY_OP)
    ls_ids = t.ids_matching(lambda s: s in LOG_SOFTMAX_OPS)
    if not ops.size or not np.isin(t.name[ops], ls_ids).any():
        return []
    n = nest(*row_spans(t, ops))
    rows, parent = ops[n.order], n.parent
    is_ce = np.isin(t.name[rows], ce_ids)
    is_ls = np.isin(t.name[rows], ls_ids)
    is_nll = np.isin(t.name[rows], t.ids_matching(lambda s: s in NLL_OPS))
    is_copy = np.isin(t.name[rows], t.ids_matching(lambda s: s in COPY_OPS))
    is_view = np.isin(t.name[rows], t.ids_matching(lambda s: s in VIEW_OPS))
    is_product = np.isin(t.name[rows], t.ids_matching(lambda s: s in PRODUCT_OPS))
    copying = np.zeros(rows.size, dtype=bool)  # the operator copies: it is, or holds, one of COPYING_OPS
    for x in np.flatnonzero(np.isin(t.name[rows], t.ids_matching(lambda s: s in COPYING_OPS))).tolist():
        while x >= 0 and not copying[x]:
            copying[x], x = True, int(parent[x])

    def inside(i: int, mask: np.ndarray) -> int:  # the nearest enclosing position in mask, or -1
        i = int(parent[i])
        while i >= 0 and not mask[i]:
            i = int(parent[i])
        return i

    def outermost(i: int, mask: np.ndarray) -> int:  # the outermost enclosing position in mask, or -1
        top, i = -1, inside(i, mask)
        while i >= 0:
            top, i = i, inside(i, mask)
        return top

    outer_ls = [i for i in np.flatnonzero(is_ls).tolist() if inside(i, is_ls) < 0]
    by_sibling = np.lexsort((n.start, parent, n.key))
    where = np.empty_like(by_sibling)
    where[by_sibling] = np.arange(by_sibling.size)

    def copies_before(i: int, elements: int | None) -> list[int]:
        """The copies of the logits (COPY_OPS on elements of them, SAME_LOGITS_SHARE) among the MAX_OPS_BEFORE
        siblings before position i, nearest first, back to the matrix product that made the logits: looking through
        views and operators on other tensors (the labels' shift), stopping at any other operator on the logits."""
        found, j = [], int(where[i])
        for x in by_sibling[max(j - MAX_OPS_BEFORE, 0):j][::-1].tolist() if elements else ():
            if n.key[x] != n.key[i] or parent[x] != parent[i] or is_product[x]:
                break
            dims, _ = _first_input(t, int(rows[x]))
            e = None if dims is None else int(np.prod(dims))
            if e is None or abs(e - elements) > SAME_LOGITS_SHARE * elements or is_view[x] or (
                    is_copy[x] and not copying[x]):
                continue  # another tensor (the labels), a view, a cast or .contiguous() that returned its input
            if not (is_copy[x] and copying[x]):
                break
            found.append(x)
        return found

    def region(i: int, end: int, log_softmax: int, class_dim: int) -> LossRegion:
        tokens, vocab, dtype = _logits_shape(t, int(rows[i]), class_dim)
        copies = copies_before(i, tokens * vocab if vocab else None)
        return LossRegion(key=int(n.key[i]), start_ns=int(n.start[copies[-1] if copies else i]),
                          end_ns=int(n.end[end]), row=int(rows[i]), log_softmax_row=int(rows[log_softmax]),
                          tokens=tokens, vocab=vocab, dtype=dtype, copies=len(copies),
                          model_dtype=_first_input(t, int(rows[copies[-1]]))[1] if copies else dtype,
                          log_softmax_dtype=_first_input(t, int(rows[log_softmax]))[1])

    # each log-softmax's outermost loss: under autocast the loss runs as an aten::cross_entropy_loss of the 16-bit
    # logits holding their upcast and the fp32 one; the outer one is the region, its log-softmax the inner one's
    owner = {j: outermost(j, is_ce) for j in outer_ls}
    first_of = {}
    for j, ce in owner.items():
        first_of.setdefault(ce, j)
    out = [region(i, i, first_of[i], 1) for i in np.flatnonzero(is_ce).tolist() if i in first_of]
    for i in outer_ls:
        if owner[i] >= 0:
            continue
        j = int(where[i])
        after = [x for x in by_sibling[j + 1:j + MAX_OPS_BETWEEN + 2].tolist()
                 if n.key[x] == n.key[i] and parent[x] == parent[i]]
        nll = next((x for x in after if is_nll[x]), -1)
        if nll >= 0:
            out.append(region(i, nll, i, -1))
    return sorted(out, key=lambda r: (r.key, r.start_ns))


def window_loss_regions(f: RankFacts) -> list[LossRegion]:
    """The rank's loss regions whose operator is in the analysed window (once per rank)."""
    return f.once("loss_regions", lambda: [r for r in loss_regions(f.table) if f.window.keep[r.row]])


def _named_backward_nodes(t: EventTable, regions: list[LossRegion]) -> np.ndarray:
    """Trace rows of the regions' backward nodes by name, for a trace without sequence numbers (an exporter that
    drops operator ids): the loss is the root of the autograd graph, so after each region, before the next one, the
    first NllLossBackward0 and LogSoftmaxBackward0 (and, per copy of the logits, ToCopyBackward0) the engine runs
    are its own."""
    nodes = np.flatnonzero(t.kind == CPU_OP)
    nodes = nodes[backward_node_mask(t, nodes)]
    out = []
    starts = np.sort([r.start_ns for r in regions] + [np.iinfo(np.int64).max])
    for r in regions:
        until = starts[np.searchsorted(starts, r.start_ns, side="right")]  # the next region's start
        after = nodes[(t.ts_ns[nodes] >= r.end_ns) & (t.ts_ns[nodes] < until)]
        names = [node_function(t.name_of(x)) for x in after]
        wanted = list(LOSS_BACKWARD_NODES) + ["ToCopyBackward0"] * r.copies
        for x, name in zip(after.tolist(), names):
            if name in wanted:
                wanted.remove(name)
                out.append(x)
    return np.array(out, dtype=np.int64)


def loss_work(f: RankFacts, regions: list[LossRegion]) -> tuple[RegionWork, np.ndarray]:
    """(the regions' work, forward and backward: regions.region_work, or where the trace records no sequence numbers
    its backward nodes by name (_named_backward_nodes); the window's device rows their log-softmax operators
    launched)."""
    t, w = f.table, f.window
    key, start, end = region_spans(regions)
    ls = np.array([r.log_softmax_row for r in regions], dtype=np.int64)
    ls_end = t.ts_ns[ls] + t.dur_ns[ls]
    work = region_work(t, w, key, start, end)
    if not work.backward and not (t.seq >= 0).any():
        nodes = _named_backward_nodes(t, regions)
        work = with_backward_spans(t, w, work, thread_key(t.pid[nodes], t.tid[nodes]), *own_function_spans(t, nodes))
    return work, launched_inside(t, w, key, t.ts_ns[ls], ls_end)


def unfused_cross_entropy(f: RankFacts) -> F.Finding | None:
    """A cross-entropy run as separate kernels (module docstring) takes UNFUSED_LOSS_MIN_PCT of the span or more.

    GPU: priced by replay, the regions' kernels sped up to one fused kernel's time (their forward log-softmax
    kernels', times LossRegion.fused_traffic_share); unpriced where no log-softmax kernel is found. Host only: the
    regions' host time as evidence, unpriced."""
    w = f.window
    regions = window_loss_regions(f)
    if not regions:
        return None
    work, log_softmax = f.once("loss_work", lambda: loss_work(f, regions))
    metrics = {"regions": (len(regions), "count")}
    shaped = [r for r in regions if r.vocab]
    if shaped:
        r = max(shaped, key=lambda x: x.tokens * x.vocab)
        metrics.update(vocabulary=(r.vocab, "count"), tokens=(r.tokens, "count"),
                       logits_bytes=(r.tokens * r.vocab * DTYPE_BYTES.get(r.dtype, 4), "B"),
                       copies_of_the_logits=(sum(x.copies for x in regions), "count"))
    events = _events(f, regions)
    if not f.has_gpu:
        if f.pct(work.host_us) < UNFUSED_LOSS_MIN_PCT:
            return None
        metrics.update(loss_host_time=(work.host_us, "us"), loss_host_share=(f.pct(work.host_us), "%"))
        x = F.rank_finding(f, "unfused_cross_entropy", metrics, events, severity="low",
                           what_if="not priced: a fused kernel's rate on this host is not in the catalog",
                           evidence_pct=f.pct(work.host_us))
        x.confidence = "low"
        return x
    dur = w.end_us[work.kernels] - w.ts_us[work.kernels]
    unfused_us = float(dur.sum())
    if f.pct(unfused_us) < UNFUSED_LOSS_MIN_PCT:
        return None
    # the log-softmax's time for the fused kernel's, scaled to the bytes it moves on the model's own logits (half,
    # where they were upcast from 16 bits to fp32 for the loss): the regions of a window are one loss, step after step
    share = float(np.median([r.fused_traffic_share for r in regions]))
    fused_us = share * float((w.end_us[log_softmax] - w.ts_us[log_softmax]).sum())
    metrics.update(loss_kernel_time=(unfused_us, "us"), loss_kernel_share=(f.pct(unfused_us), "%"),
                   fused_kernel_estimate=(fused_us, "us"), fused_traffic_share=(share, "x"),
                   backward_in_trace=(int(work.backward), "bool"))
    if fused_us <= 0:
        x = F.rank_finding(f, "unfused_cross_entropy", metrics, events, severity="low",
                           what_if="not priced: no log-softmax kernel in the regions to measure a fused kernel by",
                           evidence_pct=f.pct(unfused_us))
        x.confidence = "low"
        return x
    if fused_us >= unfused_us:
        return None
    factor = unfused_us / fused_us
    x = F.rank_finding(f, "unfused_cross_entropy", metrics, events,
                       (Change("speedup_rows", factor=factor, rows=tuple(int(r) for r in work.kernels)),),
                       f"the loss regions' {work.kernels.size} kernels as one fused cross-entropy kernel that costs "
                       f"their forward log-softmax's time{' on 16-bit logits' if share < 1.0 else ''} "
                       f"({factor:.3g}x faster)",
                       evidence_pct=f.pct(unfused_us) * (1.0 - 1.0 / factor))
    x.confidence = "medium"
    return x


def _events(f: RankFacts, regions: list[LossRegion]) -> list[tuple[str, float, float]]:
    """The first regions as evidence events (the loss operator and its logits' shape, start µs, duration µs)."""
    t, w = f.table, f.window
    out = []
    for r in regions[:3]:
        s = op_shape(t, r.row)
        shape = f" {s.dims[0]}" if s is not None and s.dims else ""
        out.append((f"{t.name_of(r.row)}{shape}", float(w.ts_us[r.row]), float(w.end_us[r.row] - w.ts_us[r.row])))
    return out
