"""Property-based sweep (hypothesis) over shapes and options, against torch.nn.functional references in fp64."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import trainperf.kernels as K
from trainperf.kernels import reference as R


@settings(max_examples=15, deadline=None, derandomize=True)
@given(rows=st.integers(1, 40), vocab=st.integers(1, 700), smoothing=st.sampled_from([0.0, 0.2, 1.0]),
       reduction=st.sampled_from(["mean", "sum", "none"]), scale=st.sampled_from([0.1, 10.0, 300.0]),
       n_ignored=st.integers(0, 3), seed=st.integers(0, 1000))
def test_cross_entropy_property(rows, vocab, smoothing, reduction, scale, n_ignored, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g, dtype=torch.float64) * scale).requires_grad_()
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[:min(n_ignored, rows - 1)] = -100
    ref = F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)
    x32 = x.detach().float().requires_grad_()
    ours = K.cross_entropy(x32, t, reduction=reduction, label_smoothing=smoothing)
    tol = dict(atol=1e-5 * max(1.0, scale) * (rows if reduction == "sum" else 1), rtol=1e-5)
    torch.testing.assert_close(ours.double(), ref, **tol)
    w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    (gx,) = torch.autograd.grad(ref, x, w)
    (gx32,) = torch.autograd.grad(ours, x32, w.float())
    torch.testing.assert_close(gx32.double(), gx, atol=1e-5, rtol=1e-4)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=2), hidden=st.integers(1, 600),
       seed=st.integers(0, 1000))
def test_rms_norm_property(shape, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, hidden, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(hidden, generator=g, dtype=torch.float64).requires_grad_()
    ref = R.rms_norm(x, w, 1e-6)
    x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ours = K.rms_norm(x32, w32, 1e-6)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    gx, gw = torch.autograd.grad(ref, [x, w], dy)
    gx32, gw32 = torch.autograd.grad(ours, [x32, w32], dy.float())
    torch.testing.assert_close(gx32.double(), gx, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gw32.double(), gw, atol=1e-4, rtol=1e-4)
