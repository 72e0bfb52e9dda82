"""Kernel categories from kernel names (NVIDIA, AMD, Triton, NCCL/RCCL old and new names).

Ordered rules, first match wins: XLA's own names (below), communication (NCCL/RCCL, any
generation), memcpy/memset, attention, GEMM (incl. convolutions and Triton templates), optimizer
(multi-tensor apply / fused Adam), reduction or normalisation, elementwise, else other.

XLA (JAX, TensorFlow) names a kernel or CPU thunk after its HLO instruction, so the name says
what the kernel computes: an unfused instruction is "<opcode>[.N]" in hlo_opcode.h's spelling
("dot", "fft.14.0", "all-reduce-start.1", "reduce-scatter.1.1"); a fusion is
"[<kind>_]<heroes>_fusion[.N]" (xla/service/gpu/transforms/rename_fusions.cc: kind loop / input /
output, heroes the opcodes of its roots' heroes joined by "_", "-" made "_"; the CPU backend names
its fusions "<ops>_fusion", e.g. "multiply_add_fusion"). A fusion's work is its hero's: a dot or
convolution makes it a GEMM, a reduce / reduce-window / sort a reduction, a collective
communication; without one of those it is a loop over elements (XLA fuses only elementwise ops
and data movement around a hero), elementwise. "ynn_fusion" / "xnn_fusion" are XLA CPU's library
fusions (YNNPACK / XNNPACK, backends/cpu/transforms/ynn_matcher.h fusion_prefix); their default
fusion type is one dot (debug_options_flags.cc: LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT): GEMM.
"custom-call" says nothing by itself (cuBLAS, cuDNN, a user kernel): left to the other rules.
"""

from __future__ import annotations

import re

from trainperf.trace.events import (ATTENTION, CAT_MEMCPY, CAT_MEMSET, CAT_OTHER, COMMUNICATION, ELEMENTWISE,
                                    GEMM, MEMCPY, MEMSET, OPTIMIZER, REDUCTION)

# ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllReduce_Sum_f32_RING_LL (NCCL >= 2.19),
# ncclAllReduceRingLLKernel_sum_f32 (NCCL 2.4-2.7), rcclGenericKernel / ncclDevKernel_Generic (RCCL)
# plus communication libraries other than NCCL: DeepEP expert-parallel dispatch/combine (deep_ep::, dpsk::ep::),
# MSCCL++, NVSHMEM, Transformer Engine userbuffers, vLLM/SGLang custom all-reduce, and kernels named after
# their collective (all2all, all_to_all, allgather, reduce_scatter) by custom libraries
COMM_RE = re.compile(r"^_*(nccl|rccl|ncclx?Dev|ncclDev)|^void\s+(nccl|rccl)|msccl|^c10d::|all_?reduce_kernel"
                     r"|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce|custom_?all_?reduce"
                     r"|deep_?ep::|dpsk::ep|mscclpp|nvshmemi?_|userbuffers|(?<![a-z])all2all|(?<![a-z])all_?to_?all"
                     r"|(?<![a-z])all_?gather(?!_?(into|base))|(?<![a-z])reduce_?scatter", re.I)
# host record functions (cpu_op / user_annotation) and GPU annotations that wrap a collective's launches
COMM_OP_RE = re.compile(r"^record_param_comms$|^c10d::|^nccl:|^rccl:|ProcessGroupNCCL|^gloo:|deep_?ep|dpsk::ep"
                        r"|^(all_?reduce|all_?gather\w*|reduce_?scatter\w*|all_?to_?all\w*|all2all\w*|broadcast"
                        r"|send|recv|barrier)$", re.I)
_COLLECTIVES = (
    ("cross_device_reduce", "all_reduce"),  # vLLM's custom all-reduce (cross_device_reduce_1stage / _2stage)
    ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"), ("all2all", "all_to_all"),
    ("ragged_all_to_all", "all_to_all"), ("collective_permute", "send_recv"),  # XLA (hyphens made "_")
    ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("bcast", "broadcast"),
    ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce"),
)
ATTENTION_RE = re.compile(r"flash|fmha|attention|attn|_mha|mha_|xformers|sdpa|paged_att|decode_att", re.I)
# beside the libraries' GEMMs, products named otherwise: the mixture-of-experts GEMM of vLLM and SGLang (the Triton
# kernel fused_moe_kernel) and AITER's (fmoe_*, ROCm), vLLM's skinny GEMMs for ROCm decode (wvSplitK*, LLGemm1:
# csrc/rocm/skinny_gemms.cu), MIOpen's convolutions (MIOpenConv1x1, MIOpenCvD3x3_WSR0, miopenSp3AsmConv*)
GEMM_RE = re.compile(r"(?<!fb)gemm|cutlass|cublas|matmul|xmma|wgmma|nvjet|^Cijk_|hipblaslt|_mm_|addmm|bmm|triton_tem_"
                     r"|convolution|conv[123]d|_conv_|convolve|implicit_?gemm|winograd|(?<![a-z])(dgrad|wgrad|fprop)|s884|s1688"
                     r"|h884|h1688|sm\d\d_xmma|scudnn|hcudnn|cudnn_(infer|train)|fft"
                     r"|fused_moe_kernel|(?<![a-z])fmoe|wvSplitK|LLGemm|MIOpenConv|MIOpenCvD|AsmConv", re.I)
