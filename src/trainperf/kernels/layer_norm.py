"""LayerNorm: y = (x - mean) / sqrt(var + eps) * weight + bias, fused forward and backward.

This module also holds the kernels of rms_norm: RMSNorm is LayerNorm without the mean
subtraction and without bias (constexpr IS_RMS, compiled away). One pass over each row in
registers (looped beyond 16K columns forward, 8K backward), fp32 mean (LayerNorm only) and rstd
saved per row, weight and bias gradients reduced via per-program partial sums (no atomics).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from trainperf.kernels._rowwise import load_tile, row_block, store_tile
from trainperf.kernels._runtime import as_rows, n_persistent_programs, num_warps_for, row_tile


@triton.jit
def _centred(x, mean, mask, IS_RMS: tl.constexpr):
    """Return x - mean, 0 outside mask (LayerNorm); x itself for RMSNorm (masked loads are 0 already)."""
    if IS_RMS:
        xc = x
    else:
        xc = tl.where(mask, x - mean[:, None], 0.0)
    return xc


@triton.jit
def _x_hat(x, mean, rstd, mask, IS_RMS: tl.constexpr):
    """Return the normalised x: (x - mean) * rstd, 0 outside mask (LayerNorm); x * rstd (RMSNorm)."""
    if IS_RMS:
        x_hat = x * rstd[:, None]
    else:
        x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    return x_hat


@triton.jit
def _dx(wdy, x_hat, c1, c2, rstd, IS_RMS: tl.constexpr):
    """Return dx = (w*dy - (x_hat * mean(x_hat*w*dy) + mean(w*dy))) * rstd; RMSNorm has no mean(w*dy) term."""
    if IS_RMS:
        proj = x_hat * c1[:, None]
    else:
        proj = x_hat * c1[:, None] + c2[:, None]
    return (wdy - proj) * rstd[:, None]


@triton.jit
def _add_to_partial(PARTIAL, pid, n_cols, c, col_mask, value):
    """Add value (cols,) into this program's row of the (programs, n_cols) fp32 PARTIAL sums."""
    p = PARTIAL + pid.to(tl.int64) * n_cols + c
    tl.store(p, tl.load(p, mask=col_mask, other=0.0) + value, mask=col_mask)


