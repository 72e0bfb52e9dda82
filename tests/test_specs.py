"""specs: parameter counts, FLOPs per token, model loading (references named per test)."""

import json

import pytest

from trainperf.errors import TrainperfError
from trainperf.specs import (ModelSpec, active_param_count, attention_params, load_model, model_flops_per_token,
                             model_from_dict, param_count, parse_layout, recompute_flops_per_token, training_flops)


@pytest.mark.parametrize("name,expected", [
    # Meta's model cards / Hugging Face safetensors totals: 8.03B, 70.6B, 405.9B
    ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9),
])
def test_llama3_param_counts_match_published(name, expected):
    assert param_count(load_model(name)) == pytest.approx(expected, rel=0.001)


def test_llama3_8b_exact_param_count():
    # Hugging Face meta-llama/Meta-Llama-3-8B: 8,030,261,248 parameters (safetensors index total_size / 2)
    assert param_count(load_model("llama3-8b")) == 8_030_261_248


def test_gpt3_training_compute():
    # Brown et al. 2020 / Kaplan 6ND: 175B params x 300B tokens ~ 3.14e23 FLOPs
    m = load_model("gpt3-175b")
    assert 6 * param_count(m) * 300e9 == pytest.approx(3.14e23, rel=0.01)
    # our count adds causal attention and the LM head: within 2% of 6ND
    assert training_flops(m, 300e9) == pytest.approx(3.14e23, rel=0.02)


def _hand_model():
    return ModelSpec(name="hand", n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, ffn_hidden=16, vocab=10, seq_len=4)


def test_small_case_by_hand():
    m = _hand_model()  # head_dim 4, q 8, kv 4
    # per layer: q 8*8 + k,v 2*8*4 + o 8*8 + 3 gated mlp mats 3*8*16 = 576 matmul weights, + 2 rmsnorm x 8
    # total: 2*(576+16) + embedding 10*8 + lm head 10*8 + final norm 8 = 1352
    assert param_count(m) == 1352
    # forward per token per layer: 2*576 + causal attention 2*s*q = 2*4*8 = 64 -> 1216; x2 layers + head 2*10*8
    # = 2592; training = 3x = 7776 (non-causal attention: 2*(1152+128)+160 = 2720 -> 8160)
    assert model_flops_per_token(m) == 7776
    assert model_flops_per_token(m, causal=False) == 8160
    assert recompute_flops_per_token(m, "full") == 2432
    assert recompute_flops_per_token(m, "selective") == 128
    assert recompute_flops_per_token(m, "none") == 0


def test_hf_config_json(tmp_path):
    # Hugging Face meta-llama/Meta-Llama-3-8B config.json keys
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_model(p)
    assert param_count(m) == 8_030_261_248
    assert load_model(tmp_path, seq_len=4096).seq_len == 4096  # a directory holding config.json


def test_own_json_and_missing_field(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"n_layers": 2, "hidden": 8, "n_heads": 2, "n_kv_heads": 1, "ffn_hidden": 16,
                             "vocab": 10, "seq_len": 4}))
    assert param_count(load_model(p)) == 1352
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"n_layers": 2, "hidden": 8, "n_heads": 2, "ffn_hidden": 16, "seq_len": 4}))
    with pytest.raises(TrainperfError, match="missing field 'vocab'"):
        load_model(bad)
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    with pytest.raises(TrainperfError, match="missing field 'num_hidden_layers'"):
        load_model(hf)


def test_unknown_model_lists_presets():
    with pytest.raises(TrainperfError, match="llama3-70b"):
        load_model("no-such-model")


def test_parse_layout_defaults_and_errors():
    lay = parse_layout("tp=8,pp=16,cp=1,vpp=1,mbs=1,sp=1,recompute=selective,zero=1")
    assert (lay.tp, lay.pp, lay.sp, lay.recompute, lay.zero) == (8, 16, True, "selective", 1)
    assert parse_layout("fsdp=1").zero == 3
    with pytest.raises(TrainperfError, match="does not divide"):
        parse_layout("tp=3").resolve(8)


# Hugging Face config.json fields of four MoE families (values as published on the Hub)
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
               "num_hidden_layers": 61, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
               "tie_word_embeddings": False}
QWEN_MOE = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
            "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
            "max_position_embeddings": 8192, "tie_word_embeddings": False, "mlp_only_layers": []}
OLMOE = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_attention_heads": 16,
         "num_key_value_heads": 16, "num_hidden_layers": 16, "num_experts": 64, "num_experts_per_tok": 8,
         "vocab_size": 50304, "max_position_embeddings": 4096, "tie_word_embeddings": False}


@pytest.mark.parametrize("cfg,total,active", [
    (MIXTRAL, 46.7e9, 12.9e9),        # Mistral AI: 46.7B total, 12.9B active per token
    (DEEPSEEK_V3, 671e9, 37e9),       # DeepSeek-V3 report: 671B total, 37B activated (MTP module excluded)
    (QWEN_MOE, 14.3e9, 2.7e9),        # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated
    (OLMOE, 6.9e9, 1.3e9),            # OLMoE-1B-7B paper: 6.9B total, 1.3B active
])
def test_moe_configs_count_total_and_active_params(tmp_path, cfg, total, active):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_model(p)
    assert m.is_moe and param_count(m) == pytest.approx(total, rel=0.015)
    assert active_param_count(m) == pytest.approx(active, rel=0.03)
    # FLOPs follow the active parameters: 6 x active matmul weights (+ attention at 4K), not 6 x total
    assert 6 * active_param_count(m) * 0.9 < model_flops_per_token(m.with_seq_len(4096)) < 6 * active_param_count(m) * 1.3


def test_deepseek_v3_reads_mla_and_dense_layers():
    m = model_from_dict(DEEPSEEK_V3, "dsv3")
    assert (m.n_experts, m.top_k, m.moe_ffn_hidden, m.shared_ffn_hidden, m.n_dense_layers) == (256, 8, 2048, 2048, 3)
    assert m.mla and (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_dim, m.head_dim, m.v_head_dim) == (1536, 512, 64, 192, 128)
    # hand count of one layer's MLA projections: q 7168*1536 + 1536*128*192, kv 7168*576 + 512*128*256,
    # out 128*128*7168
    assert attention_params(m) == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168


def test_moe_without_top_k_is_one_line_error(tmp_path):
    cfg = dict(MIXTRAL)
    del cfg["num_experts_per_tok"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(TrainperfError, match="8 experts.*num_experts_per_tok") as err:
        load_model(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("cfg", [
    # Trimmed from the Hugging Face configs of state-spaces/mamba-130m-hf, google-t5/t5-small and
    # google-bert/bert-base-uncased: a state-space model, an encoder-decoder and an encoder-only model.
    {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280, "state_size": 16},
    {"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "vocab_size": 32128},
    {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
     "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512},
])
def test_non_decoder_model_types_are_refused_by_name(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(TrainperfError) as err:
        load_model(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: model_type '{cfg['model_type']}' is not supported (supported: llama, mistral")
    assert "\n" not in msg and "missing field" not in msg
