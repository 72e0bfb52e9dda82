"""torch.library registration: torch.compile traces through every op; opcheck validates fake/autograd registration."""

import torch

import trainperf.kernels as K
from trainperf.kernels import reference as R


def _model_step(x, w, gate, up, q, k, cos, sin, logits, t, h, wv):
    a = K.rms_norm(x, w).sum() + K.layer_norm(x, w, w).sum() + K.softmax(x).square().sum()
    b = K.swiglu(gate, up).sum() + K.geglu(gate, up).sum()
    qr, kr = K.rope(q, k, cos, sin)
    c = qr.square().sum() + kr.square().sum()
    return a + b + c + K.cross_entropy(logits, t) + K.fused_linear_cross_entropy(h, wv, t)


def _ref_step(x, w, gate, up, q, k, cos, sin, logits, t, h, wv):
    a = R.rms_norm(x, w, 1e-6).sum() + R.layer_norm(x, w, w).sum() + R.softmax(x).square().sum()
    b = R.swiglu(gate, up).sum() + R.geglu(gate, up).sum()
    qr, kr = R.rope(q, k, cos, sin)
    c = qr.square().sum() + kr.square().sum()
    return a + b + c + R.cross_entropy(logits, t) + R.linear_cross_entropy(h, wv, t)


def _inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(s, generator=g).requires_grad_()  # noqa: E731
    ang = torch.arange(5.0)[:, None] * torch.tensor([1.0, 0.1, 1.0, 0.1])
    return [r(6, 8), r(8), r(6, 8), r(6, 8), r(1, 5, 2, 4), r(1, 5, 1, 4), ang.cos(), ang.sin(), r(6, 11),
            torch.tensor([0, 1, 2, -100, 4, 10]), r(6, 8), r(11, 8)]


def test_torch_compile_traces_all_ops_without_graph_breaks():
    # Reference: the same step in eager PyTorch; fullgraph=True fails on any graph break.
    compiled = torch.compile(_model_step, backend="aot_eager", fullgraph=True)
    ins = _inputs()
    loss = compiled(*ins)
    diff = [t for t in ins if t.requires_grad]
    grads = torch.autograd.grad(loss, diff)
    ref_ins = [t.detach().clone().requires_grad_(t.requires_grad) for t in ins]
    ref = _ref_step(*ref_ins)
    ref_grads = torch.autograd.grad(ref, [t for t in ref_ins if t.requires_grad])
    torch.testing.assert_close(loss, ref, atol=1e-4, rtol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_opcheck_registrations():
    # torch.library.opcheck: schema, fake (meta) kernel and autograd registration agree with the real op.
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 8, generator=g, requires_grad=True), torch.randn(8, generator=g, requires_grad=True)
    t = torch.tensor([1, 2, -100, 7])
    cos, sin = torch.ones(3, 4), torch.zeros(3, 4)
    cases = [
        (torch.ops.trainperf.rms_norm_fwd, (x, w, 1e-6)),
        (torch.ops.trainperf.layer_norm_fwd, (x, w, None, 1e-5)),
        (torch.ops.trainperf.glu_fwd, (x, x.detach().clone().requires_grad_(), 0)),
        (torch.ops.trainperf.softmax_fwd, (x,)),
        (torch.ops.trainperf.rope_fwd, (torch.randn(1, 3, 2, 4, requires_grad=True),
                                        torch.randn(1, 3, 1, 4, requires_grad=True), cos, sin)),
        (torch.ops.trainperf.cross_entropy_fwd, (x, t, -100, 0.0, 0.0)),
        (torch.ops.trainperf.flce_fwd_rows, (x, torch.randn(9, 8, requires_grad=True), t, -100, 0.0, 0.0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                     "test_aot_dispatch_dynamic"))


def test_cpu_runs_even_when_triton_was_imported_first():
    # Reference: PyTorch's RMSNorm formula. Triton decorates its library functions when
    # triton.language is imported; trainperf.kernels must cope when that happened before it.
    import os
    import subprocess
    import sys

    if torch.cuda.is_available():
        return
    code = ("import triton.language, torch, trainperf.kernels as K; x = torch.randn(3, 8); "
            "r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6); "
            "assert torch.allclose(K.rms_norm(x, torch.ones(8)), r, atol=1e-6); print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
