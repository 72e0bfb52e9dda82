"""Attention written out of separate operators, and the `unfused_attention` finding.

Attention computed as ``softmax(Q Kᵀ · scale + mask) V`` with one operator per step (a batched matmul, the scale,
the mask, the softmax, dropout, a second batched matmul) writes the S × S score matrix to memory and reads it back
at every step, forward and backward; a fused kernel (FlashAttention through ``F.scaled_dot_product_attention``,
cuDNN or memory-efficient attention) keeps it on chip and does only the matmul FLOPs. TraceLens's analysis guide
names the same pattern ("unfused attention: softmax + bmm + mul + copy_") as its first fusion recommendation.

How a region is found (`attention_regions`), on every thread and at every nesting level, so that it holds for
model code written out by hand (nanoGPT's non-flash path, Hugging Face ``attn_implementation="eager"``) and for
SDPA's own fallback (``aten::_scaled_dot_product_attention_math`` runs the same operators inside it):
- a softmax operator (``aten::softmax``, ``aten::_softmax``, ``aten::_safe_softmax``; not one nested in another,
  and never log-softmax, which is the loss) between two batched-matmul operators among its siblings (same
  thread, same enclosing operator), the nearest on each side, at most MAX_OPS_BETWEEN siblings away and with no
  other matrix product (OTHER_PRODUCTS: a projection, a router's linear) between: the scores product before it,
  the product with V after it;
- with recorded shapes (record_shapes=True) the element counts must chain, whatever the layout (bhsd, bshd, a
  transposed key, einsum): the softmax input is [..., Sq, Sk] with at least one batch/head dimension (B·H of
  them), the first product takes Q of B·H·Sq·D and K of B·H·Sk·D elements for one integer D, the second the
  scores and V of B·H·Sk·Dv. A router's softmax over [tokens, experts], or a softmax whose neighbour matmul
  multiplies something else (HTA's trace_filter: softmax of [2, 1] then a [2048, 2] x [2, 1] mm), is not
  attention. Without shapes the operator pattern alone decides, at low confidence.
The region's backward is the autograd nodes whose sequence number is one of its forward operators' (as
autograd_links links them: regions.region_work); in a trace without sequence numbers, by name
(_named_backward_spans).

Pricing (GPU): the region's kernels, forward and backward, replaced by a fused kernel that does the attention
FLOPs (forward 2·B·H·Sq·Sk·(D + Dv), 4·B·H·Sq·Sk·D for equal head dims; backward 2.5x that: FlashAttention-2
recomputes the scores, 5 matmuls against 2) at the catalog's rate of PyTorch SDPA's flash kernel (the planner's
number: hardware catalog attn_eff / fa2_eff of the bf16/fp16 peak, the fp32 peak for fp32 inputs; einsum records
no dtype, so there the GEMM kernels' names decide). No causal saving is assumed (a causal model gains more).
Without shapes or a known accelerator the fused kernel is taken to cost what the region's matmul kernels cost
(the scores' memory passes removed): an upper bound, since flash kernels run below cuBLAS's rate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask, node_function
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.precision import FP32, TF32, classify_kernel
from trainperf.diagnose.regions import (RegionWork, own_function_spans, region_spans, region_work,
                                        with_backward_spans)
from trainperf.diagnose.replay import Change
from trainperf.diagnose.roofline import DTYPE_BYTES, device_accelerator, is_shape, op_shape
from trainperf.diagnose.window import Window
from trainperf.trace.events import CPU_OP, GEMM, EventTable
from trainperf.trace.nesting import nest, row_spans, thread_key

SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
MATMUL_OPS = ("aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum")
# other matrix products: one of them between the softmax and a batched product means that product does not take
# the scores (a projection, a router's linear, the next layer)
OTHER_PRODUCTS = ("aten::linear", "aten::mm", "aten::addmm", "aten::convolution", "aten::conv2d", "aten::conv1d")
MATH_SDPA = "aten::_scaled_dot_product_attention_math"
# the autograd nodes of a softmax and of a batched product (a trace without sequence numbers links a region's
# backward by these names: _named_backward_spans)
SOFTMAX_BACKWARD_NODES = ("SoftmaxBackward0", "SafeSoftmaxBackward0")
PRODUCT_BACKWARD_RE = re.compile(r"^(?:Bmm|Baddbmm|Matmul|Einsum)Backward\d+$")
# siblings between the scores product and the softmax (scale, mask, casts, views) and between the softmax and the
# product with V (dropout, casts): nanoGPT writes 2 (mul, masked_fill), Hugging Face eager 3-4 (+ the mask add,
# the fp32 cast and back), SDPA's math path 1-2; 8 leaves room for views and copies without reaching a
# neighbouring layer's matmul (a projection sits between layers: the shape chain then rejects it)
MAX_OPS_BETWEEN = 8
# the region's time (forward and backward), % of the span, before it is a finding. Not fitted: no labeled trace
# has this kind; 3 % is where a fused kernel's usual 2-5x saving reaches the 1-2 % the stall rules start at
UNFUSED_ATTENTION_MIN_PCT = 3.0
FLASH_BACKWARD_FLOPS = 2.5  # FlashAttention-2 backward: 5 matmuls of 2·Sq·Sk·D per head against the forward's 2


@dataclass(frozen=True, kw_only=True)
class AttentionRegion:
    """One unfused attention computation: the scores product through the product with V on one thread."""

    key: int                 # thread key (trace.nesting.thread_key)
    start_ns: int            # the scores matmul's start
    end_ns: int              # the value matmul's end
    qk_row: int              # trace rows of the two matmuls and the softmax
    pv_row: int
    softmax_row: int
    flops: float | None      # forward attention FLOPs 2·B·H·Sq·Sk·(D + Dv); None without shapes
    dtype: str               # the query's type ("c10::BFloat16", "float", ...; "" unknown)
    in_math_sdpa: bool       # inside SDPA's math fallback


def _operands(t: EventTable, row: int) -> tuple[list, list, str] | None:
    """(A dims, B dims, A's type) of a matmul-family op from its recorded shapes: the first two tensor inputs
    (baddbmm: batch1 and batch2 after its bias; einsum: the tensor list after the equation); None without them."""
    s = op_shape(t, row)
    if s is None:
        return None
    pairs = [(d, ty) for d, ty in zip(s.dims, s.types or [""] * len(s.dims))]
    if s.name == "aten::einsum" and len(s.dims) >= 2 and isinstance(s.dims[1], list):
        pairs = [(d, "") for d in s.dims[1]]
    elif s.name == "aten::baddbmm":
        pairs = pairs[1:]
    tensors = [(d, ty) for d, ty in pairs if is_shape(d) and len(d) >= 2]
    if len(tensors) < 2:
        return None
    (a, ty), (b, _) = tensors[:2]
    return a, b, ty


def _chain(t: EventTable, qk: int, sm: int, pv: int) -> tuple[bool, float | None, str]:
    """(is attention, forward FLOPs or None, dtype) from the recorded shapes of the three ops; without shapes
    (True, None, "").

    The chain is checked by element counts, whatever the layout (bhsd, bshd, a transposed key, einsum): scores of
    BH·Sq·Sk elements (a softmax over [..., Sq, Sk] with a batch or head dimension), Q of BH·Sq·D and K of BH·Sk·D
    elements for one integer D, and the value product taking the scores and V of BH·Sk·Dv."""
    s = op_shape(t, sm)
    if s is None:
        return _operands(t, qk) is None and _operands(t, pv) is None, None, ""
    a, b = _operands(t, qk), _operands(t, pv)
    scores = s.dims[0] if s.dims else None
    if not is_shape(scores) or len(scores) < 3 or a is None or b is None:
        return False, None, ""  # no batch or head dimension (a router, a classifier), or products without shapes
    sq, sk = scores[-2:]
    bh = int(np.prod(scores[:-2]))
    (q, k, dtype), (p, v, _) = a, b  # the query's dtype: the scores may be kept in fp32 around the softmax
    nq, nk, nv = int(np.prod(q)), int(np.prod(k)), int(np.prod(v))
    d = nq // (bh * sq) if bh * sq else 0
    if not (d > 0 and nq == bh * sq * d and nk == bh * sk * d and int(np.prod(p)) == bh * sq * sk
            and nv % (bh * sk) == 0):
        return False, None, ""
    return True, 2.0 * bh * sq * sk * (d + nv // (bh * sk)), dtype  # QK^T and PV: 2·Sq·Sk·D and 2·Sq·Sk·Dv


def attention_regions(t: EventTable) -> list[AttentionRegion]:
    """Every unfused attention region of a rank's trace (module docstring), in thread and time order."""
    ops = np.flatnonzero(t.kind == CPU_OP)
    if not ops.size:
        return []
    soft_ids = t.ids_matching(lambda s: s in SOFTMAX_OPS)
    if not np.isin(t.name[ops], soft_ids).any():
        return []
    mm_ids = t.ids_matching(lambda s: s in MATMUL_OPS)
    math_ids = t.ids_matching(lambda s: s == MATH_SDPA)
    n = nest(*row_spans(t, ops))
    rows = ops[n.order]
    parent = n.parent
    is_soft = np.isin(t.name[rows], soft_ids)
    is_mm = np.isin(t.name[rows], mm_ids)
    is_other = np.isin(t.name[rows], t.ids_matching(lambda s: s in OTHER_PRODUCTS))
    # siblings: positions sorted by (thread, parent, start); a softmax's siblings are its neighbours in that order
    # with its thread and parent
    by_sibling = np.lexsort((n.start, parent, n.key))
    where = np.empty_like(by_sibling)
    where[by_sibling] = np.arange(by_sibling.size)
    out = []
    for i in np.flatnonzero(is_soft & ~((parent >= 0) & is_soft[np.maximum(parent, 0)])).tolist():
        j = int(where[i])
        near = by_sibling[max(j - MAX_OPS_BETWEEN - 1, 0):j + MAX_OPS_BETWEEN + 2]
        near = near[(n.key[near] == n.key[i]) & (parent[near] == parent[i])].tolist()
        k = near.index(i)
        qk = _nearest_product(near[:k][::-1], is_mm, is_other)
        pv = _nearest_product(near[k + 1:], is_mm, is_other)
        if qk < 0 or pv < 0:
            continue
        ok, flops, dtype = _chain(t, int(rows[qk]), int(rows[i]), int(rows[pv]))
        if not ok:
            continue
        anc, in_math = int(parent[i]), False
        while anc >= 0 and not in_math:
            in_math, anc = bool(np.isin(t.name[rows[anc]], math_ids)), int(parent[anc])
        out.append(AttentionRegion(key=int(n.key[i]), start_ns=int(n.start[qk]), end_ns=int(n.end[pv]),
                                   qk_row=int(rows[qk]), pv_row=int(rows[pv]), softmax_row=int(rows[i]),
                                   flops=flops, dtype=dtype, in_math_sdpa=in_math))
    return out


def _nearest_product(positions: list[int], is_mm: np.ndarray, is_other: np.ndarray) -> int:
    """The first batched product among positions (nearest first, at most MAX_OPS_BETWEEN + 1 of them), or -1 when
    another product comes first."""
    for x in positions:
        if is_mm[x]:
            return x
        if is_other[x]:
            return -1
    return -1


def _with_kernel_dtype(t: EventTable, regions: list[AttentionRegion], kernels: np.ndarray) -> list[AttentionRegion]:
    """The regions, those whose products recorded no dtype (einsum takes a TensorList) given "float" when most of
    the regions' GEMM kernel time is fp32 or TF32 by the kernel names (precision.classify_kernel), else kept."""
    if all(r.dtype for r in regions):
        return regions
    gemm = kernels[t.category[kernels] == GEMM]
    dur = t.dur_ns[gemm].astype(float)
    wide = np.array([classify_kernel(t.name_of(int(r))) in (FP32, TF32) for r in gemm], dtype=bool)
    if not dur.sum() or dur[wide].sum() <= dur.sum() / 2:
        return regions
    return [r if r.dtype else replace(r, dtype="float") for r in regions]


def _peak_tflops(acc, dtype: str) -> float:
    """The accelerator's dense peak for a fused attention kernel on inputs of this dtype (TFLOP/s; 0 unknown); an
    unrecorded dtype ("") is taken as 16-bit, what fused attention kernels run in."""
    if dtype == "float":
        return float(acc.fp32_tflops or 0.0)
    if DTYPE_BYTES.get(dtype) == 2 or not dtype:
        return float(max(acc.bf16_tflops or 0.0, acc.fp16_tflops or 0.0))
    return 0.0


def fused_attention_us(t: EventTable, regions: list[AttentionRegion], backward: bool) -> float | None:
    """Time a fused attention kernel would take for these regions (µs) at the catalog's SDPA flash rate
    (min(attn_eff, fa2_eff) of the dtype's peak: the planner's kernel, plan/efficiency.resolve), forward and, when
    the trace holds the backward, backward (FLASH_BACKWARD_FLOPS x); None without shapes or a known device."""
    acc = device_accelerator(t)
    if acc is None or any(r.flops is None for r in regions):
        return None
    eff = min(acc.attn_eff, acc.fa2_eff or acc.attn_eff)
    total = 0.0
    for r in regions:
        rate = _peak_tflops(acc, r.dtype) * eff
        if rate <= 0:
            return None
        total += r.flops * (1.0 + (FLASH_BACKWARD_FLOPS if backward else 0.0)) / (rate * 1e6)
    return total


def window_regions(f: RankFacts) -> list[AttentionRegion]:
    """The rank's attention regions whose softmax is in the analysed window (once per rank)."""
    return f.once("attention_regions", lambda: [r for r in attention_regions(f.table) if f.window.keep[r.softmax_row]])


def window_region_work(f: RankFacts) -> RegionWork:
    """region_work of window_regions (once per rank), with their backward found by name where the trace records no
    sequence numbers (_named_backward_spans): the kernels unfused_attention prices."""
    def work() -> RegionWork:
        t, w, regions = f.table, f.window, window_regions(f)
        found = region_work(t, w, *region_spans(regions))
        if found.backward or (t.seq >= 0).any():
            return found
        return with_backward_spans(t, w, found, *_named_backward_spans(t, w, len(regions)))
    return f.once("attention_work", work)


def _named_backward_spans(t: EventTable, w: Window, regions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thread key, start ns, end ns) of the attention regions' backward, by name, for a trace without sequence
    numbers (an exporter that drops operator ids): where the window runs as many SoftmaxBackward0 nodes as it holds
    regions (so that none is a router's or another softmax's), each one with the product-backward nodes
    (BmmBackward0, ...) nearest before and after it among MAX_OPS_BETWEEN nodes of its thread: the engine runs a
    region's nodes in reverse, the product with V's, the softmax's (and the dropout's, mask's, scale's), the scores
    product's. Empty arrays where the counts differ."""
    nodes = np.flatnonzero(w.keep & (t.kind == CPU_OP))
    nodes = nodes[backward_node_mask(t, nodes)]
    key = thread_key(t.pid[nodes], t.tid[nodes])
    nodes, key = nodes[np.lexsort((t.ts_ns[nodes], key))], np.sort(key)
    names = [node_function(t.names[int(i)]) for i in t.name[nodes]]
    softmax = [k for k, n in enumerate(names) if n in SOFTMAX_BACKWARD_NODES]
    empty = np.zeros(0, dtype=np.int64)
    if not softmax or len(softmax) != regions:
        return empty, empty, empty

    def nearest(k: int, step: int) -> int:  # the nearest product-backward node on k's thread, else k itself
        for j in range(k + step, k + step * (MAX_OPS_BETWEEN + 1), step):
            if not 0 <= j < len(nodes) or key[j] != key[k]:
                break
            if PRODUCT_BACKWARD_RE.match(names[j]):
                return j
        return k

    first = np.array([nearest(k, -1) for k in softmax], dtype=np.int64)
    last = np.array([nearest(k, 1) for k in softmax], dtype=np.int64)
    return key[softmax], own_function_spans(t, nodes[first])[0], own_function_spans(t, nodes[last])[1]


