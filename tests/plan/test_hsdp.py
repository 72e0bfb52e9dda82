"""Hybrid sharding (``Layout.dp_shard``): ZeRO/FSDP states sharded over a group, replicas all-reduce.

References: the ring alpha-beta formulas of plan/comm.py's docstring worked by hand for a
2-node DGX H100 job (NVLink 450 GB/s and one 400 Gb/s NIC per GPU, NCCL bus efficiency 0.8),
and the ZeRO-3 bytes per parameter (2 weights + 2 gradients + 12 optimizer) divided by the shard
group, as torchtitan's HSDP (dp_shard x dp_replicate) and Pax's ICI fsdp x DCN data meshes lay
them out.
"""

import pytest

from trainperf.errors import TrainperfError
from trainperf.plan import memory
from trainperf.plan.estimate import estimate
from trainperf.plan.stacks import get_stack
from trainperf.specs import Layout, ModelSpec, layout_problems, make_cluster, parse_layout

GPT5B = ModelSpec(name="gpt5b", n_layers=24, hidden=4096, n_heads=32, n_kv_heads=32, ffn_hidden=16384,
                  vocab=51200, seq_len=2048, gated_mlp=False, tied_embeddings=True, norm="layernorm",
                  linear_bias=True, learned_pos_emb=True)


def test_dp_shard_round_trips_and_is_checked():
    lay = parse_layout("tp=1,pp=1,dp=16,zero=3,mbs=4,dp_shard=8")
    assert lay.dp_shard == 8
    assert parse_layout(lay.to_string()) == lay
    assert "dp_shard" not in Layout().to_string()          # unchanged strings for plain layouts
    assert any("does not divide dp=16" in p for p in layout_problems(GPT5B, Layout(dp=16, zero=3, dp_shard=6), 16))
    assert any("zero >= 1" in p for p in layout_problems(GPT5B, Layout(dp=16, zero=0, dp_shard=8), 16))
    assert any("reference trainer" in p
               for p in layout_problems(GPT5B, Layout(dp=16, zero=3, dp_shard=8), 16, for_trainer=True))
    with pytest.raises(TrainperfError):
        Layout(dp_shard=-1)


def test_dp_shard_equal_to_dp_is_plain_fsdp():
    cluster = make_cluster("h100", 16, 8)
    a = estimate(GPT5B, cluster, Layout(zero=3, mbs=4), 64)
    b = estimate(GPT5B, cluster, Layout(zero=3, mbs=4, dp_shard=16), 64)
    assert b.step_time_s == pytest.approx(a.step_time_s)
    assert b.memory_bytes_per_gpu == pytest.approx(a.memory_bytes_per_gpu)


def test_hsdp_states_and_collectives_by_hand():
    cluster = make_cluster("h100", 16, 8)
    sw = get_stack("megatron-2021")                      # no DP overlap: every collective is on the step
    full = estimate(GPT5B, cluster, Layout(zero=3, mbs=4), 64, None, sw)
    hsdp = estimate(GPT5B, cluster, Layout(zero=3, mbs=4, dp_shard=8), 64, None, sw)
    p, _ = memory.stage_params(GPT5B, 1, 1, 1)
    p = float(p)
    # states: 16 B per parameter over the shard group (8 GPUs instead of 16)
    w, g, o = memory.model_state_terms(p, 8, 3)
    assert float(w + g + o) == pytest.approx(16.0 * p / 8)
    assert hsdp.memory_bytes_per_gpu - full.memory_bytes_per_gpu == pytest.approx(16.0 * p / 8 - 16.0 * p / 16)
    # one micro batch (64 sequences / 16 ranks / mbs 4): all-gather forward, again backward, reduce-scatter
    nvlink, nic = 450e9 * 0.8, 50e9 * 0.8
    ag_in_node = 7 / 8 * 2.0 * p / nvlink + 8e-6 * 3            # 8 ranks inside one NVLink domain
    rs_in_node = 7 / 8 * 2.0 * p / nvlink + 8e-6 * 3            # bf16 gradients (megatron-2021)
    # the two replicas (8 ranks apart, one per node) all-reduce their 1/8 shard over one NIC each
    ar_replicas = 2 * (1 / 2) * 2.0 * p / 8 / nic + 20e-6 * 2
    assert hsdp.breakdown["dp_comm"] == pytest.approx(2 * ag_in_node + rs_in_node + ar_replicas, rel=1e-9)
    # sharding over both nodes instead: every ring crosses the network (8 NICs per node)
    across = min(nvlink, 8 * nic)
    ag_16 = 15 / 16 * 2.0 * p / across + 20e-6 * 4
    assert full.breakdown["dp_comm"] == pytest.approx(3 * ag_16, rel=1e-9)
