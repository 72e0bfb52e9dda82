"""The model's parts against independent references (PyTorch ops, hand formulas)."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainperf.specs import load_model, param_count
from trainperf.train.model import RMSNorm, Transformer, apply_rope, build_model, rope_tables, swiglu


def test_rmsnorm_matches_pytorch_rms_norm():
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    norm = RMSNorm(64, eps=1e-6)
    norm.weight.data = torch.randn(64)
    ref = F.rms_norm(x.float(), (64,), norm.weight, eps=1e-6).to(torch.bfloat16)  # PyTorch's own op
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)


def test_rope_matches_complex_rotation():
    # Reference: RoPE as complex multiplication, pairing dims (i, i + d/2) (HF rotate_half).
    b, s, h, d = 2, 16, 3, 8
    q, k = torch.randn(b, s, h, d), torch.randn(b, s, h, d)
    cos, sin = rope_tables(s, d, theta=10000.0)
    q2, k2 = apply_rope(q, k, cos, sin)
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d)
    angle = torch.outer(torch.arange(s).float(), inv)  # (s, d/2)
    rot = torch.polar(torch.ones_like(angle), angle)[None, :, None, :]
    for x, y in ((q, q2), (k, k2)):
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * rot
        torch.testing.assert_close(y, torch.cat([z.real, z.imag], dim=-1), rtol=1e-5, atol=1e-5)


def test_attention_matches_explicit_causal_softmax():
    spec = load_model("tiny")
    model = build_model(spec)
    attn = model.layers["0"].attention
    b, s = 2, 10
    x = torch.randn(b, s, spec.hidden)
    cos, sin = torch.ones(s, spec.head_dim), torch.zeros(s, spec.head_dim)  # identity rotation
    out = attn(x, cos, sin)
    hd, rep = spec.head_dim, spec.n_heads // spec.n_kv_heads
    q = (x @ attn.wq.weight.T).view(b, s, spec.n_heads, hd).transpose(1, 2)
    k = (x @ attn.wk.weight.T).view(b, s, spec.n_kv_heads, hd).transpose(1, 2).repeat_interleave(rep, 1)
    v = (x @ attn.wv.weight.T).view(b, s, spec.n_kv_heads, hd).transpose(1, 2).repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1) @ attn.wo.weight.T
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_parameter_count_matches_planner(name):
    spec = load_model(name)
    with torch.device("meta"):
        model = Transformer(spec)
    model.tie_weights()
    assert sum(p.numel() for p in model.parameters()) == param_count(spec)


def test_patch_points_are_used():
    spec = load_model("tiny")
    model = build_model(spec, seed=1)
    tokens = torch.randint(0, spec.vocab, (1, 32))
    base = model(tokens, tokens)
    assert model.output.weight is model.tok_embeddings.weight  # tied preset stays tied after to_empty
    assert torch.equal(build_model(spec, seed=1)(tokens, tokens), base)  # deterministic init
    calls = []
    ff = model.layers["0"].feed_forward
    ff.swiglu = lambda g, u: calls.append("swiglu") or swiglu(g, u)
    model.layers["0"].attention.rope = lambda q, k, c, s: calls.append("rope") or apply_rope(q, k, c, s)
    model.loss_fn = lambda logits, t: calls.append("loss") or F.cross_entropy(logits, t)
    torch.testing.assert_close(model(tokens, tokens), base)
    assert calls == ["rope", "swiglu", "loss"]
    # the initial loss of a fresh model is close to a uniform guess, ln(vocab)
    targets = torch.randint(0, spec.vocab, (1, 32))
    assert build_model(spec)(tokens, targets).item() == pytest.approx(math.log(spec.vocab), rel=0.05)
