"""First-stage in-flight activations under the real pipeline schedules, and the distributed-optimizer layout.

References: Korthikanti et al. 2022 eq. 6 (first stage of 1F1B holds p micro batches of L/p layers;
interleaving multiplies by 1 + (p-1)/(p v)), Megatron-LM's warm-up counts in
``pipeline_parallel/schedules.py`` (1F1B: p - r - 1; interleaved: 2 (p - r - 1) + (v - 1) p chunk
forwards), and the distributed-optimizer bytes per parameter of Megatron's
``theoretical_memory_usage.py`` with bf16 gradients (2 + 2 + 12/d).
"""

import pytest

from trainperf.plan import memory
from trainperf.specs import Layout, LayoutArrays, ModelSpec

# GPT-3 175B shape of Korthikanti et al. Table 3 (no dropout here, flash attention)
GPT = ModelSpec(name="gpt175", n_layers=96, hidden=12288, n_heads=96, n_kv_heads=96, ffn_hidden=4 * 12288,
                vocab=51200, seq_len=2048, gated_mlp=False, tied_embeddings=True, norm="layernorm",
                linear_bias=True, learned_pos_emb=True)


def test_1f1b_first_stage_holds_min_m_p():
    assert float(memory.inflight_micro_batches(8, 1, 64)) == 8.0
    assert float(memory.inflight_micro_batches(8, 1, 3)) == 3.0           # fewer micro batches than stages
    assert float(memory.inflight_micro_batches(8, 1, 64, last=True)) == 1.0


def test_interleaved_first_stage_is_korthikanti_eq6():
    for p, v in ((8, 3), (8, 12), (4, 2), (16, 5)):
        assert float(memory.inflight_micro_batches(p, v, 4 * p)) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_interleaved_few_micro_batches_hand_count():
    # p=8, v=3, m=4: 12 chunk forwards in all, fewer than the 2*7 + 2*8 = 30 warm-up ones, so all 12
    # chunks (of L/24 layers) are held at once = 4 micro batches of the stage's layers.
    assert float(memory.inflight_micro_batches(8, 3, 4)) == pytest.approx(4.0)
    # last stage (r = 7): (v-1) p = 16 warm-up + 1 = 17 chunks of the 24 = 17/3 micro batches
    assert float(memory.inflight_micro_batches(8, 3, 8, last=True)) == pytest.approx(17 / 3)


def test_first_stage_total_by_hand():
    # tp8 pp8 vpp3 dp4, selective recompute + sp, distributed optimizer (zero=1), m=32:
    # states (2 + 2 + 12/4) B per first-stage parameter; activations L * 34sbh/t-style per-layer bytes
    # times the interleaving penalty; fragmentation on the activations only.
    tp, pp, vpp, dp, ga = 8, 8, 3, 4, 32
    lay = LayoutArrays.of(Layout(tp=tp, pp=pp, dp=dp, vpp=vpp, sp=True, zero=1, recompute="selective",
                                 mbs=1, grad_accum=ga))
    s, h, f, L = GPT.seq_len, GPT.hidden, GPT.ffn_hidden, GPT.n_layers
    # per token per layer with sp + selective: (8h + 4q + 4kv + 4f) / t, q = kv = h here
    per_layer = s * (8 * h + 4 * h + 4 * h + 4 * f) / tp
    act = L * per_layer * (1 + (pp - 1) / (pp * vpp))
    p_first, _ = memory.stage_params(GPT, tp, pp, vpp)
    states = (2 + 2 + 12 / dp) * float(p_first)
    expect = states + act * (1 + memory.FRAGMENTATION) + memory.RESERVED_BYTES
    assert float(memory.memory_bytes(GPT, lay)) == pytest.approx(expect, rel=1e-9)


def test_distributed_optimizer_shards_only_fp32_states():
    p = 1e9
    for d in (1, 2, 8, 64):
        assert float(memory.model_state_bytes(p, d, 1)) == pytest.approx((2 + 2 + 12 / d) * p)
