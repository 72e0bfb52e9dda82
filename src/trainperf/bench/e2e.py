"""End-to-end A/B: the reference trainer's model trained with and without the fused kernels.

Same init, same data, same optimizer; one run in eager PyTorch, one after
trainperf.kernels.apply(model), and one eager run whose RMSNorm is written differently
(x / sqrt(ms + eps) instead of x * rsqrt(ms + eps)). Training is chaotic, so two fp32 runs that
differ only in rounding order drift apart; that third run measures the drift, the yardstick
for calling the kernel run's loss curve equal. Also reports the median step time of each run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import types
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class E2EResult:
    """Per-step losses of the three runs and their median step times (s)."""

    eager: np.ndarray
    eager_rounding_variant: np.ndarray
    kernels: np.ndarray
    step_s: dict[str, float]
    applied: dict[str, int]

    def early_max_abs_diff(self, steps: int) -> float:
        """Return max |loss_kernels - loss_eager| over the first steps."""
        return float(np.abs(self.kernels[:steps] - self.eager[:steps]).max())

    def verdict(self, variant: str = "kernels") -> str:
        """Return ``trainperf compare``'s numerics verdict of ``variant`` against eager: "equivalent"
        or "diverges at step N" (loss against the batch-noise band of the eager run)."""
        from trainperf.compare.numerics import compare_numerics
        from trainperf.compare.runs import RunData

        other = self.kernels if variant == "kernels" else self.eager_rounding_variant

        def run(losses: np.ndarray, name: str) -> RunData:
            n = len(losses)
            ones = np.ones(n)
            return RunData(name=name, step=np.arange(1, n + 1, dtype=float), step_time_s=ones, loss=losses,
                           grad_norm=np.full(n, np.nan), tokens_per_s=ones, mfu=ones, mem_peak_bytes=ones,
                           t_end=np.cumsum(ones), t_start=0.0, comparable={"same": True})

        return compare_numerics([run(self.eager, "eager")], [run(other, variant)]).verdict

    def late_mean_diff(self, steps: int, variant: str = "kernels") -> float:
        """Return |mean of the last steps losses (variant) - the same for eager|."""
        other = self.kernels if variant == "kernels" else self.eager_rounding_variant
        return float(abs(other[-steps:].mean() - self.eager[-steps:].mean()))


def _rms_norm_div(self, x):
    xf = x.float()
    return (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def train_losses(variant: str, steps: int, n_layers: int, batch: int, seq: int, lr: float, device: str,
                 tokens: np.ndarray, seed: int = 0) -> tuple[np.ndarray, float, dict[str, int]]:
    """Return (per-step losses, median step time in s, kernel replacements) of one run of the tiny model.

    variant: 'eager', 'eager-div' (rounding-order variant of RMSNorm) or 'kernels'.
    """
    from trainperf.kernels import apply
    from trainperf.specs import load_model
    from trainperf.train.model import build_model

    spec = dataclasses.replace(load_model("tiny"), n_layers=n_layers, seq_len=seq)
    model = build_model(spec, device, seed=seed)
    applied: dict[str, int] = {}
    if variant == "kernels":
        applied = apply(model).counts
    elif variant == "eager-div":
        for m in model.modules():
            if type(m).__name__ == "RMSNorm":
                m.forward = types.MethodType(_rms_norm_div, m)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses, times = [], []
    for _ in range(steps):
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        data = torch.from_numpy(np.stack([tokens[s:s + seq + 1] for s in starts]).astype(np.int64)).to(device)
        t0 = time.perf_counter()
        loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))  # syncs the device
        times.append(time.perf_counter() - t0)
    return np.array(losses), statistics.median(times), applied


def compare_training(steps: int = 300, n_layers: int = 2, batch: int = 8, seq: int = 64, lr: float = 2e-3,
                     device: str = "cpu") -> E2EResult:
    """Return the three runs (eager, eager rounding variant, kernels) on the shipped text sample."""
    from trainperf.train.data import read_byte_tokens, shipped_text_path

    tokens = read_byte_tokens([shipped_text_path()])
    runs = {v: train_losses(v, steps, n_layers, batch, seq, lr, device, tokens)
            for v in ("eager", "eager-div", "kernels")}
    return E2EResult(runs["eager"][0], runs["eager-div"][0], runs["kernels"][0],
                     {v: r[1] for v, r in runs.items()}, runs["kernels"][2])
