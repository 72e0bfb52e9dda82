"""Per-operator roofline: FLOPs against PyTorch's own flop counter, the args of a real profiler
trace, rows worked out by hand, and a real A100 trace."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.roofline import ATTENTION, op_cost, op_shape, roofline, roofline_for_trace  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"
BF = "c10::BFloat16"


def _torch_flops(fn) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn(torch)
    return fc.get_total_flops()


def _meta(torch, *shape):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16)


@pytest.mark.parametrize("name,dims,fn", [
    ("aten::mm", [[64, 128], [128, 32]], lambda T: T.mm(_meta(T, 64, 128), _meta(T, 128, 32))),
    ("aten::addmm", [[32], [64, 128], [128, 32]], lambda T: T.addmm(_meta(T, 32), _meta(T, 64, 128), _meta(T, 128, 32))),
    ("aten::bmm", [[3, 64, 128], [3, 128, 32]], lambda T: T.bmm(_meta(T, 3, 64, 128), _meta(T, 3, 128, 32))),
    ("aten::baddbmm", [[3, 64, 32], [3, 64, 128], [3, 128, 32]],
     lambda T: T.baddbmm(_meta(T, 3, 64, 32), _meta(T, 3, 64, 128), _meta(T, 3, 128, 32))),
    ("aten::matmul", [[5, 64, 128], [128, 32]], lambda T: T.matmul(_meta(T, 5, 64, 128), _meta(T, 128, 32))),
    ("aten::linear", [[5, 64, 128], [32, 128], [32]],
     lambda T: T.nn.functional.linear(_meta(T, 5, 64, 128), _meta(T, 32, 128), _meta(T, 32))),
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 64, 32], [2, 4, 128, 32], [2, 4, 128, 32]],
     lambda T: T.ops.aten._scaled_dot_product_flash_attention(_meta(T, 2, 4, 64, 32), _meta(T, 2, 4, 128, 32),
                                                              _meta(T, 2, 4, 128, 32))),
    ("aten::_scaled_dot_product_efficient_attention", [[2, 4, 64, 32], [2, 4, 128, 32], [2, 4, 128, 32], []],
     lambda T: T.ops.aten._scaled_dot_product_efficient_attention(_meta(T, 2, 4, 64, 32), _meta(T, 2, 4, 128, 32),
                                                                  _meta(T, 2, 4, 128, 32), None, True)),
])
def test_flops_match_torch_flop_counter(name, dims, fn):
    # reference: torch.utils.flop_counter.FlopCounterMode on meta tensors (no causal mask)
    types = [BF if d else "" for d in dims]
    assert op_cost(name, dims, types).flops == _torch_flops(fn)


def test_attention_backward_causal_and_layouts_by_hand():
    # forward 4*b*h*sq*sk*d, backward twice that, causal half; _flash_attention_* take (b, s, h, d)
    b, h, s, d = 2, 8, 256, 64
    fwd = 4 * b * h * s * s * d
    bhsd, bshd = [b, h, s, d], [b, s, h, d]
    c = [""] * 8
    assert op_cost("aten::_scaled_dot_product_flash_attention", [bhsd] * 3, [BF] * 3, c).flops == fwd
    causal = ["", "", "", "0.", "True", "False", ""]
    assert op_cost("aten::_scaled_dot_product_flash_attention", [bhsd] * 3, [BF] * 3, causal).flops == fwd / 2
    assert op_cost("aten::_flash_attention_forward", [bshd] * 3, [BF] * 3).flops == fwd
    grad = op_cost("aten::_flash_attention_backward", [bshd] * 5, [BF] * 5)
    assert grad.flops == 2 * fwd and grad.bytes == 2 * (4 * b * s * h * d + 4 * b * s * h * d)
    # the flash-attn package's ops take (b, s, h, d) too; is_causal is the 6th input of the forward, the 12th of the
    # backward (after dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale)
    fa_fwd = ["", "", "", "0.", "0.125", "True", "-1", "-1", "0.", "", "False"]
    assert op_cost("flash_attn::_flash_attn_forward", [bshd] * 3 + [[]] * 8, [BF] * 3 + [""] * 8,
                   fa_fwd).flops == fwd / 2
    assert op_cost("FlashAttnFunc", [bshd] * 3 + [[]] * 8, [BF] * 3 + [""] * 8, fa_fwd).flops == fwd / 2
    fa_bwd = [""] * 9 + ["0.", "0.125", "False"]
    assert op_cost("flash_attn::_flash_attn_backward", [bshd] * 5 + [[b, h, s]] + [bshd] * 3 + [[]] * 3,
                   [BF] * 5 + ["float"] + [BF] * 3 + [""] * 3, fa_bwd).flops == 2 * fwd
    gqa = op_cost("aten::_scaled_dot_product_flash_attention", [bhsd, [b, 2, s, d], [b, 2, s, d]], [BF] * 3)
    assert gqa.flops == fwd and gqa.bytes == 2 * (2 * b * h * s * d + 2 * b * 2 * s * d)  # k, v read once


@pytest.mark.parametrize("lengths", [[64, 64, 64, 64], [200, 20, 20, 16]])
def test_variable_length_attention_counts_its_packed_sequences_as_equal_ones(lengths):
    # reference: torch.utils.flop_counter's formulas for the packed (nested/jagged) calls, given the offsets' values
    # (which the profiler never records): equal lengths match exactly; others are at least the equal-length count,
    # at most the count at the longest length (what flop_counter assumes where the offsets are not real values)
    import torch
    from torch.utils import flop_counter as fc

    h, d, n, total = 4, 32, len(lengths), sum(lengths)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    longest = max(lengths)
    packed = torch.empty(total, h, d)
    exact = fc._flash_attention_forward_flop(packed, packed, packed, offsets, offsets, longest, longest)
    at_longest = n * 4 * h * longest * longest * d
    cu = [n + 1]
    # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    fwd = op_cost("aten::_flash_attention_forward", [[total, h, d]] * 3 + [cu, cu, [], [], [], []],
                  [BF] * 3 + ["int", "int", "Scalar", "Scalar", "Scalar", "Scalar"],
                  ["", "", "", "", "", str(longest), str(longest), "0.", "False", "False"]).flops
    assert fwd == 4 * h * d * total * total / n
    assert fwd == exact if len(set(lengths)) == 1 else fwd < exact < at_longest
    # the backward twice the forward, causal half of it (flop_counter's backward counts 2.5x: the scores' recomputation
    # too, which a model's FLOPs leave out)
    grad = 0.8 * fc._flash_attention_backward_flop(packed, packed, packed, packed, packed, None, offsets, offsets,
                                                   longest, longest)
    bwd_dims = [[total, h, d]] * 5 + [[h, total], cu, cu] + [[]] * 4
    bwd_types = [BF] * 5 + ["float", "int", "int"] + ["Scalar"] * 4
    bwd = op_cost("aten::_flash_attention_backward", bwd_dims, bwd_types, [""] * 11 + ["False"]).flops
    assert bwd == 2 * fwd and (bwd == grad if len(set(lengths)) == 1 else bwd < grad)
    assert op_cost("aten::_flash_attention_backward", bwd_dims, bwd_types, [""] * 11 + ["True"]).flops == fwd
    # efficient attention packs into batch 1 of (1, total, heads, dim), its offsets after the bias
    eff = fc._efficient_attention_forward_flop(packed[None], packed[None], packed[None], None, offsets, offsets,
                                               longest, longest)
    e = op_cost("aten::_efficient_attention_forward", [[1, total, h, d]] * 3 + [[], cu, cu],
                [BF] * 3 + ["", "int", "int"]).flops
    assert e == fwd and (e == eff if len(set(lengths)) == 1 else e < eff)
    # the flash-attn package's varlen ops: (total, heads, dim), the offsets after v; causal the 10th input of the
    # forward, the 16th of the backward (after dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
    # cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale)
    fa = op_cost("flash_attn::_flash_attn_varlen_forward", [[total, h, d]] * 3 + [cu, cu] + [[]] * 5,
                 [BF] * 3 + ["int", "int"] + ["Scalar"] * 5, [""] * 9 + ["True"]).flops
    assert fa == fwd / 2
    fa_bwd = op_cost("flash_attn::_flash_attn_varlen_backward", [[total, h, d]] * 5 + [[h, total]] +
                     [[total, h, d]] * 3 + [cu, cu] + [[]] * 5, [BF] * 5 + ["float"] + [BF] * 3 + ["int"] * 2 +
                     ["Scalar"] * 5, [""] * 15 + ["False"]).flops
    assert fa_bwd == 2 * fwd
    # a dense call keeps its count: no offsets recorded ([] for None), or a batch of more than one
    dense = op_cost("aten::_efficient_attention_forward", [[2, 64, h, d]] * 3 + [[], [], []], [BF] * 3 + [""] * 3)
    assert dense.flops == 4 * 2 * 64 * h * 64 * d


def test_causal_argument_positions_follow_the_aten_schemas():
    # reference: the operator schemas of the installed PyTorch (is_causal / custom_mask_type positions)
    import torch

    for name, (qi, ki, _, ci, _, cu) in ATTENTION.items():
        if not name.startswith("aten::"):  # the flash-attn package's (not installed here): by hand below
            continue
        op = getattr(torch.ops.aten, name.split("::")[1]).default
        args = [a.name for a in op._schema.arguments]
        assert args[ci] in ("is_causal", "custom_mask_type"), name
        assert args[qi] == "query" and args[ki] == "key", name
        assert cu < 0 or args[cu] in ("cum_seq_q", "cu_seqlens_q"), name


@pytest.mark.parametrize("name,x,w,stride,padding,dilation,groups", [
    ("aten::conv2d", [2, 8, 16, 16], [16, 8, 3, 3], [2, 2], [1, 1], [1, 1], 1),
    ("aten::conv2d", [2, 8, 17, 15], [16, 4, 3, 5], [1, 2], [0, 2], [2, 1], 2),
    ("aten::conv1d", [4, 3, 50], [6, 3, 7], [3], [0], [1], 1),
    ("aten::conv3d", [1, 2, 6, 7, 8], [4, 2, 3, 3, 3], [1, 1, 1], [1, 0, 1], [1, 1, 1], 1),
])
def test_convolution_flops_match_torch_flop_counter(name, x, w, stride, padding, dilation, groups):
    # reference: FlopCounterMode on meta tensors; the recorded args as the profiler writes them (int lists as
    # concrete inputs "[2, 2]"; conv2d(input, weight, bias, stride, padding, dilation, groups))
    fn = {"aten::conv1d": "conv1d", "aten::conv2d": "conv2d", "aten::conv3d": "conv3d"}[name]
    ref = _torch_flops(lambda T: getattr(T.nn.functional, fn)(_meta(T, *x), _meta(T, *w), None, stride, padding,
                                                              dilation, groups))
    dims = [x, w, [], [], [], [], []]
    types = [BF, BF, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
    concrete = ["", "", "", str(stride), str(padding), str(dilation), str(groups)]
    c = op_cost(name, dims, types, concrete)
    assert c.kind == "conv" and c.flops == ref and c.precision == "bf16"
    # cuDNN's op takes padding before stride: the same call's args in its order
    cud = op_cost("aten::cudnn_convolution", [x, w, [], [], [], [], [], [], []], [BF, BF] + [""] * 7,
                  ["", "", str(padding), str(stride), str(dilation), str(groups), "False", "False", "True"])
    assert cud.flops == ref


@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [True, False, False]])
def test_convolution_backward_flops_match_torch_flop_counter(mask):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x, w, gy = [2, 8, 16, 16], [16, 8, 3, 3], [2, 16, 8, 8]
    with FlopCounterMode(display=False) as fc:
        torch.ops.aten.convolution_backward(_meta(torch, *gy), _meta(torch, *x), _meta(torch, *w), [16], [2, 2],
                                            [1, 1], [1, 1], False, [0, 0], 1, mask)
    dims = [gy, x, w] + [[]] * 8
    concrete = ["", "", "", "[16]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", str(mask)]
    assert op_cost("aten::convolution_backward", dims, [BF] * 3 + [""] * 8, concrete).flops == fc.get_total_flops()


def test_grouped_convolution_backward_by_hand():
    # each of the g groups computes its slice of both gradients: each gradient costs the forward's FLOPs, 2 x N x
    # Cout x Cin/g x k x output positions (FlopCounterMode's grad_weight count leaves the groups out: g times this)
    n, cin, cout, g, k, o = 4, 8, 16, 2, 3, 10
    fwd = 2 * n * cout * (cin // g) * k * k * o * o
    dims = [[n, cout, o, o], [n, cin, 20, 20], [cout, cin // g, k, k]] + [[]] * 8
    concrete = ["", "", "", "[16]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", str(g), "[True, True, True]"]
    assert op_cost("aten::convolution_backward", dims, [BF] * 3 + [""] * 8, concrete).flops == 2 * fwd
    # transposed convolutions are not modelled
    assert op_cost("aten::convolution_backward", dims, [BF] * 3 + [""] * 8,
                   concrete[:7] + ["True"] + concrete[8:]) is None


def test_convolution_argument_positions_follow_the_aten_schemas():
    import torch

    from trainperf.diagnose.roofline import CONV_BACKWARD_MASK, CONV_BACKWARD_TRANSPOSED, CONVOLUTION

    for name, (xi, wi, si, pi, di, gi, ti) in CONVOLUTION.items():
        args = [a.name for a in getattr(torch.ops.aten, name.split("::")[1]).default._schema.arguments]
        assert (args[xi] in ("input", "self"), args[wi], args[si], args[pi], args[di], args[gi]) == \
            (True, "weight", "stride", "padding", "dilation", "groups"), name
        assert ti < 0 or args[ti] == "transposed", name
    args = [a.name for a in torch.ops.aten.convolution_backward.default._schema.arguments]
    assert (args[CONV_BACKWARD_TRANSPOSED], args[CONV_BACKWARD_MASK]) == ("transposed", "output_mask")


def test_a_real_cpu_convolutions_trace_counts_torchs_flops(tmp_path):
    # a real profile of a strided, padded conv2d forward and backward on this CPU: the counted operators' FLOPs
    # (roofline's rows: what did the work, mkldnn_convolution and convolution_backward) are FlopCounterMode's
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
    x = torch.randn(4, 8, 20, 20, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        conv(x).sum().backward()
    with torch.profiler.profile(record_shapes=True) as prof:
        conv(x).sum().backward()
    prof.export_chrome_trace(str(tmp_path / "conv.json"))
    rows = [r for r in roofline(read_kineto(tmp_path / "conv.json")) if r.kind == "conv"]
    assert sum(r.flops * r.count for r in rows) == fc.get_total_flops()


def test_grouped_products_by_hand_and_on_a_real_cpu_profile(tmp_path):
    # torch._grouped_mm's four layouts (the output shapes as torch gives them on this CPU), 2 x M x K x N summed
    # over the groups: the experts' forward [M, K] rows split among [G, K, N], their weight gradients with K split
    import torch

    bf, i32 = torch.bfloat16, torch.int32
    offs = torch.tensor([16, 32, 48], dtype=i32)
    cases = [((48, 16), (3, 16, 24), offs, 2 * 48 * 16 * 24),      # [M, K] x [G, K, N] -> [M, N]
             ((16, 48), (48, 24), offs, 2 * 16 * 48 * 24),          # [M, K] x [K, N] -> [G, M, N]
             ((3, 16, 8), (3, 8, 24), None, 2 * 3 * 16 * 8 * 24),  # [G, M, K] x [G, K, N] -> [G, M, N]
             ((3, 16, 8), (8, 48), offs, 2 * 16 * 8 * 48)]          # [G, M, K] x [K, N] -> [M, N]
    for a, b, o, flops in cases:
        dims = [list(a), list(b)] + ([[3]] if o is not None else [[]]) + [[], []]
        types = [BF, BF] + (["int"] if o is not None else [""]) + ["", ""]
        assert op_cost("aten::_grouped_mm", dims, types).flops == flops, (a, b)
    a, b, _, flops = cases[0]
    x, w = torch.randn(*a, dtype=bf), torch.randn(*b, dtype=bf)
    with torch.profiler.profile(record_shapes=True) as prof:
        torch._grouped_mm(x, w, offs)
    prof.export_chrome_trace(str(tmp_path / "g.json"))
    # on the CPU the grouped product runs one aten::mm a group inside it: counted once, either way
    rows = [r for r in roofline(read_kineto(tmp_path / "g.json")) if r.kind == "gemm"]
    assert sum(r.flops * r.count for r in rows) == flops


def test_odd_recorded_args_never_give_a_negative_or_infinite_cost():
    # seeded random "Input Dims" / types / concrete inputs for every modelled product and attention: a size below 0 is
    # no tensor's shape (is_shape), so nothing priced from it; a cost is None or finite and >= 0 (before, a -1 size
    # gave negative FLOPs and bytes that a sum over operators would subtract)
    import math
    import random

    from trainperf.diagnose.roofline import CONVOLUTION, GROUPED_GEMMS

    names = [*CONVOLUTION, "aten::convolution_backward", *GROUPED_GEMMS, *ATTENTION, "aten::mm", "aten::addmm",
             "aten::linear", "aten::bmm", "aten::add", "aten::sum", "aten::native_layer_norm"]
    rnd = random.Random(0)
    sizes, kinds = [0, 1, 3, 16, -1, -8, 10**9], [BF, "float", "int", "", "Scalar", "ScalarList", "c10::Float8_e4m3fn"]
    concretes = ["", "[1, 1]", "[2, 2]", "[0, 0]", "[-1, 1]", "[1]", "True", "False", "1", "2", "[a]", "[]", "nan"]
    for _ in range(20000):
        k = rnd.randint(0, 12)
        dims = [[rnd.choice(sizes) for _ in range(rnd.randint(0, 5))] if rnd.random() < 0.6 else [] for _ in range(k)]
        c = op_cost(rnd.choice(names), dims, [rnd.choice(kinds) for _ in range(k)],
                    [rnd.choice(concretes) for _ in range(k)])
        assert c is None or (math.isfinite(c.flops) and c.flops >= 0 and math.isfinite(c.bytes) and c.bytes >= 0)


def test_memory_ops_by_hand():
    # add of two bf16 [4096, 4096]: read 2 x 32 MiB, write 32 MiB; 1 FLOP per element
    n = 4096 * 4096
    c = op_cost("aten::add", [[4096, 4096], [4096, 4096], []], [BF, BF, "Scalar"])
    assert (c.kind, c.flops, c.bytes, c.precision) == ("elementwise", n, 3 * 2 * n, "bf16")
    # in place with a broadcast bias row: read x and the row, write x
    c = op_cost("aten::add_", [[4096, 4096], [4096]], ["float", "float"])
    assert c.bytes == 4 * (n + 4096 + n)
    # a wrapped Python scalar (0-dim long tensor) counts one element
    assert op_cost("aten::mul", [[64, 128], []], ["float", "long int"]).bytes == 4 * 64 * 128 * 2 + 8
    # layer norm over rows of 1024: read x, weight, bias; write y and each row's mean and rstd (fp32: the
    # accumulation dtype); the rows from the weight's shape when normalized_shape's value was not recorded
    c = op_cost("aten::native_layer_norm", [[8, 1024], [], [1024], [1024], []], [BF, "ScalarList", BF, BF, "Scalar"])
    assert (c.kind, c.bytes, c.flops) == ("norm", 2 * (8 * 1024 * 2 + 2 * 1024) + 2 * 8 * 4, 5 * 8 * 1024)
    assert op_cost("aten::copy_", [[10, 10], [10, 10], []], [BF, "float", "Scalar"]).bytes == 100 * (2 + 4)
    assert op_cost("aten::view", [[10, 10], []], [BF, ""]) is None


def test_real_cpu_profile_args(tmp_path):
    # a real torch.profiler trace (record_shapes=True): the args as PyTorch writes them
    import torch
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    a, w, bias = torch.randn(6, 10), torch.randn(4, 10), torch.randn(4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        torch.nn.functional.linear(a, w, bias)
        torch.bmm(torch.randn(3, 6, 10), torch.randn(3, 10, 5))
    p.export_chrome_trace(str(tmp_path / "t.json"))
    got = {}
    t = read_kineto(tmp_path / "t.json")
    for s in filter(None, (op_shape(t, r) for r in range(len(t)))):
        c = op_cost(s.name, s.dims, s.types, s.concrete)
        if c is not None and c.kind in ("gemm", "attention"):
            got.setdefault(s.name, c.flops)
    fwd = 4 * 1 * 2 * 16 * 16 * 8 / 2  # causal
    assert got["aten::_scaled_dot_product_flash_attention_for_cpu"] == fwd
    assert got["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 2 * fwd
    assert got["aten::addmm"] == 2 * 6 * 10 * 4 and got["aten::linear"] == 2 * 6 * 10 * 4
    assert got["aten::bmm"] == 2 * 3 * 6 * 10 * 5


def _gpu_trace(tmp_path, device="NVIDIA H100 80GB HBM3") -> Path:
    b = TraceBuilder()
    b.cpu("aten::linear", 0, 30, **{"External id": 4, "Input Dims": [[4096, 4096], [4096, 4096], []],
                                     "Input type": [BF, BF, ""]})
    b.cpu("aten::mm", 1, 20, **{"External id": 5, "Input Dims": [[4096, 4096], [4096, 4096]],
                                 "Input type": [BF, BF]})
    b.launch("sm90_xmma_gemm_bf16bf16_bf16f32", 2, 10, 200)
    b.cpu("aten::add", 40, 10, **{"External id": 6, "Input Dims": [[4096, 4096], [4096, 4096], []],
                                   "Input type": [BF, BF, "Scalar"]})
    b.launch("vectorized_elementwise_kernel", 41, 300, 40)
    doc = b.doc()
    doc["deviceProperties"] = [{"id": 0, "name": device}]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    return tmp_path / "g.json"


def test_roofline_rows_by_hand(tmp_path):
    # H100 SXM (catalog): 989.4 dense bf16 TFLOP/s, 3.35 TB/s.
    # mm 4096^3: 2*4096^3 = 137.44 GFLOP in 200 µs -> 687.19 TFLOP/s; roof 137.44e9/989.4e12 = 138.91 µs;
    #   bytes 3 * 2 * 4096^2 = 100.66 MB -> 30.05 µs < 138.91: compute bound, 69.46 % of roof, 61.09 µs lost.
    #   The kernel is launched inside aten::mm (innermost), not counted again for aten::linear.
    # add: 100.66 MB in 40 µs -> 2.517 TB/s; roof 30.05 µs: memory bound, 75.1 %, 9.95 µs lost.
    p = _gpu_trace(tmp_path)
    rows = roofline(read_kineto(p))
    assert [r.op for r in rows] == ["aten::mm", "aten::add"]
    mm, add = rows
    assert mm.achieved_tflops == pytest.approx(687.19, abs=0.01) and mm.bound == "compute"
    assert mm.min_time_us == pytest.approx(138.91, abs=0.01) and mm.lost_us == pytest.approx(61.09, abs=0.01)
    assert mm.roofline_pct == pytest.approx(69.46, abs=0.01) and mm.intensity == pytest.approx(4096 / 3)
    assert add.achieved_tbps == pytest.approx(2.517, abs=0.001) and add.bound == "memory"
    assert add.min_time_us == pytest.approx(30.05, abs=0.01) and add.roofline_pct == pytest.approx(75.12, abs=0.01)
    assert mm.to_json()["shapes"] == "[4096, 4096] x [4096, 4096] bf16"


def test_unknown_device_gives_achieved_rates_without_a_bound(tmp_path):
    p = _gpu_trace(tmp_path, device="Some Future GPU")
    rows = roofline_for_trace(p)[0]
    assert rows[0].achieved_tflops > 0 and rows[0].bound == "" and rows[0].roofline_pct is None
    rows = roofline_for_trace(p, accelerator="h200")[0]  # the user names it
    assert rows[0].peak_tbps == 4.8 and rows[0].bound == "compute"


def test_real_a100_trace():
    # rank 0 of a 16-GPU A100 job (HTA's test data), fp32 model: most GEMMs run CUTLASS's TF32 kernels
    # (tensorop_s1688gemm: fp32 operands on tensor cores), measured against TF32's 156 TFLOP/s, one shape cuBLAS's
    # SIMT ampere_sgemm against the 19.5 TFLOP/s fp32 peak (NVIDIA's A100 datasheet); device copies near HBM
    # bandwidth, the many tiny elementwise kernels far under it.
    f = HTA / "negative_queue_length_values_check" / "rank0.json.gz"
    if not f.exists():
        pytest.skip(f"{f} absent (../shared/data not mounted)")
    rows = roofline_for_trace(f)[0]
    assert rows and all(r.peak_tbps == 2.039 for r in rows)
    gemm = [r for r in rows if r.kind == "gemm"]
    assert gemm and all(0 < r.roofline_pct <= 100 for r in gemm)
    # these skinny products (64 rows) do 19-31 FLOP a byte: above fp32's ridge (19.5 / 2.039 = 9.6), under TF32's
    # (156 / 2.039 = 76.5)
    assert all(r.bound == ("compute" if r.precision == "fp32" else "memory") for r in gemm)
    assert {(r.precision, r.peak_tflops) for r in gemm} == {("tf32", 156.0), ("fp32", 19.5)}
    assert [r.shapes for r in gemm if r.precision == "fp32"] == ["[4096, 64] x [64, 2798] fp32"]
    assert all(r.bound == "memory" for r in rows if r.kind == "elementwise")
    assert all(r.roofline_pct <= 100 for r in rows)
    assert [r.lost_us for r in rows] == sorted((r.lost_us for r in rows), reverse=True)


def test_out_argument_is_written_not_read():
    # torch.mul(a, b, out=c) records c as a third input: read a and b, write c (4 bytes each, fp32)
    n = 512 * 2862
    c = op_cost("aten::mul", [[512, 2862], [], [512, 2862]], ["float", "float", "float"])
    assert c.bytes == 4 * (n + 1 + n) and c.flops == n


def test_summary_by_kind_by_hand(tmp_path):
    # from test_roofline_rows_by_hand: add moves 100.66 MB in 40 µs on a 3.35 TB/s part -> 75.12 % of HBM;
    # mm runs 137.44 GFLOP in 200 µs against 989.4 TFLOP/s -> 69.46 % of the FLOP peak
    from trainperf.diagnose.roofline import rank_roofline

    s = rank_roofline(read_kineto(_gpu_trace(tmp_path)))
    assert s.accelerator == "h100-sxm"
    assert s.by_kind["elementwise"]["hbm_pct"] == pytest.approx(75.12, abs=0.01)
    assert s.by_kind["gemm"]["tflops_pct"] == pytest.approx(69.46, abs=0.01)
    assert s.by_kind["gemm"]["roofline_pct"] == pytest.approx(69.46, abs=0.01)
    assert s.to_json()["rows"][0]["op"] == "aten::mm"


def test_calibrated_peaks_by_hand(tmp_path):
    # a `trainperf calibrate` profile of the same H100 measured 700 TFLOP/s bf16 GEMMs and 2.8 TB/s copies:
    # mm 137.44 GFLOP / 700e12 = 196.34 µs at the roof of 200 µs -> 98.17 %, 3.66 µs lost;
    # add 100.66 MB / 2.8e12 = 35.95 µs of 40 µs -> 89.88 %
    from trainperf.diagnose.roofline import calibrated_accelerator

    profile = {"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
               "efficiency": {"measured_gemm_tflops": 700.0, "measured_hbm_tbps": 2.8, "source": "test"}}
    (tmp_path / "cal.json").write_text(json.dumps(profile))
    rows = {r.op: r for r in roofline_for_trace(_gpu_trace(tmp_path), calibration=tmp_path / "cal.json")[0]}
    assert rows["aten::mm"].peak_tflops == 700.0 and rows["aten::mm"].peak_tbps == 2.8
    assert rows["aten::mm"].roofline_pct == pytest.approx(98.17, abs=0.01)
    assert rows["aten::mm"].lost_us == pytest.approx(3.66, abs=0.01)
    assert rows["aten::add"].roofline_pct == pytest.approx(89.88, abs=0.01)
    acc = calibrated_accelerator(profile)
    assert acc.name == "h100-sxm (calibrated)" and acc.fp8_tflops == 1978.9  # fp8 keeps the catalog's peak
    cpu = calibrated_accelerator({"device": "cpu (x86_64, 2 threads)", "dtype": "float32",
                                  "efficiency": {"measured_gemm_tflops": 0.1, "measured_hbm_tbps": 0.01}})
    assert cpu.peak_flops("fp32") == 0.1e12 and cpu.bf16_tflops == 0.0 and cpu.hbm_tbps == 0.01
    from trainperf.errors import TrainperfError

    with pytest.raises(TrainperfError, match="calibrate"):
        calibrated_accelerator({"device": "x", "dtype": "int8", "efficiency": {}})


def test_roofline_verb_json(tmp_path):
    # `trainperf roofline` prints the rows worked by hand above (mm first: most time lost) and, with a
    # calibration, measures against its peaks; the traces are loaded once for both analyses
    from typer.testing import CliRunner

    from trainperf.cli import app

    p = _gpu_trace(tmp_path)
    r = CliRunner().invoke(app, ["roofline", str(p), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["accelerator"] == "h100-sxm" and doc["collectives"] == []
    mm = doc["ranks"]["0"]["rows"][0]
    assert mm["op"] == "aten::mm" and mm["roofline_pct"] == pytest.approx(69.46, abs=0.01)
    (tmp_path / "cal.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "efficiency": {
        "measured_gemm_tflops": 700.0, "measured_hbm_tbps": 2.8}}))
    r = CliRunner().invoke(app, ["roofline", str(p), "--calibration", str(tmp_path / "cal.json"), "--json-out",
                                 str(tmp_path / "out.json")])
    assert r.exit_code == 0, r.output
    assert "h100-sxm (calibrated)" in r.output and "aten::mm" in r.output
    doc = json.loads((tmp_path / "out.json").read_text())
    rows = {r["op"]: r for r in doc["ranks"]["0"]["rows"]}
    assert rows["aten::mm"]["roofline_pct"] == pytest.approx(98.17, abs=0.01)
