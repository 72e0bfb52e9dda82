"""apply(model): swaps the fused kernels into the reference trainer's model and into HF Llama-style modules.

The end-to-end reference is the same model trained without the kernels (PyTorch eager).
"""

import dataclasses

import torch
from torch import nn

import trainperf.kernels as K
from trainperf.bench.e2e import compare_training
from trainperf.specs import load_model
from trainperf.train.model import build_model

# The CPU budget allows only a short run in the Triton interpreter (~0.5 s per step on a loaded
# 2-core machine); benchmarks/gpu_kernels.py runs the same comparison for 300 steps on a GPU.
STEPS, N_LAYERS, BATCH, SEQ = 60, 1, 4, 16
# Stated tolerance. Two fp32 runs that differ only in rounding order drift apart (training is
# chaotic), so the yardstick for "equal" is that drift itself, measured by an eager run whose
# RMSNorm is written differently (trainperf.bench.e2e). Kernels pass if (a) the first 20 steps
# agree to 1e-4 absolute, before drift is amplified, and (b) the mean loss of the last 20 steps
# differs from eager by at most max(3x the rounding drift, 0.02), while the loss falls by more
# than 1.0 (so agreement is not trivial).
EARLY_STEPS, EARLY_ATOL, LATE_STEPS, LATE_FLOOR = 20, 1e-4, 20, 0.02


def _spec():
    return dataclasses.replace(load_model("tiny"), n_layers=2, seq_len=SEQ)


def test_trainer_model_losses_equal_with_and_without_kernels():
    r = compare_training(steps=STEPS, n_layers=N_LAYERS, batch=BATCH, seq=SEQ, lr=3e-3, device="cpu")
    assert r.applied == {"rms_norm": 2 * N_LAYERS + 1, "swiglu": N_LAYERS, "rope": N_LAYERS, "cross_entropy": 1}
    assert r.eager[:5].mean() - r.eager[-LATE_STEPS:].mean() > 1.0, "the model must learn for the check to mean anything"
    assert r.early_max_abs_diff(EARLY_STEPS) < EARLY_ATOL
    drift = r.late_mean_diff(LATE_STEPS, "eager-div")
    assert r.late_mean_diff(LATE_STEPS) <= max(3 * drift, LATE_FLOOR), (r.late_mean_diff(LATE_STEPS), drift)


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
