"""layout_transposes on hand-built A100 traces (answers worked by hand): cuDNN converting NCHW tensors to NHWC and
back around each convolution of a GPU-bound step."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import end_gpu_bound_step, queued_ops, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

P, STEPS = 1500.0, 5
TO_NHWC = "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, (cudnnKernelDataType_t)0>(...)"
TO_NCHW = "void cudnn::ops::nhwcToNchwKernel<__half, __half, float, true, false, (cudnnKernelDataType_t)0>(...)"
CONV = "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1"


def _trace(folder: Path, transpose_us: float = 40.0, transposes: bool = True) -> Path:
    # each 1500-us step: 4 convolutions, each a 200-us NHWC kernel between two transposes of transpose_us (or none:
    # the model in channels_last), one 8-us aten::cudnn_convolution op per kernel launched 10 us apart from T, the
    # kernels back to back on the device from T+10; a cudaDeviceSynchronize from T+130 returns 5 us after the last
    # kernel; Python until 1 us before the next step
    conv = [("aten::cudnn_convolution", {}, TO_NHWC, transpose_us), ("aten::cudnn_convolution", {}, CONV, 200.0),
            ("aten::cudnn_convolution", {}, TO_NCHW, transpose_us)] if transposes else \
        [("aten::cudnn_convolution", {}, CONV, 200.0)]
    b = TraceBuilder()
    for s in range(STEPS):
        b.step(s, s * P, P)
        end_gpu_bound_step(b, s * P, P, queued_ops(b, s * P, conv * 4, s * P + 10.0), sync_at=130.0)
    return write_trace(b, folder, device="NVIDIA A100-SXM4-80GB")


def _find(d):
    return next((f for f in d.findings if f.kind == "layout_transposes"), None)


def test_layout_transposes_around_convolutions_are_priced_as_not_run(tmp_path):
    # 8 transposes of 40 us a step: 320 us of the 1500-us step (21.3 %), 320 of the 1120 us of kernels (28.6 %). Not
    # run, the first convolution starts when it is launched (T+12) plus the trace's launch latency (8 us: the first
    # kernel, launched at T+2, started at T+10), the rest back to back: the device's step ends at T+820 instead of
    # T+1130, the sync and the Python after it following: 310 us, 20.7 % of the step
    d = diagnose(_trace(tmp_path))
    f = _find(d)
    assert f is not None and f.severity == "high"
    # 28.6 % of the kernel time, over memory_bound_unfused's bar of 25 %: they are elementwise kernels by name, but
    # no fusion removes them (a memory format does), so they are this finding's alone
    assert all(x.kind != "memory_bound_unfused" for x in d.findings)
    m = f.evidence["metrics"]
    assert m["layout_transposes"]["value"] == 8 * 4  # 4 steps in the window
    assert m["share_of_kernel_time"]["value"] == pytest.approx(100.0 * 320 / 1120, abs=0.01)
    assert f.gain_alone_pct == pytest.approx(100.0 * 310 / P, abs=0.05)
    assert f.evidence["events"][0]["name"] == f"{TO_NHWC} (16 calls, 0.6 ms)"
    assert "channels_last" in f.recommendation


def test_channels_last_or_few_transposes_are_no_finding(tmp_path):
    # in channels_last there is nothing to convert; 8 transposes of 5 us (40 of 1500 us, 2.7 %) are under the bar
    for name, kw in (("channels_last", {"transposes": False}), ("few", {"transpose_us": 5.0})):
        (tmp_path / name).mkdir()
        assert _find(diagnose(_trace(tmp_path / name, **kw))) is None, name
