"""Kernel categories from kernel names (NVIDIA, AMD, Triton, NCCL/RCCL old and new names).

Ordered rules, first match wins: communication (NCCL/RCCL, any generation), memcpy/memset,
attention, GEMM (incl. convolutions and Triton templates), optimizer (multi-tensor apply /
fused Adam), reduction or normalisation, elementwise, else other.
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
    ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("bcast", "broadcast"),
    ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce"),
)
ATTENTION_RE = re.compile(r"flash|fmha|attention|attn|_mha|mha_|xformers|sdpa|paged_att|decode_att", re.I)
GEMM_RE = re.compile(r"(?<!fb)gemm|cutlass|cublas|matmul|xmma|wgmma|nvjet|^Cijk_|hipblaslt|_mm_|addmm|bmm|triton_tem_"
                     r"|convolution|conv[123]d|_conv_|convolve|implicit_?gemm|winograd|(?<![a-z])(dgrad|wgrad|fprop)|s884|s1688"
                     r"|h884|h1688|sm\d\d_xmma|scudnn|hcudnn|cudnn_(infer|train)|fft", re.I)
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


def collective_type(name: str) -> str:
    """Collective of a communication kernel or op name ("all_reduce", "all_gather", ...), else "unknown"."""
    low = name.lower().replace("nccl:", "").replace("c10d::", "")
    for key, value in _COLLECTIVES:
        if key in low:
            return value
    return "unknown"
