"""@triton.jit helpers shared by the row-wise kernels (norms, softmax, cross-entropy).

A row-wise kernel works on a tile of BLOCK_M rows of a (n_rows, n_cols) matrix with unit
column stride and row stride `stride`, BLOCK_N columns at a time. Triton inlines these calls,
so a helper costs nothing at run time.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_block(tile, n_rows, BLOCK_M: tl.constexpr):
    """Return (rows, row_mask, rows as int64) of row tile number `tile`."""
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows, rows < n_rows, rows.to(tl.int64)


@triton.jit
def load_tile(PTR, rows64, stride, cols, mask, other):
    """Return the (rows, cols) tile of PTR as fp32, `other` where mask is False."""
    return tl.load(PTR + rows64[:, None] * stride + cols[None, :], mask=mask, other=other).to(tl.float32)


@triton.jit
def store_tile(PTR, rows64, stride, cols, value, mask):
    """Store value into the (rows, cols) tile of PTR, cast to PTR's element type."""
    tl.store(PTR + rows64[:, None] * stride + cols[None, :], value.to(PTR.dtype.element_ty), mask=mask)


@triton.jit
def online_softmax_step(m, d, x):
    """Fold a chunk x (rows, cols) into the running row max m and sum d of exp(x - m); return (m, d).

    Rows that are all -inf so far keep m = -inf and d = 0 (no NaN from -inf - -inf).
    """
    m_new = tl.maximum(m, tl.max(x, axis=1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
    return m_new, d
