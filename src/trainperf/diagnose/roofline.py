"""Per-operator roofline from the shapes the profiler recorded (``record_shapes=True``).

For each operator that launched device work, its FLOPs and minimum bytes come from its "Input
Dims" / "Input type" (and "Concrete Inputs" for causal masks) args, which the loader keeps in the
event table (EventTable.args), its time from the kernels it launched (correlation ids); in a trace
without device events (a CPU run) from the operator's own host span (host_owned_ops). Against the
accelerator's peaks (catalog): achieved TFLOP/s and TB/s,
arithmetic intensity, the bound (compute when FLOPs/peak > bytes/bandwidth) and the time lost to
the roofline (measured - max(FLOPs/peak, bytes/bandwidth)). Grouped by operator and shape.

Counting conventions (stated, so a reader can check a row by hand):
- GEMMs: 2·m·n·k per product (PyTorch's torch.utils.flop_counter; bias adds not counted); bytes:
  each operand read once, the output written once. On fp32 operands whose kernel's name says TF32
  (precision.classify_kernel: fp32 on tensor cores, allow_tf32) against TF32's peak, half bf16's. Grouped
  products (torch._grouped_mm, MoE experts): 2·M·K·N summed over the groups, in each of its four layouts.
- convolutions: 2·N·C_out·(C_in/groups)·kernel·output positions (torch.utils.flop_counter's count; the output
  positions from the recorded stride, padding and dilation); the backward one forward's worth for each gradient its
  output_mask computes (flop_counter leaves the groups out of the weight's); transposed ones not modelled.
- attention: forward 4·b·h·s_q·s_k·d (QKᵀ and PV), backward twice that (the model's FLOPs:
  torch.utils.flop_counter's backward counts 2.5x, the scores' recomputation included); halved when causal (the
  kernels skip the masked half). A variable-length call (n sequences packed, their cumulative lengths an input:
  flash-attn's *_varlen_*, nested/jagged SDPA) as n sequences of equal length, 4·h·d·T_q·T_k / n: exact for equal
  lengths, a lower bound otherwise (the lengths are tensor values). Bytes: q, k, v
  read and the output written (forward); q, k, v, out, dout read and dq, dk, dv written (backward).
- elementwise: 1 FLOP per output element; norms, softmax and reductions: 5 per input element (the
  bound of these is bytes: their intensity is far under any ridge point). Bytes: every tensor
  input read once, every output written once (in place: the first input written back; an out=
  tensor written, not read; a reduction's output of the kept dims; layer/RMS norm's per-row
  statistics, mean and rstd, in the accumulation dtype, at least fp32).
Only operators that own kernels count (an aten::linear whose aten::addmm launched the GEMM is
counted once, as addmm), so the rows add up to the device time of the operators covered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.categories import OFF_DEVICE_DIRECTIONS, copy_direction
from trainperf.trace.nesting import enclosing_span, nest, row_spans, thread_key
from trainperf.trace import events as ev
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, MEMCPY, RUNTIME, EventTable

DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8, "int": 4,
               "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
               "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
               "c10::Float8_e8m0fnu": 1, "c10::complex<float>": 8, "c10::complex<double>": 16}
PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
             "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}
NORM_FLOPS_PER_ELEMENT = 5

# attention operators: (index of query, index of key, layout of q/k, index of is_causal or of
# custom_mask_type (efficient attention: 1 and 2 are causal), backward?, index of the cumulative sequence lengths of a
# variable-length call (cum_seq_q / cu_seqlens_q; -1: none)) - indices from the ATen schemas
ATTENTION = {
    "aten::_flash_attention_forward": (0, 1, "bshd", 8, False, 3),
    "aten::_scaled_dot_product_flash_attention": (0, 1, "bhsd", 4, False, -1),
    "aten::_scaled_dot_product_efficient_attention": (0, 1, "bhsd", 6, False, -1),
    "aten::_efficient_attention_forward": (0, 1, "bshd", 9, False, 4),
    "aten::_scaled_dot_product_cudnn_attention": (0, 1, "bhsd", 6, False, -1),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 1, "bhsd", 4, False, -1),
    "aten::_flash_attention_backward": (1, 2, "bshd", 11, True, 6),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 2, "bhsd", 11, True, -1),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 2, "bhsd", 11, True, -1),
    "aten::_efficient_attention_backward": (1, 2, "bshd", 14, True, 6),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 2, "bhsd", 14, True, -1),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 2, "bhsd", 7, True, -1),
    # the flash-attn package (HF transformers' attn_implementation="flash_attention_2"): its custom ops since 2.6
    # (flash_attn_interface.py: _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, ...),
    # _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, ...)),
    # and before them its autograd Function's record (FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal,
    # ...)); the variable-length variants take (total tokens, heads, dim) and the cumulative lengths after v:
    # _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
    # softmax_scale, causal, ...), _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
    # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, ...)
    "flash_attn::_flash_attn_forward": (0, 1, "bshd", 5, False, -1),
    "flash_attn::_flash_attn_backward": (1, 2, "bshd", 11, True, -1),
    "FlashAttnFunc": (0, 1, "bshd", 5, False, -1),
    "flash_attn::_flash_attn_varlen_forward": (0, 1, "bshd", 9, False, 3),
    "flash_attn::_flash_attn_varlen_backward": (1, 2, "bshd", 15, True, 9),
    "FlashAttnVarlenFunc": (0, 1, "bshd", 9, False, 3),
}
# convolutions (torch.nn.functional.conv*d and what it dispatches to): index of the input, the weight, and of the
# stride, padding, dilation and groups arguments, and of `transposed` (-1: never), from the ATen schemas (checked
# against the installed PyTorch's in tests/diagnose/test_roofline.py). The profiler records the int lists as
# concrete inputs ("[2, 2]")
CONVOLUTION = {
    "aten::conv1d": (0, 1, 3, 4, 5, 6, -1), "aten::conv2d": (0, 1, 3, 4, 5, 6, -1),
    "aten::conv3d": (0, 1, 3, 4, 5, 6, -1),
    "aten::convolution": (0, 1, 3, 4, 5, 8, 6), "aten::_convolution": (0, 1, 3, 4, 5, 8, 6),
    "aten::cudnn_convolution": (0, 1, 3, 2, 4, 5, -1), "aten::miopen_convolution": (0, 1, 4, 3, 5, 6, -1),
    "aten::mkldnn_convolution": (0, 1, 4, 3, 5, 6, -1),
}
# aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
# output_padding, groups, output_mask): the transposed flag's and the output mask's index
CONV_BACKWARD, CONV_BACKWARD_TRANSPOSED, CONV_BACKWARD_MASK = "aten::convolution_backward", 7, 10

# elementwise ops by number of tensor operands; a tensor beyond them is an out= argument (written, not read)
_UNARY = {"relu", "gelu", "silu", "sigmoid", "tanh", "exp", "neg", "clamp", "clamp_min", "clamp_max", "rsqrt", "sqrt",
          "abs", "log", "sin", "cos", "reciprocal", "square", "leaky_relu", "hardtanh"}
_BINARY = {"add", "sub", "mul", "div", "rsub", "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
           "threshold_backward", "pow", "masked_fill", "maximum", "minimum"}
_TERNARY = {"where", "addcmul", "addcdiv", "lerp"}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}  # binary, their output bool (1 byte per element)
ELEMENTWISE = {**{n: 1 for n in _UNARY}, **{n: 2 for n in _BINARY | COMPARISONS}, **{n: 3 for n in _TERNARY}}
MOVES = {"copy_", "fill_", "zero_"}  # memory only, no FLOPs
NORMS = {"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "native_batch_norm",
         "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_dropout",
         "native_dropout_backward", "sum", "mean", "amax", "norm", "_fused_rms_norm_backward"}
# reductions: index of the dim list among the concrete inputs (ATen schemas: sum/mean/amax(self, dim, ...),
# norm(self, p, dim, ...))
REDUCTIONS = {"sum": 1, "mean": 1, "amax": 1, "norm": 2}
# norms that also write per-row statistics: how many (native_layer_norm: mean and rstd; _fused_rms_norm: rstd),
# rows = input elements / elements of normalized_shape (concrete input 1)
ROW_STATS = {"native_layer_norm": 2, "_fused_rms_norm": 1}


@dataclass(frozen=True, kw_only=True, slots=True)
class OpCost:
    """FLOPs and minimum bytes of one operator call, the kind of operator and its precision."""

    kind: str        # gemm, attention, elementwise, norm
    flops: float
    bytes: float
    precision: str   # bf16, fp16, fp32, fp8 (the peak to compare with); "" when unknown
    mkn: tuple[int, int, int] | None = None  # a GEMM's (m, k, n), m counting the rows of every matrix of a batch


def is_shape(d) -> bool:
    """Whether a recorded "Input Dims" entry is one tensor's shape (a list of sizes, ints >= 0; a scalar's is [])."""
    return isinstance(d, list) and all(isinstance(x, int) and x >= 0 for x in d)


def _numel(dims) -> int:
    return int(math.prod(dims)) if is_shape(dims) else 0


def _tensors(dims: list, types: list) -> list[tuple[list, int, str]]:
    """(shape, bytes per element, dtype) of every plain tensor argument (not scalars, lists or absent ones)."""
    out = []
    for d, t in zip(dims, types):
        if t in DTYPE_BYTES and is_shape(d):
            out.append((d, DTYPE_BYTES[t], t))
    return out


def _broadcast(shapes: list[list]) -> list:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for i, d in enumerate(s, nd - len(s)):
            out[i] = max(out[i], d)
    return out


def _gemm(name: str, dims: list, types: list) -> OpCost | None:
    ts = _tensors(dims, types)
    if name in ("aten::addmm", "aten::baddbmm"):  # (bias, a, b)
        if len(ts) < 3:
            return None
        bias, (a, s, dt), (b, sb, _) = ts[0], ts[1], ts[2]
        extra = _numel(bias[0]) * bias[1]
    elif name == "aten::linear":  # (x, weight [n, k], bias)
        if len(ts) < 2:
            return None
        (a, s, dt), (w, sb, _) = ts[:2]
        b = [w[1], w[0]] if len(w) == 2 else w
        extra = sum(_numel(d) * e for d, e, _ in ts[2:])
    else:  # mm, bmm, matmul, _scaled_mm (a, b, scales, bias)
        if len(ts) < 2:
            return None
        (a, s, dt), (b, sb, _) = ts[:2]
        extra = sum(_numel(d) * e for d, e, _ in ts[2:])
    if not a or not b:
        return None
    a2 = a if len(a) >= 2 else [1] + a
    b2 = b if len(b) >= 2 else b + [1]
    m, k, n = a2[-2], a2[-1], b2[-1]
    if b2[-2] != k:
        return None
    batch = math.prod(_broadcast([a2[:-2], b2[:-2]]))
    prec = PRECISION.get(dt, "")
    out_e = 2 if prec == "fp8" else s  # fp8 GEMMs write bf16/fp16
    nbytes = _numel(a) * s + _numel(b) * sb + batch * m * n * out_e + extra
    return OpCost(kind="gemm", flops=2.0 * batch * m * n * k, bytes=float(nbytes), precision=prec,
                  mkn=(batch * m, k, n))


GROUPED_GEMMS = ("aten::_grouped_mm", "aten::_scaled_grouped_mm")  # MoE experts' products (torch._grouped_mm)


def _grouped_gemm(dims: list, types: list) -> OpCost | None:
    """A grouped product's cost (torch._grouped_mm(a, b, offs): a [M, K] rows split among b [G, K, N]'s groups;
    [M, K] x [K, N] with K split, a [G, M, N] out, the experts' weight gradients; [G, M, K] x [G, K, N]; [G, M, K] x
    [K, N] with N split): 2 x M x K x N over every group's share, as the output's elements times the depth each
    summed. Rows of a 2-D operand past the offsets' end are counted, as the shapes cannot tell them."""
    ts = _tensors(dims, types)
    if len(ts) < 2:
        return None
    (a, s, dt), (b, sb, _) = ts[:2]
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:
        out, depth = a[0] * b[2], a[1]
    elif len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        out, depth = a[0] * b[1], a[1]  # each group's out sums its share of K: all groups together sum all of it
    elif len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        out, depth = a[0] * a[1] * b[2], a[2]
    elif len(a) == 3 and len(b) == 2 and a[2] == b[0]:
        out, depth = a[1] * b[1], a[2]
    else:
        return None
    prec = PRECISION.get(dt, "")
    out_e = 2 if prec == "fp8" else s
    # [M, K] x [K, N] writes one [M, N] a group: as many as the offsets (the third tensor, 1-D) hold
    groups = _numel(ts[2][0]) if len(a) == len(b) == 2 and len(ts) > 2 and len(ts[2][0]) == 1 else 1
    nbytes = _numel(a) * s + _numel(b) * sb + groups * out * out_e
    return OpCost(kind="gemm", flops=2.0 * out * depth, bytes=float(nbytes), precision=prec)


