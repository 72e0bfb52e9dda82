"""The kernel bench's traffic model (trainperf.bench.roofline) worked by hand, and checked against the
per-operator roofline of diagnose on the same eager calls (benchmarks/roofline_vs_bench.py)."""

import importlib.util
from pathlib import Path

import pytest

from trainperf.bench import roofline

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "roofline_vs_bench.py"


def test_norm_backward_bytes_by_hand():
    # LayerNorm fwd+bwd, 8 x 96 bf16 (2 B), weight and bias [96] bf16, fp32 statistics:
    # fwd: read x, write y (2 x 8*96*2), read weight and bias (2 x 96*2), write mean and rstd (2 x 8*4)
    # bwd: read dy and x, write dx (3 x 8*96*2), read weight (96*2; bias is not needed: dbias = sum dy),
    #      read mean and rstd (2 x 8*4), write dweight and dbias in the weight's dtype (2 x 96*2)
    fwd = 2 * 8 * 96 * 2 + 2 * 96 * 2 + 2 * 8 * 4
    bwd = 3 * 8 * 96 * 2 + 96 * 2 + 2 * 8 * 4 + 2 * 96 * 2
    assert roofline.row_kernel_work("layer_norm", 8, 96, 2, "fwd").bytes == fwd == 3520
    assert roofline.row_kernel_work("layer_norm", 8, 96, 2, "fwd+bwd").bytes == fwd + bwd == 3520 + 5248
    # RMSNorm bwd: read dy, x, weight, rstd; write dx, dweight (bf16)
    assert roofline.row_kernel_work("rms_norm", 8, 96, 2, "fwd+bwd").bytes == \
        (2 * 8 * 96 * 2 + 96 * 2 + 8 * 4) + (3 * 8 * 96 * 2 + 96 * 2 + 8 * 4 + 96 * 2)


def test_linear_cross_entropy_reads_the_targets():
    # 64 rows, hidden 64, vocab 1000, fp32: hidden 64*64*4 + weight 1000*64*4 + 64 int64 targets;
    # fwd+bwd also writes both gradients (the targets are read once, as cross_entropy_work counts them)
    io = (64 * 64 + 1000 * 64) * 4
    assert roofline.linear_cross_entropy_work(64, 64, 1000, 4, "fwd").bytes == io + 64 * 8 == 272_896
    assert roofline.linear_cross_entropy_work(64, 64, 1000, 4, "fwd+bwd").bytes == 2 * io + 64 * 8


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("roofline_vs_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kernel,passname,hand", [
    # one ATen operator is the whole eager kernel in fp32 (no casts): both models must count the same bytes.
    # layer_norm 8 x 96 fp32: fwd 2*768*4 + 2*96*4 + 2*8*4; bwd 3*768*4 + 96*4 + 2*8*4 + 2*96*4
    ("layer_norm", "fwd", 6976), ("layer_norm", "fwd+bwd", 6976 + 10432),
    # softmax 8 x 96 fp32: read x, write y; bwd read y, dy, write dx
    ("softmax", "fwd", 2 * 768 * 4), ("softmax", "fwd+bwd", 5 * 768 * 4),
])
def test_bench_and_diagnose_agree_where_eager_is_one_operator(script, tmp_path, kernel, passname, hand):
    import torch

    from trainperf.bench.cases import build_case

    bench = build_case(kernel, (8, 96), torch.float32, torch.device("cpu"), ()).work[passname]
    diag, rows = script.profile_case(kernel, (8, 96), "fp32", "cpu", passname, 2, tmp_path)
    assert bench.bytes == hand and diag["bytes"] == hand
    assert all(r.count == 2 for r in rows) and diag["time_us"] > 0


def test_eager_excess_is_what_eager_materialises(script, tmp_path):
    # cross_entropy fwd, 8 x 96 fp32 logits: bench counts one read of the logits and the targets
    # (8*96*4 + 8*8); eager's _log_softmax reads them and writes the log-probabilities (2 x 8*96*4) before
    # nll_loss gathers 8 of them: diagnose's bytes are about twice the fused minimum
    diag, rows = script.profile_case("cross_entropy", (8, 96), "fp32", "cpu", "fwd", 2, tmp_path)
    logsm = next(r for r in rows if r.op == "aten::_log_softmax")
    assert logsm.bytes == 2 * 8 * 96 * 4
    assert roofline.cross_entropy_work(8, 96, 4, "fwd").bytes == 8 * 96 * 4 + 8 * 8
    assert diag["bytes"] / (8 * 96 * 4 + 8 * 8) == pytest.approx(2.0, abs=0.05)
