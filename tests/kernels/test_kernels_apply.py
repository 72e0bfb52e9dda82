"""apply(model): swaps the fused kernels into the reference trainer's model and into HF Llama-style modules.

The end-to-end reference is the same model trained without the kernels (PyTorch eager).
"""

import dataclasses
import types

import numpy as np
import torch
from torch import nn

import trainperf.kernels as K
from trainperf.specs import load_model
from trainperf.train.data import read_byte_tokens, shipped_text_path
from trainperf.train.model import build_model

STEPS = 200
BATCH, SEQ = 4, 16
# Stated tolerance. Two fp32 runs that differ only in rounding order drift apart (training is
# chaotic), so the reference for "equal" is that drift itself: the eager model trained with an
# RMSNorm written differently (x / sqrt(ms + eps) instead of x * rsqrt(ms + eps)). Kernels pass if
# (a) the first 20 steps agree to 1e-4 absolute (before any drift is amplified), and (b) the mean
# loss over the last 50 steps differs from eager by at most max(3x the rounding drift, 0.02)
# while the loss falls by more than 1.0 (so agreement is not trivial).
EARLY_STEPS, EARLY_ATOL, LATE_STEPS, LATE_FLOOR = 20, 1e-4, 50, 0.02


def _spec():
    return dataclasses.replace(load_model("tiny"), n_layers=2, seq_len=SEQ)


def _rms_norm_div(self, x):
    xf = x.float()
    return (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def _train(variant: str, tokens: np.ndarray) -> np.ndarray:
    spec = _spec()
    model = build_model(spec, "cpu", seed=0)
    if variant == "kernels":
        applied = K.apply(model)
        assert applied.counts == {"rms_norm": 2 * spec.n_layers + 1, "swiglu": spec.n_layers,
                                  "rope": spec.n_layers, "cross_entropy": 1}
    elif variant == "eager-div":
        for m in model.modules():
            if type(m).__name__ == "RMSNorm":
                m.forward = types.MethodType(_rms_norm_div, m)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        starts = rng.integers(0, len(tokens) - spec.seq_len - 1, size=BATCH)
        batch = torch.from_numpy(np.stack([tokens[s:s + spec.seq_len + 1] for s in starts]).astype(np.int64))
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return np.array(losses)


def test_trainer_model_losses_equal_with_and_without_kernels():
    tokens = read_byte_tokens([shipped_text_path()])
    eager, eager_div, fused = (_train(v, tokens) for v in ("eager", "eager-div", "kernels"))
    assert eager[:10].mean() - eager[-LATE_STEPS:].mean() > 1.0, "the model must learn for the check to mean anything"
    early = np.abs(fused[:EARLY_STEPS] - eager[:EARLY_STEPS]).max()
    assert early < EARLY_ATOL, early
    drift = abs(eager_div[-LATE_STEPS:].mean() - eager[-LATE_STEPS:].mean())
    late = abs(fused[-LATE_STEPS:].mean() - eager[-LATE_STEPS:].mean())
    assert late <= max(3 * drift, LATE_FLOOR), (late, drift)


def test_apply_shares_parameters_and_matches_outputs():
    spec = _spec()
    model = build_model(spec, "cpu", seed=1)
    tokens = torch.randint(0, spec.vocab, (2, spec.seq_len + 1), generator=torch.Generator().manual_seed(0))
    ref = model(tokens[:, :-1], tokens[:, 1:])
    params_before = {n: p.data_ptr() for n, p in model.named_parameters()}
    K.apply(model)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == params_before
    assert isinstance(model.norm, K.RMSNorm)
    torch.testing.assert_close(model(tokens[:, :-1], tokens[:, 1:]), ref, atol=1e-5, rtol=1e-5)


class LlamaRMSNorm(nn.Module):  # the Hugging Face shape: weight + variance_epsilon
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


class LlamaMLP(nn.Module):  # the Hugging Face shape: gate/up/down projections and act_fn
    def __init__(self, dim, ffn):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_apply_to_hugging_face_llama_style_modules():
    torch.manual_seed(0)
    model = nn.Sequential(LlamaRMSNorm(16), LlamaMLP(16, 40), LlamaRMSNorm(16))
    x = torch.randn(3, 5, 16)
    ref = model(x)
    applied = K.apply(model)
    assert applied.counts == {"rms_norm": 2, "swiglu": 1}
    assert isinstance(model[0], K.RMSNorm) and model[0].eps == 1e-6
    torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
