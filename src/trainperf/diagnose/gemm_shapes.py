"""The `misaligned_gemm` finding: 16-bit GEMMs whose row lengths break the tensor cores' alignment, running far below
the trace's own aligned GEMMs.

cuBLAS and CUTLASS take their fast tensor-core kernels when every matrix row starts on a 16-byte boundary: in fp16
or bf16, the lengths k (A's and, for `aten::linear`, the weight's rows) and n (B's and C's rows) a multiple of 8
elements; in fp8 of 16 (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tensor cores
are used most efficiently when the dimensions are multiples of 16 bytes; cuBLAS picks kernels by the operands'
alignment). A row length that is not falls back to kernels with narrower loads, often 2-4x slower: GPT-2's
vocabulary of 50,257 in the output layer is the known case (padded to 50,304, nanoGPT trained ~25 % faster). m
(the rows of A and C) does not set an alignment. An operand that is a view (a slice of a fused or padded weight, a
transposed slice) keeps the rows of the tensor it views: PyTorch hands cuBLAS its row stride as the leading
dimension, so a [4096, 4096] slice of a [4096, 4097] parameter is misaligned whatever its shape. Its strides are read
where the trace recorded them ("Input Strides", PyTorch >= 2.0).

Measured against the trace itself: the reference is the time-weighted rate of the window's aligned, compute-bound
GEMMs of the same precision (FLOPs from the recorded shapes over their kernels' device time); with none, the
catalog's GEMM efficiency x the peak. Only compute-bound GEMMs count (arithmetic intensity above the device's ridge
point, peak FLOP/s / HBM bandwidth): a memory-bound GEMV (decode, m = batch) runs at its bandwidth whatever its
alignment. Needs the shapes (record_shapes=True) and a catalog device (deviceProperties); else nothing is found.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gpu_time import concurrent_compute_us
from trainperf.diagnose.replay import Change
from trainperf.diagnose.roofline import (DTYPE_BYTES, PRECISION, OpShape, device_accelerator, is_shape, op_cost,
                                         op_shape)
from trainperf.trace.events import KERNEL

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ALIGN_BYTES = 16  # a row's start on a 16-byte boundary: what the tensor cores' fast loads need
MISALIGNED_MIN_PCT = 3.0  # the misaligned GEMMs' device time, % of the window: the medium level of findings
# slower than this share of the reference rate: a fallback kernel, not the noise between GEMM shapes (a quarter off:
# the tile quantisation of a ragged last tile costs less at the sizes that are compute-bound). Stated, not fitted
MISALIGNED_MAX_RATE_SHARE = 0.75
# a GEMM call whose kernels ran beside another stream's computation for more than this share of their time does not
# time its own speed (two full GEMMs side by side each take ~twice as long: overlapped micro-batches, a shared expert
# beside the routed ones)
CONCURRENT_MAX_SHARE = 0.5
# the positions in "Input Dims" of a GEMM operator's two matrix operands (addmm and baddbmm take the bias first)
OPERANDS = {"aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmCall:
    """One GEMM operator call with its shape, its kernels and their device time."""

    row: int                # the operator's trace row
    name: str
    m: int
    k: int
    n: int
    flops: float
    bytes: float
    precision: str          # bf16 / fp16 / fp8 / fp32 (roofline.PRECISION of its dtype)
    elem_bytes: int
    kernels: tuple          # trace rows of the kernels it launched
    time_us: float
    misaligned_stride: int = 0  # an operand's row stride (elements) off the alignment; 0: none, or not recorded
    shared_us: float = 0.0  # how long its kernels ran beside another stream's computation

    @property
    def aligned(self) -> bool:
        """Whether k, n and the operands' recorded row strides are whole multiples of ALIGN_BYTES in this dtype."""
        per = max(ALIGN_BYTES // self.elem_bytes, 1)
        return self.k % per == 0 and self.n % per == 0 and not self.misaligned_stride

    @property
    def timed_alone(self) -> bool:
        """Whether its kernels ran alone on the device for most of their time (CONCURRENT_MAX_SHARE), so that their
        duration measures their speed."""
        return self.shared_us <= CONCURRENT_MAX_SHARE * self.time_us

    @property
    def shape(self) -> str:
        stride = f" row stride {self.misaligned_stride}" if self.misaligned_stride else ""
        return f"{self.name} m={self.m} k={self.k} n={self.n}{stride} {self.precision}"


def misaligned_stride(s: OpShape, elem_bytes: int) -> int:
    """The first row stride (elements) of the operator's two matrix operands that is no whole multiple of
    ALIGN_BYTES, or 0 (none, or strides not recorded). A stride counts where its dimension has more than one element
    and is neither 0 (broadcast) nor 1 (the contiguous one); an operand with no unit stride is copied by PyTorch
    before the GEMM, so is not judged."""
    per = max(ALIGN_BYTES // elem_bytes, 1)
    for i in OPERANDS.get(s.name, (0, 1)):
        if i >= min(len(s.dims), len(s.strides)) or not is_shape(s.dims[i]) or not is_shape(s.strides[i]):
            continue
        pairs = [(d, x) for d, x in zip(s.dims[i], s.strides[i]) if d > 1]
        if not any(x == 1 for _, x in pairs):
            continue
        bad = next((x for _, x in pairs if x > 1 and x % per), 0)
        if bad:
            return bad
    return 0


REDUCED_PRECISIONS = ("bf16", "fp16", "fp8")


def gemm_calls(f: RankFacts, precisions: tuple[str, ...] = REDUCED_PRECISIONS) -> list[GemmCall]:
    """The window's GEMM operator calls of the given precisions (roofline.PRECISION of their dtype: 16-bit and fp8
    unless told) that carry shapes and launched kernels, with their kernels' device time and the part of it beside
    another stream's computation (µs); [] without recorded shapes. Once per rank (RankFacts.once), not on every
    re-run of the rules (cv_diagnose re-runs them per threshold value)."""
    return f.once(f"gemm_calls:{','.join(precisions)}", lambda: _gemm_calls(f, precisions))


def _gemm_calls(f: RankFacts, precisions: tuple[str, ...]) -> list[GemmCall]:
    t, w = f.table, f.window
    op = f.launching_op()
    kernels = w.device[(t.kind[w.device] == KERNEL) & (op[w.device] >= 0)]
    names = set(t.ids_matching(lambda s: s in GEMM_OPS))
    kernels = kernels[np.isin(t.name[op[kernels]], list(names))] if names else kernels[:0]
    out = []
    order = np.argsort(op[kernels], kind="stable")
    rows, starts = np.unique(op[kernels][order], return_index=True)
    for r, ks in zip(rows, np.split(kernels[order], starts[1:])):
        s = op_shape(t, int(r))
        if s is None:
            continue
        c = op_cost(s.name, s.dims, s.types, s.concrete)
        dtype = next((x for x in s.types if x in DTYPE_BYTES), "")
        if c is None or c.mkn is None or PRECISION.get(dtype) not in precisions:
            continue
        (m, k, n) = c.mkn
        out.append(GemmCall(row=int(r), name=s.name, m=m, k=k, n=n, flops=c.flops, bytes=c.bytes,
                            precision=c.precision, elem_bytes=DTYPE_BYTES[dtype], kernels=tuple(int(x) for x in ks),
                            time_us=float((w.end_us[ks] - w.ts_us[ks]).sum()),
                            misaligned_stride=misaligned_stride(s, DTYPE_BYTES[dtype])))
    if not out:
        return out
    shared = concurrent_compute_us(t, w, np.array([k for c in out for k in c.kernels]))
    starts = np.cumsum([0] + [len(c.kernels) for c in out[:-1]])
    return [dataclasses.replace(c, shared_us=float(us)) for c, us in zip(out, np.add.reduceat(shared, starts))]


def _rate(calls: list[GemmCall]) -> float:
    """Time-weighted FLOP rate of the calls (FLOP per µs)."""
    us = sum(c.time_us for c in calls)
    return sum(c.flops for c in calls) / us if us > 0 else 0.0


def misaligned_gemm(f: RankFacts) -> F.Finding | None:
    """Compute-bound 16-bit GEMMs with a misaligned row length (k or n not a multiple of 16 bytes) take
    >= MISALIGNED_MIN_PCT of the window and run under MISALIGNED_MAX_RATE_SHARE of the rate of the trace's aligned
    compute-bound GEMMs of that precision (or the catalog's GEMM efficiency x peak without them). Priced by replay:
    their kernels at that reference rate (speedup_rows), an estimate: padding makes the GEMM slightly larger."""
    if not f.has_gpu:
        return None
    acc = device_accelerator(f.table)
    if acc is None or not acc.hbm_tbps:
        return None
    bound = [c for c in gemm_calls(f) if c.time_us > 0 and c.timed_alone
             and c.flops / max(c.bytes, 1.0) > acc.peak_flops(c.precision) / (acc.hbm_tbps * 1e12)]
    slow = []
    refs = {}
    for prec in sorted({c.precision for c in bound}):
        aligned = [c for c in bound if c.precision == prec and c.aligned]
        ref = _rate(aligned) if aligned else acc.gemm_eff * acc.peak_flops(prec) / 1e6
        bad = [c for c in bound if c.precision == prec and not c.aligned]
        if bad and _rate(bad) < MISALIGNED_MAX_RATE_SHARE * ref:
            slow += bad
            refs[prec] = (ref, bool(aligned))
    time_us = sum(c.time_us for c in slow)
    if not slow or f.pct(time_us) < MISALIGNED_MIN_PCT:
        return None
    ref_us = sum(c.flops / refs[c.precision][0] for c in slow)
    factor = time_us / ref_us
    by_shape: dict[str, list[GemmCall]] = {}
    for c in slow:
        by_shape.setdefault(c.shape, []).append(c)
    top = sorted(by_shape.values(), key=lambda cs: -sum(c.time_us for c in cs))[:3]
    # each shape's first call, named with how many calls it stands for
    events = [(f"{cs[0].shape} ({len(cs)} calls, {sum(c.time_us for c in cs) / 1e3:.1f} ms)",
               float(f.window.ts_us[cs[0].kernels[0]]), cs[0].time_us) for cs in top]
    metrics = {"misaligned_gemm_time": (time_us, "us"), "misaligned_gemm_share": (f.pct(time_us), "%"),
               "their_rate": (_rate(slow) / 1e6, "TFLOP/s"),
               "reference_rate": (sum(c.flops for c in slow) / ref_us / 1e6, "TFLOP/s"),
               "reference_from_the_trace": (float(all(refs[c.precision][1] for c in slow)), "bool"),
               "speedup": (factor, "x")}
    rows = tuple(k for c in slow for k in c.kernels)
    return F.make("misaligned_gemm", [f.rank], f.steps, metrics, events,
                  what_if=f"the misaligned GEMMs at the rate of the aligned ones ({factor:.3g}x faster)",
                  changes=(Change("speedup_rows", factor=factor, rows=rows),),
                  evidence_pct=f.pct(time_us) * (1.0 - 1.0 / factor))
