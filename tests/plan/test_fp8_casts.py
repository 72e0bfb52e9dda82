"""fp8 per stack: cast traffic (fused producers vs a cast pass per GEMM input) and the fp8 copies kept for backward.

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


def test_fp8_keeps_linear_inputs_in_fp8_by_hand():
    # per token and layer, with sp over tp=2: QKV and MLP inputs (h wide, split by sp), the
    # attention output (q wide) and the MLP activation output (ffn wide), both split by tp,
    # are kept in 1 B instead of 2 (TransformerEngine saves the quantised GEMM input)
    from trainperf.plan.memory import activation_bytes_per_token_layer

    bf16 = activation_bytes_per_token_layer(LLAMA8B, TP, True, 1, True, False, None, False)
    fp8 = activation_bytes_per_token_layer(LLAMA8B, TP, True, 1, True, False, None, True)
    assert float(bf16 - fp8) == pytest.approx(2 * 4096 / TP + (4096 + 14336) / TP)
    full = activation_bytes_per_token_layer(LLAMA8B, TP, True, 2, True, False, None, True)
    assert float(full) == pytest.approx(2 * 4096 / TP)                 # full recompute: the bf16 layer input only