def _flag(concrete: list, i: int) -> bool:
    v = concrete[i] if concrete and i < len(concrete) else ""
    return v in ("True", "1", "2")  # is_causal=True, or custom_mask_type 1/2 (causal top-left/bottom-right)


def _packed_sequences(dims: list, i: int) -> int:
    """How many sequences a variable-length attention call packs (its cumulative lengths' size, less one); 0 where
    the call is not variable-length (no such input, or none recorded)."""
    d = dims[i] if 0 <= i < len(dims) else None
    return max(d[0] - 1, 0) if is_shape(d) and len(d) == 1 else 0


def _attention(name: str, dims: list, types: list, concrete: list) -> OpCost | None:
    qi, ki, layout, ci, backward, cu = ATTENTION[name]
    if max(qi, ki) >= len(dims) or types[qi] not in DTYPE_BYTES:
        return None
    q, k = dims[qi], dims[ki]
    n = _packed_sequences(dims, cu)
    if n and is_shape(q) and is_shape(k) and len(q) == len(k) == 3:  # flash's packed (total tokens, heads, dim)
        q, k = [1, *q], [1, *k]
    if not (is_shape(q) and is_shape(k) and len(q) == len(k) == 4):
        return None
    s_k = k[1] if layout == "bshd" else k[2]
    # n sequences packed in one (batch 1): their lengths are tensor values no shape gives; counted as n equal ones,
    # T_q T_k / n of the score matrix, exact for equal lengths and for self-attention the least any lengths summing
    # to the totals give (Cauchy-Schwarz), so the step's FLOPs stay a lower bound
    packed = n if n and q[0] == k[0] == 1 else 1
    flops = 4.0 * _numel(q) * s_k * (2 if backward else 1) * (0.5 if _flag(concrete, ci) else 1) / packed
    e = DTYPE_BYTES[types[qi]]
    nq, nk = _numel(q), _numel(k)
    nbytes = e * ((4 * nq + 4 * nk) if backward else (2 * nq + 2 * nk))
    return OpCost(kind="attention", flops=flops, bytes=float(nbytes), precision=PRECISION.get(types[qi], ""))


