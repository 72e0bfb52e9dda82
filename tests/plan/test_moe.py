"""Mixture of experts in the planner: all-to-all on the link the EP group crosses, expert memory, ep search."""

import json

import numpy as np
import pytest

from trainperf.errors import TrainperfError
from trainperf.plan import comm, memory
from trainperf.plan.efficiency import Efficiency
from trainperf.plan.estimate import estimate
from trainperf.plan.search import evaluate_all, search
from trainperf.specs import (Layout, LayoutArrays, expert_params_per_layer, layout_problems, load_model, make_cluster,
                             model_from_dict)

MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}
EFF = Efficiency()


def test_all_to_all_hand_formula_inside_and_across_nodes():
    c = make_cluster("h100", 64)  # 8 GPUs per NVLink domain, 450 GB/s NVLink, 50 GB/s NIC, bus eff 0.8
    up, nic = 450e9 * 0.8, 50e9 * 0.8
    b = 1e9
    # 8 ranks in one node: each keeps 1/8, sends 7/8 over NVLink; alpha per log2 step
    assert float(comm.all_to_all_s(c, EFF, b, 1, 8)) == pytest.approx(b * 7 / 8 / up + 8e-6 * 3)
    # 32 ranks, 8 per node: 24/32 of the bytes leave through the NIC, which paces the exchange
    assert float(comm.all_to_all_s(c, EFF, b, 1, 32)) == pytest.approx(b * 24 / 32 / nic + 20e-6 * 5)
    # a stride of 2 (tp=2 inside the node) leaves 4 group members per node
    assert float(comm.all_to_all_s(c, EFF, b, 2, 16)) == pytest.approx(b * 12 / 16 / nic + 20e-6 * 4)
    assert float(comm.all_to_all_s(c, EFF, b, 1, 1)) == 0.0


def test_all_to_all_across_nvl72_trays_runs_at_nccls_measured_rate():
    # GB200 NVL72: 4 GPUs per tray, one 72-GPU NVLink domain. Peers in the tray at NVLink x bus eff,
    # peers in other trays of the domain at the catalog's NCCL all-to-all rate (43 GB/s: ~40 GiB/s
    # measured on 64 GPUs, rapidsai/rapidsmpf#833), beyond the domain through the NIC; the slowest paces.
    c = make_cluster("gb200", 128)
    up, a2a, nic = 900e9 * 0.8, 43e9, 50e9 * 0.8
    b = 1e9
    assert float(comm.all_to_all_s(c, EFF, b, 1, 4)) == pytest.approx(b * 3 / 4 / up + 8e-6 * 2)
    # 32 ranks 2 apart (tp=2): 2 in the tray, 30 in other trays of the rack
    assert float(comm.all_to_all_s(c, EFF, b, 2, 32)) == pytest.approx(b * 30 / 32 / a2a + 8e-6 * 5)
    # 128 ranks: 72 in the domain (4 in the tray), 56 through the NIC
    t = max(b * 3 / 128 / up, b * 68 / 128 / a2a, b * 56 / 128 / nic) + 20e-6 * 7
    assert float(comm.all_to_all_s(c, EFF, b, 1, 128)) == pytest.approx(t)


def test_mixtral_is_planned_as_moe_not_dense():
    m = model_from_dict(MIXTRAL, "mixtral")
    c = make_cluster("h100", 64)
    e8 = estimate(m, c, Layout(tp=2, ep=8, zero=1), 256)
    assert e8.breakdown["ep_comm"] > 0
    # 46.7B parameters: with ep=1 every GPU holds all 8 experts (tp=2): more memory than with ep=8
    e1 = estimate(m, c, Layout(tp=2, ep=1, zero=1), 256)
    assert e1.memory_bytes_per_gpu > e8.memory_bytes_per_gpu
    # expert weights per GPU fall by ep: the difference in bf16 weights + grads is (1 - 1/8) of them, by hand
    lay1, lay8 = (LayoutArrays.of(x.layout) for x in (e1, e8))
    p1 = memory.stage_expert_params(m, 1, 1, lay1.ep, lay1.etp)
    p8 = memory.stage_expert_params(m, 1, 1, lay8.ep, lay8.etp)
    assert float(p1) == pytest.approx(32 * expert_params_per_layer(m) / 2)
    assert float(p8) == pytest.approx(float(p1) / 8)
    # MFU counts active FLOPs: a plausible 20-60% range, not the dense misreading's
    assert 0.15 < e8.mfu < 0.65


def test_ep_crossing_nodes_costs_more_than_inside():
    m = model_from_dict(MIXTRAL, "mixtral")
    c = make_cluster("h100", 64)
    inside = estimate(m, c, Layout(tp=1, ep=8, zero=1), 256)
    across = estimate(m, make_cluster("h100", 64, nic_gbit_per_gpu=100), Layout(tp=1, ep=8, zero=1), 256)
    assert inside.breakdown["ep_comm"] == pytest.approx(across.breakdown["ep_comm"])  # 8 ranks stay in the node
    wide = estimate(m, make_cluster("h100", 64, gpus_per_node=4), Layout(tp=1, ep=8, zero=1), 256)
    assert wide.breakdown["ep_comm"] > 3 * inside.breakdown["ep_comm"]  # half the peers behind a 50 GB/s NIC


def test_moe_layout_rules():
    m = model_from_dict(MIXTRAL, "mixtral")
    assert layout_problems(m, Layout(ep=8), 64) == []
    assert any("does not divide the model's 8 experts" in p for p in layout_problems(m, Layout(ep=16), 64))
    dense = load_model("llama3-8b")
    assert any("needs a mixture-of-experts model" in p for p in layout_problems(dense, Layout(ep=2), 8))
    with pytest.raises(TrainperfError, match="ep=16 does not divide"):
        estimate(m, make_cluster("h100", 64), Layout(ep=16), 256)


def test_search_covers_ep_and_matches_scalar():
    m = model_from_dict(MIXTRAL, "mixtral")
    c = make_cluster("h100", 64)
    arrays, out = evaluate_all(m, c, 256)
    assert set(np.unique(arrays.ep)) == {1, 2, 4, 8}
    i = int(np.flatnonzero(arrays.ep == 8)[0])
    est = estimate(m, c, arrays.at(i), 256)
    assert est.step_time_s == pytest.approx(out["step_time_s"][i], rel=1e-12)
    assert est.memory_bytes_per_gpu == pytest.approx(out["memory_bytes"][i], rel=1e-12)


def test_deepseek_v3_search_on_2048_gpus(tmp_path):
    # the search-speed case for MoE (benchmarks/bench_plan_search.py measures it; this guards 10x losses)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(DSV3))
    m, c = load_model(p), make_cluster("h800", 2048)
    res = search(m, c, 4096, top=3)
    assert res.elapsed_s < 10.0 and res.n_fit > 0
    arrays, _ = evaluate_all(m, c, 4096)
    assert len(arrays) == res.n_candidates and set(np.unique(arrays.ep)) >= {1, 8, 64, 256}
