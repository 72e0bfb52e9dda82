"""fp32_matmul and the kernel-precision classifier (diagnose/precision.py).

References: the libraries' own naming (cuBLAS/cuDNN/CUTLASS/Tensile names, cited in precision.py), HTA's real
V100 trace ns_resolution_trace (fp32 volta_sgemm_* and scudnn kernels, GPU-bound: the expert audit's reading in
h10's table, P13), HTA's real A100 trace nccl_parser_config (TF32 cutlass tensorop_s1688 kernels: no finding),
and a hand-built GPU-bound trace whose what-if is worked by hand (below).
"""

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import K_US, N, STEPS  # noqa: E402
from gpu_bound import P as PERIOD  # noqa: E402
from gpu_bound import gpu_bound_trace  # noqa: E402

from trainperf.diagnose import precision as P  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.hardware import get_accelerator  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

HTA = Path("/work/shared/data/traces/hta")

# (kernel name as the profiler records it, precision) - one or more per naming family
NAMES = [
    # cuBLAS SIMT: BLAS type letter s/c = single, d/z = double
    ("volta_sgemm_128x64_nn", P.FP32), ("ampere_sgemm_32x32_sliced1x4_tn", P.FP32),
    ("ampere_gcgemm_64x64_nt", P.FP32), ("maxwell_sgemm_128x64_nt", P.FP32), ("volta_dgemm_64x64_nn", P.FP64),
    # cuBLAS tensor-core kernels: 16-bit types or HMMA shapes
    ("volta_h884gemm_64x128_ldg8_nn", P.REDUCED), ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", P.REDUCED),
    ("turing_h1688gemm_256x128_ldg8_tn", P.REDUCED), ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", P.REDUCED),
    ("ampere_fp16_s16816gemm_fp16_64x64_sliced1x2_ldg8_relu_f2f_stages_64x6_tn", P.REDUCED),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     P.REDUCED),
    # xmma with TF32 math on fp32 data, and with fp32 math
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", P.TF32),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4", P.FP32),
    # CUTLASS: tensorop with fp32 operands runs TF32 (cutlass#466); simt is CUDA cores
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
     "256x64_16x4_nn_align4::Params)", P.TF32),
    ("cutlass_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", P.TF32),
    ("cutlass_80_tensorop_f16_s16816gemm_relu_f16_128x128_32x4_tn_align8", P.REDUCED),
    ("cutlass_simt_sgemm_128x128_8x2_nn_align1", P.FP32),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemm"
     "MultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEENS_10tfloat32_tENS_9transform", P.TF32),
    # cuDNN: scudnn = single, hcudnn = half, templated engines on their element type
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", P.FP32), ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1",
                                                                    P.FP32),
    ("turing_hcudnn_128x128_relu_small_nn_v1", P.REDUCED),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)", P.FP32),
    ("void wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*)", P.FP32),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::Params)", P.FP32),
    ("implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>", P.FP32),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false>(float)", P.FP32),
    ("void cudnn::detail::dgrad_engine<__half, 512, 6, 5, 3, 3, 3, false>(int)", P.REDUCED),
    # rocBLAS / hipBLASLt (Tensile): the type code's first letter is the input type
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_MI32x32x2x1_SN_1LDSB0_APM1", P.FP32),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", P.FP32),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB1", P.REDUCED),
    ("Cijk_Ailk_Bljk_BBS_BH_MT256x128x64_MI32x32x8x1_SN", P.REDUCED), ("Cijk_Ailk_Bljk_DB_MT64x64x4_SN", P.FP64),
    ("Cijk_Ailk_Bljk_4xi8II_BH_MT128x128x64_SN", P.REDUCED),
    ("Cijk_Alik_Bljk_S_B_UserArgs_MT128x64x16_SN_LDSB0_AFC0", P.FP32),  # hipBLASLt, compute f32_r
    ("Cijk_Ailk_Bjlk_S_MX_B_Bias_HA_S_SAV_UserArgs_MT32x64x64_MI32x32x1_SN_LDSB0", P.TF32),  # compute xf32_r
    ("Custom_Cijk_Ailk_Bljk_S_MX_B_BIAS_HA_S_SAV_NTD_SK3_UserArgs_MT256x256x32_MI16x16x1_shortname0_gfx950", P.TF32),
    # names that state no type: unknown, never guessed
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNN", P.UNKNOWN), ("triton_tem_fused_mm_0", P.UNKNOWN),
    ("void cask_cudnn_infer::computeOffsetsKernel<false, false>(cask_cudnn_infer::ComputeOffsetsParams)", P.UNKNOWN),
]


