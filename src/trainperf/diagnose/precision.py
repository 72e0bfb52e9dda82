"""The math precision of GEMM and convolution kernels, and the `fp32_matmul` finding.

On a tensor-core accelerator the largest lever of a GPU-bound step is often the precision of its matrix work:
fp32 GEMMs and convolutions run on the fp32 pipe (CUDA cores) at 1/8 to 1/16 of the bf16/fp16 tensor-core peak
(V100 15.7 vs 125 TFLOP/s, A100 19.5 vs 312, H100 66.9 vs 989). `classify_kernel` reads the precision a kernel
computes in from its name, as the libraries name their kernels; `gemm_precision` sums one rank's GEMM/conv
device time (trace.categories: GEMM, which includes convolutions) by precision, using the recorded dtype of
the launching operator (record_shapes' "Input type") where the name says nothing; `fp32_matmul` is the rule.

Precisions: "fp32" (fp32 math without tensor cores, or TF32 off), "tf32" (fp32 data on tensor cores: TF32,
AMD xf32), "reduced" (fp16, bf16, fp8, int8 on tensor/matrix cores), "fp64", "unknown" (the name and the
dtype do not say: counted as unknown, never guessed).

How kernels are named (sources in brackets; first matching rule wins, module-level regexes below):
- Explicit reduced types in the name: bf16, fp16/f16, half, e4m3/e5m2/fp8, int8/i8 [CUTLASS functionality.md:
  "bf16 - bfloat16, tf32 - tfloat32, f16 ..."; cuBLAS names such as ampere_bf16_s16816gemm_bf16_*,
  ampere_fp16_s16816gemm_fp16_* (NVIDIA/cutlass#1025); xmma names sm80_xmma_gemm_bf16bf16_bf16f32_f32_*].
  Tensor-core instruction shapes that exist only for 16-bit inputs: Volta HMMA 8x8x4 (h884, s884), Turing/
  Ampere HMMA 16x8x16 and 16x8x8 with an h accumulator (h1688, h16816, s16816) [CUDA PTX ISA, mma shapes:
  m16n8k16 takes .f16/.bf16, m8n8k4 .f16]; hcudnn (cuDNN fp16).
- TF32: "tf32" anywhere (sm80_xmma_*_tf32f32_tf32f32_f32_*, cutlass_tensorop_s1688tf32gemm_*), cutlass::tfloat32_t
  in a (mangled) template (cuDNN's cutlass_cudnn_train ImplicitGemmConvolution<...tfloat32_t...>); CUTLASS
  "tensorop_s1688gemm" without a 16-bit type (fp32 operands on tensor cores are converted to TF32: the TF32
  mma is m16n8k8, hence 1688) [NVIDIA/cutlass#466: "CUTLASS will use TF32 tensor core for FP32 input"].
- fp32 without tensor cores: cuBLAS <arch>_sgemm_* / <arch>_gcgemm_* / <arch>_cgemm_* (BLAS type letters
  s = single, c = complex single), cutlass_*simt_sgemm (Simt = CUDA-core MMA, CUTLASS functionality.md),
  cuDNN "scudnn" kernels (s = single: cudnn_infer_volta_scudnn_*, cudnn_ampere_scudnn_*),
  implicit/explicit/precomputed_convolve_sgemm, xmma names whose math types are f32f32_f32f32
  (sm80_xmma_gemm_f32f32_f32f32_f32_*), and templated kernels whose first floating type argument is float
  (cudnn::detail::dgrad_engine<float, ...>, wgrad_alg0_engine<float, ...>, winograd*<float, float>,
  fft2d_r2c_32x32<float, ...>, gemv2T_kernel_val<int, int, float, ...>).
- fp64: <arch>_dgemm_* / zgemm, templates on double.
- rocBLAS / hipBLASLt (Tensile) Cijk_A*_B*_<types>...: the type code's letters [Tensile precision support:
  S single, D double, C/Z complex, H half, B bfloat16, I8/4xi8 int8, F8/B8 fp8, X xfloat32; "HHS_BH" = half in
  and out, single compute, "B" use beta, "H" high-precision accumulate (ROCm/Tensile#1488)]. The first letter
  is the input type: Cijk_Ailk_Bljk_SB_* and hipBLASLt's Cijk_Alik_Bljk_S_B_* are fp32 (compute f32_r,
  ROCm/rocm-libraries#10211), Cijk_Ailk_Bljk_BBS_BH_* bf16; hipBLASLt's xf32 (TF32-like) kernels carry "_MX"
  after the type code: (Custom_)Cijk_Ailk_Bjlk_S_MX_B_Bias_* (compute xf32_r: ROCm/rocm-libraries#12226,
  #1172). fp32 Tensile kernels
  may use MFMA matrix instructions (MI16x16x1 in the name); the catalog's fp32 peak of an AMD part is its
  fp32 matrix rate, so the ratio of peaks already counts that.
cuBLAS's Hopper "nvjet_*" kernels and other library names that state no type are "unknown" unless the
launching operator's dtype decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.replay import Change
from trainperf.trace.events import GEMM, GPU_SYNC, EventTable

FP32, TF32, REDUCED, FP64, UNKNOWN = "fp32", "tf32", "reduced", "fp64", "unknown"
PRECISIONS = (FP32, TF32, REDUCED, FP64, UNKNOWN)

_REDUCED_RE = re.compile(
    r"bf16|bfloat16|(?<![a-z])f(p)?16|_f16|f16_|fp16|half|e4m3|e5m2|fp8|f8f6f4|(?<![a-z])(i|int|s)8(?![0-9])"
    r"|int8|imma|hmma|h884|s884|h1688|h16816|s16816|i8816|hcudnn|hgemm", re.I)
_TF32_RE = re.compile(r"tf32|tfloat32|xf32|tensorop_s1688gemm|tensorop_s1688(fprop|dgrad|wgrad)", re.I)
_FP32_RE = re.compile(
    r"(?:^|_)(maxwell|pascal|volta|turing|ampere|hopper|blackwell|sm\d+)_(s|c|gc)gemm|(?:^|[^a-z])(s|c|gc)gemm_\d"
    r"|simt_sgemm|simt_s|scudnn|convolve_sgemm|xmma_\w*?f32f32_f32f32_f32|magma_sgemm", re.I)
_FP64_RE = re.compile(r"(?:^|_)(maxwell|pascal|volta|turing|ampere|hopper|blackwell|sm\d+)_(d|z)gemm|dgemm|zgemm"
                      r"|simt_dgemm", re.I)
# Tensile / TensileLite (rocBLAS, hipBLASLt): [Custom_]Cijk_<A index order>_<B index order>_<type code>[_MX: xf32][_...]
_TENSILE_RE = re.compile(r"(?:^|_)Cijk_A[a-zA-Z]+_B[a-zA-Z]+_([A-Z0-9a-z]+)(_MX(?:_|$))?")
# the first floating-point type among a C++ kernel's template arguments
_TEMPLATE_TYPE_RE = re.compile(r"(?<![\w:])(float|double|__half|half|__nv_bfloat16|c10::Half|c10::BFloat16"
                               r"|cutlass::half_t|cutlass::bfloat16_t|cutlass::tfloat32_t|__nv_fp8_e4m3"
                               r"|__nv_fp8_e5m2)(?![\w])")
_TEMPLATE_PRECISION = {"float": FP32, "double": FP64, "cutlass::tfloat32_t": TF32}


def _tensile(code: str) -> str:
    """Precision of a Tensile type code ("SB", "HHS_BH" -> "HHS", "BBS", "4xi8II", "DB", "XS")."""
    if "X" in code.upper().replace("4XI8", ""):
        return TF32
    first = code[:1].upper()
    if code.lower().startswith(("4xi8", "i8", "f8", "b8")):
        return REDUCED
    return {"S": FP32, "C": FP32, "D": FP64, "Z": FP64, "H": REDUCED, "B": REDUCED}.get(first, UNKNOWN)


@lru_cache(maxsize=4096)
def classify_kernel(name: str) -> str:
    """The math precision of one GEMM/conv kernel from its name (module docstring): fp32, tf32, reduced,
    fp64 or unknown."""
    m = _TENSILE_RE.search(name)
    if m:
        return TF32 if m.group(2) else _tensile(m.group(1))
    if _REDUCED_RE.search(name):
        return REDUCED
    if _TF32_RE.search(name):
        return TF32
    if _FP64_RE.search(name):
        return FP64
    if _FP32_RE.search(name):
        return FP32
    t = _TEMPLATE_TYPE_RE.search(name[name.find("<"):]) if "<" in name else None
    if t is not None:
        return _TEMPLATE_PRECISION.get(t.group(1), REDUCED)
    return UNKNOWN


# record_shapes' "Input type" of the launching operator -> precision of its data
_DTYPE_PRECISION = {"float": FP32, "double": FP64, "c10::Half": REDUCED, "c10::BFloat16": REDUCED,
                    "c10::Float8_e4m3fn": REDUCED, "c10::Float8_e5m2": REDUCED, "c10::Float8_e4m3fnuz": REDUCED,
                    "c10::Float8_e5m2fnuz": REDUCED, "signed char": REDUCED}
FP32_DATA = ["float"]  # the recorded input types of an operator on fp32 tensors


def dtype_precision(types: list, tf32_possible: bool = True) -> str:
    """Precision the first floating tensor input's dtype ("Input type" of record_shapes) allows: reduced for
    half/bfloat16/fp8, fp64 for double; for float, fp32 only where the device has no TF32 (NVIDIA before
    Ampere), else unknown (fp32 data runs fp32 or TF32 as allow_tf32 says); unknown without a float type."""
    for t in types or ():
        p = _DTYPE_PRECISION.get(t) if isinstance(t, str) else None
        if p is None:
            continue
        if p == FP32 and tf32_possible:
            return UNKNOWN
        return p
    return UNKNOWN


def kernel_precision(name: str, dtypes: list | None = None, tf32_possible: bool = True) -> tuple[str, bool]:
    """(a GEMM/conv kernel's math precision, whether its dtype decided it): its name's (classify_kernel), else, where
    the name says nothing, its launching operator's recorded input types' (dtype_precision), else UNKNOWN."""
    p = classify_kernel(name)
    if p != UNKNOWN or not dtypes:
        return p, False
    p = dtype_precision(dtypes, tf32_possible)
    return p, p != UNKNOWN


@dataclass(kw_only=True)
class PrecisionSplit:
    """GEMM/conv device time (µs) by math precision, and the fp32 kernels taking most of it."""

    time_us: dict = field(default_factory=lambda: {p: 0.0 for p in PRECISIONS})
    by_dtype_us: float = 0.0  # of it, time decided by the launching operator's dtype (the name said nothing)
    top_fp32: list = field(default_factory=list)  # (name, first start µs, total µs), largest first

    @property
    def total_us(self) -> float:
        return float(sum(self.time_us.values()))

    @property
    def fp32_us(self) -> float:
        return float(self.time_us[FP32])

    @property
    def fp32_share(self) -> float:
        """fp32 time as a share (0..1) of all GEMM/conv time (unknown counted in the total)."""
        return self.fp32_us / self.total_us if self.total_us > 0 else 0.0


def precision_split(names: list[str], dur_us, start_us=None, dtypes: list | None = None,
                    tf32_possible: bool = True, top: int = 4) -> PrecisionSplit:
    """Sum GEMM/conv kernel durations (µs) by precision: the name decides (classify_kernel), the launching
    operator's recorded input types (dtypes[i], a list or None) where the name says nothing."""
    out = PrecisionSplit()
    fp32: dict[str, list] = {}
    starts = start_us if start_us is not None else np.zeros(len(names))
    for i, (n, d) in enumerate(zip(names, dur_us)):
        p, by_dtype = kernel_precision(n, dtypes[i] if dtypes is not None else None, tf32_possible)
        out.by_dtype_us += float(d) if by_dtype else 0.0
        out.time_us[p] += float(d)
        if p == FP32:
            e = fp32.setdefault(n, [float(starts[i]), 0.0])
            e[0] = min(e[0], float(starts[i]))
            e[1] += float(d)
    out.top_fp32 = sorted(((n, s, d) for n, (s, d) in fp32.items()), key=lambda x: -x[2])[:top]
    return out


_NOT_NVIDIA = ("amd", "radeon", "instinct", "gaudi", "mtia")


def _nvidia_device(t: EventTable) -> tuple[str, int, int] | None:
    """(name, computeMajor, computeMinor) of the trace's first device when deviceProperties names an NVIDIA GPU."""
    props = t.metadata.get("deviceProperties")
    if not (isinstance(props, list) and props and isinstance(props[0], dict)):
        return None
    name = str(props[0].get("name", ""))
    major, minor = props[0].get("computeMajor"), props[0].get("computeMinor", 0)
    if not isinstance(major, int) or any(v in name.lower() for v in _NOT_NVIDIA):
        return None
    return name, major, minor if isinstance(minor, int) else 0


def _nvidia_major(t: EventTable) -> int | None:
    """computeMajor of the trace's first device when deviceProperties names an NVIDIA GPU, else None."""
    dev = _nvidia_device(t)
    return dev[1] if dev else None


# Dense fp16/bf16 tensor-core math (fp32 accumulate) per clock and SM over fp32 FMA math per clock and SM, by
# compute capability, for the data-centre parts of each architecture (NVIDIA's architecture whitepapers): the ratio
# of the two peaks at any clock and SM count, so a part the catalog lacks is priced from its deviceProperties.
# Volta/Turing (V100, T4): 8 tensor cores x 64 FMA vs 64 fp32 FMA = 8 (V100 125 / 15.7 TFLOP/s; T4 65 / 8.1);
# GA100 (A100): 4 x 256 vs 64 = 16 (312 / 19.5); GA10x and Ada (A10, A40, L4, L40S): 4 x 128 vs 128 = 4 (A10 125 /
# 31.2, L40S 362 / 91.6); Hopper: 14.8 (H100 SXM 989 / 67). GeForce parts run fp32-accumulate tensor math at half
# rate (RTX 3090 71 / 35.6, RTX 4090 165 / 82.6): half the ratio.
TENSOR_CORE_RATIO_BY_ARCH = {(7, 0): 8.0, (7, 2): 8.0, (7, 5): 8.0, (8, 0): 16.0, (8, 6): 4.0, (8, 9): 4.0,
                             (9, 0): 14.8}
# the fraction of that peak large GEMMs reach where the catalog has no figure for the part: the catalog's default
# (hardware.Accelerator.gemm_eff), an estimate
ARCH_GEMM_EFF = 0.70


def arch_peak_ratio(t: EventTable) -> float:
    """Tensor-core / fp32 peak ratio of the trace's NVIDIA device by its compute capability
    (TENSOR_CORE_RATIO_BY_ARCH, halved on GeForce parts); 0 when not NVIDIA or the architecture is not listed."""
    dev = _nvidia_device(t)
    if dev is None:
        return 0.0
    name, major, minor = dev
    ratio = TENSOR_CORE_RATIO_BY_ARCH.get((major, minor), 0.0)
    return ratio / 2.0 if "geforce" in name.lower() else ratio


def tf32_possible(t: EventTable) -> bool:
    """False only where the trace's device cannot run TF32: an NVIDIA GPU before Ampere (deviceProperties
    computeMajor < 8; TF32 tensor cores start with sm_80). Other or unknown devices: True (fp32 data then
    stays unknown)."""
    major = _nvidia_major(t)
    return not (major is not None and major < 8)


def tensor_cores(t: EventTable) -> bool:
    """True when deviceProperties names an NVIDIA GPU with tensor cores (computeMajor >= 7: Volta on)."""
    major = _nvidia_major(t)
    return major is not None and major >= 7


def gemm_precision(t: EventTable, device_rows: np.ndarray, ts_us: np.ndarray, end_us: np.ndarray) -> PrecisionSplit:
    """PrecisionSplit of one rank's GEMM/conv kernels among device_rows (the window's device rows; times µs
    per row), with the launching operator's dtypes where the trace recorded shapes."""
    from trainperf.diagnose.roofline import launching_op, op_shape

    rows = device_rows[(t.category[device_rows] == GEMM) & (t.kind[device_rows] != GPU_SYNC)]
    names = [t.names[int(i)] for i in t.name[rows]]
    dtypes = None
    unnamed = [i for i, n in enumerate(names) if classify_kernel(n) == UNKNOWN]  # only these read a dtype
    if unnamed and (t.args >= 0).any():
        op = launching_op(t)
        dtypes = [None] * len(rows)
        for i in unnamed:
            s = op_shape(t, int(op[rows[i]])) if op[rows[i]] >= 0 else None
            dtypes[i] = s.types if s is not None else None
    return precision_split(names, end_us[rows] - ts_us[rows], ts_us[rows], dtypes, tf32_possible(t))


# --- the finding --------------------------------------------------------------------------------

# fp32 GEMM/conv time, % of the replayed span. 5 %: the smallest speed-up the rule allows (MIN_PEAK_RATIO x
# the accelerator's gemm_eff, >= ~1.4x) then gains >= ~1.5 %, the size the stall rules start at (1 %) with room
# for kernels that do not reach the tensor-core rate; with the usual 8-16x ratios 5 % is worth >= ~4 % of the
# step, a medium finding. Not fitted: no labeled trace has this kind yet.
FP32_MATMUL_MIN_PCT = 5.0
# the accelerator's tensor-core peak over its fp32 peak must be at least this: below 2x, halving the bytes
# (bf16 operands) gives memory-bound GEMMs about as much as the faster math, and the finding would be a guess
# about which of them are compute-bound. Catalog: A100 16x, H100 14.8x, MI300X 8x, MI250X 4x, H20 3.4x, L40S 4x.
MIN_PEAK_RATIO = 2.0


@dataclass(frozen=True, kw_only=True)
class PrecisionLever:
    """What moving fp32 GEMM/conv work to tensor cores can give on one accelerator."""

    accelerator: str        # catalog name ("" when the part is not in the catalog)
    peak_ratio: float       # tensor-core (bf16/fp16) peak / fp32 peak; 0 when unknown
    efficiency: float       # fraction of the tensor-core peak large GEMMs reach in training (catalog gemm_eff)

    @property
    def speedup(self) -> float:
        """The what-if speed-up of an fp32 GEMM/conv kernel: peak_ratio x efficiency (>= 1), 0 when unknown."""
        return max(self.peak_ratio * self.efficiency, 1.0) if self.peak_ratio > 0 else 0.0


def precision_lever(t: EventTable) -> PrecisionLever | None:
    """The trace's accelerator (deviceProperties -> catalog) as a PrecisionLever; an NVIDIA part with tensor cores
    the catalog lacks by its architecture (arch_peak_ratio, efficiency ARCH_GEMM_EFF), of unknown size (peak_ratio
    0) when its architecture is not listed either; None when there is no tensor-core peak to move to (no device
    named, a part without a reduced-precision peak well above fp32)."""
    from trainperf.diagnose.roofline import device_accelerator

    acc = device_accelerator(t)
    if acc is None:
        if not tensor_cores(t):
            return None
        ratio = arch_peak_ratio(t)
        if 0 < ratio < MIN_PEAK_RATIO:
            return None
        dev = _nvidia_device(t)
        return PrecisionLever(accelerator=f"{dev[0]} (sm_{dev[1]}{dev[2]}, by architecture)" if ratio else "",
                              peak_ratio=ratio, efficiency=ARCH_GEMM_EFF if ratio else 0.0)
    if not acc.fp32_tflops:
        return None  # TPUs: no fp32 peak in the catalog (XLA runs fp32 matmuls through bf16 passes anyway)
    ratio = max(acc.bf16_tflops, acc.fp16_tflops) / acc.fp32_tflops
    if ratio < MIN_PEAK_RATIO:
        return None
    return PrecisionLever(accelerator=acc.name, peak_ratio=ratio, efficiency=acc.gemm_eff)


def fp32_matmul(f: RankFacts) -> F.Finding | None:
    """fp32 GEMMs/convolutions (no tensor cores, or TF32 off) take a material share of the step on an
    accelerator whose bf16/fp16 tensor-core peak is well above its fp32 peak.

    Priced by replay: the fp32 kernels sped up peak_ratio x gemm_eff times (PrecisionLever.speedup; the fp32
    kernels credited at the fp32 peak, the tensor-core ones at the efficiency large GEMMs reach in training).
    It is an upper bound (the replay's "speedup" change): a small or bandwidth-bound GEMM gains at most the ~2x
    of halved bytes, and autocast adds casts. The replay speeds up GEMM-category kernels by category, so where
    fp32 kernels are only part of that category the factor is the one that takes the same total time off the
    category (an approximation of where on the critical path the time goes). Confidence medium at most:
    the precision is read from kernel names. Unpriced (low) when neither the catalog nor its architecture
    (arch_peak_ratio) gives the part's peaks."""
    if not f.has_gpu:
        return None
    lever = precision_lever(f.table)
    if lever is None:
        return None
    w = f.window
    split = gemm_precision(f.table, w.device, w.ts_us, w.end_us)
    share = f.pct(split.fp32_us)
    if share <= FP32_MATMUL_MIN_PCT:
        return None
    metrics = {"fp32_gemm_conv_time": (split.fp32_us, "us"), "fp32_gemm_conv_share": (share, "%"),
               "fp32_share_of_gemm_conv": (100.0 * split.fp32_share, "%"),
               "tf32_share_of_gemm_conv": (_pct(split.time_us[TF32], split.total_us), "%"),
               "reduced_share_of_gemm_conv": (_pct(split.time_us[REDUCED], split.total_us), "%"),
               "unknown_share_of_gemm_conv": (_pct(split.time_us[UNKNOWN], split.total_us), "%"),
               "decided_by_dtype": (split.by_dtype_us, "us")}
    events = [(f"[fp32] {n}", s, d) for n, s, d in split.top_fp32]
    if lever.speedup <= 0:
        x = F.make("fp32_matmul", [f.rank], f.steps, metrics, events, None, 0.0,
                   "not priced: the accelerator's peaks are not in the catalog (hardware/catalog.yaml)",
                   severity="low", evidence_pct=share)
    elif (shaped := f.once("shaped_fp32_fix", lambda: shaped_fp32_fix(f, split.fp32_us))) is not None:
        x = _priced_by_shapes(f, shaped, metrics, events)
    else:
        s = lever.speedup
        metrics.update({"peak_ratio": (lever.peak_ratio, "x"), "assumed_efficiency": (lever.efficiency, "x"),
                        "speedup": (s, "x")})
        gemm_us = split.total_us
        # one factor over the GEMM category taking off what the fp32 kernels alone sped up s times would
        factor = gemm_us / (gemm_us - split.fp32_us * (1.0 - 1.0 / s))
        x = F.make("fp32_matmul", [f.rank], f.steps, metrics, events, what_if=(
            f"fp32 GEMM/conv kernels on tensor cores ({s:.3g}x faster: {lever.accelerator} bf16/fp16 peak "
            f"{lever.peak_ratio:.3g}x fp32 x {lever.efficiency:.2g} efficiency; upper bound)"),
            changes=(Change("speedup", GEMM, factor),), evidence_pct=share * (1.0 - 1.0 / s), upper_bound=True)
    x.confidence = "medium" if lever.speedup > 0 else "low"
    if x.gain_is_upper_bound or lever.speedup <= 0:
        x.notes.append("precision read from kernel names (cuBLAS/cuDNN/CUTLASS/Tensile naming); "
                       + ("the speed-up assumes compute-bound kernels: an upper bound" if lever.speedup > 0 else
                          "the device has tensor cores (computeMajor >= 7) but no catalog entry: not priced"))
    return x


# the share of the fp32 GEMM/conv time whose calls carry shapes (record_shapes) for the shapes to price the fix: the
# rest would go unpriced. 0.9: a tenth left out moves a gain by under a tenth of itself. Stated, not fitted (no
# labeled trace has fp32 GEMMs with shapes)
FP32_SHAPED_MIN_SHARE = 0.9
DTYPE_BYTES_16 = 2  # bytes of a bf16/fp16 element


@dataclass(frozen=True, kw_only=True)
class ShapedFix:
    """The fp32 GEMM calls with shapes, grouped by shape, each at the planner's time for it in 16-bit math."""

    accelerator: str
    precision: str                  # bf16, or fp16 on a part without bf16 (V100)
    shapes: list                    # slow_gemm.ShapeTime of each shape (model_us: in 16-bit math), longest first
    covered: float                  # their share (0-1) of the window's fp32 GEMM/conv time

    @property
    def time_us(self) -> float:
        """The calls' kernel time (µs)."""
        return sum(x.time_us for x in self.shapes)

    @property
    def model_us(self) -> float:
        """The model's time for them (µs)."""
        return sum(x.model_us for x in self.shapes)


def shaped_fp32_fix(f: RankFacts, fp32_us: float) -> ShapedFix | None:
    """The fp32 GEMM calls priced by their recorded shapes (ShapedFix) when those cover FP32_SHAPED_MIN_SHARE of the
    window's fp32 GEMM/conv time `fp32_us` and the part is in the catalog; None otherwise.

    Each call's kernels at the time slow_gemm.expected_us gives its shape in 16-bit math on the part (its FLOPs at the
    bf16/fp16 peak x the catalog's GEMM efficiency x the shape's saturation, never faster than half its fp32 bytes at
    the achieved HBM bandwidth, plus each kernel's fixed cost), and never slower than it ran: a compute-bound GEMM
    gains the ratio of peaks, a small or bandwidth-bound one the ~2x of halved bytes or nothing. What the upper bound
    assumed (every fp32 GEMM compute-bound) is then read from the shapes."""
    from trainperf.diagnose.gemm_shapes import gemm_calls
    from trainperf.diagnose.roofline import device_accelerator
    from trainperf.diagnose.slow_gemm import KERNEL_FIXED_COST_MAX_US, ShapeTime, expected_us
    from trainperf.plan.efficiency import Efficiency, resolve

    acc = device_accelerator(f.table)
    if acc is None or not acc.hbm_tbps or fp32_us <= 0:
        return None
    t, tf32 = f.table, tf32_possible(f.table)

    def fp32_math(row: int) -> bool:  # as gemm_precision reads it: the name, else the call's dtype (fp32 data)
        return kernel_precision(t.names[int(t.name[row])], FP32_DATA, tf32)[0] == FP32

    calls = [c for c in gemm_calls(f, ("fp32",)) if c.time_us > 0 and all(fp32_math(k) for k in c.kernels)]
    time_us = sum(c.time_us for c in calls)
    if time_us < FP32_SHAPED_MIN_SHARE * fp32_us:
        return None
    precision = "bf16" if acc.bf16_tflops else "fp16"
    eff, floor = resolve(Efficiency(), acc), min(f.graph.kernel_floor_us, KERNEL_FIXED_COST_MAX_US)
    by_shape: dict[tuple, list] = {}
    for c in calls:
        by_shape.setdefault((c.name, c.m, c.k, c.n), []).append(c)
    shapes = [ShapeTime(calls=cs, time_us=sum(c.time_us for c in cs), model_us=sum(
        min(expected_us(replace(c, precision=precision, bytes=c.bytes * DTYPE_BYTES_16 / c.elem_bytes), acc, eff,
                        floor), c.time_us) for c in cs)) for cs in by_shape.values()]
    return ShapedFix(accelerator=acc.name, precision=precision, shapes=sorted(shapes, key=lambda x: -x.time_us),
                     covered=min(time_us / fp32_us, 1.0))


def _priced_by_shapes(f: RankFacts, fix: ShapedFix, metrics: dict, events: list) -> F.Finding:
    """fp32_matmul priced from the calls' shapes (shaped_fp32_fix): each shape's kernels at the model's time
    (speedup_rows), an estimate, not an upper bound."""
    s = fix.time_us / fix.model_us if fix.model_us > 0 else 1.0
    metrics.update({"priced_by_shapes": (100.0 * fix.covered, "% of fp32 time"), "their_time": (fix.time_us, "us"),
                    "model_time": (fix.model_us, "us"), "speedup": (s, "x")})
    changes = tuple(Change("speedup_rows", factor=x.ratio, rows=tuple(k for c in x.calls for k in c.kernels))
                    for x in fix.shapes if x.model_us > 0 and x.ratio > 1.0)
    what_if = (f"the fp32 GEMMs in {fix.precision} on tensor cores at the planner's time for their recorded shapes on "
               f"{fix.accelerator} ({s:.3g}x faster)")
    x = F.make("fp32_matmul", [f.rank], f.steps, metrics, events, gain_pct=None if changes else 0.0, changes=changes,
               what_if=what_if, evidence_pct=f.pct(fix.time_us - fix.model_us))
    x.notes.append(f"priced from the recorded shapes of {100.0 * fix.covered:.0f} % of the fp32 GEMM time (each shape "
                   f"at the planner's {fix.precision} time on the part); autocast's casts of the weights and "
                   "activations are not priced")
    return x


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b > 0 else 0.0
