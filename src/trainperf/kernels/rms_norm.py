"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, fused forward and backward.

Forward reads x once and writes y once (plus one fp32 rstd per row for the backward).
Backward reads x, dy once and writes dx once; the weight gradient is reduced without atomics:
each program owns a contiguous run of rows and keeps its partial sum of dy * x_hat in
registers, writing one fp32 row per program, which a final torch sum folds (the QuACK/Apex
scheme; Liger does the same but with one program per SM-sized block of rows).
Rows stay in registers (one pass) up to 16K columns forward, 8K backward; wider rows loop over
chunks (a second read of the row, mostly from L2). The kernels are LayerNorm's
(trainperf.kernels.layer_norm) with IS_RMS set: no mean subtraction, no bias.
"""

from __future__ import annotations

import torch

from trainperf.kernels.layer_norm import norm_backward, norm_forward


@torch.library.custom_op("trainperf::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (y shaped like x, rstd fp32 per row): the RMSNorm forward on the Triton kernel."""
    y, _mean, rstd = norm_forward(x, weight, None, eps, is_rms=True)
    return y, rstd


@rms_norm_fwd.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("trainperf::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dx shaped like x, dweight in weight's dtype): the RMSNorm backward on the Triton kernel."""
    dx, dw, _db = norm_backward(dy, x, weight, None, rstd)
    return dx, dw


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
