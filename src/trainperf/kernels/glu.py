"""Gated linear units: swiglu(gate, up) = silu(gate) * up and geglu(gate, up) = gelu_tanh(gate) * up.

One elementwise kernel per pass: the forward reads gate and up once and writes the product;
the backward reads dy, gate, up once and writes dgate, dup, recomputing the activation
instead of saving it (saves one activation-sized tensor per layer). gate and up may be
strided row views (e.g. the two halves of a fused gate/up projection): no copy is made.
GeGLU uses the tanh approximation (as Gemma's gelu_pytorch_tanh and Liger do); tanh is
written from exp because libdevice.tanh is unavailable in the Triton interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainperf.kernels._rowwise import load_tile, row_block, store_tile
from trainperf.kernels._runtime import INTERPRETED, INTERPRETER_BLOCK_ELEMS, as_rows, next_pow2

SILU, GELU_TANH = 0, 1


@triton.jit
def _tanh(z):
    # tanh(z) = 1 - 2 / (exp(2z) + 1): exact at both tails (exp overflow gives 1, underflow -1).
    return 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Return (rows as int64, cols, mask) of this program's (BLOCK_M, BLOCK_N) tile on the 2-D grid."""
    _rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows64, cols, row_mask[:, None] & (cols < n_cols)[None, :]


@triton.jit
def _glu_fwd_kernel(G, U, Y, n_rows, n_cols, stride_g, stride_u, stride_y,
                    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows64, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    g = load_tile(G, rows64, stride_g, cols, mask, 0.0)
    u = load_tile(U, rows64, stride_u, cols, mask, 0.0)
    if ACT == 0:
        act = g / (1.0 + tl.exp(-g))
    else:
        act = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    store_tile(Y, rows64, stride_y, cols, act * u, mask)


@triton.jit
def _glu_bwd_kernel(DY, G, U, DG, DU, n_rows, n_cols, stride_dy, stride_g, stride_u, stride_dg, stride_du,
                    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows64, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dy = load_tile(DY, rows64, stride_dy, cols, mask, 0.0)
    g = load_tile(G, rows64, stride_g, cols, mask, 0.0)
    u = load_tile(U, rows64, stride_u, cols, mask, 0.0)
    if ACT == 0:
        s = 1.0 / (1.0 + tl.exp(-g))
        act = g * s
        dact = s * (1.0 + g * (1.0 - s))
    else:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = _tanh(inner)
        act = 0.5 * g * (1.0 + t)
        dact = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    store_tile(DG, rows64, stride_dg, cols, dy * u * dact, mask)
    store_tile(DU, rows64, stride_du, cols, dy * act, mask)


def _tiles(n_rows: int, n_cols: int) -> tuple[int, int]:
    if INTERPRETED:
        block_n = min(next_pow2(n_cols), INTERPRETER_BLOCK_ELEMS)
        return max(1, min(next_pow2(n_rows), INTERPRETER_BLOCK_ELEMS // block_n)), block_n
    block_n = min(next_pow2(n_cols), 1024)
    return max(1, min(next_pow2(n_rows), 4096 // block_n)), block_n


def _glu_forward(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    if gate.shape != up.shape:
        raise ValueError(f"glu: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    g2, u2 = as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    y = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    bm, bn = _tiles(n_rows, n_cols)
    _glu_fwd_kernel[(triton.cdiv(n_rows, bm), triton.cdiv(n_cols, bn))](
        g2, u2, y, n_rows, n_cols, g2.stride(0), u2.stride(0), y.stride(0), ACT=act, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=4)
    return y.view(gate.shape)


def _glu_backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int):
    d2, g2, u2 = as_rows(dy), as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    dg = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    du = torch.empty((n_rows, n_cols), dtype=up.dtype, device=up.device)
    bm, bn = _tiles(n_rows, n_cols)
    _glu_bwd_kernel[(triton.cdiv(n_rows, bm), triton.cdiv(n_cols, bn))](
        d2, g2, u2, dg, du, n_rows, n_cols, d2.stride(0), g2.stride(0), u2.stride(0), dg.stride(0), du.stride(0),
        ACT=act, BLOCK_M=bm, BLOCK_N=bn, num_warps=4)
    return dg.view(gate.shape), du.view(up.shape)


@torch.library.custom_op("trainperf::glu_fwd", mutates_args=())
def glu_fwd(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    """Return act(gate) * up (act 0 = silu, 1 = gelu_tanh), shaped and typed like gate."""
    return _glu_forward(gate, up, act)


@glu_fwd.register_fake
def _(gate, up, act):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("trainperf::glu_bwd", mutates_args=())
def glu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dgate, dup) of act(gate) * up for upstream gradient dy."""
    return _glu_backward(dy, gate, up, act)


@glu_bwd.register_fake
def _(dy, gate, up, act):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs, output):
    gate, up, act = inputs
    ctx.act = act
    ctx.save_for_backward(gate, up)


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dg, du = glu_bwd(dy, gate, up, ctx.act)
    return dg, du, None


glu_fwd.register_autograd(_backward, setup_context=_setup_context)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return silu(gate) * up (shape and dtype of gate); differentiable, compilable."""
    return glu_fwd(gate, up, SILU)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return gelu_tanh(gate) * up (shape and dtype of gate); differentiable, compilable."""
    return glu_fwd(gate, up, GELU_TANH)