def _conv_output(x: list, w: list, stride: list, padding: list, dilation: list) -> list[int] | None:
    """The output spatial dims of a convolution (PyTorch's: (i + 2p - d (k - 1) - 1) // s + 1), None where the
    lists do not fit the shapes."""
    spatial, kernel = x[2:], w[2:]
    if not (len(spatial) == len(kernel) == len(stride) == len(padding) == len(dilation)) or min(stride, default=1) < 1:
        return None
    out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)]
    return out if min(out, default=1) >= 1 else None


def _conv_flops(batch: int, w: list, out_spatial: list) -> float:
    """One convolution pass's FLOPs: 2 x batch x out channels x in channels a group x kernel x output positions
    (torch.utils.flop_counter's conv_flop_count; bias adds not counted)."""
    return 2.0 * batch * w[0] * w[1] * math.prod(w[2:]) * math.prod(out_spatial)


def _convolution(name: str, dims: list, types: list, concrete: list) -> OpCost | None:
    """A forward convolution's cost from its input and weight shapes and its stride, padding and dilation; None
    for a transposed one or one whose lists were not recorded."""
    xi, wi, si, pi, di, _, ti = CONVOLUTION[name]
    if max(xi, wi) >= len(dims) or types[xi] not in DTYPE_BYTES or (ti >= 0 and _flag(concrete, ti)):
        return None
    x, w = dims[xi], dims[wi]
    lists = [_int_list(concrete, i) for i in (si, pi, di)]
    if not (is_shape(x) and is_shape(w) and len(x) == len(w) >= 3) or any(v is None for v in lists):
        return None
    out = _conv_output(x, w, *lists)
    if out is None:
        return None
    e = DTYPE_BYTES[types[xi]]
    nbytes = e * (_numel(x) + _numel(w) + x[0] * w[0] * math.prod(out))
    return OpCost(kind="conv", flops=_conv_flops(x[0], w, out), bytes=float(nbytes),
                  precision=PRECISION.get(types[xi], ""))


