"""LayerNorm: y = (x - mean) / sqrt(var + eps) * weight + bias, fused forward and backward.

Same structure as rms_norm: one pass over each row in registers (looped beyond
16K columns forward, 8K backward), fp32 mean and rstd saved per row, weight and bias gradients reduced via
per-program partial sums (no atomics).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from trainperf.kernels._runtime import as_rows, n_persistent_programs, num_warps_for, row_tile


@triton.jit
def _layer_norm_fwd_kernel(X, W, B, Y, MEAN, RSTD, n_rows, n_cols, stride_x, stride_y, eps,
                           HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    eps32 = tl.cast(eps, tl.float32)
    if ONE_PASS:
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / n_cols + eps32)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = xc * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            y += tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            acc += tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / n_cols
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):  # two-pass variance: no cancellation for large means
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, x - mean[:, None], 0.0)
            acc += xc * xc
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / n_cols + eps32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            col_mask = c < n_cols
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None] * w[None, :]
            if HAS_BIAS:
                y += tl.load(B + c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + rows64[:, None] * stride_y + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _layer_norm_bwd_kernel(X, W, DY, MEAN, RSTD, DX, DW_PARTIAL, DB_PARTIAL, n_rows, n_cols,
                           stride_x, stride_dy, stride_dx, tiles_per_program,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        col_mask = cols < n_cols
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t in range(0, tiles_per_program):
            rows = (pid * tiles_per_program + t) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < n_rows
            rows64 = rows.to(tl.int64)
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            wdy = dy * w[None, :]
            c1 = tl.sum(x_hat * wdy, axis=1) / n_cols
            c2 = tl.sum(wdy, axis=1) / n_cols
            dx = (wdy - (x_hat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            dw_acc += tl.sum(dy * x_hat, axis=0)
            db_acc += tl.sum(dy, axis=0)
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)
        tl.store(DB_PARTIAL + pid.to(tl.int64) * n_cols + cols, db_acc, mask=col_mask)
    else:
        for t in range(0, tiles_per_program):
            rows = (pid * tiles_per_program + t) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < n_rows
            rows64 = rows.to(tl.int64)
            mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + rows64[:, None] * stride_dy + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
                acc1 += x_hat * dy * w[None, :]
                acc2 += dy * w[None, :]
            c1 = tl.sum(acc1, axis=1) / n_cols
            c2 = tl.sum(acc2, axis=1) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + rows64[:, None] * stride_dy + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
                dx = (dy * w[None, :] - (x_hat * c1[:, None] + c2[:, None])) * rstd[:, None]
                tl.store(DX + rows64[:, None] * stride_dx + c[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                pw = DW_PARTIAL + pid.to(tl.int64) * n_cols + c
                tl.store(pw, tl.load(pw, mask=col_mask, other=0.0) + tl.sum(dy * x_hat, axis=0), mask=col_mask)
                pb = DB_PARTIAL + pid.to(tl.int64) * n_cols + c
                tl.store(pb, tl.load(pb, mask=col_mask, other=0.0) + tl.sum(dy, axis=0), mask=col_mask)


@torch.library.custom_op("trainperf::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (y shaped like x, mean fp32 per row, rstd fp32 per row): the LayerNorm forward."""
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"layer_norm: weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=3)
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w
    _layer_norm_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, w, b, y, mean, rstd, n_rows, n_cols, x2.stride(0), y.stride(0), eps,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass,
        num_warps=num_warps_for(block_m * block_n))
    return y.view(x.shape), mean.view(x.shape[:-1]), rstd.view(x.shape[:-1])


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.custom_op("trainperf::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                   rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (dx shaped like x, dweight, dbias), the last two in weight's dtype: the LayerNorm backward."""
    x2, dy2 = as_rows(x), as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=8)
    n_tiles = triton.cdiv(n_rows, block_m)
    tiles_per_program = triton.cdiv(n_tiles, n_persistent_programs(x.device, n_tiles))
    n_programs = triton.cdiv(n_tiles, tiles_per_program)
    alloc = torch.empty if one_pass else torch.zeros
    dw_partial = alloc((n_programs, n_cols), dtype=torch.float32, device=x.device)
    db_partial = alloc((n_programs, n_cols), dtype=torch.float32, device=x.device)
    _layer_norm_bwd_kernel[(n_programs,)](
        x2, weight.contiguous(), dy2, mean.reshape(-1), rstd.reshape(-1), dx, dw_partial, db_partial,
        n_rows, n_cols, x2.stride(0), dy2.stride(0), dx.stride(0), tiles_per_program,
        BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass, num_warps=num_warps_for(block_m * block_n, live=4))
    return dx.view(x.shape), dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype)


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
