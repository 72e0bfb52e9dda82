"""Shared checks for kernel tests: forward and gradients against an fp64 PyTorch reference.

Tolerances (stated once, used everywhere):
- fp32 kernels vs the fp64 reference: atol = rtol = 1e-5 (observed ~1e-6: fp32 accumulation).
- bf16 kernels: the error of our bf16 output against the fp64 reference must be no larger
  than 1.5x the error of PyTorch's own bf16 eager computation, plus 1/128 (one bf16 ulp at 1).
"""

from __future__ import annotations

import torch

FP32_TOL = dict(atol=1e-5, rtol=1e-5)


def _flat(out):
    outs = out if isinstance(out, tuple) else (out,)
    return torch.cat([o.reshape(-1) for o in outs])


def check_fp32_against_fp64(fn, ref, inputs, seed: int = 0, tol: dict = FP32_TOL) -> None:
    """Assert fn(fp32 inputs) and its input gradients match ref(fp64 inputs) within tol."""
    g = torch.Generator().manual_seed(seed)
    x64 = [t.detach().double().requires_grad_(t.is_floating_point()) for t in inputs]
    x32 = [t.detach().float().requires_grad_(t.is_floating_point()) for t in inputs]
    out32, out64 = _flat(fn(*x32)), _flat(ref(*x64))
    torch.testing.assert_close(out32.double(), out64, **tol)
    grad = torch.randn(out64.shape, generator=g, dtype=torch.float64)
    g32 = torch.autograd.grad(out32, x32, grad.float())
    g64 = torch.autograd.grad(out64, x64, grad)
    for a, b in zip(g32, g64):
        torch.testing.assert_close(a.double(), b, **tol)


def check_bf16_no_worse_than_eager(fn, ref, inputs, seed: int = 0) -> None:
    """Assert fn on bf16 inputs is about as accurate as ref on bf16 inputs (both vs ref in fp64), fwd and grads."""
    g = torch.Generator().manual_seed(seed)
    xb = [t.detach().bfloat16() for t in inputs]
    x64 = [t.double().requires_grad_() for t in xb]
    ours_in = [t.clone().requires_grad_() for t in xb]
    eager_in = [t.clone().requires_grad_() for t in xb]
    exact, ours, eager = _flat(ref(*x64)), _flat(fn(*ours_in)), _flat(ref(*eager_in))
    assert ours.dtype == torch.bfloat16
    grad = torch.randn(exact.shape, generator=g, dtype=torch.float64)
    pairs = [(ours.detach().double(), eager.detach().double(), exact.detach())]
    g_exact = torch.autograd.grad(exact, x64, grad)
    g_ours = torch.autograd.grad(ours, ours_in, grad.bfloat16())
    g_eager = torch.autograd.grad(eager, eager_in, grad.bfloat16())
    pairs += [(a.double(), b.double(), c) for a, b, c in zip(g_ours, g_eager, g_exact)]
    for o, e, x in pairs:
        scale = x.abs().max().clamp(min=1.0)
        err_ours = float((o - x).abs().max() / scale)
        err_eager = float((e - x).abs().max() / scale)
        assert err_ours <= 1.5 * err_eager + 1 / 128, (err_ours, err_eager)
