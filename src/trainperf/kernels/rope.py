"""Rotary position embedding in the Hugging Face rotate_half convention, fused for q and k.

q_out = q * cos + rotate_half(q) * sin with rotate_half(x) = cat(-x2, x1) over the two halves
of head_dim. q, k: (batch, seq, heads, head_dim), any strides with a unit stride on head_dim
(e.g. views of a fused qkv projection or a transposed (batch, heads, seq, dim) tensor);
cos, sin: (seq, head_dim) or (batch or 1, seq, head_dim). One program rotates every head of
a (batch, seq) position, so cos/sin are read once per position, not once per head. The
backward is the transposed rotation (same kernel, sin sign flipped); nothing is saved but
cos and sin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainperf.kernels._runtime import INTERPRETED, INTERPRETER_BLOCK_ELEMS, next_pow2


@triton.jit
def _rope_kernel(X, COS, SIN, Y, n_rows, seq_len, n_heads, half,
                 sxb, sxs, sxh, syb, sys_, syh, scb, scs, ssb, sss,
                 BACKWARD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    b = (rows // seq_len).to(tl.int64)
    s = (rows % seq_len).to(tl.int64)
    h = tl.arange(0, BLOCK_H).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    cs_mask = row_ok[:, None] & (d < half)[None, :]
    c_off = b[:, None] * scb + s[:, None] * scs + d[None, :]
    s_off = b[:, None] * ssb + s[:, None] * sss + d[None, :]
    c1 = tl.load(COS + c_off, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    c2 = tl.load(COS + c_off + half, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    s1 = tl.load(SIN + s_off, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    s2 = tl.load(SIN + s_off + half, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    mask = cs_mask[:, None, :] & (h < n_heads)[None, :, None]
    x_off = b[:, None, None] * sxb + s[:, None, None] * sxs + h[None, :, None] * sxh + d[None, None, :]
    y_off = b[:, None, None] * syb + s[:, None, None] * sys_ + h[None, :, None] * syh + d[None, None, :]
    x1 = tl.load(X + x_off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + x_off + half, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    tl.store(Y + y_off, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + y_off + half, y2.to(Y.dtype.element_ty), mask=mask)


def _cos_sin_strides(t: torch.Tensor, batch: int, seq: int, dim: int) -> tuple[torch.Tensor, int, int]:
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 4 and t.shape[2] == 1:  # HF-style (batch, seq, 1, dim) after unsqueeze
        t = t.squeeze(2)
    if t.dim() == 2 and t.shape == (seq, dim):
        return t, 0, t.stride(0)
    if t.dim() == 3 and t.shape[1:] == (seq, dim) and t.shape[0] in (1, batch):
        return t, (t.stride(0) if t.shape[0] == batch and batch > 1 else 0), t.stride(1)
    raise ValueError(f"rope: cos/sin shape {tuple(t.shape)} does not fit (seq={seq}, head_dim={dim}) "
                     f"or (batch={batch}, seq, head_dim)")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"rope: expected (batch, seq, heads, head_dim), got shape {tuple(x.shape)}")
    batch, seq, heads, dim = x.shape
    if dim % 2:
        raise ValueError(f"rope: head_dim must be even, got {dim}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, scb, scs = _cos_sin_strides(cos, batch, seq, dim)
    sin, ssb, sss = _cos_sin_strides(sin, batch, seq, dim)
    y = torch.empty((batch, seq, heads, dim), dtype=x.dtype, device=x.device)
    n_rows, half = batch * seq, dim // 2
    block_h, block_d = next_pow2(heads), next_pow2(half)
    per_row = block_h * block_d
    if INTERPRETED:
        block_m = max(1, min(next_pow2(n_rows), INTERPRETER_BLOCK_ELEMS // per_row))
    else:
        block_m = max(1, min(next_pow2(n_rows), 2048 // per_row))
    _rope_kernel[(triton.cdiv(n_rows, block_m),)](
        x, cos, sin, y, n_rows, seq, heads, half,
        x.stride(0), x.stride(1), x.stride(2), y.stride(0), y.stride(1), y.stride(2), scb, scs, ssb, sss,
        BACKWARD=backward, BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4 if block_m * per_row >= 2048 else 2)
    return y


@torch.library.custom_op("trainperf::rope_fwd", mutates_args=())
def rope_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q rotated, k rotated), contiguous, shaped and typed like q and k."""
    return _rotate(q, cos, sin, False), _rotate(k, cos, sin, False)


def _empty_like_pair(a, b, cos, sin):
    # fake (meta) implementation of both ops: outputs shaped and typed like the two inputs
    return a.new_empty(a.shape), b.new_empty(b.shape)


rope_fwd.register_fake(_empty_like_pair)


@torch.library.custom_op("trainperf::rope_bwd", mutates_args=())
def rope_bwd(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dq, dk) through the rotation: the transposed rotation of the upstream gradients."""
    return _rotate(dq, cos, sin, True), _rotate(dk, cos, sin, True)


rope_bwd.register_fake(_empty_like_pair)


def _setup_context(ctx, inputs, output):
    _q, _k, cos, sin = inputs
    ctx.save_for_backward(cos, sin)


def _backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    dq_in, dk_in = rope_bwd(dq, dk, cos, sin)
    return dq_in, dk_in, None, None


rope_fwd.register_autograd(_backward, setup_context=_setup_context)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q, k) rotated by cos/sin (HF rotate_half convention); q, k: (batch, seq, heads, head_dim)."""
    return rope_fwd(q, k, cos, sin)
