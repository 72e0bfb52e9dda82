"""The ``deepspeed-hf`` stack: the DeepSpeed engine around an eager Hugging Face model.

References: the eager byte counts of plan/stacks.py (the same operator counts as the
``pytorch-fsdp`` stack: HF LlamaRMSNorm, RoPE and SwiGLU are the same eager PyTorch ops), and
the ring alpha-beta formulas of plan/comm.py's docstring worked by hand for ZeRO-3 on one
8-GPU H800 node (NVLink 200 GB/s per direction, NCCL bus efficiency 0.8, 8 us per step): with
nothing hidden, each micro batch pays the forward all-gather, the backward all-gather and the
gradient reduce-scatter, all in the model dtype (2 B per parameter).
"""

import pytest

from trainperf.plan import compute, memory
from trainperf.plan.estimate import estimate
from trainperf.plan.stacks import get_stack
from trainperf.specs import Layout, ModelSpec, make_cluster

LLAMA2_7B = ModelSpec(name="llama2-7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32, ffn_hidden=11008,
                      vocab=32000, seq_len=4096, gated_mlp=True, tied_embeddings=False, norm="rmsnorm")


def test_elementwise_bytes_are_eager_pytorch():
    hf = compute.layer_elementwise_fwd_s(LLAMA2_7B, 1.0, 1, False, 1.0, sw=get_stack("deepspeed-hf"))
    h, f, qkv = 4096, 11008, 4096 + 4096
    assert float(hf) == pytest.approx((2 * 36 + 12) * h + 10 * f + 20 * qkv)
    assert get_stack("deepspeed-hf").attention == "math"           # HF eager attention unless fa2 is set
    assert get_stack("deepspeed-hf:attention=fa2").flash_attention


def test_zero3_collectives_are_on_the_step_by_hand():
    cluster = make_cluster("h800", 8, 8)
    lay = Layout(zero=3, mbs=1)
    hf = estimate(LLAMA2_7B, cluster, lay, 16, None, get_stack("deepspeed-hf:attention=fa2"))
    p = float(max(memory.stage_params(LLAMA2_7B, 1, 1, 1)))
    busbw = 200e9 * 0.8
    one = 7 / 8 * 2.0 * p / busbw + 8e-6 * 3                        # all-gather or reduce-scatter, 8 ranks
    grad_accum = 16 // 8                                             # two micro batches per step
    assert hf.breakdown["dp_comm"] == pytest.approx(grad_accum * 3 * one, rel=1e-9)
    assert hf.breakdown["comm_contention"] == pytest.approx(0.0)    # nothing hidden, nothing contended
    # the same job priced as overlapped (pytorch-fsdp hides FSDP traffic behind compute) pays less
    fsdp = estimate(LLAMA2_7B, cluster, lay, 16, None, get_stack("pytorch-fsdp:grad_reduce_bytes=2"))
    assert fsdp.breakdown["dp_comm"] < 0.1 * hf.breakdown["dp_comm"]
    assert fsdp.breakdown["compute"] == pytest.approx(hf.breakdown["compute"])


def test_eager_attention_moves_22_bytes_per_score_by_operator_count():
    # HF LlamaAttention without flash: /sqrt(d) 4 B, + mask 6 B, fp32 softmax 6 B, cast back 6 B = 22 B per
    # score element, against 9 B for Megatron's fused scale-mask-softmax; the batched GEMMs are the same
    from trainperf.plan.efficiency import Efficiency

    eff, hbm = Efficiency(gemm_eff_max=0.8, attn_eff=0.4), 2.0e12
    args = (LLAMA2_7B, 2, 4096, 1, 1, 312e12, hbm, eff, False)
    extra = compute.attention_fwd_s(*args, get_stack("deepspeed-hf").score_bytes) \
        - compute.attention_fwd_s(*args, get_stack("deepspeed").score_bytes)
    assert float(extra) == pytest.approx((22 - 9) * 2 * 32 * 4096 * 4096 / hbm)
    assert get_stack("pytorch-fsdp").score_bytes == 22.0 and get_stack("megatron-2021").score_bytes == 9.0