def _convolution_backward(dims: list, types: list, concrete: list) -> OpCost | None:
    """convolution_backward's cost: a forward pass's FLOPs for each gradient it computes (the input's, the
    weight's: output_mask), the output positions from the gradient's own shape; None for a transposed one."""
    if len(dims) < 3 or types[0] not in DTYPE_BYTES or _flag(concrete, CONV_BACKWARD_TRANSPOSED):
        return None
    gy, x, w = dims[:3]
    if not (is_shape(gy) and is_shape(x) and is_shape(w) and len(gy) == len(x) == len(w) >= 3):
        return None
    mask = concrete[CONV_BACKWARD_MASK] if CONV_BACKWARD_MASK < len(concrete) else ""
    flags = [s.strip() == "True" for s in mask.strip("[]").split(",")] if isinstance(mask, str) else []
    grad_x, grad_w = flags[:2] if len(flags) >= 2 else (True, True)  # unrecorded: both, as training computes
    e = DTYPE_BYTES[types[0]]
    nbytes = e * (_numel(gy) + _numel(x) + _numel(w) + grad_x * _numel(x) + grad_w * _numel(w))
    return OpCost(kind="conv", flops=(grad_x + grad_w) * _conv_flops(gy[0], w, gy[2:]), bytes=float(nbytes),
                  precision=PRECISION.get(types[0], ""))


def _memory_op(base: str, dims: list, types: list, concrete: list) -> OpCost | None:
    ts = _tensors(dims, types)
    if not ts:
        return None
    reads = sum(_numel(d) * e for d, e, _ in ts)
    first, e0, _ = ts[0]
    prec = PRECISION.get(types[0], "")
    if base in MOVES:
        if base == "copy_":
            return OpCost(kind="elementwise", flops=0.0, bytes=float(reads), precision=prec)
        return OpCost(kind="elementwise", flops=0.0, bytes=float(_numel(first) * e0), precision=prec)
    inplace = base.endswith("_")
    op = base.rstrip("_")
    if op in ELEMENTWISE:
        operands, outs = ts[:ELEMENTWISE[op]], ts[ELEMENTWISE[op]:]
        reads = sum(_numel(d) * e for d, e, _ in operands)
        if inplace:
            out, out_e = _numel(first), e0
        elif outs:  # an out= tensor
            out, out_e = _numel(outs[0][0]), outs[0][1]
        else:
            out = _numel(_broadcast([d for d, _, _ in operands]))
            out_e = 1 if op in COMPARISONS else \
                max((e for d, e, _ in operands if d), default=e0)  # 0-dim wrapped scalars aside
        return OpCost(kind="elementwise", flops=float(out), bytes=float(reads + out * out_e), precision=prec)
    if op in NORMS:
        n = _numel(first)
        if op in REDUCTIONS:
            if len(ts) > 1:  # an out= tensor: written, not read
                reads, write = n * e0, sum(_numel(d) * e for d, e, _ in ts[1:])
            else:
                write = _reduced_numel(first, concrete, REDUCTIONS[op]) * e0
        elif op == "native_layer_norm_backward":
            # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask): bias is passed for
            # its shape and dtype only (its gradient is the sum of grad_out), not read; written: grad input,
            # grad weight and grad bias
            bias = _arg_bytes(dims, types, 6)
            reads -= bias
            write = n * e0 + _arg_bytes(dims, types, 5) + bias
        elif op == "native_dropout":
            write = n * e0 + n  # output and a bool mask
        elif op in ROW_STATS:  # y, and per normalised row its statistics (mean and rstd, or rstd)
            # normalized_shape: the concrete input, else the weight's shape; neither: the statistics left out
            row_shape = _int_list(concrete, 1) or (ts[1][0] if len(ts) > 1 else None)
            rows = n // _numel(row_shape) if row_shape and _numel(row_shape) else 0
            write = n * e0 + ROW_STATS[op] * rows * max(e0, 4)
        else:
            write = n * e0
        return OpCost(kind="norm", flops=float(NORM_FLOPS_PER_ELEMENT * n), bytes=float(reads + write),
                      precision=prec)
    return None


def _arg_bytes(dims: list, types: list, i: int) -> int:
    """Bytes of the tensor at argument position i (0 when absent or not a tensor)."""
    return _numel(dims[i]) * DTYPE_BYTES[types[i]] if i < len(dims) and types[i] in DTYPE_BYTES else 0


def _int_list(concrete: list, i: int) -> list[int] | None:
    """The int list a profiler recorded as concrete input i ("[-1]", "[512]"), else None."""
    v = concrete[i] if i < len(concrete) else ""
    if not (isinstance(v, str) and v.startswith("[") and v.endswith("]")):
        return None
    try:
        return [int(x) for x in v[1:-1].split(",") if x.strip()]
    except ValueError:
        return None


def _reduced_numel(shape: list, concrete: list, dim_index: int) -> int:
    """Elements of a reduction's output: the input's with the reduced dims (concrete input dim_index)
    removed or kept as 1 alike; no dim list (or an empty one) reduces every dim to one element."""
    dims = _int_list(concrete, dim_index)
    if not dims:
        return 1
    nd = len(shape)
    reduced = {d % nd for d in dims} if nd else set()
    return int(math.prod(s for i, s in enumerate(shape) if i not in reduced))


