"""Bytes and FLOPs each kernel must move/compute, counted from shapes: the roofline's numerators.

Counts are the minimum traffic of an ideal fused kernel (every input read once, every output
written once; small per-row statistics and weight vectors included), so achieved GB/s =
bytes / time is comparable across implementations: an implementation that moves more bytes
simply shows a lower GB/s. 'fwd+bwd' counts forward plus backward traffic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Work:
    """Bytes moved and FLOPs done by one call (fwd) or one forward+backward (fwd+bwd)."""

    bytes: float
    flops: float


def row_kernel_work(kernel: str, rows: int, cols: int, elem_bytes: int, passname: str) -> Work:
    """Return the work of a row-wise kernel over a (rows, cols) input of elem_bytes-wide elements.

    rms_norm / layer_norm / softmax: fwd reads x and writes y; bwd reads x (or y) and dy, writes dx.
    The norms also read the weight (and bias, fwd only: its gradient is the sum of dy) and write (fwd) /
    read (bwd) fp32 per-row statistics; their bwd writes dweight (and dbias) in the weight's dtype, as
    the eager reference returns them.
    swiglu / geglu: fwd reads gate, up, writes out; bwd reads dy, gate, up and writes dgate, dup.
    FLOPs: a handful per element (reported, but these kernels are memory-bound).
    """
    n = rows * cols * elem_bytes
    stats = rows * 4  # one fp32 per row (rstd, mean) where the kernel saves it
    weight = cols * elem_bytes
    if kernel in ("rms_norm", "layer_norm"):
        n_params = 1 if kernel == "rms_norm" else 2
        fwd = Work(2 * n + n_params * weight + stats * n_params, 4.0 * rows * cols)
        bwd = Work(3 * n + weight + stats * n_params + n_params * weight, 8.0 * rows * cols)
    elif kernel == "softmax":
        fwd = Work(2 * n, 4.0 * rows * cols)
        bwd = Work(3 * n, 3.0 * rows * cols)
    elif kernel in ("swiglu", "geglu"):
        fwd = Work(3 * n, 6.0 * rows * cols)
        bwd = Work(5 * n, 12.0 * rows * cols)
    else:
        raise ValueError(f"not a row kernel: {kernel}")
    return fwd if passname == "fwd" else Work(fwd.bytes + bwd.bytes, fwd.flops + bwd.flops)


def rope_work(batch: int, seq: int, q_heads: int, k_heads: int, head_dim: int, elem_bytes: int,
              passname: str) -> Work:
    """Return RoPE's work: read and write q and k (and read the fp32 cos/sin tables) per pass."""
    qk = batch * seq * (q_heads + k_heads) * head_dim
    one = Work(2 * qk * elem_bytes + 2 * seq * head_dim * 4, 3.0 * qk)
    return one if passname == "fwd" else Work(2 * one.bytes, 2 * one.flops)


def cross_entropy_work(rows: int, vocab: int, elem_bytes: int, passname: str) -> Work:
    """Return cross-entropy's work: fwd reads the logits once; bwd reads them again and writes their gradient."""
    n = rows * vocab * elem_bytes
    fwd = Work(n + rows * 8, 4.0 * rows * vocab)
    return fwd if passname == "fwd" else Work(3 * n + rows * 8, 8.0 * rows * vocab)


def linear_cross_entropy_work(rows: int, hidden: int, vocab: int, elem_bytes: int, passname: str) -> Work:
    """Return the linear + cross-entropy work: 2*rows*hidden*vocab FLOPs per GEMM (1 fwd, 3 fwd+bwd).

    Bytes: hidden states, weight and (for fwd+bwd) their gradients, once each, and the int64 targets
    once (as cross_entropy_work counts them); the logits are not counted because a fused kernel need
    not move them.
    """
    gemm = 2.0 * rows * hidden * vocab
    io = (rows * hidden + vocab * hidden) * elem_bytes
    targets = rows * 8
    return Work(io + targets, gemm) if passname == "fwd" else Work(2 * io + targets, 3 * gemm)


def gbps(work: Work, ms: float) -> float:
    """Return achieved bandwidth in GB/s (1e9 bytes per second) for work done in ms milliseconds."""
    return work.bytes / (ms * 1e-3) / 1e9


def tflops(work: Work, ms: float) -> float:
    """Return achieved TFLOP/s for work done in ms milliseconds."""
    return work.flops / (ms * 1e-3) / 1e12