@triton.jit
def _norm_fwd_kernel(X, W, B, Y, MEAN, RSTD, n_rows, n_cols, stride_x, stride_y, eps,
                     IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     ONE_PASS: tl.constexpr):
    # IS_RMS: no mean (MEAN is not written), no bias.
    rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    eps32 = tl.cast(eps, tl.float32)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ONE_PASS:
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = load_tile(X, rows64, stride_x, cols, mask, 0.0)
        if not IS_RMS:
            mean = tl.sum(x, axis=1) / n_cols
        xc = _centred(x, mean, mask, IS_RMS)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / n_cols + eps32)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = xc * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            y += tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        store_tile(Y, rows64, stride_y, cols, y, mask)
    else:
        if not IS_RMS:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                acc += load_tile(X, rows64, stride_x, c, row_mask[:, None] & (c < n_cols)[None, :], 0.0)
            mean = tl.sum(acc, axis=1) / n_cols
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):  # two-pass variance: no cancellation for large means
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            xc = _centred(load_tile(X, rows64, stride_x, c, mask, 0.0), mean, mask, IS_RMS)
            acc += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / n_cols + eps32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            col_mask = c < n_cols
            mask = row_mask[:, None] & col_mask[None, :]
            x = load_tile(X, rows64, stride_x, c, mask, 0.0)
            if not IS_RMS:
                x = x - mean[:, None]  # lanes outside mask are never stored
            w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            if HAS_BIAS:
                y += tl.load(B + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            store_tile(Y, rows64, stride_y, c, y, mask)
    if not IS_RMS:
        tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _norm_bwd_kernel(X, W, DY, MEAN, RSTD, DX, DW_PARTIAL, DB_PARTIAL, n_rows, n_cols,
                     stride_x, stride_dy, stride_dx, tiles_per_program,
                     IS_RMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
    # Each program owns tiles_per_program consecutive row tiles and writes its partial weight (and,
    # for LayerNorm, bias) gradient to its own row of DW_PARTIAL (DB_PARTIAL); IS_RMS: no MEAN, no bias.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        col_mask = cols < n_cols
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t in range(0, tiles_per_program):
            rows, row_mask, rows64 = row_block(pid * tiles_per_program + t, n_rows, BLOCK_M)
            mask = row_mask[:, None] & col_mask[None, :]
            x = load_tile(X, rows64, stride_x, cols, mask, 0.0)
            dy = load_tile(DY, rows64, stride_dy, cols, mask, 0.0)
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            if not IS_RMS:
                mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            x_hat = _x_hat(x, mean, rstd, mask, IS_RMS)
            wdy = dy * w[None, :]
            c1 = tl.sum(x_hat * wdy, axis=1) / n_cols
            c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            if not IS_RMS:
                c2 = tl.sum(wdy, axis=1) / n_cols
            store_tile(DX, rows64, stride_dx, cols, _dx(wdy, x_hat, c1, c2, rstd, IS_RMS), mask)
            dw_acc += tl.sum(dy * x_hat, axis=0)
            if not IS_RMS:
                db_acc += tl.sum(dy, axis=0)
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)
        if not IS_RMS:
            tl.store(DB_PARTIAL + pid.to(tl.int64) * n_cols + cols, db_acc, mask=col_mask)
    else:
        # Rows wider than the register budget: two passes over column chunks per row tile,
        # accumulating into this program's (zeroed) partial rows.
        for t in range(0, tiles_per_program):
            rows, row_mask, rows64 = row_block(pid * tiles_per_program + t, n_rows, BLOCK_M)
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            if not IS_RMS:
                mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x = load_tile(X, rows64, stride_x, c, mask, 0.0)
                dy = load_tile(DY, rows64, stride_dy, c, mask, 0.0)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                if IS_RMS:  # rstd factored out of the row sum (applied to c1 below)
                    acc1 += x * dy * w[None, :]
                else:
                    acc1 += _x_hat(x, mean, rstd, mask, IS_RMS) * dy * w[None, :]
                    acc2 += dy * w[None, :]
            if IS_RMS:
                c1 = tl.sum(acc1, axis=1) * rstd / n_cols
            else:
                c1 = tl.sum(acc1, axis=1) / n_cols
            c2 = tl.sum(acc2, axis=1) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x_hat = _x_hat(load_tile(X, rows64, stride_x, c, mask, 0.0), mean, rstd, mask, IS_RMS)
                dy = load_tile(DY, rows64, stride_dy, c, mask, 0.0)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                store_tile(DX, rows64, stride_dx, c, _dx(dy * w[None, :], x_hat, c1, c2, rstd, IS_RMS), mask)
                _add_to_partial(DW_PARTIAL, pid, n_cols, c, col_mask, tl.sum(dy * x_hat, axis=0))
                if not IS_RMS:
                    _add_to_partial(DB_PARTIAL, pid, n_cols, c, col_mask, tl.sum(dy, axis=0))


def norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float,
                 is_rms: bool) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Return (y shaped like x, mean fp32 per row or None for RMSNorm, rstd fp32 per row): the norm forward."""
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"{'rms_norm' if is_rms else 'layer_norm'}: weight shape {tuple(weight.shape)} "
                         f"does not match hidden size {x.shape[-1]}")
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    mean = None if is_rms else torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=3)
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w  # placeholders for unused pointers
    _norm_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, w, b, y, rstd if mean is None else mean, rstd, n_rows, n_cols, x2.stride(0), y.stride(0), eps,
        IS_RMS=is_rms, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass,
        num_warps=num_warps_for(block_m * block_n))
    return y.view(x.shape), (None if mean is None else mean.view(x.shape[:-1])), rstd.view(x.shape[:-1])


def norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: Optional[torch.Tensor],
                  rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Return (dx shaped like x, dweight, dbias or None), the last two in weight's dtype.

    mean None: the RMSNorm backward (no bias); otherwise LayerNorm's.
    """
    is_rms = mean is None
    x2, dy2 = as_rows(x), as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=8)
    n_tiles = triton.cdiv(n_rows, block_m)
    tiles_per_program = triton.cdiv(n_tiles, n_persistent_programs(x.device, n_tiles))
    n_programs = triton.cdiv(n_tiles, tiles_per_program)
    alloc = torch.empty if one_pass else torch.zeros
    dw_partial = alloc((n_programs, n_cols), dtype=torch.float32, device=x.device)
    db_partial = dw_partial if is_rms else alloc((n_programs, n_cols), dtype=torch.float32, device=x.device)
    rstd = rstd.reshape(-1)
    _norm_bwd_kernel[(n_programs,)](
        x2, weight.contiguous(), dy2, rstd if is_rms else mean.reshape(-1), rstd, dx, dw_partial, db_partial,
        n_rows, n_cols, x2.stride(0), dy2.stride(0), dx.stride(0), tiles_per_program,
        IS_RMS=is_rms, BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass,
        num_warps=num_warps_for(block_m * block_n, live=4))
    db = None if is_rms else db_partial.sum(0).to(weight.dtype)
    return dx.view(x.shape), dw_partial.sum(0).to(weight.dtype), db


@torch.library.custom_op("trainperf::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (y shaped like x, mean fp32 per row, rstd fp32 per row): the LayerNorm forward."""
    return norm_forward(x, weight, bias, eps, is_rms=False)


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.custom_op("trainperf::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                   rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (dx shaped like x, dweight, dbias), the last two in weight's dtype: the LayerNorm backward."""
    return norm_backward(dy, x, weight, mean, rstd)


@layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    _y, mean, rstd = output
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, mean, rstd)


def _backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_bwd(dy, x, weight, mean, rstd)
    return dx, dw, (db if ctx.has_bias else None), None


layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Return LayerNorm(x) * weight + bias over the last dim (same shape and dtype as x); differentiable."""
    return layer_norm_fwd(x, weight, bias, float(eps))[0]


class LayerNorm(torch.nn.Module):
    """LayerNorm module on the fused kernel: parameters `weight`, `bias` (or None), attribute `eps`."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.bias = torch.nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the normalised x (same shape and dtype)."""
        return layer_norm(x, self.weight, self.bias, self.eps)