def op_cost(name: str, dims: list, types: list, concrete: list | None = None) -> OpCost | None:
    """FLOPs and minimum bytes of one call of operator `name` from its recorded input dims and types
    (and concrete scalar inputs); None for operators this roofline does not model."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                "aten::_scaled_mm"):
        return _gemm(name, dims, types)
    if name in GROUPED_GEMMS:
        return _grouped_gemm(dims, types)
    if name in ATTENTION:
        return _attention(name, dims, types, concrete or [])
    if name in CONVOLUTION:
        return _convolution(name, dims, types, concrete or [])
    if name == CONV_BACKWARD:
        return _convolution_backward(dims, types, concrete or [])
    if name.startswith("aten::"):
        return _memory_op(name[len("aten::"):], dims, types, concrete or [])
    return None


# ---- reading the shapes ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OpShape:
    """The recorded inputs of one operator call."""

    name: str
    dims: list
    types: list
    concrete: list
    strides: list   # "Input Strides" (PyTorch >= 2.0), as dims; [] when not recorded


def op_shape(t: EventTable, row: int) -> OpShape | None:
    """The recorded inputs of the operator at `row`, from the args the loader kept (EventTable.args);
    None when the trace was recorded without record_shapes."""
    a = int(t.args[row])
    if a < 0:
        return None
    args = t.kept_args()[a]
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return None
    return OpShape(t.names[int(t.name[row])], dims, args.get("Input type") or [], args.get("Concrete Inputs") or [],
                   args.get("Input Strides") or [])


# ---- the roofline ---------------------------------------------------------------------------------

@dataclass(kw_only=True, slots=True)
class RooflineRow:
    """One operator and input shape: calls, device time and where it sits on the roofline."""

    op: str
    shapes: str                  # "[4096, 4096] x [4096, 4096] bf16"
    kind: str
    count: int
    time_us: float               # device time of all calls (µs)
    flops: float                 # per call
    bytes: float                 # per call (minimum)
    precision: str
    peak_tflops: float | None    # at this precision; None without a known accelerator
    peak_tbps: float | None

    @property
    def total_flops(self) -> float:
        """FLOPs of all its calls."""
        return self.flops * self.count

    @property
    def total_bytes(self) -> float:
        """Minimum bytes of all its calls."""
        return self.bytes * self.count

    @property
    def achieved_tflops(self) -> float:
        return self.total_flops / (self.time_us * 1e6) if self.time_us > 0 else 0.0

    @property
    def achieved_tbps(self) -> float:
        return self.total_bytes / (self.time_us * 1e6) if self.time_us > 0 else 0.0

    @property
    def intensity(self) -> float:
        """Arithmetic intensity (FLOP per byte)."""
        return self.flops / self.bytes if self.bytes > 0 else math.inf

    def _roofs_us(self) -> tuple[float, float] | None:
        """(compute, memory) time of one call at the peaks (µs). Without a FLOP peak for the dtype
        (integers, fp64), elementwise and norm ops keep the bandwidth roof alone: their intensity is
        far under any ridge point, so bytes / bandwidth is their bound either way."""
        if not self.peak_tbps:
            return None
        if not self.peak_tflops:
            return (0.0, self.bytes / (self.peak_tbps * 1e6)) if self.kind in ("elementwise", "norm") else None
        return self.flops / (self.peak_tflops * 1e6), self.bytes / (self.peak_tbps * 1e6)

    @property
    def min_time_us(self) -> float | None:
        """Time of all calls at the roofline: max(FLOPs / peak, bytes / bandwidth) (µs)."""
        roofs = self._roofs_us()
        return self.count * max(roofs) if roofs is not None else None

    @property
    def bound(self) -> str:
        """"compute" or "memory": which roof is lower at this intensity ("" without peaks)."""
        roofs = self._roofs_us()
        if roofs is None:
            return ""
        return "compute" if roofs[0] > roofs[1] else "memory"

    @property
    def roofline_pct(self) -> float | None:
        """Time at the roofline as % of the measured time (100 = on the roof)."""
        m = self.min_time_us
        return 100.0 * m / self.time_us if m is not None and self.time_us > 0 else None

    @property
    def lost_us(self) -> float:
        """Measured time minus time at the roofline (µs, all calls)."""
        m = self.min_time_us
        return self.time_us - m if m is not None else 0.0

    def to_json(self) -> dict:
        # 6 significant digits, not decimals: a CPU run's TB/s are millionths
        r = lambda v: float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v  # noqa: E731
        return {"op": self.op, "shapes": self.shapes, "kind": self.kind, "count": self.count,
                "time_us": r(self.time_us), "flops": self.flops, "bytes": self.bytes, "precision": self.precision,
                "achieved_tflops": r(self.achieved_tflops), "achieved_tbps": r(self.achieved_tbps),
                "intensity_flop_per_byte": r(self.intensity), "bound": self.bound,
                "roofline_pct": r(self.roofline_pct), "lost_us": r(self.lost_us),
                "peak_tflops": self.peak_tflops, "peak_tbps": self.peak_tbps}


def shape_key(s: OpShape) -> str:
    """Readable shapes of the tensor inputs: "[4096, 4096] x [4096, 4096] bf16"."""
    ts = [str(d) for d, t in zip(s.dims, s.types) if t in DTYPE_BYTES and isinstance(d, list)]
    prec = next((PRECISION.get(t, t) for t in s.types if t in DTYPE_BYTES), "")
    return " x ".join(ts) + (f" {prec}" if prec else "")


def device_accelerator(t: EventTable):
    """The catalog entry of the trace's device (deviceProperties[0]: its name, else its compute units and memory),
    or None."""
    from trainperf.hardware import accelerator_for_properties

    props = t.metadata.get("deviceProperties")
    if not (isinstance(props, list) and props and isinstance(props[0], dict)):
        return None
    dev = props[0]
    units, memory = dev.get("numSms"), dev.get("totalGlobalMem")
    return accelerator_for_properties(str(dev.get("name") or ""),
                                      units if isinstance(units, int) else None,
                                      float(memory) if isinstance(memory, (int, float)) else None)


def launching_op(t: EventTable) -> np.ndarray:
    """For every row, the innermost cpu_op on the launching thread that encloses the launch of this
    device event (kernel, memcpy, memset), else -1. Via the correlation id, not the "External id"
    arg, whose meaning on device events differs between Kineto versions. An op encloses a launch
    that starts in [op start, op end); at equal starts the shorter op is the inner one (trace.nesting)."""
    out = np.full(len(t), -1, dtype=np.int64)
    link = correlated_host_row(t)
    dev = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & (link >= 0))
    if dev.size == 0:
        return out
    ops = np.flatnonzero(t.kind == CPU_OP)
    if ops.size == 0:
        return out
    launches = np.unique(link[dev])
    key = thread_key(t.pid, t.tid)
    hit = enclosing_span(key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[launches], t.ts_ns[launches])
    lut = np.full(len(t), -1, dtype=np.int64)
    lut[launches] = np.where(hit >= 0, ops[np.clip(hit, 0, None)], -1)
    out[dev] = lut[link[dev]]
    return out


def cpu_run(t: EventTable) -> bool:
    """Whether the trace is of a run on the CPU: no device events, no device runtime calls (cudaLaunchKernel
    and the like) and no device in its deviceProperties (a CPU profile writes an empty list). A GPU run
    profiled without the device activity has the runtime calls or the properties."""
    props = t.metadata.get("deviceProperties")
    return not np.isin(t.kind, DEVICE_KINDS).any() and not (t.kind == RUNTIME).any() \
        and not (isinstance(props, list) and props)


def host_owned_ops(t: EventTable, price) -> np.ndarray:
    """The cpu_op rows that did their priced work themselves, in a trace without device events (a CPU
    run, where an operator's work is its own host span). Among the operators this roofline prices
    (price(row) -> OpCost or None), nested as the host called them: an operator whose directly nested
    priced operators move at least its own bytes and do at least its own FLOPs only dispatched to them
    (aten::linear -> aten::addmm, aten::mean -> aten::sum + aten::div_): they are counted instead. Any
    other operator did its work itself, around helpers that move less (add of a Python scalar wrapping
    it in a 0-dim tensor, norm backward zeroing a small buffer) or compute less (a convolution's backward
    copying its inputs contiguous first: its copies move more bytes than its own minimum, and no FLOP): it is
    counted with its whole span, its nested operators not. Each priced byte, FLOP and host µs is so counted
    once."""
    ops = np.flatnonzero((t.kind == CPU_OP) & (t.args >= 0))
    priced = np.array([r for r in ops if price(int(r)) is not None], dtype=np.int64)
    if priced.size == 0:
        return priced
    n = nest(*row_spans(t, priced))
    rows = priced[n.order]  # table rows in nesting order
    nested_bytes, nested_flops = np.zeros(len(n)), np.zeros(len(n))
    has_parent = n.parent >= 0
    np.add.at(nested_bytes, n.parent[has_parent], [price(int(r)).bytes for r in rows[has_parent]])
    np.add.at(nested_flops, n.parent[has_parent], [price(int(r)).flops for r in rows[has_parent]])
    own = np.array([price(int(r)).bytes for r in rows])
    own_flops = np.array([price(int(r)).flops for r in rows])
    dispatcher = ((np.bincount(n.parent[has_parent], minlength=len(n)) > 0) & (nested_bytes >= own)
                  & (nested_flops >= own_flops))
    # counted: not a dispatcher, and every priced operator around it is a dispatcher (top-down, parents first)
    counted = np.zeros(len(n), dtype=bool)
    open_path = np.zeros(len(n), dtype=bool)  # all enclosing priced operators are dispatchers
    for i in range(len(n)):  # nesting order puts every parent before its children
        p = n.parent[i]
        open_path[i] = p < 0 or (open_path[p] and dispatcher[p])
        counted[i] = open_path[i] and not dispatcher[i]
    return np.sort(rows[counted])


def roofline(t: EventTable, accelerator=None, keep: np.ndarray | None = None,
             op: np.ndarray | None = None) -> list[RooflineRow]:
    """Roofline rows of one rank, sorted by time lost to the roofline (then by time), from its event
    table (shapes: the args the loader kept). accelerator: a hardware.Accelerator (default: the trace's).
    Time: the device time of the kernels each operator launched; in a CPU run's trace (cpu_run), the host
    span of each operator that did its own work (host_owned_ops); none in a GPU run's trace without its
    device events. keep: bool per row, the rows counted (the analysis window's: its device events, or on a CPU
    run its operators); default every row. op: launching_op(t), where the caller has it already."""
    acc = accelerator if accelerator is not None else device_accelerator(t)
    counted = np.ones(len(t), dtype=bool) if keep is None else keep
    costs: dict[tuple[int, int], tuple] = {}  # (name id, args id) -> (OpShape, OpCost): each shape priced once

    def priced(r: int) -> tuple:
        pair = (int(t.name[r]), int(t.args[r]))
        got = costs.get(pair)
        if got is None:
            s = op_shape(t, r)
            got = costs[pair] = (s, op_cost(s.name, s.dims, s.types, s.concrete) if s is not None else None)
        return got

    on_tf32: set[int] = set()  # GEMM operators whose kernels ran TF32
    if np.isin(t.kind, DEVICE_KINDS).any():
        op = launching_op(t) if op is None else op
        # copies to or from the host or another device run at the link's speed, not HBM's: left out
        host_link = t.ids_matching(lambda n: copy_direction(n) in OFF_DEVICE_DIRECTIONS)
        dev = np.flatnonzero((op >= 0) & counted & ~((t.kind == MEMCPY) & np.isin(t.name, host_link)))
        op_rows, inv = np.unique(op[dev], return_inverse=True)
        time_by_op = np.bincount(inv.reshape(-1), weights=t.dur_ns[dev] / 1e3, minlength=op_rows.size)
        on_tf32 = _ops_on_tf32(t, dev, op)
    elif cpu_run(t):
        op_rows = host_owned_ops(t, lambda r: priced(r)[1])
        op_rows = op_rows[counted[op_rows]]
        time_by_op = t.dur_ns[op_rows] / 1e3
    else:  # a GPU run profiled without its device activity: host spans would time launches, not work
        op_rows, time_by_op = np.zeros(0, dtype=np.int64), np.zeros(0)
    groups: dict[tuple, RooflineRow] = {}
    for r, us in zip(op_rows, time_by_op):
        s, c = priced(int(r))
        if c is None:
            continue
        # fp32 operands on tensor cores (allow_tf32, set_float32_matmul_precision("high")) run at TF32's peak
        prec = TF32 if c.kind in ("gemm", "conv") and c.precision == "fp32" and int(r) in on_tf32 else c.precision
        # the cost too: the same shapes may cost differently by their concrete inputs (the dims a sum
        # reduces, a causal flag), each such variant its own row
        key = (s.name, shape_key(s), c.flops, c.bytes, prec)
        row = groups.get(key)
        if row is None:
            peak, tbps = _peaks(acc, prec)
            row = groups[key] = RooflineRow(op=s.name, shapes=key[1], kind=c.kind, count=0, time_us=0.0,
                                            flops=c.flops, bytes=c.bytes, precision=prec, peak_tflops=peak,
                                            peak_tbps=tbps)
        row.count += 1
        row.time_us += float(us)
    _add_hlo_rows(t, acc, groups, counted)
    return sorted(groups.values(), key=lambda r: (-r.lost_us, -r.time_us))


_KIND_OF_CATEGORY = {ev.GEMM: "gemm", ev.ATTENTION: "attention", ev.ELEMENTWISE: "elementwise", ev.REDUCTION: "norm"}


TF32 = "tf32"  # a GEMM's precision where its fp32 operands ran on tensor cores (precision.classify_kernel's TF32)
# TF32's dense peak as a share of bf16's: half on every part whose kernels run it (NVIDIA's datasheets: A100 156 of
# 312, H100 SXM 494.7 of 989.4, L40S 183 of 362, A10 62.5 of 125 TFLOP/s; AMD's xf32 on MI300X 653.7 of 1307.4): a
# kernel named TF32 only runs on such a part, so the catalog needs no figure of its own
TF32_SHARE_OF_BF16 = 0.5


def _peaks(acc, precision: str) -> tuple[float | None, float | None]:
    """(peak TFLOP/s at this precision, HBM TB/s) of an accelerator; None where unknown."""
    if acc is None:
        return None, None
    peak = None
    if precision in ("bf16", "fp16", "fp8") or (precision == "fp32" and acc.fp32_tflops is not None):
        peak = acc.peak_flops(precision) / 1e12  # (no fp32 figure: peak_flops would give bf16's)
    elif precision == TF32:
        peak = TF32_SHARE_OF_BF16 * acc.peak_flops("bf16") / 1e12
    return peak, acc.hbm_tbps


def _ops_on_tf32(t: EventTable, dev: np.ndarray, op: np.ndarray) -> set[int]:
    """The operator rows (op: launching_op) among whose device events `dev` a GEMM kernel's name says TF32 (fp32
    operands on tensor cores; precision.classify_kernel)."""
    from trainperf.diagnose.precision import TF32 as KERNEL_TF32, classify_kernel  # (precision imports facts,
    # which imports this module)

    gemm = dev[t.category[dev] == ev.GEMM]
    names = np.unique(t.name[gemm])
    tf32 = [i for i in names if classify_kernel(t.names[int(i)]) == KERNEL_TF32]
    return set(op[gemm[np.isin(t.name[gemm], tf32)]].tolist()) if tf32 else set()


def _add_hlo_rows(t: EventTable, acc, groups: dict, counted: np.ndarray) -> None:
    """Rows for the kept device events that carry their own cost: XLA kernels whose HLO instruction the JAX
    reader priced (EventTable.args hlo_flops / hlo_bytes, trace.hlo), one call per kernel."""
    dev = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & (t.args >= 0) & counted)
    if dev.size == 0:
        return
    kept = t.kept_args()
    for r in dev:
        a = kept[int(t.args[r])]
        if "hlo_flops" not in a:
            continue
        name = t.names[int(t.name[r])]
        key = (name, str(a.get("hlo_shapes", "")))
        row = groups.get(key)
        if row is None:
            prec = str(a.get("hlo_precision", ""))
            peak, tbps = _peaks(acc, prec)
            kind = _KIND_OF_CATEGORY.get(int(t.category[r]), "other")
            row = groups[key] = RooflineRow(op=name, shapes=key[1], kind=kind,
                                            count=0, time_us=0.0, flops=float(a["hlo_flops"]),
                                            bytes=float(a.get("hlo_bytes", 0.0)), precision=prec, peak_tflops=peak,
                                            peak_tbps=tbps)
        row.count += 1
        row.time_us += float(t.dur_ns[r]) / 1e3


# torch dtype names of a `trainperf calibrate` profile -> the precision its GEMMs measured
_CALIBRATED_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def calibrated_accelerator(profile: dict | str | Path, base=None):
    """The accelerator as a `trainperf calibrate` profile measured it: the GEMM peak of the profile's
    dtype (efficiency.measured_gemm_tflops, the large-GEMM asymptote) and the device-copy bandwidth
    (efficiency.measured_hbm_tbps) replace the catalog's peaks; other precisions keep the catalog's
    (base: the catalog entry, default the one the profile's device name matches; a device the catalog
    does not know, a CPU, gets only the measured precision). The roofline then measures against what
    this machine attains rather than the datasheet."""
    import dataclasses
    import json

    from trainperf.hardware import Accelerator, accelerator_for_device

    if not isinstance(profile, dict):
        try:
            profile = json.loads(Path(profile).read_text())
        except (OSError, ValueError) as e:
            raise TrainperfError(f"{profile}: not a readable calibration profile ({e})") from None
    eff = profile.get("efficiency") if isinstance(profile, dict) else None
    prec = _CALIBRATED_PRECISION.get(str(profile.get("dtype", ""))) if isinstance(profile, dict) else None
    if not isinstance(eff, dict) or prec is None or not eff.get("measured_gemm_tflops") \
            or not eff.get("measured_hbm_tbps"):
        raise TrainperfError("calibration profile without measured_gemm_tflops, measured_hbm_tbps and a dtype of "
                             "bfloat16, float16 or float32; make it with `trainperf calibrate`")
    tflops, tbps = float(eff["measured_gemm_tflops"]), float(eff["measured_hbm_tbps"])
    device = str(profile.get("device", "device"))
    base = base if base is not None else accelerator_for_device(device)
    field = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp32": "fp32_tflops"}[prec]
    if base is not None:
        return dataclasses.replace(base, name=f"{base.name} (calibrated)", hbm_tbps=tbps, **{field: tflops})
    peaks = {"bf16_tflops": 0.0, "fp16_tflops": 0.0, "fp8_tflops": None, "fp32_tflops": None, field: tflops}
    return Accelerator(name=f"{device} (calibrated)", vendor="", hbm_gb=0.0, hbm_tbps=tbps, scaleup_gbps=0.0,
                       scaleup_domain=1, gpus_per_node=1, scaleout_gbps=0.0, tdp_w=0.0, usd_per_hour=0.0,
                       sources=str(eff.get("source", "trainperf calibrate")), **peaks)


def roofline_for_trace(path: str | Path, accelerator: str | None = None,
                       calibration: str | Path | None = None) -> dict[int, list[RooflineRow]]:
    """{rank: roofline rows} for a Kineto file or a folder of ranks. accelerator: a catalog name
    (default: each trace's deviceProperties); calibration: a `trainperf calibrate` profile whose
    measured peaks replace the catalog's (calibrated_accelerator)."""
    from trainperf.hardware import get_accelerator
    from trainperf.trace.load import load_trace

    acc = get_accelerator(accelerator) if accelerator else None
    tables = load_trace(path)
    if calibration is not None:
        first = next(iter(tables.values()))
        acc = calibrated_accelerator(calibration, acc if acc is not None else device_accelerator(first))
    return {r: roofline(t, acc) for r, t in tables.items()}


@dataclass(kw_only=True)
class RooflineSummary:
    """The roofline of one rank for `trainperf diagnose`: rows and totals per kind of operator."""

    accelerator: str                 # catalog name, "" when unknown
    rows: list[RooflineRow]          # sorted by time lost to the roofline
    by_kind: dict[str, dict]         # kind -> time_us, lost_us, roofline_pct, hbm_pct, tflops_pct

    def to_json(self, top: int = 20) -> dict:
        """{accelerator, by_kind, rows (the top ones)}."""
        return {"accelerator": self.accelerator, "by_kind": self.by_kind,
                "rows": [r.to_json() for r in self.rows[:top]]}


def summarize(rows: list[RooflineRow], accelerator: str = "") -> RooflineSummary:
    """Totals per kind: device time, time lost, time at the roof as % of time (roofline_pct), achieved
    bandwidth as % of HBM peak (hbm_pct: all bytes over all time) and FLOP rate as % of peak (tflops_pct)."""
    by_kind: dict[str, dict] = {}
    for kind in sorted({r.kind for r in rows}):
        rs = [r for r in rows if r.kind == kind]
        time = sum(r.time_us for r in rs)
        roofed = [r for r in rs if r.min_time_us is not None]
        at_roof = sum(r.min_time_us for r in roofed)
        roofed_time = sum(r.time_us for r in roofed)
        bw = [r for r in rs if r.peak_tbps]
        fl = [r for r in rs if r.peak_tflops]
        pct = lambda num, den: round(100.0 * num / den, 2) if den > 0 else None  # noqa: E731
        by_kind[kind] = {
            "time_us": round(time, 3), "count": sum(r.count for r in rs),
            "lost_us": round(sum(r.lost_us for r in rs), 3),
            "roofline_pct": pct(at_roof, roofed_time),
            "hbm_pct": pct(sum(r.total_bytes / (r.peak_tbps * 1e6) for r in bw), sum(r.time_us for r in bw)),
            "tflops_pct": pct(sum(r.total_flops / (r.peak_tflops * 1e6) for r in fl), sum(r.time_us for r in fl))}
    return RooflineSummary(accelerator=accelerator, rows=rows, by_kind=by_kind)


def rank_roofline(t: EventTable, accelerator=None) -> RooflineSummary:
    """The roofline summary of one rank's table (a trace recorded without record_shapes gives no rows).
    accelerator: a hardware.Accelerator (default: the trace's device)."""
    acc = accelerator if accelerator is not None else device_accelerator(t)
    return summarize(roofline(t, acc), acc.name if acc is not None else "")