@pytest.mark.parametrize("name,want", NAMES)
def test_classify_kernel_by_library_naming(name, want):
    assert P.classify_kernel(name) == want


def test_dtype_decides_only_what_the_device_allows():
    assert P.dtype_precision(["c10::BFloat16", "c10::BFloat16"]) == P.REDUCED
    assert P.dtype_precision(["c10::Half", "float"]) == P.REDUCED
    assert P.dtype_precision(["float", "float"], tf32_possible=False) == P.FP32  # V100: no TF32 exists
    assert P.dtype_precision(["float", "float"], tf32_possible=True) == P.UNKNOWN  # A100: fp32 or TF32
    assert P.dtype_precision(["long int", "Scalar"]) == P.UNKNOWN and P.dtype_precision([]) == P.UNKNOWN


def test_precision_split_sums_by_precision_and_uses_dtype_only_for_unknown_names():
    names = ["volta_sgemm_128x64_nn", "triton_tem_fused_mm_0", "triton_tem_fused_mm_0", "volta_h884gemm_64x128_nn",
             "nvjet_x"]
    dur = [30.0, 20.0, 5.0, 40.0, 7.0]
    dtypes = [["c10::Half"], ["float"], ["c10::BFloat16"], None, None]  # the sgemm's dtype is ignored: its name decides
    s = P.precision_split(names, dur, [0.0, 1.0, 2.0, 3.0, 4.0], dtypes, tf32_possible=False)
    assert s.time_us == {P.FP32: 50.0, P.TF32: 0.0, P.REDUCED: 45.0, P.FP64: 0.0, P.UNKNOWN: 7.0}
    assert s.by_dtype_us == 25.0 and s.fp32_share == pytest.approx(50.0 / 102.0)
    assert [n for n, _, _ in s.top_fp32] == ["volta_sgemm_128x64_nn", "triton_tem_fused_mm_0"]


# --- a hand-built GPU-bound trace, the what-if worked by hand ------------------------------------------------
# Each 2000-us step launches N aten::mm (10 us apart, launch 2 us into the op, kernel queued 5 us after its
# launch), then cudaDeviceSynchronize at +100 us (tests/diagnose/gpu_bound.py). On an
# A100-40GB (catalog: bf16 312, fp32 19.5 TFLOP/s, gemm_eff 0.83) an fp32 sgemm is sped up 16 x 0.83 = 13.28x:
# 80 us -> 6.024 us. Measured: the kernels run back to back from +7 us, the last ends at +807, the sync returns
# at +812. Fixed: each kernel ends before the next launch; the last starts at its launch + 5 = +97 and the sync
# returns 5 us after it ends: +102 + 6.024 us. The Python after it until the step's end takes as long as before.


def _trace(path: Path, kernel: str, device: str = "NVIDIA A100-SXM4-40GB", major: int = 8,
           dtype: str | None = None) -> Path:
    args = {"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": [dtype, dtype]} if dtype else None
    return gpu_bound_trace(path, op="aten::mm", kernel=kernel, op_args=args,
                           device={"id": 0, "name": device, "computeMajor": major, "computeMinor": 0})


def _facts(path):
    t = next(iter(load_trace(path, ranks=None).values()))
    return collect_facts(t, analysis_window(t))


def test_fp32_gemms_on_a100_are_priced_at_the_ratio_of_peaks(tmp_path):
    f = _facts(_trace(tmp_path, "ampere_sgemm_128x64_nn"))
    x = P.fp32_matmul(f)
    assert x is not None and x.kind == "fp32_matmul" and x.gain_is_upper_bound and x.confidence == "medium"
    a100 = get_accelerator("a100-40gb")
    s = a100.bf16_tflops / a100.fp32_tflops * a100.gemm_eff
    assert x.evidence["metrics"]["speedup"]["value"] == pytest.approx(s, abs=1e-3)
    n = len(f.steps)
    assert n == STEPS - 1
    span = n * PERIOD  # the analysed steps, each closed by its Python after the sync, which no fix moves
    gain = n * ((7.0 + K_US * N + 5.0) - (102.0 + K_US / s))
    assert f.gain(x.changes)[0] == pytest.approx(100.0 * gain / span, abs=0.01)
    assert x.evidence["metrics"]["fp32_share_of_gemm_conv"]["value"] == pytest.approx(100.0)
    assert "torch.autocast" in x.recommendation and "allow_tf32" in x.recommendation