def unfused_attention(f: RankFacts) -> F.Finding | None:
    """Attention computed by separate operators (module docstring) takes a material share of the step.

    GPU: priced by replay, the regions' kernels sped up to the fused kernel's time (fused_attention_us; the
    regions' matmul kernel time where that is unknown, an upper bound). Host only: the regions' host time as
    evidence, unpriced (the CPU's fused kernel rate is not in the catalog)."""
    t, w = f.table, f.window
    regions = window_regions(f)
    if not regions:
        return None
    work = window_region_work(f)
    in_math = sum(r.in_math_sdpa for r in regions)
    shapes = all(r.flops is not None for r in regions)
    metrics = {"regions": (len(regions), "count"), "in_sdpa_math_fallback": (in_math, "count")}
    notes = []
    if in_math:
        notes.append(f"{in_math} of {len(regions)} regions run inside aten::_scaled_dot_product_attention_math: "
                     "SDPA fell back to its unfused math path")
    if not shapes:
        notes.append("found by the operator pattern alone (no recorded shapes: record_shapes=True confirms it)")
    if not f.has_gpu:
        host_us = work.host_us
        if f.pct(host_us) <= UNFUSED_ATTENTION_MIN_PCT:
            return None
        metrics["attention_host_time"] = (host_us, "us")
        metrics["attention_host_share"] = (f.pct(host_us), "%")
        x = F.make("unfused_attention", [f.rank], f.steps, metrics, _events(f, regions), severity="low",
                   what_if="not priced: a fused kernel's rate on this host is not in the catalog",
                   evidence_pct=f.pct(host_us))
        x.notes.extend(notes)
        x.confidence = "low"
        return x
    kernels = work.kernels
    dur = w.end_us[kernels] - w.ts_us[kernels]
    unfused_us = float(dur.sum())
    if f.pct(unfused_us) <= UNFUSED_ATTENTION_MIN_PCT:
        return None
    fused_us = fused_attention_us(t, _with_kernel_dtype(t, regions, kernels), work.backward)
    bound = fused_us is None
    if bound:
        fused_us = float(dur[t.category[kernels] == GEMM].sum())
    metrics.update({"attention_kernel_time": (unfused_us, "us"), "attention_kernel_share": (f.pct(unfused_us), "%"),
                    "fused_kernel_estimate": (fused_us, "us"), "backward_in_trace": (int(work.backward), "bool")})
    if fused_us <= 0 or fused_us >= unfused_us:
        return None
    factor = unfused_us / fused_us
    how = "the matmul kernels' own time: upper bound" if bound else "attention FLOPs at the catalog's SDPA flash rate"
    x = F.make("unfused_attention", [f.rank], f.steps, metrics, _events(f, regions),
               changes=(Change("speedup_rows", factor=factor, rows=tuple(int(r) for r in kernels)),),
               what_if=f"the attention regions' {kernels.size} kernels as one fused kernel ({factor:.3g}x faster; "
                       f"{how})", evidence_pct=f.pct(unfused_us) * (1.0 - 1.0 / factor), upper_bound=bound)
    x.notes.extend(notes)
    x.confidence = "low" if not shapes else "medium" if bound else "high"
    return x


def _events(f: RankFacts, regions: list[AttentionRegion]) -> list[tuple[str, float, float]]:
    """The first regions as evidence events (name, start µs, duration µs)."""
    t = f.table
    out = []
    for r in regions[:3]:
        s = op_shape(t, r.softmax_row)
        shape = f" {s.dims[0]}" if s is not None and s.dims else ""
        w = f.window
        out.append((f"[{t.name_of(r.qk_row)} .. {t.name_of(r.softmax_row)}{shape} .. {t.name_of(r.pv_row)}]",
                    float(w.ts_us[r.qk_row]), float(w.end_us[r.pv_row] - w.ts_us[r.qk_row])))
    return out
