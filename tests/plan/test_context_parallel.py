"""Context parallelism: ring attention's KV exchange step by step, activations and states with cp, by hand.

References: TransformerEngine's p2p context parallelism (``AttnFuncWithCPAndKVP2P``: forward
sends the KV block cp - 1 times, each behind one step's attention; backward sends KV, then
KV and dKV packed, then dKV, one per step), the load-balanced causal split (two chunks per
rank, every step the same 1/cp of the rank's attention), and Korthikanti et al. 2022's
activation bytes with the tokens of one rank (s / cp).
"""

import pytest

from trainperf.plan import comm, memory
from trainperf.specs import Layout, LayoutArrays, load_model, param_count


def test_ring_exposure_by_hand():
    # 8 MiB KV block, 100 GB/s, alpha 10 us: one send 93.886 us, a packed KV + dKV send 177.772 us
    kv, bw, alpha = 8 * 2**20, 100e9, 10e-6
    t1, t2 = alpha + kv / bw, alpha + 2 * kv / bw
    assert t1 == pytest.approx(93.886e-6, rel=1e-4) and t2 == pytest.approx(177.772e-6, rel=1e-4)
    # cp 4, forward attention 200 us (50 us a step), backward 500 us (125 us a step)
    ring = comm.ring_attention_s(kv, 4, bw, alpha, 200e-6, 500e-6)
    assert float(ring.fwd_exposed) == pytest.approx(3 * (93.886e-6 - 50e-6), rel=1e-4)            # 131.7 us
    assert float(ring.bwd_exposed) == pytest.approx(2 * 0.0 + 2 * (177.772e-6 - 125e-6), rel=1e-4)  # 105.5 us
    assert float(ring.fwd_sent) == pytest.approx(3 * t1) and float(ring.bwd_sent) == pytest.approx(2 * t1 + 2 * t2)


def test_ring_step_cannot_borrow_time_from_other_steps():
    # cp 8, each send 100 us, forward attention 720 us in all (90 us a step): the sends add up to
    # 700 us < 720 us, yet every step waits 10 us for its block
    ring = comm.ring_attention_s(100e-6 * 100e9, 8, 100e9, 0.0, 720e-6, 1.0)
    assert float(ring.fwd_exposed) == pytest.approx(7 * 10e-6)
    # long attention hides everything; cp 1 sends nothing
    assert comm.ring_attention_s(1e6, 8, 100e9, 0.0, 1.0, 2.0)[:2] == (0.0, 0.0)
    assert comm.ring_attention_s(1e9, 1, 1e9, 1e-3, 0.0, 0.0) == (0.0, 0.0, 0.0, 0.0)


def test_cp_divides_activations_and_shards_states_over_dp_times_cp():
    # tiny: 4 layers, h 128, 4 heads (head dim 32), 2 kv heads (kv width 64), ffn 352, vocab 256, seq 128
    m = load_model("tiny")
    lay = LayoutArrays.of(Layout(cp=2, dp=4, mbs=2, grad_accum=4, zero=1))
    terms = memory.memory_terms(m, lay)
    # per token per layer, no recompute, tp 1, flash: norms/inputs 8h + Q 2q, K/V 4kv, attention out 2q,
    # gated MLP 6f, softmax statistics 4 B per head
    per_token_layer = 8 * 128 + 4 * 128 + 4 * 64 + 6 * 352 + 4 * 4
    tokens = 2 * 128 / 2                                   # mbs x seq / cp
    act = 4 * tokens * per_token_layer + 4 * tokens * 256  # layers (one micro batch in flight) + fp32 logits
    assert float(terms["activations and buffers"]) == pytest.approx(act * (1 + memory.FRAGMENTATION), rel=1e-12)
    # ZeRO-1 over the 4 x 2 ranks that hold the same weights: 12 B / 8 of Adam state per parameter
    assert float(terms["optimizer state"]) == pytest.approx(12 * param_count(m) / 8, rel=1e-12)
    assert float(terms["weights"]) == pytest.approx(2 * param_count(m), rel=1e-12)
    # the same layout without cp holds twice the activations
    no_cp = memory.memory_terms(m, LayoutArrays.of(Layout(cp=1, dp=8, mbs=2, grad_accum=4, zero=1)))
    assert float(no_cp["activations and buffers"]) == pytest.approx(2 * act * (1 + memory.FRAGMENTATION), rel=1e-12)
    assert sum(float(v) for v in terms.values()) == pytest.approx(float(memory.memory_bytes(m, lay)), rel=1e-12)


def test_causal_attention_is_split_evenly_over_cp_ranks():
    # load-balanced causal split (two chunks per rank): every rank computes 1/cp of the lower
    # triangle, s^2/2 x (d_qk + d_v) x 2 FLOPs per head in all; with the short-sequence penalty
    # switched off (attn_seq_half = 0) a rank's time is exactly 1/cp of the whole
    from trainperf.plan import compute
    from trainperf.plan.efficiency import Efficiency

    m = load_model("llama3-8b", 8192)
    eff = Efficiency(attn_eff=0.5, attn_seq_half=0.0)
    peak = 989e12
    whole = float(compute.attention_fwd_s(m, 1, m.seq_len, 1, 1, peak, 3e12, eff))
    head_factor = (m.head_dim / (m.head_dim + 32.0)) / (128.0 / 160.0)   # 1 at head dim 128
    flops = m.seq_len**2 / 2 * 2 * (m.head_dim + m.head_dim) * m.n_heads
    assert whole == pytest.approx(flops / (peak * 0.5 * head_factor), rel=1e-12)
    for cp in (2, 4, 8):
        assert float(compute.attention_fwd_s(m, 1, m.seq_len, 1, cp, peak, 3e12, eff)) == pytest.approx(whole / cp)