def test_fp32_gemms_with_recorded_shapes_are_priced_by_their_shapes(tmp_path):
    # the same trace with record_shapes: each aten::mm is 1024 x 1024 x 1024 in fp32. In bf16 on an A100-40GB the
    # planner's time (plan.compute.gemm_rate_flops) is 2 x 1024^3 FLOPs at 312 TFLOP/s x 0.83 (gemm_eff_max) x
    # (1024 / (1024 + 96))^3 (gemm_dim_half 96) = 10.851 us, compute-bound (half the fp32 bytes, 6.29 MB at
    # 1.555 TB/s x 0.7, take 5.78 us), plus the kernel's fixed cost: the trace's shortest kernel (80 us) capped at
    # 5 us. 15.851 us per kernel, so an estimate, not an upper bound, and no faster than that.
    path = _trace(tmp_path, "ampere_sgemm_128x64_nn", dtype="float")
    f = _facts(path)
    x = P.fp32_matmul(f)
    assert x is not None and not x.gain_is_upper_bound
    model_us = 2 * 1024 ** 3 / (312e12 * 0.83 * (1024 / 1120) ** 3) * 1e6 + 5.0
    n = len(f.steps)
    m = x.evidence["metrics"]
    assert m["model_time"]["value"] == pytest.approx(n * N * model_us, rel=1e-4)
    assert m["speedup"]["value"] == pytest.approx(K_US / model_us, rel=1e-4)
    assert m["priced_by_shapes"]["value"] == pytest.approx(100.0)
    # fixed: 15.85-us kernels, launched 10 us apart, run back to back from +7 us; the sync returns 5 us after the
    # last ends
    gain = n * ((7.0 + K_US * N + 5.0) - (7.0 + N * model_us + 5.0))
    assert f.gain(x.changes)[0] == pytest.approx(100.0 * gain / (n * PERIOD), abs=0.01)
    assert any("recorded shapes" in note for note in x.notes)
    # measured, not a bound: its severity is its gain's (32 % here: high), not a level lower
    found = next(y for y in diagnose(path).findings if y.kind == "fp32_matmul")
    assert found.severity == "high" and found.gain_pct == pytest.approx(100.0 * gain / (n * PERIOD), abs=0.01)


def test_fp32_gemms_whose_shapes_are_mostly_unrecorded_keep_the_upper_bound(tmp_path):
    # shapes on none of the fp32 time (a bf16 dtype recorded for sgemm kernels: no fp32 call): the ratio of peaks
    f = _facts(_trace(tmp_path, "ampere_sgemm_128x64_nn", dtype="c10::BFloat16"))
    x = P.fp32_matmul(f)
    assert x is not None and x.gain_is_upper_bound and "priced_by_shapes" not in x.evidence["metrics"]


