"""An optimizer whose update runs on the CPU (ZeRO-Offload's DeepSpeedCPUAdam, FSDP's CPU offload): its step span
launches no kernel while the GPU idles through it. The host work there is the optimizer's (optimizer_slow with the
offload's fix), priced as host_work prices the same work under another name.

Hand-built traces (the format PyTorch writes: torch.optim.Optimizer's profiling hook names the step span
"Optimizer.step#<class>.step"): a 10-ms step launching six 900-us GEMMs 1 ms apart, then the optimizer's span of O us,
then the updated parameters copied to the GPU (a host-to-device copy launched after the span)."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose import advice
from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

P, O = 10_000.0, 3_800.0


def _job(path: Path, span: str = "Optimizer.step#DeepSpeedCPUAdam.step", kernels_in_step: int = 0) -> Path:
    b = TraceBuilder()
    for s in range(3):
        T = s * P
        b.step(s, T, P)
        for i in range(6):
            b.cpu("aten::mm", T + 100 + 1000 * i, 50)
            b.launch("ampere_sgemm_128x64_tn", T + 110 + 1000 * i, T + 120 + 1000 * i, 900)
        b.cpu(span, T + 6000, O, cat="user_annotation")
        for k in range(kernels_in_step):  # an optimizer on the GPU launches its update
            b.launch("multi_tensor_apply_kernel", T + 6010 + 100 * k, T + 6020 + 100 * k, 50)
        b.launch("Memcpy HtoD (Pinned -> Device)", T + 6000 + O + 50, T + 6000 + O + 60, 100, cat="gpu_memcpy",
                 runtime="cudaMemcpyAsync")
    return b.write(path)


def _kinds(d) -> dict:
    return {f.kind: f for f in d.findings}


def test_an_optimizer_step_on_the_cpu_is_named_with_the_offloads_fix(tmp_path):
    d = diagnose(_job(tmp_path / "offload.json.gz"))
    f = d.findings[0]
    assert f.kind == "optimizer_slow" and f.recommendation == advice.HOST_OPTIMIZER_RECOMMENDATION
    assert "host_work" not in _kinds(d)
    # most of each step's host block (from the last GEMM's launch to the copy's) lies in the 3.8-ms span
    assert 50 < f.evidence["metrics"]["inside_optimizer_steps_launching_no_kernel"]["value"] < 100
    # the same work under another name (a metrics flush) is host_work, priced alike: the name changes the fix only
    other = _kinds(diagnose(_job(tmp_path / "logging.json.gz", span="log_metrics")))["host_work"]
    assert f.gain_pct == pytest.approx(other.gain_pct) and f.gain_is_upper_bound and f.severity == other.severity
    assert other.recommendation != advice.HOST_OPTIMIZER_RECOMMENDATION


def test_an_optimizer_that_launches_its_update_is_not_said_to_run_on_the_cpu(tmp_path):
    d = diagnose(_job(tmp_path / "gpu.json.gz", kernels_in_step=3))
    assert all(f.recommendation != advice.HOST_OPTIMIZER_RECOMMENDATION for f in d.findings)
    assert "host_work" in _kinds(d)
