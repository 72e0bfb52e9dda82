"""optimizer_slow for a per-parameter optimizer: its per-tensor tiny kernels, launched one by one inside
Optimizer.step, pace the step (torch.optim with foreach=False, a hand-written loop). The fix is specific (a foreach
or fused optimizer), so the finding names the optimizer, not only small kernels in general.

Hand-built traces (answers worked by hand): 4 steps of two 2-ms GEMMs launched at once (the GPU busy 4 ms), then
Optimizer.step#Adam.step running 400 per-tensor ops of 15 us on the host, each launching a 3-us kernel: the host
takes 6 ms on the optimizer while the GPU has 4 ms of GEMMs, so the step is the host's (6110 us). Fused, the 400
ops and launches cost the host nothing and the step is the GPU's: no faster than the GEMMs (4052 us), no slower
than the GEMMs and the 400 kernels' own device time (3.5 us each, which a fused kernel may still need): a gain
between (6110 - 4052 - 1400) / 6110 = 10.8 % and (6110 - 4052) / 6110 = 33.7 %. Its foreach twin
launches 3 multi_tensor_apply kernels of 100 us per step instead: nothing to name."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.advice import RECOMMENDATIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

STEPS, TENSORS, OP_US, KERNEL_US, GEMM_US = 4, 400, 15.0, 3.0, 2_000.0
FOREACH = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>"


def _job(path: Path, foreach: bool) -> Path:
    b = TraceBuilder()
    t0 = 0.0
    for s in range(STEPS):
        gpu = t0 + 50.0
        for k in range(2):
            b.cpu("aten::mm", t0 + 10 + 30 * k, 25)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t0 + 20 + 30 * k, gpu, GEMM_US, launch_dur=5)
            gpu += GEMM_US + 1.0
        at = t0 + 100.0
        ops = 3 if foreach else TENSORS
        b.cpu("Optimizer.step#Adam.step", at, ops * OP_US + 10, cat="user_annotation")
        for i in range(ops):
            b.cpu("aten::_fused_adam_" if foreach else ("aten::mul_", "aten::add_", "aten::addcdiv_")[i % 3], at, 14)
            start = max(gpu, at + 12)
            dur = 100.0 if foreach else KERNEL_US
            b.launch(FOREACH if foreach else "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>",
                     at + 8, start, dur, launch_dur=4)
            gpu = start + dur + 0.5
            at += OP_US
        end = max(at, gpu) + 20
        b.step(s, t0, end - t0)
        t0 = end
    return b.write(path)


def test_a_per_parameter_optimizer_is_named_and_priced_as_fused(tmp_path):
    d = diagnose(_job(tmp_path / "loop.json.gz", foreach=False))
    top = d.findings[0]
    assert top.kind == "optimizer_slow" and [c.kind for c in top.changes] == ["fuse_optimizer"]
    assert top.evidence["metrics"]["optimizer_small_kernel_launches"]["value"] == 3 * TENSORS  # 3 analysed steps
    assert 100 * (6110 - 4052 - TENSORS * (KERNEL_US + 0.5)) / 6110 <= top.gain_alone_pct <= 100 * (6110 - 4052) / 6110
    # the tiny kernels it fuses are all of the trace's: small_kernels adds nothing after it
    assert not any(f.kind == "small_kernels" for f in d.findings)


def test_its_foreach_twin_has_nothing_to_fuse(tmp_path):
    d = diagnose(_job(tmp_path / "foreach.json.gz", foreach=True))
    assert not any(f.kind in ("optimizer_slow", "small_kernels") for f in d.findings)


FOREACH_PASS = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"
                "::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>>")
FUSED_ADAMW = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"
               "::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4,"
               " (at::native::ADAM_MODE)1, false>>")


def _gpu_bound_with_optimizer_kernels(path: Path, kernel: str) -> Path:
    """4 host steps of 100 us, each launching a 2000-us GEMM and three 300-us optimizer kernels, which run back to
    back on the GPU from 100 us on: the host runs steps ahead, the device sets the pace (2900 us of work a step)."""
    b = TraceBuilder()
    gpu = 100.0
    for s in range(STEPS):
        T = 100.0 * s
        b.step(s, T, 100)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 10, gpu, GEMM_US)
        gpu += GEMM_US
        for k in range(3):
            b.launch(kernel, T + 20 + 10 * k, gpu, 300)
            gpu += 300
    return b.write(path)


def test_unfused_optimizer_kernels_are_priced_fused_and_a_fused_optimizer_has_nothing_to_fuse(tmp_path):
    # a foreach optimizer's passes, 900 of each step's 2900 us of GPU work (31 % of busy): fused, 3x faster, they
    # take 300 us: (2900 - 2300) / 2900 = 20.7 % a step, an assumed factor (upper bound: high rated medium)
    d = diagnose(_gpu_bound_with_optimizer_kernels(tmp_path / "foreach.json.gz", FOREACH_PASS))
    f = next(x for x in d.findings if x.kind == "optimizer_slow")
    assert f.gain_pct == pytest.approx(100 * 600 / 2900, abs=0.1) and f.gain_is_upper_bound and f.severity == "medium"
    # already foreach: the fix named is the fused one, not "use foreach"
    assert f.recommendation.startswith("The optimizer already runs foreach") and "fused=True" in f.recommendation
    # an optimizer's own unfused kernel, not foreach's: the kind's usual advice, foreach or fused
    d = diagnose(_gpu_bound_with_optimizer_kernels(tmp_path / "own.json.gz", "void adam_update_kernel<float>"))
    f = next(x for x in d.findings if x.kind == "optimizer_slow")
    assert f.recommendation == RECOMMENDATIONS["optimizer_slow"]
    # PyTorch's fused AdamW already does the whole update in one pass: no finding, however large its share
    d = diagnose(_gpu_bound_with_optimizer_kernels(tmp_path / "fused.json.gz", FUSED_ADAMW))
    assert not any(x.kind == "optimizer_slow" for x in d.findings)
