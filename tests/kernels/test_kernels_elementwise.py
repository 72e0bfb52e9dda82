"""SwiGLU, GeGLU, RoPE and softmax kernels vs PyTorch references (F.silu, F.gelu tanh, rotate_half, torch.softmax)."""

import math

import pytest
import torch

import trainperf.kernels as K
from trainperf.kernels import _runtime
from trainperf.kernels import reference as R
from kernel_checks import check_bf16_no_worse_than_eager, check_fp32_against_fp64


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 37, 70), (129, 33)])
def test_glu_fp32_matches_fp64_reference(name, shape):
    g = torch.Generator().manual_seed(7)
    gate, up = torch.randn(shape, generator=g) * 4, torch.randn(shape, generator=g)  # *4 reaches tanh/sigmoid tails
    check_fp32_against_fp64(getattr(K, name), getattr(R, name), [gate, up])


def test_glu_extreme_gate_values_stay_finite():
    gate = torch.tensor([[-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4]], requires_grad=True)
    up = torch.ones_like(gate, requires_grad=True)
    for name in ("swiglu", "geglu"):
        y = getattr(K, name)(gate, up)
        torch.testing.assert_close(y, getattr(R, name)(gate.detach(), up.detach()), atol=1e-4, rtol=1e-5)
        dg, du = torch.autograd.grad(y.sum(), [gate, up])
        assert torch.isfinite(dg).all() and torch.isfinite(du).all()


def test_glu_bf16_and_strided_halves_of_a_fused_projection():
    g = torch.Generator().manual_seed(8)
    fused = torch.randn(40, 2 * 96, generator=g)
    check_bf16_no_worse_than_eager(K.swiglu, R.swiglu, [fused[:, :96], fused[:, 96:]])
    x = fused.clone().requires_grad_()
    y = K.swiglu(x[:, :96], x[:, 96:])  # strided views, no copy
    y.square().sum().backward()
    x_ref = fused.clone().requires_grad_()
    R.swiglu(x_ref[:, :96], x_ref[:, 96:]).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)


def _tables(seq, dim, dtype=torch.float32):
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 9, 4, 16), (3, 5, 6, 10)])
def test_rope_fp32_matches_fp64_reference(shape):
    b, s, h, d = shape
    cos, sin = _tables(s, d, torch.float64)
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(shape, generator=g), torch.randn(b, s, max(1, h // 2), d, generator=g)
    check_fp32_against_fp64(lambda q, k: K.rope(q, k, cos.float(), sin.float()),
                            lambda q, k: R.rope(q, k, cos, sin), [q, k])


def test_rope_general_cos_sin_halves_and_batched_tables():
    # cos/sin halves that differ (no duplication assumed) and a (batch, seq, dim) table.
    g = torch.Generator().manual_seed(10)
    q, k = torch.randn(2, 5, 3, 8, generator=g), torch.randn(2, 5, 1, 8, generator=g)
    cos, sin = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)

    def ref(q, k):
        c, s = cos[:, :, None, :].double(), sin[:, :, None, :].double()
        return q * c + R.rotate_half(q) * s, k * c + R.rotate_half(k) * s

    check_fp32_against_fp64(lambda q, k: K.rope(q, k, cos, sin), ref, [q, k])


def test_rope_strided_transposed_input_and_bf16():
    g = torch.Generator().manual_seed(11)
    cos, sin = _tables(7, 16)
    q_bhsd = torch.randn(2, 4, 7, 16, generator=g)
    q = q_bhsd.transpose(1, 2)  # (batch, seq, heads, dim) view of a (batch, heads, seq, dim) tensor
    k = torch.randn(2, 7, 2, 16, generator=g)
    out_q, out_k = K.rope(q, k, cos, sin)
    ref_q, ref_k = R.rope(q, k, cos, sin)
    torch.testing.assert_close(out_q, ref_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k, ref_k, atol=1e-5, rtol=1e-5)
    check_bf16_no_worse_than_eager(lambda q, k: K.rope(q, k, cos, sin), lambda q, k: R.rope(q, k, cos, sin),
                                   [q.contiguous(), k])


def test_rope_preserves_norm_per_pair():
    # A rotation keeps |(x_i, x_{i+d/2})| (hand-worked property of RoPE with cos^2 + sin^2 = 1).
    cos, sin = _tables(6, 8)
    q = torch.randn(1, 6, 2, 8)
    out, _ = K.rope(q, q[:, :, :1], cos, sin)
    pair_norm = lambda t: t[..., :4] ** 2 + t[..., 4:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_norm(out), pair_norm(q), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (37, 70), (2, 3, 129)])
def test_softmax_fp32_matches_fp64_reference(shape):
    g = torch.Generator().manual_seed(12)
    check_fp32_against_fp64(K.softmax, lambda x: torch.softmax(x, -1), [torch.randn(shape, generator=g) * 5])


def test_softmax_large_logits_and_looped_path(monkeypatch):
    x = torch.tensor([[1e4, 1e4 - 1.0, -1e4, 0.0]])
    torch.testing.assert_close(K.softmax(x), torch.softmax(x, -1))
    monkeypatch.setattr(_runtime, "REGISTER_BUDGET_ELEMS", 128)
    g = torch.Generator().manual_seed(13)
    check_fp32_against_fp64(K.softmax, lambda x: torch.softmax(x, -1), [torch.randn(9, 300, generator=g) * 5])
    check_bf16_no_worse_than_eager(K.softmax, R.softmax, [torch.randn(9, 300, generator=g) * 5])
    assert math.isclose(float(K.softmax(torch.zeros(1, 300)).sum()), 1.0, rel_tol=1e-6)


def test_fp16_outputs_for_every_kernel():
    # fp16 inputs give fp16 outputs within fp16 rounding of the fp32 PyTorch reference (rtol 2e-3, atol 2e-3).
    g = torch.Generator().manual_seed(14)
    x, w = torch.randn(12, 80, generator=g), torch.randn(80, generator=g)
    cos, sin = _tables(4, 8)
    q = torch.randn(3, 4, 2, 8, generator=g)
    t = torch.randint(0, 80, (12,), generator=g)
    cases = [
        (lambda x, w: K.rms_norm(x, w), lambda x, w: R.rms_norm(x, w, 1e-6), [x, w]),
        (lambda x, w: K.layer_norm(x, w, w), lambda x, w: R.layer_norm(x, w, w), [x, w]),
        (K.swiglu, R.swiglu, [x, x.flip(0)]), (K.geglu, R.geglu, [x, x.flip(0)]), (K.softmax, R.softmax, [x]),
        (lambda q: K.rope(q, q, cos, sin)[0], lambda q: R.rope(q, q, cos, sin)[0], [q]),
        (lambda x: K.cross_entropy(x, t, reduction="none"), lambda x: R.cross_entropy(x, t, reduction="none"), [x]),
    ]
    for ours, ref, ins in cases:
        out = ours(*[i.half() for i in ins])
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), ref(*[i.half().float() for i in ins]), atol=2e-3, rtol=2e-3)
