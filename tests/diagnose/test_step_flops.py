"""The FLOPs of a step read from the recorded shapes, and the share of the peak they reach (diagnose/step_flops.py).

References: the model's FLOPs worked out from its dimensions (trainperf.specs: 6ND plus attention, recompute's
extra forward), against a real run of the reference trainer on this CPU; on a hand-built GPU trace, 2mnk a product
over the published H100 bf16 dense peak (989.4 TFLOP/s, NVIDIA's H100 SXM datasheet), worked by hand."""

import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import K_US, N, P, STEPS, end_gpu_bound_step, gpu_bound_trace, queued_ops, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.diff import diff, work_change_text  # noqa: E402
from trainperf.diagnose.render import flops_line  # noqa: E402
from trainperf.hardware import get_accelerator  # noqa: E402
from trainperf.report.diagnose import write_report  # noqa: E402
from trainperf.specs import hardware_flops_per_token, load_model, model_flops_per_token  # noqa: E402

BF = "c10::BFloat16"
GEMM_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85029158912}


def _diagnose(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diagnose(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two profiled runs of the tiny model on this CPU (~5 CPU-s each): "big", 2 micro-batches of 2 sequences a
    step with every layer recomputed in the backward; "small", one sequence a step."""
    from trainperf.train.trainer import TrainConfig, train

    tmp = tmp_path_factory.mktemp("flops")
    for name, layout in (("big", "recompute=full,mbs=2,ga=2"), ("small", "mbs=1")):
        train(TrainConfig(model="tiny", steps=4, out=str(tmp / name), progress=False, record=False,
                          peak_tflops=1.0, layout=layout, profile_steps="2:4", device="cpu"))
    return tmp


@pytest.mark.slow
def test_a_real_runs_flops_per_step_are_the_models_recompute_included(runs):
    # what ran is the model's 6ND and attention plus a second forward of each layer (the output head is not
    # recomputed)
    run = json.loads((runs / "big" / "run.json").read_text())
    m, tokens = load_model("tiny"), run["tokens_per_step"]
    assert tokens == 2 * 2 * m.seq_len
    r = _diagnose(runs / "big" / "traces").ranks[0]
    assert r.flops_per_step == pytest.approx(hardware_flops_per_token(m, "full") * tokens, rel=1e-9)
    assert r.flops_per_step > 1.3 * model_flops_per_token(m) * tokens  # the recomputed forwards are in it
    assert r.flops_covered_pct is None and r.flops_utilisation_pct is None  # a CPU run: no kernels, no catalog peak
    assert r.achieved_tflops > 0 and r.flops_precision == "fp32"


@pytest.mark.slow
def test_diff_says_when_the_two_sides_do_different_work(runs):
    m = load_model("tiny")
    small, big = model_flops_per_token(m) * m.seq_len, hardware_flops_per_token(m, "full") * 4 * m.seq_len
    d = diff(runs / "small" / "traces", runs / "big" / "traces")
    j = d.to_json()
    assert j["baseline"]["flops_per_step"] == pytest.approx(small, rel=1e-9)
    assert j["candidate"]["flops_per_step"] == pytest.approx(big, rel=1e-9)
    note = next(n for n in j["notes"] if "different work" in n)
    per_flop = 100 * (small / big * d.candidate.median_us / d.baseline.median_us - 1)  # time per FLOP, candidate's
    assert f"{100 * (big / small - 1):+.1f} %" in note
    assert f"{abs(per_flop):.1f} % {'slower' if per_flop > 0 else 'faster'}" in note
    assert f"({100 * (big / small - 1):+.1f} %)" in work_change_text(d.baseline, d.candidate)
    # the headline says it too: a step that does 5.3x the work is compared per FLOP beside per step
    assert f"per step but {abs(per_flop):.1f}% {'slower' if per_flop > 0 else 'faster'} per FLOP" in d.headline()
    same = diff(runs / "small" / "traces", runs / "small" / "traces")
    assert not any("different work" in n for n in same.notes)
    assert "(+0.0 %)" in work_change_text(same.baseline, same.candidate) and "per FLOP" not in same.headline()


def test_utilisation_of_a_gpu_bound_loop_by_hand(tmp_path):
    # STEPS steps of N bf16 2048^3 products, each kernel K_US long; the window (the last step left out) runs from
    # the first kernel's start to the last analysed one's end
    n = 2048
    shapes = {"Input Dims": [[n, n], [n, n]], "Input type": [BF, BF]}
    d = _diagnose(gpu_bound_trace(tmp_path, op="aten::mm", kernel=GEMM_KERNEL, device=H100, op_args=shapes))
    r = d.ranks[0]
    steps = STEPS - 1
    window_us = (steps - 1) * P + N * K_US
    flop = 2.0 * n ** 3
    peak = 989.4e12
    assert get_accelerator("h100").peak_flops("bf16") == pytest.approx(peak, rel=0.01)
    assert r.window_us == pytest.approx(window_us)
    assert r.flops_per_step == pytest.approx(N * flop)
    assert r.achieved_tflops == pytest.approx(steps * N * flop / window_us / 1e6, rel=1e-3)
    assert r.flops_utilisation_pct == pytest.approx(100 * steps * N * flop / peak / (window_us / 1e6), rel=0.01)
    assert r.flops_covered_pct == pytest.approx(100.0) and r.flops_precision == "bf16" and r.flops_lower_bound == ""
    line = flops_line(d)
    assert f"{r.flops_utilisation_pct:.1f} % of the bf16 peak" in line and "lower bound" not in line
    assert "17.18 GFLOP" not in line and "171.8 GFLOP a step" in line  # N x 17.18 GFLOP
    html = write_report(d, tmp_path / "r.html").read_text()
    assert "FLOPs of matrix products, convolutions and attention" in html


def test_products_without_shapes_make_the_figures_a_lower_bound(tmp_path):
    # each step: a product with its shapes recorded and one without (a compiled region's kernel), equally long
    n = 1024
    b = TraceBuilder()
    for s in range(4):
        T = s * 1000.0
        b.step(s, T, 1000.0)
        end = queued_ops(b, T, [("aten::mm", {"Input Dims": [[n, n], [n, n]], "Input type": [BF, BF]}, GEMM_KERNEL,
                                 100.0),
                                ("Torch-Compiled Region: 0/0", {}, GEMM_KERNEL, 100.0)], at=T + 20.0)
        end_gpu_bound_step(b, T, 1000.0, end)
    d = _diagnose(write_trace(b, tmp_path))
    r = d.ranks[0]
    assert r.flops_covered_pct == pytest.approx(50.0)
    assert r.flops_per_step == pytest.approx(2.0 * n ** 3)
    assert "a lower bound" in flops_line(d) and "50 %" in flops_line(d)


def test_no_line_without_recorded_shapes(tmp_path):
    d = _diagnose(gpu_bound_trace(tmp_path, op="aten::mm", kernel=GEMM_KERNEL, device=H100))
    assert d.ranks[0].flops_per_step is None and d.ranks[0].achieved_tflops is None and flops_line(d) == ""
    assert d.to_json()["ranks"][0]["flops_utilisation_pct"] is None


@pytest.mark.parametrize("kernel,precision,peak", [
    # cuBLAS's fp32 SIMT kernel: the A100's fp32 peak, 19.5 TFLOP/s (NVIDIA's A100 datasheet)
    ("ampere_sgemm_128x64_nn", "fp32", 19.5e12),
    # CUTLASS's fp32 operands on tensor cores (1688: the TF32 mma): the A100's dense TF32 peak, 156 TFLOP/s
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "tf32", 156e12),
])
def test_fp32_products_on_tensor_cores_are_measured_against_tf32s_peak(tmp_path, kernel, precision, peak):
    n = 1024
    shapes = {"Input Dims": [[n, n], [n, n]], "Input type": ["float", "float"]}
    a100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108, "totalGlobalMem": 85899345920}
    r = _diagnose(gpu_bound_trace(tmp_path, op="aten::mm", kernel=kernel, device=a100, op_args=shapes)).ranks[0]
    steps, window_us = STEPS - 1, (STEPS - 2) * P + N * K_US
    assert r.flops_precision == precision
    assert r.flops_utilisation_pct == pytest.approx(100 * steps * N * 2.0 * n ** 3 / peak / (window_us / 1e6),
                                                    rel=0.01)


def test_a_sampled_trace_counts_a_lower_bound():
    # HTA's trace_filter: 2 of 128 ranks of an A100 job, 1 runtime call in 73 kept (evidence.is_sampled): the
    # operators it lost did work too
    folder = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta" / "trace_filter"
    if not folder.is_dir():
        pytest.skip(f"{folder} absent (../shared/data not mounted)")
    d = _diagnose(folder)
    assert all(r.flops_per_step > 0 and "sampled or filtered" in r.flops_lower_bound for r in d.ranks)
    assert "a lower bound: the trace is sampled" in flops_line(d)
