"""Cross-entropy over a vocabulary, online softmax in chunks, never writing into the caller's logits.

Loss per row i with target t (PyTorch's definition, including label smoothing eps over V classes):
    loss_i = lse_i - (1 - eps) * x_it - eps * mean_j x_ij + z_loss * lse_i**2,   lse_i = logsumexp_j x_ij
and 0 for rows whose target is ignore_index. The forward kernel streams each row once in
vocab chunks (running max, rescaled sum, sum of logits, and the target logit loaded directly),
writing only loss_i and lse_i. The reduction (none / sum / mean over non-ignored rows) is plain
torch on the per-row vector, so autograd hands the backward kernel one scale per row and
`reduction='none'` needs no special case. The backward kernel reads the logits once more and
writes a fresh gradient tensor: p_ij * (1 + 2 z_loss lse_i) - eps / V - (1 - eps) [j == t].
Total traffic is two reads and one write of the logits, the same as Liger's in-place scheme,
without destroying the caller's logits (Liger #968/#678-style surprises).
Targets outside [0, V) that are not ignore_index give a NaN loss row (checked on the host for
CPU tensors, where PyTorch would raise); all-ignored batches give loss 0 and zero gradient
under 'mean' (PyTorch gives NaN there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainperf.errors import TrainperfError
from trainperf.kernels._rowwise import load_tile, online_softmax_step, row_block, store_tile
from trainperf.kernels._runtime import INTERPRETED, INTERPRETER_BLOCK_ELEMS, next_pow2


@triton.jit
def _ce_fwd_kernel(LOGITS, TARGET, LOSS, LSE, n_rows, n_cols, stride_l, ignore_index, label_smoothing, z_loss,
                   BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, SMOOTHING: tl.constexpr):
    rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_V)
    target = tl.load(TARGET + rows, mask=row_mask, other=0).to(tl.int64)
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    d = tl.zeros([BLOCK_M], dtype=tl.float32)
    sum_x = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        c = start + cols
        mask = row_mask[:, None] & (c < n_cols)[None, :]
        x = load_tile(LOGITS, rows64, stride_l, c, mask, -float("inf"))
        m, d = online_softmax_step(m, d, x)
        if SMOOTHING:
            sum_x += tl.sum(tl.where(mask, x, 0.0), axis=1)
    m = tl.where(m == -float("inf"), 0.0, m)
    lse = m + tl.log(d)
    valid = row_mask & (target != ignore_index)
    in_range = (target >= 0) & (target < n_cols)
    x_t = tl.load(LOGITS + rows64 * stride_l + target, mask=valid & in_range, other=0.0).to(tl.float32)
    eps = tl.cast(label_smoothing, tl.float32)
    loss = lse - (1.0 - eps) * x_t + tl.cast(z_loss, tl.float32) * lse * lse
    if SMOOTHING:
        loss -= eps * sum_x / n_cols
    loss = tl.where(in_range, loss, float("nan"))
    loss = tl.where(valid, loss, 0.0)
    tl.store(LOSS + rows, loss, mask=row_mask)
    tl.store(LSE + rows, lse, mask=row_mask)


@triton.jit
def _ce_bwd_kernel(LOGITS, TARGET, LSE, ROW_SCALE, DLOGITS, n_rows, n_cols, stride_l, stride_d, ignore_index,
                   label_smoothing, z_loss, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    # DLOGITS may alias LOGITS (fused linear cross-entropy owns its logits chunk): every element
    # is read and then written by the same program.
    rows, row_mask, rows64 = row_block(tl.program_id(0), n_rows, BLOCK_M)
    cols = tl.arange(0, BLOCK_V)
    target = tl.load(TARGET + rows, mask=row_mask, other=0).to(tl.int64)
    lse = tl.load(LSE + rows, mask=row_mask, other=0.0)
    scale = tl.load(ROW_SCALE + rows, mask=row_mask, other=0.0).to(tl.float32)
    scale = tl.where(target != ignore_index, scale, 0.0)
    eps = tl.cast(label_smoothing, tl.float32)
    p_scale = scale * (1.0 + 2.0 * tl.cast(z_loss, tl.float32) * lse)
    uniform = scale * eps / n_cols
    for start in range(0, n_cols, BLOCK_V):
        c = start + cols
        mask = row_mask[:, None] & (c < n_cols)[None, :]
        x = load_tile(LOGITS, rows64, stride_l, c, mask, 0.0)
        g = tl.exp(x - lse[:, None]) * p_scale[:, None] - uniform[:, None]
        g -= tl.where(c[None, :] == target[:, None], (1.0 - eps) * scale[:, None], 0.0)
        store_tile(DLOGITS, rows64, stride_d, c, g, mask)


def _tiles(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """Return (block_rows, block_vocab, num_warps)."""
    if INTERPRETED:
        block_v = min(next_pow2(n_cols), INTERPRETER_BLOCK_ELEMS)
        return max(1, min(next_pow2(n_rows), INTERPRETER_BLOCK_ELEMS // block_v)), block_v, 4
    block_v = min(next_pow2(n_cols), 8192)
    block_m = max(1, min(next_pow2(n_rows), 2048 // block_v))
    return block_m, block_v, 8 if block_m * block_v >= 8192 else 4


def check_options(op: str, reduction: str, label_smoothing: float) -> None:
    """Raise TrainperfError (naming `op`) unless reduction is none/mean/sum and label_smoothing is in [0, 1]."""
    if reduction not in ("none", "mean", "sum"):
        raise TrainperfError(f"{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise TrainperfError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")


def check_targets(op: str, target: torch.Tensor, n_rows: int, vocab: int, ignore_index: int) -> None:
    """Raise TrainperfError (naming `op`) unless target is (n_rows,) and, on CPU, each is ignore_index or in [0, vocab).

    On CUDA a bad target gives a NaN loss row instead (checking would cost a device sync).
    """
    if target.shape != (n_rows,):
        raise TrainperfError(f"{op}: target shape {tuple(target.shape)} != ({n_rows},)")
    if target.device.type == "cpu" and target.numel():
        bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
        if bool(bad.any()):
            raise TrainperfError(f"{op}: target {int(target[bad][0])} is outside [0, {vocab})")


def _check(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> None:
    if logits.dim() != 2:
        raise TrainperfError(f"cross_entropy: logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    if target.dtype.is_floating_point:
        raise TrainperfError("cross_entropy: target must hold class indices (an integer tensor)")
    check_targets("cross_entropy", target, logits.shape[0], logits.shape[1], ignore_index)


def ce_forward_rows(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                    z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (loss per row fp32, lse per row fp32) of logits (rows, vocab) with unit column stride."""
    n_rows, n_cols = logits.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    if n_rows == 0:
        return loss, lse
    bm, bv, warps = _tiles(n_rows, n_cols)
    _ce_fwd_kernel[(triton.cdiv(n_rows, bm),)](logits, target, loss, lse, n_rows, n_cols, logits.stride(0),
                                               ignore_index, label_smoothing, z_loss, BLOCK_M=bm, BLOCK_V=bv,
                                               SMOOTHING=label_smoothing > 0.0, num_warps=warps)
    return loss, lse


