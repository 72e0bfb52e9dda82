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
COMM_RE = re.compile(r"^_*(nccl|rccl|ncclx?Dev|ncclDev)|^void\s+(nccl|rccl)|msccl|^c10d::|all_?reduce_kernel"
                     r"|cross_device_reduce|one_shot_all_reduce|two_shot_all_reduce", re.I)
_COLLECTIVES = (
    ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("bcast", "broadcast"),
    ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce"),
)
ATTENTION_RE = re.compile(r"flash|fmha|attention|attn|_mha|mha_|xformers|sdpa|paged_att|decode_att", re.I)
GEMM_RE = re.compile(r"gemm|cutlass|cublas|matmul|xmma|wgmma|nvjet|^Cijk_|hipblaslt|_mm_|addmm|bmm|triton_tem_"
                     r"|convolution|conv[123]d|_conv_|convolve|implicit_?gemm|winograd|dgrad|wgrad|fprop|s884|s1688"
                     r"|h884|h1688|sm\d\d_xmma", re.I)
OPTIMIZER_RE = re.compile(r"multi_tensor_apply|adam|sgd|lamb|lion|adagrad|rmsprop|optimizer|fused_.*_step", re.I)
REDUCTION_RE = re.compile(r"reduce|norm|bn_fw|bn_bw|batchnorm|softmax|welford|triton_red_|triton_per_|cross_entropy|nll_loss|argmax|"
                          r"argmin|topk|sort|scan|cumsum|_sum_|sum_kernel|mean|max_kernel|min_kernel|logsumexp",
                          re.I)
ELEMENTWISE_RE = re.compile(r"elementwise|nchw|nhwc|vectorized|unrolled|triton_poi_|pointwise|copy|cat_|catarray|index|fill|"
                            r"where|gather|scatter|dropout|gelu|relu|silu|swiglu|rope|rotary|embedding|"
                            r"transpose|permute|cast|convert|add|mul|div|sub|exp|sigmoid|tanh|clamp|masked|"
                            r"bias|activation|triton_", re.I)


def kernel_category(name: str, kind: int) -> int:
    """Category id (trainperf.trace.events.*) of a device event from its name and kind."""
    if kind == MEMCPY:
        return CAT_MEMCPY
    if kind == MEMSET:
        return CAT_MEMSET
    if COMM_RE.search(name):
        return COMMUNICATION
    if name.startswith(("Memcpy", "dma")):  # "dma*": MTIA data movement (HTA counts it as memory)
        return CAT_MEMCPY
    if name.startswith("Memset"):
        return CAT_MEMSET
    if ATTENTION_RE.search(name):
        return ATTENTION
    if GEMM_RE.search(name):
        return GEMM
    if OPTIMIZER_RE.search(name):
        return OPTIMIZER
    if REDUCTION_RE.search(name):
        return REDUCTION
    if ELEMENTWISE_RE.search(name):
        return ELEMENTWISE
    return CAT_OTHER


def collective_type(name: str) -> str:
    """Collective of a communication kernel or op name ("all_reduce", "all_gather", ...), else "unknown"."""
    low = name.lower().replace("nccl:", "").replace("c10d::", "")
    for key, value in _COLLECTIVES:
        if key in low:
            return value
    return "unknown"
