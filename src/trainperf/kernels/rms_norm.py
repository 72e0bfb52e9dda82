"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, fused forward and backward.

Forward reads x once and writes y once (plus one fp32 rstd per row for the backward).
Backward reads x, dy once and writes dx once; the weight gradient is reduced without atomics:
each program owns a contiguous run of rows and keeps its partial sum of dy * x_hat in
registers, writing one fp32 row per program, which a final torch sum folds (the QuACK/Apex
scheme; Liger does the same but with one program per SM-sized block of rows).
Rows stay in registers (one pass) up to 16K columns forward, 8K backward; wider rows loop over
chunks (a second read of the row, mostly from L2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainperf.kernels._runtime import as_rows, n_persistent_programs, num_warps_for, row_tile


@triton.jit
def _rms_norm_fwd_kernel(X, W, Y, RSTD, n_rows, n_cols, stride_x, stride_y, eps,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
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
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps32)
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / n_cols + eps32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            col_mask = c < n_cols
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + rows64[:, None] * stride_y + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _rms_norm_bwd_kernel(X, W, DY, RSTD, DX, DW_PARTIAL, n_rows, n_cols, stride_x, stride_dy, stride_dx,
                         tiles_per_program,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        col_mask = cols < n_cols
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t in range(0, tiles_per_program):
            rows = (pid * tiles_per_program + t) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < n_rows
            rows64 = rows.to(tl.int64)
            mask = row_mask[:, None] & col_mask[None, :]
            x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            x_hat = x * rstd[:, None]
            wdy = dy * w[None, :]
            c = tl.sum(x_hat * wdy, axis=1) / n_cols
            dx = (wdy - x_hat * c[:, None]) * rstd[:, None]
            tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            dw_acc += tl.sum(dy * x_hat, axis=0)
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)
    else:
        # Rows wider than the register budget: two passes over column chunks per row tile;
        # the program's partial weight gradient lives in its own (zeroed) row of DW_PARTIAL.
        for t in range(0, tiles_per_program):
            rows = (pid * tiles_per_program + t) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_mask = rows < n_rows
            rows64 = rows.to(tl.int64)
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + rows64[:, None] * stride_dy + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                acc += x * dy * w[None, :]
            c_row = tl.sum(acc, axis=1) * rstd / n_cols
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                col_mask = c < n_cols
                mask = row_mask[:, None] & col_mask[None, :]
                x = tl.load(X + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + rows64[:, None] * stride_dy + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=col_mask, other=0.0).to(tl.float32)
                x_hat = x * rstd[:, None]
                dx = (dy * w[None, :] - x_hat * c_row[:, None]) * rstd[:, None]
                tl.store(DX + rows64[:, None] * stride_dx + c[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                p = DW_PARTIAL + pid.to(tl.int64) * n_cols + c
                tl.store(p, tl.load(p, mask=col_mask, other=0.0) + tl.sum(dy * x_hat, axis=0), mask=col_mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}")


@torch.library.custom_op("trainperf::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (y shaped like x, rstd fp32 per row): the RMSNorm forward on the Triton kernel."""
    _check(x, weight)
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=3)
    grid = (triton.cdiv(n_rows, block_m),)
    _rms_norm_fwd_kernel[grid](x2, weight.contiguous(), y, rstd, n_rows, n_cols, x2.stride(0), y.stride(0), eps,
                               BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass,
                               num_warps=num_warps_for(block_m * block_n))
    return y.view(x.shape), rstd.view(x.shape[:-1])


@rms_norm_fwd.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("trainperf::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dx shaped like x, dweight in weight's dtype): the RMSNorm backward on the Triton kernel."""
    x2, dy2 = as_rows(x), as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block_m, block_n, one_pass = row_tile(n_rows, n_cols, live=8)
    n_tiles = triton.cdiv(n_rows, block_m)
    n_programs = n_persistent_programs(x.device, n_tiles)
    tiles_per_program = triton.cdiv(n_tiles, n_programs)
    n_programs = triton.cdiv(n_tiles, tiles_per_program)
    alloc = torch.empty if one_pass else torch.zeros
    dw_partial = alloc((n_programs, n_cols), dtype=torch.float32, device=x.device)
    _rms_norm_bwd_kernel[(n_programs,)](x2, weight.contiguous(), dy2, rstd.reshape(-1), dx, dw_partial, n_rows, n_cols,
                                        x2.stride(0), dy2.stride(0), dx.stride(0), tiles_per_program,
                                        BLOCK_M=block_m, BLOCK_N=block_n, ONE_PASS=one_pass,
                                        num_warps=num_warps_for(block_m * block_n, live=4))
    return dx.view(x.shape), dw_partial.sum(0).to(weight.dtype)


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(dy, x, weight, rstd)
    return dx, dw, None


rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Return RMSNorm(x) * weight over the last dim (same shape and dtype as x); differentiable, compilable."""
    return rms_norm_fwd(x, weight, float(eps))[0]


class RMSNorm(torch.nn.Module):
    """RMSNorm module on the fused kernel: parameter `weight` (dim,), attribute `eps`."""

    def __init__(self, dim: int, eps: float = 1e-6, weight: torch.nn.Parameter | None = None):
        super().__init__()
        self.eps = eps
        self.weight = weight if weight is not None else torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the normalised x (same shape and dtype)."""
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
