"""Fused linear cross-entropy: loss of (hidden @ weight.T) against targets, never materialising all logits.

The rows are processed in chunks; for each chunk the logits (chunk, vocab) are computed by one
GEMM, the cross-entropy forward kernel gives loss and logsumexp per row, the backward kernel
overwrites that chunk (our own buffer) with dloss/dlogits, and two GEMMs turn it into the
chunk's hidden gradient and an accumulation into the weight gradient. Peak extra memory is
one (chunk, vocab) buffer instead of several (rows, vocab) tensors (bf16 logits, fp32 upcast,
log-softmax, gradient) in the eager path.

For reduction 'mean'/'sum' the gradients are computed in the forward (as Liger does) and
scaled by the upstream gradient in the backward: 3 GEMMs in all, like eager. For 'none',
the upstream gradient differs per row, so the forward only computes losses and the backward
recomputes each chunk's logits (4 GEMMs). The weight gradient accumulates in the weight's
dtype (fp32 accumulation inside each GEMM), as Liger's does.
"""

from __future__ import annotations

import torch
import triton

from trainperf.errors import TrainperfError
from trainperf.kernels.cross_entropy import (LossOptions, ce_backward_into, ce_forward_rows, check_options,
                                             check_targets, reduce_rows)


def chunk_rows(n_rows: int, hidden: int, vocab: int) -> int:
    """Return rows per chunk: about 4x as many logits per chunk as hidden-state elements, at least 1024 rows.

    Bigger chunks mean fewer read-modify-write passes over the (vocab, hidden) weight gradient
    (one per chunk) and larger GEMMs; at 8192 x 4096 x 128256 this gives 1024-row chunks (263 MB
    of bf16 logits, against ~16 GB of (rows, vocab) tensors in the eager path).
    """
    rows = triton.next_power_of_2(max(1, triton.cdiv(n_rows, triton.cdiv(vocab, 4 * hidden))))
    return max(1, min(n_rows, max(rows, 1024)))


def _flce_pass(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, opts: tuple[int, float, float],
               row_scale: torch.Tensor | None, lse: torch.Tensor | None):
    """Run the chunked loop. Returns (loss rows or None, lse, grad_hidden or None, grad_weight or None).

    lse given: skip the loss (recompute for the backward). row_scale given: compute gradients.
    """
    n_rows = hidden.shape[0]
    vocab = weight.shape[0]
    chunk = chunk_rows(n_rows, hidden.shape[1], vocab)
    want_loss = lse is None
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=hidden.device) if want_loss else None
    lse = torch.empty(n_rows, dtype=torch.float32, device=hidden.device) if want_loss else lse
    grad_hidden = grad_weight = None
    if row_scale is not None:
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight)
    for start in range(0, n_rows, chunk):
        end = min(n_rows, start + chunk)
        h_c, t_c = hidden[start:end], target[start:end]
        logits_c = h_c @ weight.t()
        if want_loss:
            loss_c, lse_c = ce_forward_rows(logits_c, t_c, *opts)
            loss_rows[start:end] = loss_c
            lse[start:end] = lse_c
        if row_scale is not None:
            ce_backward_into(logits_c, logits_c, t_c, lse[start:end].contiguous(), row_scale[start:end].contiguous(),
                             *opts)
            torch.matmul(logits_c, weight, out=grad_hidden[start:end])
            grad_weight.addmm_(logits_c.t(), h_c)
    return loss_rows, lse, grad_hidden, grad_weight


