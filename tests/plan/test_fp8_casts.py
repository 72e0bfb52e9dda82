"""fp8 cast traffic per stack: fused producers (TransformerEngine, XLA, Inductor) vs a cast pass per GEMM input.

Reference: bytes counted by hand. Hopper fp8 GEMMs take both operands K-major, so each fp8 input
is written row- and column-wise (1 B + 1 B); a separate cast pass also reads the bf16 tensor
(2 B): 4 B per element. Fused stacks need that pass for the attention output only (the
flash-attention kernel writes bf16); unfused stacks for the two norm outputs (hidden wide),
the attention output and the MLP activation.
"""

import pytest

from trainperf.plan.compute import layer_elementwise_fwd_s
from trainperf.plan.stacks import get_stack
from trainperf.specs import ModelSpec

LLAMA8B = ModelSpec(name="llama3-8b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                    vocab=128256, seq_len=8192)
HBM = 2.0e12
TOKENS, TP = 8192.0, 2


@pytest.mark.parametrize("stack, elements", [
    ("megatron-core", 4096 / TP),                                      # attention output only
    ("jax", 4096 / TP),
    ("pytorch-fsdp-compile", 4096 / TP),
    ("pytorch-fsdp", 2 * 4096 + (4096 + 14336) / TP),                  # every GEMM input
])
def test_fp8_cast_bytes_by_hand(stack, elements):
    sw = get_stack(stack)
    bf16 = layer_elementwise_fwd_s(LLAMA8B, TOKENS, TP, True, HBM, False, False, sw)
    fp8 = layer_elementwise_fwd_s(LLAMA8B, TOKENS, TP, True, HBM, True, False, sw)
    assert float(fp8 - bf16) == pytest.approx(4.0 * elements * TOKENS / HBM, rel=1e-12)


def test_stated_override_turns_the_fusion_off():
    assert get_stack("megatron-core").fp8_cast_fused
    assert not get_stack("megatron-core:fp8_cast_fused=0").fp8_cast_fused
