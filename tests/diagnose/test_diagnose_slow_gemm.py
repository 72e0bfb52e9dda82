"""slow_gemm on hand-built H100 traces (answers worked by hand from the planner's GEMM model): square bf16 GEMMs at a
third of the rate the model expects for their shape, against the same GEMMs at it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import queued_steps, recorded_shapes  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.slow_gemm import EVERY_SHAPE_PREFIX  # noqa: E402

BF16 = "c10::BFloat16"
P, STEPS = 4200.0, 5
SQUARE_FLOPS = 2.0 * 4096 ** 3
# the planner's rate for 4096^3 in bf16 on an H100 SXM: 989.4 TFLOP/s dense x 0.664 (the catalog's training GEMM
# efficiency) x (4096 / (4096 + 96))^3 (each dimension's saturation) = 612.6 TFLOP/s: 224.3 us, + 5 us of fixed cost
MODEL_US = SQUARE_FLOPS / (989.4e12 * 0.664 * (4096 / 4192) ** 3) * 1e6 + 5.0


def _trace(folder: Path, square_us: float, small_us: float = 30.0, shapes: bool = True) -> Path:
    # each 4200-us step: 4 aten::mm [4096, 4096] x [4096, 4096] (square_us each), then one aten::mm
    # [1024, 4096] x [4096, 1024] (small_us), queued back to back from T+10; a cudaDeviceSynchronize from T+60 returns
    # 5 us after the last kernel; Python until 1 us before the next step
    square = recorded_shapes([[4096, 4096], [4096, 4096]], BF16, shapes)
    small = recorded_shapes([[1024, 4096], [4096, 1024]], BF16, shapes)
    ops = [("aten::mm", square, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", square_us)] * 4 + \
        [("aten::mm", small, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", small_us)]
    return queued_steps(folder, ops, steps=STEPS, step_us=P)


def _find(d):
    return next((f for f in d.findings if f.kind == "slow_gemm"), None)


def test_square_gemms_at_a_third_of_the_models_rate_are_slow_and_priced_at_it(tmp_path):
    # 4 x 687 us a step (200 TFLOP/s); at the model's 229.3 us each the step is 4 x 457.7 = 1830.9 us shorter, the
    # sync and the Python after it following: 43.6 % of the 4200-us step. The small GEMM (2 x 1024 x 4096 x 1024 FLOPs
    # in 30 us: 286 TFLOP/s; the model's 536.6 TFLOP/s, 16.0 us + 5 of fixed cost) is not slow
    f = _find(diagnose(_trace(tmp_path, square_us=687.0)))
    assert f is not None and f.severity == "high"
    m = f.evidence["metrics"]
    assert m["their_rate"]["value"] == pytest.approx(SQUARE_FLOPS / 687e-6 / 1e12, rel=1e-3)
    assert m["times_the_model"]["value"] == pytest.approx(687.0 / MODEL_US, rel=1e-3)
    assert m["slow_shapes"]["value"] == 1 and m["gemm_shapes"]["value"] == 2
    assert f.gain_alone_pct == pytest.approx(100.0 * 4 * (687.0 - MODEL_US) / P, abs=0.05)
    assert f.evidence["events"][0]["name"].startswith("aten::mm m=4096 k=4096 n=4096 bf16: 3x the model's time")
    assert "PYTORCH_TUNABLEOP_ENABLED=1" in f.recommendation and not f.recommendation.startswith(EVERY_SHAPE_PREFIX)


def test_every_shape_slow_points_at_the_device_first(tmp_path):
    # the small GEMM also at a third of its rate (63 us for the model's 21.0): the clocks and the part come first
    f = _find(diagnose(_trace(tmp_path, square_us=687.0, small_us=63.0)))
    assert f is not None and f.recommendation.startswith(EVERY_SHAPE_PREFIX)
    assert f.evidence["metrics"]["slow_shapes"]["value"] == 2


def test_gemms_near_the_model_or_without_shapes_are_not_slow(tmp_path):
    # at 600 TFLOP/s (229 us, the model's own time) and at 1.9x it (435 us, under the bar of twice); without shapes
    # there is no model time
    for name, kw in (("at_model", {"square_us": 229.0}), ("under_bar", {"square_us": 435.0}),
                     ("no_shapes", {"square_us": 687.0, "shapes": False})):
        (tmp_path / name).mkdir()
        assert _find(diagnose(_trace(tmp_path / name, **kw))) is None, name


def test_an_unfused_attentions_products_are_unfused_attentions_not_slow_gemms(tmp_path):
    # test_diagnose_attention's H100 step: its attention products [4, 16, 2048, 128] x [.., 128, 2048] take 400 us,
    # 6.87e10 FLOPs at 172 TFLOP/s, twice the model's 195.9 us (k = 128: 357 TFLOP/s, + 5 us) - but priced as the
    # fused kernel they become; the 3000-us linear, 6.87e10 FLOPs at 23 TFLOP/s, is slow_gemm's alone
    from test_diagnose_attention import _h100_trace

    d = diagnose(_h100_trace(tmp_path))
    f = _find(d)
    assert f is not None and any(x.kind == "unfused_attention" for x in d.findings)
    assert f.evidence["metrics"]["slow_shapes"]["value"] == 1
    assert f.evidence["events"][0]["name"].startswith("aten::linear m=8192 k=2048 n=2048 bf16")


def test_gemms_sharing_the_device_with_another_streams_gemms_are_not_judged(tmp_path):
    # the 4 square GEMMs of each step run two by two side by side on two streams (overlapped micro-batches), 573 us
    # each (2.5x the model's 229.3 us: each has half the SMs); the same 2 x 573 us back to back on one stream would
    # be slow_gemm's, side by side they are not judged
    from gpu_bound import end_gpu_bound_step, write_trace
    from kineto_builder import TraceBuilder

    for name, streams in (("side_by_side", (7, 8)), ("one_stream", (7, 7))):
        b = TraceBuilder()
        square = recorded_shapes([[4096, 4096], [4096, 4096]], BF16)
        for s in range(STEPS):
            T = s * P
            b.step(s, T, P)
            end = T + 10.0
            for pair in range(2):
                for j, stream in enumerate(streams):
                    at = T + 10.0 * (2 * pair + j)
                    start = T + 10.0 + 573.0 * (pair if streams[0] != streams[1] else 2 * pair + j)
                    b.cpu("aten::mm", at, 8.0, **square)
                    b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", at + 2.0, start, 573.0,
                             stream=stream)
                    end = max(end, start + 573.0)
            end_gpu_bound_step(b, T, P, end, sync_at=60.0)
        (tmp_path / name).mkdir()
        found = _find(diagnose(write_trace(b, tmp_path / name)))
        assert (found is None) == (name == "side_by_side"), name