def _check(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise TrainperfError(f"fused_linear_cross_entropy: hidden {tuple(hidden.shape)} and weight "
                             f"{tuple(weight.shape)} must be (rows, hidden) and (vocab, hidden)")
    if hidden.dtype != weight.dtype:
        raise TrainperfError(f"fused_linear_cross_entropy: hidden dtype {hidden.dtype} != weight dtype {weight.dtype}")
    check_targets("fused_linear_cross_entropy", target, hidden.shape[0], weight.shape[0], ignore_index)


@torch.library.custom_op("trainperf::flce_fwd_with_grads", mutates_args=())
def flce_fwd_with_grads(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                        label_smoothing: float, z_loss: float,
                        mean: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (reduced loss fp32 scalar, dloss/dhidden, dloss/dweight) for reduction mean (or sum)."""
    _check(hidden, weight, target, ignore_index)
    hidden, target = hidden.contiguous(), target.contiguous()
    valid = (target != ignore_index).to(torch.float32)
    row_scale = valid / valid.sum().clamp(min=1.0) if mean else valid
    loss_rows, _lse, gh, gw = _flce_pass(hidden, weight, target, (ignore_index, label_smoothing, z_loss),
                                         row_scale, None)
    return (loss_rows * row_scale).sum(), gh, gw


@flce_fwd_with_grads.register_fake
def _(hidden, weight, target, ignore_index, label_smoothing, z_loss, mean):
    return hidden.new_empty((), dtype=torch.float32), hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


def _setup_with_grads(ctx, inputs, output):
    _loss, gh, gw = output
    ctx.save_for_backward(gh, gw)


def _backward_with_grads(ctx, d_loss, _dgh, _dgw):
    gh, gw = ctx.saved_tensors
    return (gh * d_loss).to(gh.dtype), (gw * d_loss).to(gw.dtype), None, None, None, None, None


flce_fwd_with_grads.register_autograd(_backward_with_grads, setup_context=_setup_with_grads)


@torch.library.custom_op("trainperf::flce_fwd_rows", mutates_args=())
def flce_fwd_rows(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                  label_smoothing: float, z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (loss per row fp32, lse per row fp32), no gradients (reduction 'none')."""
    _check(hidden, weight, target, ignore_index)
    loss_rows, lse, _, _ = _flce_pass(hidden.contiguous(), weight, target.contiguous(),
                                      (ignore_index, label_smoothing, z_loss), None, None)
    return loss_rows, lse


@flce_fwd_rows.register_fake
def _(hidden, weight, target, ignore_index, label_smoothing, z_loss):
    rows = hidden.new_empty(hidden.shape[:1], dtype=torch.float32)
    return rows, torch.empty_like(rows)


@torch.library.custom_op("trainperf::flce_bwd_rows", mutates_args=())
def flce_bwd_rows(d_rows: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                  lse: torch.Tensor, ignore_index: int, label_smoothing: float,
                  z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (dhidden, dweight) for per-row upstream gradients d_rows, recomputing logits chunk by chunk."""
    _, _, gh, gw = _flce_pass(hidden.contiguous(), weight, target.contiguous(),
                              (ignore_index, label_smoothing, z_loss), d_rows.to(torch.float32).contiguous(), lse)
    return gh, gw


@flce_bwd_rows.register_fake
def _(d_rows, hidden, weight, target, lse, ignore_index, label_smoothing, z_loss):
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


def _setup_rows(ctx, inputs, output):
    hidden, weight, target, ignore_index, label_smoothing, z_loss = inputs
    ctx.opts = (ignore_index, label_smoothing, z_loss)
    ctx.save_for_backward(hidden, weight, target, output[1])


def _backward_rows(ctx, d_rows, _dlse):
    hidden, weight, target, lse = ctx.saved_tensors
    gh, gw = flce_bwd_rows(d_rows, hidden, weight, target, lse, *ctx.opts)
    return gh, gw, None, None, None, None


flce_fwd_rows.register_autograd(_backward_rows, setup_context=_setup_rows)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                               z_loss: float = 0.0) -> torch.Tensor:
    """Return cross_entropy(hidden @ weight.T, target) without materialising the (rows, vocab) logits.

    hidden: (rows, hidden) or (..., hidden); weight: (vocab, hidden), same dtype; target: class indices.
    Loss in hidden's dtype; options as in trainperf.kernels.cross_entropy.
    """
    check_options("fused_linear_cross_entropy", reduction, label_smoothing)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    target = target.reshape(-1)
    opts = (int(ignore_index), float(label_smoothing), float(z_loss))
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if reduction == "none" or not needs_grad:  # no gradients wanted now: losses only, no gradient buffers
        loss_rows, _ = flce_fwd_rows(hidden, weight, target, *opts)
        return reduce_rows(loss_rows, target, ignore_index, reduction).to(hidden.dtype)
    loss, _, _ = flce_fwd_with_grads(hidden, weight, target, *opts, reduction == "mean")
    return loss.to(hidden.dtype)


class FusedLinearCrossEntropyLoss(LossOptions):
    """Module form: forward(hidden, weight, target) -> loss (see fused_linear_cross_entropy)."""

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the loss."""
        return fused_linear_cross_entropy(hidden, weight, target, self.ignore_index, self.reduction,
                                          self.label_smoothing, self.z_loss)
