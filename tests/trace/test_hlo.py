"""FLOPs and bytes of XLA instructions from the HLO modules of a real JAX profile, worked by hand.

The committed profile (tests/trace/data/jax, jax 0.10.2, CPU) is four steps of
`w - 0.1 * grad(lambda w: (tanh(x @ w) ** 2).sum())(w)` with x f32[32,64], w f32[64,64].
"""

from pathlib import Path

import pytest

from trainperf.trace.hlo import xspace_costs

XSPACE = Path(__file__).resolve().parent / "data" / "jax" / "jax_cpu.xplane.pb"
F32 = 4


def test_costs_by_hand():
    c = xspace_costs(XSPACE.read_bytes())
    # forward x @ w in XLA CPU's YNNPACK fusion: 2 * 32 * 64 * 64; reads x and w, writes [32, 64]
    ynn = c[("jit_update", "ynn_fusion")]
    assert ynn.flops == 2 * 32 * 64 * 64 and ynn.bytes == F32 * (32 * 64 + 64 * 64 + 32 * 64)
    assert ynn.precision == "fp32" and ynn.shapes == "f32[32,64] x f32[64,64] -> f32[32,64]"
    # backward xᵀ @ g: contracts the 32 rows, writes [64, 64]
    dot = c[("jit_update", "dot")]
    assert dot.flops == 2 * 64 * 64 * 32 and dot.bytes == F32 * (32 * 64 + 32 * 64 + 64 * 64)
    # tanh' chain: tanh, add, subtract, multiply, multiply, add on [32, 64] (broadcast and constant are free)
    loop = c[("jit_update", "multiply_add_fusion")]
    assert loop.flops == 6 * 32 * 64 and loop.bytes == F32 * 2 * 32 * 64
    # the update w - 0.1 * g: multiply and subtract on [64, 64]; reads w and g, writes w
    upd = c[("jit_update", "multiply_subtract_fusion")]
    assert upd.flops == 2 * 64 * 64 and upd.bytes == F32 * 3 * 64 * 64


def test_roofline_of_a_jax_profile():
    # the JAX kernels get roofline rows from their HLO cost; with a calibration of this CPU
    # (0.1 TFLOP/s fp32, 0.01 TB/s): the dot's roof is max(262144 / 0.1e12, 32768 / 0.01e12) = 3.2768 µs
    from trainperf.diagnose.roofline import calibrated_accelerator, roofline
    from trainperf.trace.producers import read_any

    t = read_any(XSPACE)
    rows = {r.op: r for r in roofline(t)}
    assert set(rows) == {"dot", "ynn_fusion", "multiply_add_fusion", "multiply_subtract_fusion"}
    assert rows["dot"].kind == "gemm" and rows["dot"].count == 4 and rows["multiply_add_fusion"].kind == "elementwise"
    assert rows["dot"].achieved_tflops == pytest.approx(4 * 262144 / (rows["dot"].time_us * 1e6))
    cpu = calibrated_accelerator({"device": "cpu", "dtype": "float32",
                                  "efficiency": {"measured_gemm_tflops": 0.1, "measured_hbm_tbps": 0.01}})
    dot = {r.op: r for r in roofline(t, cpu)}["dot"]
    assert dot.min_time_us == pytest.approx(4 * 3.2768) and dot.bound == "memory"
