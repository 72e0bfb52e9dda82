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

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

P, STEPS, N = 2000.0, 5, 10
NBYTES = 3 * 4 * (1 << 20)
T_ROOF = NBYTES / 1.555e6  # µs at 1.555 TB/s
K_US = 80.0
KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
          "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")


def _trace(path: Path, shapes: bool = True) -> Path:
    b = TraceBuilder()
    ext = 0
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        for k in range(N):
            at = T + 10.0 * k
            ext += 1
            args = {"External id": ext}
            if shapes:
                args.update({"Input Dims": [[1 << 20], [1 << 20], []], "Input type": ["float", "float", "Scalar"]})
            b.cpu("aten::add", at, 9.0, **args)
            b.launch(KERNEL, at + 2.0, T + 7.0 + K_US * k, K_US, launch_dur=5.0)
        end = T + 7.0 + K_US * N
        b.cpu("cudaDeviceSynchronize", T + 100.0, end + 5.0 - (T + 100.0), cat="cuda_runtime")
        b.cpu("python_work", end + 6.0, T + P - end - 7.0)
    doc = b.doc()
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]
    p = path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return p


def test_memory_bound_is_priced_at_the_hbm_peak(tmp_path):
    d = diagnose(_trace(tmp_path))
    f = next(x for x in d.findings if x.kind == "memory_bound_unfused")
    hbm = f.evidence["metrics"]["achieved_bandwidth"]["value"]
    assert hbm == pytest.approx(100.0 * T_ROOF / K_US, abs=0.01)
    n = len(f.steps)
    assert n == STEPS - 1
    span = (n - 1) * P + 7.0 + K_US * N + 5.0
    gain = n * ((7.0 + K_US * N + 5.0) - (102.0 + K_US * hbm / 100.0))
    assert f.gain_alone_pct == pytest.approx(100.0 * gain / span, abs=0.01)


def test_without_shapes_it_is_reported_unpriced(tmp_path):
    d = diagnose(_trace(tmp_path, shapes=False))
    f = next(x for x in d.findings if x.kind == "memory_bound_unfused")
    assert f.gain_pct == 0.0 and f.severity == "low" and f.what_if.startswith("not priced")
