"""PyTorch eager references of every kernel: the ground truth in tests and the 'eager' column in bench.

Each computes in fp32 (or the input's dtype when that is wider) and returns the input's dtype,
as the usual model code does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Return x * rsqrt(mean(x^2) + eps) * weight over the last dim."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(xf.dtype)
    return y.to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Return torch.nn.functional.layer_norm over the last dim, computed in fp32."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    b = bias.to(xf.dtype) if bias is not None else None
    return F.layer_norm(xf, (x.shape[-1],), weight.to(xf.dtype), b, eps).to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return silu(gate) * up."""
    return F.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return gelu(gate, approximate='tanh') * up."""
    return F.gelu(gate, approximate="tanh") * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Return cat(-x2, x1) of the halves of the last dim (Hugging Face convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (q, k) rotated; q, k (batch, seq, heads, head_dim), cos/sin (seq, head_dim)."""
    c = cos[None, :, None, :].to(q.dtype)
    s = sin[None, :, None, :].to(q.dtype)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Return softmax over the last dim (fp32 inside)."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """Return F.cross_entropy on fp32 logits plus z_loss * logsumexp^2 per non-ignored row; all-ignored mean = 0."""
    lf = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    rows = F.cross_entropy(lf, target, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing)
    valid = target != ignore_index
    if z_loss:
        rows = rows + z_loss * torch.logsumexp(lf, dim=-1).pow(2) * valid
    if reduction == "none":
        return rows.to(logits.dtype)
    if reduction == "sum":
        return rows.sum().to(logits.dtype)
    return (rows.sum() / valid.sum().clamp(min=1)).to(logits.dtype)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """Return cross_entropy(hidden @ weight.T, target): the unfused (materialised logits) path."""
    return cross_entropy(hidden @ weight.t(), target, ignore_index, reduction, label_smoothing, z_loss)
