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


# --- collective message sizes -------------------------------------------------------------------

COLLECTIVES = Path(__file__).resolve().parent / "data" / "jax" / "jax_collectives.xplane.pb"
# the collectives of the same program, as XLA printed it (jax_collectives.hlo.txt), and their sizes by hand
HLO_TEXT = {
    "psum_invariant.7": "%psum_invariant.7 = f32[256,64]{1,0} all-reduce(%param.2), channel_id=1, "
                        "replica_groups={{0,1,2,3}}",
    "all_gather.3": "%all_gather.3 = f32[128,64]{1,0} all-gather(%wrapped_convert), channel_id=1, "
                    "replica_groups={{0,1,2,3}}",
    "reduce_scatter.7": "%reduce_scatter.7 = f32[64,64]{1,0} reduce-scatter(%param.2), channel_id=1, "
                        "replica_groups={{0,1,2,3}}",
    "all-to-all": "%all-to-all = (f32[64,64]{1,0}, f32[64,64]{1,0}, f32[64,64]{1,0}, f32[64,64]{1,0}) "
                  "all-to-all(%wrapped_slice, %wrapped_slice.1, %wrapped_slice.2, %wrapped_slice.3), channel_id=1, "
                  "replica_groups={{0,1,2,3}}",
    "ppermute.3": "%ppermute.3 = f32[32,64]{1,0} collective-permute(%wrapped_convert), channel_id=1, "
                  "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
}
# operands: %param.2 f32[256,64], %wrapped_convert f32[32,64], %wrapped_slice* f32[64,64] (in the same text)
BY_HAND = {  # (kind, bytes sent, bytes received, group size, NCCL's S = the larger)
    "psum_invariant.7": ("all_reduce", F32 * 256 * 64, F32 * 256 * 64, 4, 65536),
    "all_gather.3": ("all_gather", F32 * 32 * 64, F32 * 128 * 64, 4, 32768),
    "reduce_scatter.7": ("reduce_scatter", F32 * 256 * 64, F32 * 64 * 64, 4, 65536),
    "all-to-all": ("all_to_all", 4 * F32 * 64 * 64, 4 * F32 * 64 * 64, 4, 65536),
    "ppermute.3": ("send_recv", F32 * 32 * 64, F32 * 32 * 64, 4, 8192),  # 4 devices in the pairs
}


def test_collective_sizes_by_hand_from_the_hlo_text():
    text = (XSPACE.parent / "jax_collectives.hlo.txt").read_text()
    for line in HLO_TEXT.values():
        assert line in text  # the hand counts are of the program that was profiled
    costs = xspace_costs(COLLECTIVES.read_bytes())
    got = {op: c.collective for (module, op), c in costs.items() if c.collective is not None}
    assert set(got) == set(BY_HAND)
    for op, (kind, sent, received, group, s) in BY_HAND.items():
        c = got[op]
        assert (c.kind, c.in_bytes, c.out_bytes, c.group_size, c.nbytes, c.dtype) == \
            (kind, sent, received, group, s, "Float"), op
    # a non-collective instruction has no message size
    assert costs[("jit_body", "concatenate_add_fusion")].collective is None


def test_async_start_and_iota_groups():
    from trainperf.trace.hlo import _instruction, _Shape, collective_size

    bf16 = 16
    # all-gather-start returns (operand, gathered): S is the gathered buffer, bf16[128,64]
    start = collective_size("all-gather-start", [_Shape(bf16, (32, 64), ())],
                            _Shape(0, (), (_Shape(bf16, (32, 64), ()), _Shape(bf16, (128, 64), ()))), 4)
    assert (start.in_bytes, start.out_bytes, start.nbytes, start.dtype) == (2 * 32 * 64, 2 * 128 * 64, 16384,
                                                                          "BFloat16")
    # all-reduce-start of two arrays: its tuple result is the two outputs
    ar = collective_size("all-reduce-start", [_Shape(11, (8,), ()), _Shape(11, (4,), ())],
                         _Shape(0, (), (_Shape(11, (8,), ()), _Shape(11, (4,), ()))), 2)
    assert ar.nbytes == 4 * 12 and ar.kind == "all_reduce"
    assert collective_size("add", [], _Shape(11, (4,), ()), 0) is None
    # HloInstructionProto with collective_device_list (87) in iota form: 2 groups of 8 devices, written by hand
    iota = bytes([0x08, 0x02, 0x10, 0x08])                      # num_replica_groups 2, num_devices_per_group 8
    device_list = bytes([0x12, len(iota)]) + iota              # iota_replica_group_list = 2
    proto = bytes([0x12, 10]) + b"all-reduce" + bytes([0xBA, 0x05, len(device_list)]) + device_list
    assert _instruction(proto).group_size == 8
    # the older replica_groups (49): one group {0, 1, 2}
    group = bytes([0x0A, 3, 0, 1, 2])                          # replica_ids = 1, packed
    assert _instruction(bytes([0x8A, 0x03, len(group)]) + group).group_size == 3