@pytest.mark.parametrize("kernel", ["ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn",
                                    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>()"])
def test_bf16_and_tf32_gemms_give_no_finding(tmp_path, kernel):
    assert P.fp32_matmul(_facts(_trace(tmp_path, kernel))) is None


def test_unnamed_kernels_follow_the_recorded_dtype_where_the_device_decides(tmp_path):
    # a Triton GEMM on fp32 data: on an A100 it may run TF32 (unknown, no finding); bf16 data is reduced
    for dtype in ("float", "c10::BFloat16"):
        (tmp_path / dtype).mkdir()
        assert P.fp32_matmul(_facts(_trace(tmp_path / dtype, "triton_tem_fused_mm_0", dtype=dtype))) is None
    # on a V100 (computeMajor 7: no TF32) fp32 data is fp32 math
    (tmp_path / "v100").mkdir()
    x = P.fp32_matmul(_facts(_trace(tmp_path / "v100", "triton_tem_fused_mm_0", "Tesla V100-SXM2-32GB", 7, "float")))
    assert x is not None and x.evidence["metrics"]["decided_by_dtype"]["value"] == pytest.approx(N * (STEPS - 1) * K_US)


def test_no_tensor_cores_no_finding(tmp_path):
    # Pascal (computeMajor 6, not in the catalog): fp32 is the fastest math it has
    assert P.fp32_matmul(_facts(_trace(tmp_path, "maxwell_sgemm_128x64_nn", "Quadro GP100", 6))) is None


# --- real traces -----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not (HTA / "ns_resolution_trace").exists(), reason="HTA traces not present")
def test_real_v100_fp32_resnet_gives_the_finding():
    f = _facts(HTA / "ns_resolution_trace")
    x = P.fp32_matmul(f)
    assert x is not None and x.kind == "fp32_matmul"
    m = x.evidence["metrics"]
    # the audit's reading: fp32 volta_sgemm_* and scudnn convolutions, nearly all GEMM/conv time (the rest:
    # cuDNN's cask offset kernels, which state no type), most of the GPU-bound step
    assert m["fp32_share_of_gemm_conv"]["value"] > 99.0 and m["fp32_gemm_conv_share"]["value"] > 50.0
    top = [e["name"] for e in x.evidence["events"]]
    assert any("volta_sgemm" in n for n in top) and any("engine<float" in n or "scudnn" in n for n in top)
    if P.precision_lever(f.table).speedup > 0:  # once the catalog has a Volta part
        assert x.changes and x.gain_is_upper_bound
    else:
        assert x.severity == "low" and x.what_if.startswith("not priced")


@pytest.mark.skipif(not (HTA / "nccl_parser_config").exists(), reason="HTA traces not present")
def test_real_a100_tf32_trace_gives_no_finding():
    f = _facts(HTA / "nccl_parser_config")
    s = P.gemm_precision(f.table, f.window.device, f.window.ts_us, f.window.end_us)
    assert s.time_us[P.TF32] > 0.8 * s.total_us  # cutlass tensorop_s1688 / xmma tf32 kernels
    assert P.fp32_matmul(f) is None


@pytest.mark.parametrize("device, major, minor, ratio", [
    ("NVIDIA TITAN V", 7, 0, 8.0),              # Volta as the V100: 125 / 15.7 TFLOP/s (V100 datasheet)
    ("Quadro RTX 8000", 7, 5, 8.0),             # Turing as the T4: 65 / 8.1
    ("NVIDIA RTX A5000", 8, 6, 4.0),            # GA10x as the A10: 125 / 31.2
    ("NVIDIA GeForce RTX 3080", 8, 6, 2.0),     # as the RTX 3090, 71 / 35.6: fp32-accumulate at half rate
    ("NVIDIA L40", 8, 9, 4.0),                  # Ada as the L4: 121 / 30.3
])
def test_a_part_the_catalog_lacks_is_priced_by_its_architecture(tmp_path, device, major, minor, ratio):
    path = gpu_bound_trace(tmp_path, op="aten::mm", kernel="volta_sgemm_128x64_nn",
                           device={"id": 0, "name": device, "computeMajor": major, "computeMinor": minor})
    f = _facts(path)
    lever = P.precision_lever(f.table)
    assert lever.peak_ratio == ratio and lever.speedup == pytest.approx(ratio * P.ARCH_GEMM_EFF)
    x = P.fp32_matmul(f)
    assert x is not None and x.changes and x.gain_is_upper_bound and "by architecture" in x.what_if


def test_a_catalog_part_is_priced_by_its_datasheet(tmp_path):
    # V100 SXM2 datasheet: 125 TFLOP/s fp16 tensor over 15.7 fp32, at the catalog's GEMM efficiency 0.72
    path = gpu_bound_trace(tmp_path, op="aten::mm", kernel="volta_sgemm_128x64_nn",
                           device={"id": 0, "name": "Tesla V100-SXM2-32GB", "computeMajor": 7, "computeMinor": 0})
    lever = P.precision_lever(_facts(path).table)
    assert lever.accelerator == "v100-sxm2" and lever.speedup == pytest.approx(125 / 15.7 * 0.72)


H200_FP32 = Path(__file__).resolve().parents[1] / "data" / "h200_faults" / "fp32_matmul-high-h200"


def test_real_h200_fp32_loop_priced_by_its_shapes_lands_between_the_measured_fixes(tmp_path):
    # the run's GEMMs are all 8192 x 8192 x 8192 (benchmarks/gpu_diagnose_faults.py: 4 Linear(8192, 8192) blocks over
    # 8192 tokens in fp32), written on its operators as record_shapes would have (the run profiled without it).
    # Measured in the same run: TF32 matmuls 80.1 % faster, the loop in bf16 90.4 % (labels.json)
    w = 8192
    shapes = {"aten::addmm": ([[w], [w, w], [w, w], [], []], ["float", "float", "float", "Scalar", "Scalar"]),
              "aten::mm": ([[w, w], [w, w]], ["float", "float"]),
              "aten::linear": ([[w, w], [w, w], [w]], ["float", "float", "float"])}
    doc = json.loads(gzip.decompress((H200_FP32 / "traces" / "rank0.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] in shapes:
            e.setdefault("args", {}).update({"Input Dims": shapes[e["name"]][0], "Input type": shapes[e["name"]][1]})
    (tmp_path / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    labels = json.loads((H200_FP32 / "labels.json").read_text())
    top = diagnose(tmp_path).findings[0]
    assert top.kind == "fp32_matmul" and not top.gain_is_upper_bound and top.severity == "high"
    assert labels["true_gain_pct"] < top.gain_pct < max(labels["other_fixes"].values())