OPTIMIZER_RE = re.compile(r"multi_tensor_apply|adam|sgd|lamb(?!da)|(?<![a-z])lion|adagrad|rmsprop|optimizer"
                          r"|fused_.*_step", re.I)  # not "lambda" (in most ATen kernel names)
REDUCTION_RE = re.compile(r"reduce|norm(?!al)|gammabeta|moments|pool|bn_fw|bn_bw|batchnorm|softmax|welford|triton_red_|triton_per_"
                          r"|cross_entropy|nll_loss|argmax|argmin|topk|sort|scan|cumsum|_sum_|sum_kernel|mean"
                          r"|max_kernel|min_kernel|logsumexp", re.I)
ELEMENTWISE_RE = re.compile(r"elementwise|nchw|nhwc|quantize|dequant|fp8|vectorized|unrolled|triton_poi_|pointwise|copy|cat_|catarray"
                            r"|index|fill|"
                            r"where|gather|scatter|dropout|gelu|relu|silu|swiglu|rope|rotary|embedding|"
                            r"transpose|permute|cast|convert|add|mul|div|sub|exp|sigmoid|tanh|clamp|masked|"
                            r"bias|activation|triton_", re.I)


# XLA HLO opcodes (hlo_opcode.h) by what their kernels do; opcodes absent here (custom-call,
# while, call, tuple, parameter, ...) say nothing about the work
_XLA_COMM = ("all-reduce", "all-reduce-start", "all-reduce-done", "all-gather", "all-gather-start",
             "all-gather-done", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute",
             "collective-permute-start", "collective-permute-done", "collective-broadcast", "send", "send-done",
             "recv", "recv-done")
_XLA_GEMM = ("dot", "ragged-dot", "scaled-dot", "convolution", "fft", "triangular-solve", "cholesky")
_XLA_REDUCTION = ("reduce", "reduce-window", "select-and-scatter", "sort", "topk", "batch-norm-training",
                  "batch-norm-inference", "batch-norm-grad")
_XLA_ELEMENTWISE = (
    "abs", "acos", "acosh", "add", "and", "asin", "atan2", "bitcast-convert", "broadcast", "cbrt", "ceil", "clamp",
    "compare", "complex", "concatenate", "convert", "copy", "copy-start", "copy-done", "cosine", "count-leading-zeros",
    "divide", "dynamic-slice", "dynamic-update-slice", "erf", "exponential", "exponential-minus-one", "floor", "gather",
    "imag", "iota", "is-finite", "log", "log-plus-one", "logistic", "map", "maximum", "minimum", "multiply", "negate",
    "not", "or", "pad", "popcnt", "power", "real", "reduce-precision", "remainder", "reshape", "reverse", "rng",
    "rng-bit-generator", "round-nearest-afz", "round-nearest-even", "rsqrt", "scatter", "select", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "slice", "sqrt", "stochastic-convert",
    "subtract", "tan", "tanh", "transpose", "xor")
XLA_OPCODE_CATEGORY = {**{o: ELEMENTWISE for o in _XLA_ELEMENTWISE}, **{o: REDUCTION for o in _XLA_REDUCTION},
                       **{o: GEMM for o in _XLA_GEMM}, **{o: COMMUNICATION for o in _XLA_COMM}}
_XLA_OP_RE = re.compile(r"^([a-z][a-z0-9-]*?)((?:[._]\d+)*)$")
_XLA_FUSION_RE = re.compile(r"^(?:(?:loop|input|output|custom)_)?([a-z0-9_]+?)_fusion(?:[._]\d+)*$")
_XLA_LIBRARY_FUSIONS = ("ynn", "xnn")


def _hero(heroes: str, opcodes) -> bool:
    """True when one of opcodes ("-" written "_", as in fusion names) is a whole token of heroes."""
    return any(re.search(rf"(?:^|_){o.replace('-', '_')}(?:_|$)", heroes) for o in opcodes)


def xla_category(name: str) -> int | None:
    """Category of a kernel named the XLA way (module docstring), else None."""
    m = _XLA_OP_RE.match(name)
    if m and m.group(1) in XLA_OPCODE_CATEGORY:
        return XLA_OPCODE_CATEGORY[m.group(1)]
    m = _XLA_FUSION_RE.match(name)
    if not m:
        return None
    heroes = m.group(1)
    if heroes in _XLA_LIBRARY_FUSIONS:
        return GEMM
    if _hero(heroes, _XLA_COMM):
        return COMMUNICATION
    if _hero(heroes, _XLA_GEMM):
        return GEMM
    # "reduce" as a hero, not reduce-precision (elementwise) or reduce-scatter (a collective)
    if _hero(heroes, [o for o in _XLA_REDUCTION if o != "reduce"]) or re.search(
            r"(?:^|_)reduce(?!_(?:precision|scatter))(?:_|$)", heroes):
        return REDUCTION
    return ELEMENTWISE


