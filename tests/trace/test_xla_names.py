"""Kernel categories of XLA's (JAX, TensorFlow) kernel names, from the HLO instruction they run.

References: the spellings of xla/hlo/ir/hlo_opcode.h, the fusion names of
xla/service/gpu/transforms/rename_fusions.cc (and its test: loop_multiply_fusion, input_log_fusion,
loop_exponential_fusion), the kernels of the JAX CPU profile committed in tests/trace/data/jax, and
the kernel names of an A100 JAX profile summary published on GitHub (fft.14.0, all-reduce-start.1,
input_transpose_fusion.1, reduce-scatter.1.1, custom-call.160.0, ...).
"""

from pathlib import Path

import pytest

from trainperf.trace.categories import collective_type, kernel_category
from trainperf.trace.events import CATEGORY_NAMES, KERNEL
from trainperf.trace.producers import read_any

JAX = Path(__file__).resolve().parent / "data" / "jax"


@pytest.mark.parametrize("name,category", [
    # unfused instructions: "<opcode>[.N]"
    ("dot", "gemm"), ("fft.14.0", "gemm"), ("convolution.3", "gemm"),
    ("reduce.4", "reduction_norm"), ("sort", "reduction_norm"), ("copy.2", "elementwise"),
    ("all-reduce-start", "communication"), ("all-reduce-start.1", "communication"),
    ("all-gather-start", "communication"), ("reduce-scatter.3", "communication"),
    ("reduce-scatter.1.1", "communication"), ("all-to-all.2", "communication"),
    ("collective-permute-done", "communication"), ("ragged-all-to-all", "communication"),
    ("custom-call.160.0", "other"),  # cuBLAS, cuDNN or a user kernel: the name does not say
    # fusions: "[<kind>_]<heroes>_fusion[.N]", by their hero
    ("loop_multiply_fusion", "elementwise"), ("input_log_fusion", "elementwise"),
    ("loop_exponential_fusion", "elementwise"), ("input_transpose_fusion.1", "elementwise"),
    ("loop_subtract_fusion", "elementwise"), ("loop_add_fusion", "elementwise"),
    ("input_reduce_fusion", "reduction_norm"), ("input_reduce_fusion_92", "reduction_norm"),
    ("input_reduce_window_fusion", "reduction_norm"), ("loop_reduce_precision_fusion", "elementwise"),
    ("output_dot_fusion", "gemm"), ("gemm_fusion_dot_265", "gemm"),
    ("multiply_add_fusion", "elementwise"),  # XLA CPU
    ("ynn_fusion", "gemm"), ("xnn_fusion", "gemm"),  # XLA CPU library fusions (default: one dot)
])
def test_xla_names(name, category):
    assert CATEGORY_NAMES[kernel_category(name, KERNEL)] == category


def test_xla_collective_types():
    assert collective_type("all-reduce-start.1") == "all_reduce"
    assert collective_type("all-gather-done") == "all_gather"
    assert collective_type("reduce-scatter.1.1") == "reduce_scatter"
    assert collective_type("ragged-all-to-all") == "all_to_all"
    assert collective_type("collective-permute-start") == "send_recv"


@pytest.mark.parametrize("f", ["jax_cpu.xplane.pb", "jax_cpu.trace.json.gz"])
def test_jax_cpu_profile_kernels(f):
    # the jitted SGD step: x @ w in a YNNPACK fusion (forward), xᵀ @ g as a dot (backward), tanh'
    # and the update as loop fusions
    t = read_any(JAX / f)
    dev = t.category >= 0
    got = {t.names[n]: CATEGORY_NAMES[c] for n, c in zip(t.name[dev], t.category[dev])}
    assert got == {"dot": "gemm", "ynn_fusion": "gemm", "multiply_add_fusion": "elementwise",
                   "multiply_subtract_fusion": "elementwise"}
