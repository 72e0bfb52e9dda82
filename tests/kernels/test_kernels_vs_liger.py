"""Cross-check against another tool: Liger Kernel's own outputs on the same inputs (where its kernels run
in the Triton interpreter: cross-entropy with z-loss and label smoothing, fused linear CE, RoPE, softmax)."""

import pytest
import torch

import trainperf.kernels as K

liger = pytest.importorskip("liger_kernel.transformers.functional", reason="liger-kernel not installed")


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def test_cross_entropy_with_z_loss_and_smoothing_matches_liger():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 300, generator=g) * 3
    t = torch.randint(0, 300, (16,), generator=g)
    t[:2] = -100
    ours = K.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-3)
    theirs = _first(liger.liger_cross_entropy(x.clone(), t, label_smoothing=0.1, lse_square_scale=1e-3))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_fused_linear_cross_entropy_matches_liger():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(24, 16, generator=g, requires_grad=True), torch.randn(200, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 200, (24,), generator=g)
    ours = K.fused_linear_cross_entropy(h, w, t)
    gh, gw = torch.autograd.grad(ours, [h, w])
    theirs = _first(liger.liger_fused_linear_cross_entropy(h, w, t))
    th, tw = torch.autograd.grad(theirs, [h, w])
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gh, th, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw, tw, atol=1e-5, rtol=1e-4)


def test_rope_and_softmax_match_liger():
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 6, 4, 16, generator=g), torch.randn(2, 6, 2, 16, generator=g)
    ang = torch.arange(6.0)[:, None] * torch.linspace(0.01, 1.0, 8)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    oq, ok = K.rope(q, k, cos, sin)
    lq, lk = liger.liger_rope(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), cos[None], sin[None])
    torch.testing.assert_close(oq, lq.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ok, lk.transpose(1, 2), atol=1e-5, rtol=1e-5)
    x = torch.randn(7, 130, generator=g) * 4
    torch.testing.assert_close(K.softmax(x), liger.liger_softmax(x), atol=1e-6, rtol=1e-5)
