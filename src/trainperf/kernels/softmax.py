"""Row softmax over the last dim, fused forward and backward.

Forward: one read and one write per element when the row fits registers; wider rows take an
online-softmax pass (running max and rescaled sum, one read) then a write pass. Backward:
dx = y * (dy - sum(dy * y)), one read of y and dy and one write of dx per element.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainperf.kernels._rowwise import load_tile, online_softmax_step, row_block, store_tile
from trainperf.kernels._runtime import as_rows, num_warps_for, row_tile


@triton.jit
def _softmax_fwd_kernel(X, Y, n_rows, n_cols, stride_x, stride_y,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
    rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = load_tile(X, rows64, stride_x, cols, mask, -float("inf"))
        m = tl.max(x, axis=1)
        m = tl.where(row_mask, m, 0.0)
        e = tl.exp(x - m[:, None])
        store_tile(Y, rows64, stride_y, cols, e / tl.sum(e, axis=1)[:, None], mask)
    else:
        m = tl.full([BLOCK_M], -float("inf"), tl.float32)
        d = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            m, d = online_softmax_step(m, d, load_tile(X, rows64, stride_x, c, mask, -float("inf")))
        m = tl.where(m == -float("inf"), 0.0, m)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            x = load_tile(X, rows64, stride_x, c, mask, -float("inf"))
            store_tile(Y, rows64, stride_y, c, tl.exp(x - m[:, None]) / d[:, None], mask)


@triton.jit
def _softmax_bwd_kernel(DY, Y, DX, n_rows, n_cols, stride_dy, stride_y, stride_dx,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
    rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        dy = load_tile(DY, rows64, stride_dy, cols, mask, 0.0)
        y = load_tile(Y, rows64, stride_y, cols, mask, 0.0)
        dot = tl.sum(dy * y, axis=1)
        # stored inline, not by store_tile: with the address computed first ptxas needs 101 registers, not 110
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], (y * (dy - dot[:, None])).to(DX.dtype.element_ty),
                 mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            acc += load_tile(DY, rows64, stride_dy, c, mask, 0.0) * load_tile(Y, rows64, stride_y, c, mask, 0.0)
        dot = tl.sum(acc, axis=1)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            dy = load_tile(DY, rows64, stride_dy, c, mask, 0.0)
            y = load_tile(Y, rows64, stride_y, c, mask, 0.0)
            store_tile(DX, rows64, stride_dx, c, y * (dy - dot[:, None]), mask)


@torch.library.custom_op("trainperf::softmax_fwd", mutates_args=())
def softmax_fwd(x: torch.Tensor) -> torch.Tensor:
    """Return softmax(x) over the last dim, shaped and typed like x."""
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    bm, bn, one_pass = row_tile(n_rows, n_cols, live=3)
    _softmax_fwd_kernel[(triton.cdiv(n_rows, bm),)](x2, y, n_rows, n_cols, x2.stride(0), y.stride(0),
                                                    BLOCK_M=bm, BLOCK_N=bn, ONE_PASS=one_pass,
                                                    num_warps=num_warps_for(bm * bn))
    return y.view(x.shape)


@softmax_fwd.register_fake
def _(x):
    return x.new_empty(x.shape)


@torch.library.custom_op("trainperf::softmax_bwd", mutates_args=())
def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Return dx = y * (dy - sum(dy * y)) over the last dim, shaped like y."""
    d2, y2 = as_rows(dy), as_rows(y)
    n_rows, n_cols = y2.shape
    dx = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device)
    bm, bn, one_pass = row_tile(n_rows, n_cols, live=4)
    _softmax_bwd_kernel[(triton.cdiv(n_rows, bm),)](d2, y2, dx, n_rows, n_cols, d2.stride(0), y2.stride(0),
                                                    dx.stride(0), BLOCK_M=bm, BLOCK_N=bn, ONE_PASS=one_pass,
                                                    num_warps=num_warps_for(bm * bn))
    return dx.view(y.shape)


@softmax_bwd.register_fake
def _(dy, y):
    return y.new_empty(y.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_bwd(dy, y)


softmax_fwd.register_autograd(_backward, setup_context=_setup_context)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Return softmax over the last dim (shape and dtype of x); differentiable, compilable."""
    return softmax_fwd(x)