def ce_backward_into(dlogits: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                     row_scale: torch.Tensor, ignore_index: int, label_smoothing: float, z_loss: float) -> None:
    """Write d(sum_i row_scale_i * loss_i)/dlogits into dlogits (which may be logits itself)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    bm, bv, warps = _tiles(n_rows, n_cols)
    _ce_bwd_kernel[(triton.cdiv(n_rows, bm),)](logits, target, lse, row_scale, dlogits, n_rows, n_cols,
                                               logits.stride(0), dlogits.stride(0), ignore_index, label_smoothing,
                                               z_loss, BLOCK_M=bm, BLOCK_V=bv, num_warps=warps)


@torch.library.custom_op("trainperf::cross_entropy_fwd", mutates_args=())
def cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                      z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (loss per row fp32, lse per row fp32); ignored rows have loss 0."""
    _check(logits, target, ignore_index)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    return ce_forward_rows(logits, target.contiguous(), ignore_index, label_smoothing, z_loss)


@cross_entropy_fwd.register_fake
def _(logits, target, ignore_index, label_smoothing, z_loss):
    rows = logits.new_empty(logits.shape[:1], dtype=torch.float32)
    return rows, torch.empty_like(rows)


@torch.library.custom_op("trainperf::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(d_rows: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                      ignore_index: int, label_smoothing: float, z_loss: float) -> torch.Tensor:
    """Return dlogits (new tensor, logits' dtype) for upstream gradient d_rows of the per-row losses."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dlogits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    ce_backward_into(dlogits, logits, target.contiguous(), lse, d_rows.contiguous(), ignore_index,
                     label_smoothing, z_loss)
    return dlogits


@cross_entropy_bwd.register_fake
def _(d_rows, logits, target, lse, ignore_index, label_smoothing, z_loss):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, label_smoothing, z_loss = inputs
    _loss, lse = output
    ctx.opts = (ignore_index, label_smoothing, z_loss)
    ctx.save_for_backward(logits, target, lse)


def _backward(ctx, d_rows, _dlse):
    logits, target, lse = ctx.saved_tensors
    return cross_entropy_bwd(d_rows, logits, target, lse, *ctx.opts), None, None, None, None


cross_entropy_fwd.register_autograd(_backward, setup_context=_setup_context)


def reduce_rows(loss_rows: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """Return the per-row losses reduced: 'none' (as is), 'sum', or 'mean' over non-ignored rows (0 if none)."""
    if reduction == "none":
        return loss_rows
    if reduction == "sum":
        return loss_rows.sum()
    if reduction == "mean":
        n_valid = (target != ignore_index).sum().clamp(min=1)
        return loss_rows.sum() / n_valid
    raise TrainperfError(f"cross_entropy: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """Return the cross-entropy of logits (rows, vocab) against class indices target (rows,), in logits' dtype.

    reduction: 'mean' over non-ignored rows, 'sum', or 'none' (a loss per row, 0 where ignored).
    label_smoothing as in torch.nn.functional.cross_entropy; z_loss adds z_loss * logsumexp**2 per row
    (PaLM). The caller's logits are never modified. Differentiable and torch.compile-traceable.
    """
    check_options("cross_entropy", reduction, label_smoothing)
    loss_rows, _lse = cross_entropy_fwd(logits, target, int(ignore_index), float(label_smoothing), float(z_loss))
    return reduce_rows(loss_rows, target, ignore_index, reduction).to(logits.dtype)


class LossOptions(torch.nn.Module):
    """Base of the cross-entropy loss modules: holds ignore_index, reduction, label_smoothing, z_loss."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss = label_smoothing, z_loss


class CrossEntropyLoss(LossOptions):
    """nn.Module form of cross_entropy (same arguments)."""

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Return the loss (see cross_entropy)."""
        return cross_entropy(logits, target, self.ignore_index, self.reduction, self.label_smoothing, self.z_loss)
