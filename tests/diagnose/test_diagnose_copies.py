"""exposed_memcpy (diagnose/copies.py): host-link copies on the device timeline that no computation hides."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn"
COPY = "Memcpy HtoD (Pinned -> Device)"
P, STEPS = 8200.0, 4  # the device's 8,000 us from +50 us, the synchronize, ~140 us of Python


def _offload_trace(folder: Path, copy_stream: int) -> Path:
    """STEPS steps: an async pinned host-to-device copy of 2000 us (cudaMemcpyAsync returns at once), then three
    2000-us GEMMs on stream 7; the copy runs on `copy_stream`: 7 (in line: the GEMMs wait for it) or 9 (a side
    stream, beside the GEMMs of the step, hidden)."""
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("aten::copy_", T + 1.0, 8.0)
        b.launch(COPY, T + 2.0, T + 50.0, 2000.0, stream=copy_stream, cat="gpu_memcpy", runtime="cudaMemcpyAsync")
        at = T + 50.0 + (2000.0 if copy_stream == 7 else 0.0)
        for k in range(3):
            b.cpu("aten::mm", T + 20.0 + 10.0 * k, 8.0)
            b.launch(GEMM, T + 22.0 + 10.0 * k, at, 2000.0)
            at += 2000.0
        end_gpu_bound_step(b, T, P, at, sync_at=100.0)  # the last GEMM ends at +8050 in line, +6050 beside
    return write_trace(b, folder, device=None)


def test_a_copy_in_line_with_the_computation_is_exposed_and_priced(tmp_path):
    # per step the 2000-us copy runs alone before the GEMMs: 2000 us exposed (24.4 % of 8200), off the timeline
    # the step is 2000 us shorter; an upper bound, so 24 % rates medium
    d = diagnose(_offload_trace(tmp_path, copy_stream=7))
    x = next((f for f in d.findings if f.kind == "exposed_memcpy"), None)
    assert x is not None and x.gain_is_upper_bound and x.severity == "medium"
    n = STEPS - 1
    assert x.evidence["metrics"]["exposed_copy_time"]["value"] == pytest.approx(2000.0 * n, rel=1e-6)
    assert x.gain_us / n == pytest.approx(2000.0, rel=0.01)


def test_a_copy_under_computation_is_not(tmp_path):
    # the copy on stream 9 runs beside the first GEMM (the GEMMs start at +50 on stream 7; the device ends at
    # +6050): nothing exposed
    d = diagnose(_offload_trace(tmp_path, copy_stream=9))
    assert not any(f.kind == "exposed_memcpy" for f in d.findings)
