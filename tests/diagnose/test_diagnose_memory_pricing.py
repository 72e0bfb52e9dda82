"""memory_bound_unfused priced by its own evidence: the elementwise kernels moving their bytes at the HBM peak
(roofline from the recorded shapes and the device), not an assumed 2x. Hand-built GPU-bound trace, answer
worked by hand:

each 2000-us step launches 10 aten::add of two 2^20-element float tensors (10 us apart, launch 2 us into
the op, kernel queued 5 us after its launch), then cudaDeviceSynchronize at +100 us. An add moves 3 x 4 x
2^20 bytes = 12,582,912 B; at the A100-40GB's 1.555 TB/s that takes 8.0918 us, and each kernel takes 80 us:
10.115 % of the HBM peak, so the fix is 9.89x faster kernels (8.09 us). Measured: the kernels run back to
back from +7 us, the last ends at +807, the sync returns 5 us later (+812). Fixed: each kernel ends before
the next launch, the last starts at its launch + 5 = +97 and the sync returns 5 us after it ends:
+102 + 8.09 us, 701.9 us sooner per step.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import K_US, N, P, STEPS, gpu_bound_trace  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

NBYTES = 3 * 4 * (1 << 20)
T_ROOF = NBYTES / 1.555e6  # µs at 1.555 TB/s
KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
          "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")


def _trace(path: Path, shapes: bool = True) -> Path:
    args = {"Input Dims": [[1 << 20], [1 << 20], []], "Input type": ["float", "float", "Scalar"]} if shapes else None
    return gpu_bound_trace(path, op="aten::add", kernel=KERNEL, device={"id": 0, "name": "NVIDIA A100-SXM4-40GB"},
                           op_args=args)


def test_memory_bound_is_priced_at_the_hbm_peak(tmp_path):
    d = diagnose(_trace(tmp_path))
    f = next(x for x in d.findings if x.kind == "memory_bound_unfused")
    hbm = f.evidence["metrics"]["achieved_bandwidth"]["value"]
    assert hbm == pytest.approx(100.0 * T_ROOF / K_US, abs=0.01)
    n = len(f.steps)
    assert n == STEPS - 1
    span = n * P  # the analysed steps, each closed by its Python after the sync, which no fix moves
    gain = n * ((7.0 + K_US * N + 5.0) - (102.0 + K_US * hbm / 100.0))
    assert f.gain_alone_pct == pytest.approx(100.0 * gain / span, abs=0.01)


def test_without_shapes_it_is_reported_unpriced(tmp_path):
    d = diagnose(_trace(tmp_path, shapes=False))
    f = next(x for x in d.findings if x.kind == "memory_bound_unfused")
    assert f.gain_pct == 0.0 and f.severity == "low" and f.what_if.startswith("not priced")