# embedding lookups/updates (incl. FBGEMM TBE backward that also applies the optimizer) are memory-bound
# gathers/scatters: elementwise, before the optimizer rule would take "..._adagrad_..."
EMBEDDING_RE = re.compile(r"embedding", re.I)
_RULES = ((ATTENTION_RE, ATTENTION), (GEMM_RE, GEMM), (EMBEDDING_RE, ELEMENTWISE), (OPTIMIZER_RE, OPTIMIZER),
          (REDUCTION_RE, REDUCTION), (ELEMENTWISE_RE, ELEMENTWISE))


def base_name(name: str) -> str:
    """The kernel's own function name: no "void", namespaces, template arguments or parameters
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::...>(...)" -> "vectorized_elementwise_kernel")."""
    s = name.replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    cuts = [i for i in (s.find("<"), s.find("(")) if i > 0]
    if cuts:
        s = s[:min(cuts)]
    return s.rsplit("::", 1)[-1]


def kernel_category(name: str, kind: int) -> int:
    """Category id (trainperf.trace.events.*) of a device event from its name and kind.

    The rules look at the kernel's own name first, then (for names such as cutlass::Kernel<...gemm...>
    whose meaning is in the template arguments) at the full name."""
    if kind == MEMCPY:
        return CAT_MEMCPY
    if kind == MEMSET:
        return CAT_MEMSET
    xla = xla_category(name)
    if xla is not None:
        return xla
    if COMM_RE.search(name) or COMM_RE.search(base_name(name)):
        return COMMUNICATION
    if name.startswith(("Memcpy", "dma")):  # "dma*": MTIA data movement (HTA counts it as memory)
        return CAT_MEMCPY
    if name.startswith("Memset"):
        return CAT_MEMSET
    for target in (base_name(name), name):
        for regex, category in _RULES:
            if regex.search(target):
                return category
    return CAT_OTHER


# DeepEP's kernels (dispatch, combine and their layout/notify helpers) move each token to the ranks of its experts
# and back: an all-to-all, whatever the kernel is called
EXPERT_PARALLEL_RE = re.compile(r"deep_?ep|dpsk::ep", re.I)


def collective_type(name: str) -> str:
    """Collective of a communication kernel or op name ("all_reduce", "all_gather", ...), else "unknown"."""
    if EXPERT_PARALLEL_RE.search(name):
        return "all_to_all"
    low = name.lower().replace("nccl:", "").replace("c10d::", "").replace("-", "_")
    for key, value in _COLLECTIVES:
        if key in low:
            return value
    return "unknown"


# A copy's direction as its name states it: CUPTI writes "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device ->
# Pageable)", "Memcpy PtoP (Device -> Device)" (between devices); roctracer "Memcpy HtoD (Host -> Device)"; rocprofv3
# "CopyHostToDevice". First match wins: a peer copy's "(Device -> Device)" is PtoP, not DtoD.
_COPY_DIRECTIONS = (
    ("PtoP", re.compile(r"PtoP|CopyPeer")),
    ("HtoD", re.compile(r"HtoD|(Host|Pinned|Pageable)\s*->\s*Device|CopyHostToDevice")),
    ("DtoH", re.compile(r"DtoH|Device\s*->\s*(Host|Pinned|Pageable)|CopyDeviceToHost")),
    ("HtoH", re.compile(r"HtoH|(Host|Pinned|Pageable)\s*->\s*(Host|Pinned|Pageable)|CopyHostToHost")),
    ("DtoD", re.compile(r"DtoD|Device\s*->\s*Device|CopyDeviceToDevice")),
    ("DtoA", re.compile(r"DtoA")),
    ("AtoD", re.compile(r"AtoD")),
)
# copies over a link other than the device's own memory (the host's PCIe/C2C link, or to another device): they run
# at that link's speed, not HBM's
OFF_DEVICE_DIRECTIONS = ("HtoD", "DtoH", "HtoH", "PtoP")


def copy_direction(name: str) -> str:
    """Direction of a memcpy event from its name: "PtoP", "HtoD", "DtoH", "HtoH", "DtoD", "DtoA", "AtoD", or "" when
    the name states none."""
    return next((d for d, pattern in _COPY_DIRECTIONS if pattern.search(name)), "")


def from_pageable_to_device(name: str) -> bool:
    """Whether a memcpy's name says it copies host memory that is not pinned to the device: "Pageable -> Device", or
    host-to-device without "Pinned" (roctracer and rocprofv3 do not name the host memory's kind)."""
    return copy_direction(name) == "HtoD" and "Pinned" not in name
