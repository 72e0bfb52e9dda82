"""The one vocabulary of trainperf: ModelSpec, Cluster, Layout, and the FLOP count.

Every verb imports these; nothing re-derives them. The FLOP convention, stated once:

* A multiply-add is 2 FLOPs. Training = forward + backward = 3x the forward FLOPs.
* Model FLOPs (MFU) count every matmul of the model, including the attention score and
  value products and the LM head. Embedding lookups, norms, activations and softmax are
  not counted (they are memory-bound and negligible in FLOPs).
* Causal convention: attention under a causal mask only computes the lower triangle, so
  the score and value products cost ``2 * seq * d_attn`` FLOPs per token per layer in the
  forward pass (half the non-causal ``4 * seq * d_attn``). ``causal=False`` gives the
  Megatron/PaLM non-causal count for comparison with papers that use it.
* Hardware FLOPs (HFU) add the FLOPs recomputed by activation checkpointing; they are
  reported separately and never mixed into MFU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainperf.errors import TrainperfError

if TYPE_CHECKING:
    from trainperf.hardware import Accelerator


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, as far as performance is concerned."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    gated_mlp: bool = True  # SwiGLU-style: three ffn matrices instead of two
    tied_embeddings: bool = False
    head_dim: int = 0  # 0: hidden // n_heads
    norm: str = "rmsnorm"  # "rmsnorm" (1 vector/norm) or "layernorm" (weight + bias)
    linear_bias: bool = False  # GPT-2/3 style biases on every linear layer
    learned_pos_emb: bool = False  # GPT-style learned position table (seq_len x hidden)
    # Mixture of experts (0 experts: dense). Each MoE layer routes every token to top_k of
    # n_experts experts of width moe_ffn_hidden, plus always-on shared experts of total width
    # shared_ffn_hidden; the first n_dense_layers layers keep a dense MLP of width ffn_hidden.
    n_experts: int = 0
    top_k: int = 0
    moe_ffn_hidden: int = 0
    shared_ffn_hidden: int = 0
    n_dense_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: ordinary attention). Q and K
    # heads are qk_nope_dim + qk_rope_dim wide (head_dim), V heads v_head_dim.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len"):
            if int(getattr(self, f)) <= 0:
                raise TrainperfError(f"model {self.name!r}: {f} must be a positive integer")
        if self.head_dim == 0:
            if self.hidden % self.n_heads:
                raise TrainperfError(
                    f"model {self.name!r}: hidden {self.hidden} is not divisible by n_heads {self.n_heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise TrainperfError(
                f"model {self.name!r}: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if self.n_experts:
            if self.n_experts < 2 or not 1 <= self.top_k <= self.n_experts or self.moe_ffn_hidden <= 0:
                raise TrainperfError(f"model {self.name!r}: a mixture of experts needs n_experts >= 2, "
                                     f"1 <= top_k <= n_experts and moe_ffn_hidden > 0")
            if not 0 <= self.n_dense_layers < self.n_layers:
                raise TrainperfError(f"model {self.name!r}: n_dense_layers must be below n_layers")
        if self.kv_lora_rank and not self.v_head_dim:
            object.__setattr__(self, "v_head_dim", self.head_dim)

    @property
    def q_dim(self) -> int:
        """Width of the query projection (n_heads * head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections (n_kv_heads * head_dim)."""
        return self.n_kv_heads * self.head_dim

    @property
    def n_ffn_mats(self) -> int:
        """Number of hidden x ffn_hidden matrices in the MLP (3 gated, 2 plain)."""
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.n_experts > 1

    @property
    def n_moe_layers(self) -> int:
        """Layers with a routed MLP (0 for a dense model)."""
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    @property
    def mla(self) -> bool:
        """True when attention is multi-head latent attention (compressed KV)."""
        return self.kv_lora_rank > 0

    @property
    def v_dim(self) -> int:
        """Width of the attention output before the output projection (n_heads * v head dim)."""
        return self.n_heads * (self.v_head_dim or self.head_dim)

    def with_seq_len(self, seq_len: int) -> "ModelSpec":
        """Return a copy with another sequence length."""
        return replace(self, seq_len=int(seq_len))

    def to_dict(self) -> dict:
        """Return the spec as a plain JSON-able dict (our own config format)."""
        return asdict(self)


def attention_gemms(m: ModelSpec) -> list[tuple[int, int, str]]:
    """Return the attention projections of one layer as (out width N, in width K, tp split).

    The split says which dimension tensor parallelism divides: "n" (column parallel), "k"
    (row parallel) or "" (replicated, as MLA's down-projections are in Megatron-Core).
    """
    h = m.hidden
    if not m.mla:
        return [(m.q_dim + 2 * m.kv_dim, h, "n"), (h, m.q_dim, "k")]
    q = ([(m.q_lora_rank, h, ""), (m.q_dim, m.q_lora_rank, "n")] if m.q_lora_rank else [(m.q_dim, h, "n")])
    nope = m.head_dim - m.qk_rope_dim
    kv = [(m.kv_lora_rank + m.qk_rope_dim, h, ""), (m.n_heads * (nope + m.v_head_dim), m.kv_lora_rank, "n")]
    return q + kv + [(h, m.v_dim, "k")]


def attention_params(m: ModelSpec) -> int:
    """Return one layer's attention projection weights (count)."""
    return sum(n * k for n, k, _ in attention_gemms(m))


def mlp_params(m: ModelSpec, width: int) -> int:
    """Return the weights of one MLP of ``width`` (count; 3 matrices gated, 2 plain)."""
    return m.n_ffn_mats * m.hidden * width


def moe_layer_mlp_params(m: ModelSpec) -> tuple[int, int]:
    """Return (all, active per token) MLP weights of one MoE layer: router, experts, shared experts."""
    router = m.hidden * m.n_experts
    shared = mlp_params(m, m.shared_ffn_hidden) if m.shared_ffn_hidden else 0
    expert = mlp_params(m, m.moe_ffn_hidden)
    return router + m.n_experts * expert + shared, router + m.top_k * expert + shared


def active_ffn_width(m: ModelSpec) -> float:
    """Return the MLP width one token activates in the average layer (elements).

    Dense layers: ffn_hidden; MoE layers: top_k routed experts plus the shared experts.
    """
    if not m.is_moe:
        return float(m.ffn_hidden)
    moe = m.top_k * m.moe_ffn_hidden + m.shared_ffn_hidden
    return (m.n_dense_layers * m.ffn_hidden + m.n_moe_layers * moe) / m.n_layers


def layer_matmul_params(m: ModelSpec) -> float:
    """Return the matmul weights of the average transformer layer (count, no biases or norms).

    For a mixture of experts this counts every expert (the memory side); the FLOP side uses
    ``active_layer_matmul_params``.
    """
    dense = attention_params(m) + mlp_params(m, m.ffn_hidden)
    if not m.is_moe:
        return dense
    moe = attention_params(m) + moe_layer_mlp_params(m)[0]
    return (m.n_dense_layers * dense + m.n_moe_layers * moe) / m.n_layers


def expert_params_per_layer(m: ModelSpec) -> float:
    """Return the routed-expert weights of the average layer (count; what expert parallelism shards)."""
    if not m.is_moe:
        return 0.0
    return m.n_moe_layers * m.n_experts * mlp_params(m, m.moe_ffn_hidden) / m.n_layers


def active_layer_matmul_params(m: ModelSpec) -> float:
    """Return the matmul weights one token passes through in the average layer (count)."""
    if not m.is_moe:
        return layer_matmul_params(m)
    dense = attention_params(m) + mlp_params(m, m.ffn_hidden)
    moe = attention_params(m) + moe_layer_mlp_params(m)[1]
    return (m.n_dense_layers * dense + m.n_moe_layers * moe) / m.n_layers


def layer_params(m: ModelSpec) -> float:
    """Return all parameters of the average transformer layer (count): matmuls, biases, two norms."""
    per_norm = 2 * m.hidden if m.norm == "layernorm" else m.hidden
    biases = 0
    if m.linear_bias:
        biases = m.q_dim + 2 * m.kv_dim + m.hidden + (m.n_ffn_mats - 1) * m.ffn_hidden + m.hidden
    latent_norms = (m.q_lora_rank + m.kv_lora_rank) if m.mla else 0
    return layer_matmul_params(m) + biases + 2 * per_norm + latent_norms


def embedding_params(m: ModelSpec) -> int:
    """Return the input embedding (and learned position table) parameters (count)."""
    return m.vocab * m.hidden + (m.seq_len * m.hidden if m.learned_pos_emb else 0)


def lm_head_params(m: ModelSpec) -> int:
    """Return the output projection's own parameters (count; 0 when tied to the embedding)."""
    return 0 if m.tied_embeddings else m.vocab * m.hidden


def final_norm_params(m: ModelSpec) -> int:
    """Return the final norm's parameters before the output projection (count: LayerNorm 2h, RMSNorm h)."""
    return 2 * m.hidden if m.norm == "layernorm" else m.hidden


def param_count(m: ModelSpec) -> int:
    """Return the total parameter count of the model (count; every expert of a MoE)."""
    return round(m.n_layers * layer_params(m) + embedding_params(m) + lm_head_params(m) + final_norm_params(m))


def active_param_count(m: ModelSpec) -> int:
    """Return the parameters one token passes through (count; = param_count for a dense model)."""
    return param_count(m) - round(m.n_layers * (layer_matmul_params(m) - active_layer_matmul_params(m)))


def attention_fwd_flops_per_token(m: ModelSpec, seq_len: int | None = None, causal: bool = True) -> float:
    """Return forward FLOPs per token of one layer's score (QK^T) and value (PV) products."""
    s = m.seq_len if seq_len is None else seq_len
    full = 2.0 * s * (m.q_dim + m.v_dim)  # 2*s*d_qk for QK^T plus 2*s*d_v for PV, per token
    return full / 2.0 if causal else full


def layer_fwd_flops_per_token(m: ModelSpec, seq_len: int | None = None, causal: bool = True) -> float:
    """Return forward FLOPs per token of the average transformer layer (FLOPs; active experts only)."""
    return 2.0 * active_layer_matmul_params(m) + attention_fwd_flops_per_token(m, seq_len, causal)


def lm_head_fwd_flops_per_token(m: ModelSpec) -> float:
    """Return forward FLOPs per token of the output projection (FLOPs)."""
    return 2.0 * m.vocab * m.hidden


def model_flops_per_token(m: ModelSpec, seq_len: int | None = None, causal: bool = True) -> float:
    """Return training (forward + backward) model FLOPs per token, the MFU numerator (FLOPs)."""
    fwd = m.n_layers * layer_fwd_flops_per_token(m, seq_len, causal) + lm_head_fwd_flops_per_token(m)
    return 3.0 * fwd


def recompute_flops_per_token(
    m: ModelSpec, recompute: str, seq_len: int | None = None, causal: bool = True
) -> float:
    """Return the extra forward FLOPs per token that activation recompute adds (FLOPs).

    ``full`` re-runs every layer's forward; ``selective`` (Korthikanti et al.) re-runs only
    the attention core (score and value products); ``none`` adds nothing.
    """
    if recompute == "full":
        return m.n_layers * layer_fwd_flops_per_token(m, seq_len, causal)
    if recompute == "selective":
        return m.n_layers * attention_fwd_flops_per_token(m, seq_len, causal)
    if recompute == "none":
        return 0.0
    raise TrainperfError(f"recompute must be none, selective or full, not {recompute!r}")


def hardware_flops_per_token(
    m: ModelSpec, recompute: str, seq_len: int | None = None, causal: bool = True
) -> float:
    """Return training FLOPs per token including recompute, the HFU numerator (FLOPs)."""
    return model_flops_per_token(m, seq_len, causal) + recompute_flops_per_token(m, recompute, seq_len, causal)


def training_flops(m: ModelSpec, tokens: float, causal: bool = True) -> float:
    """Return the model FLOPs to train on ``tokens`` tokens (FLOPs)."""
    return model_flops_per_token(m, causal=causal) * float(tokens)


def mfu(tokens_per_s_per_gpu: float, m: ModelSpec, peak_flops_per_gpu: float, causal: bool = True) -> float:
    """Return model FLOPs utilisation (fraction of ``peak_flops_per_gpu``, FLOP/s)."""
    return tokens_per_s_per_gpu * model_flops_per_token(m, causal=causal) / peak_flops_per_gpu


# ---------------------------------------------------------------- model presets


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    return ModelSpec(
        name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=heads,
        ffn_hidden=4 * hidden, vocab=vocab, seq_len=seq, gated_mlp=False, tied_embeddings=True,
        norm="layernorm", linear_bias=True, learned_pos_emb=True,
    )


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int,
           tied: bool = False) -> ModelSpec:
    return ModelSpec(name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
                     ffn_hidden=ffn, vocab=vocab, seq_len=seq, tied_embeddings=tied)


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # Brown et al. 2020 (GPT-3), Table 2.1; vocab 50257 (Megatron pads it to 51200).
        _gpt("gpt3-175b", 96, 12288, 96, vocab=50257),
        # Narayanan et al. SC21, Table 1 (vocab 51200, seq 2048, ffn 4h).
        _gpt("gpt-1.7b", 24, 2304, 24),
        _gpt("gpt-3.6b", 30, 3072, 32),
        _gpt("gpt-7.5b", 36, 4096, 32),
        _gpt("gpt-18.4b", 40, 6144, 48),
        _gpt("gpt-39.1b", 48, 8192, 64),
        _gpt("gpt-76.1b", 60, 10240, 80),
        _gpt("gpt-145.6b", 80, 12288, 96),
        _gpt("gpt-310.1b", 96, 16384, 128),
        _gpt("gpt-529.6b", 105, 20480, 128),
        _gpt("gpt-1t", 128, 25600, 160),
        # Llama 2 (Touvron et al. 2023) and Llama 3 / 3.1 / 3.2 (Meta model cards, config.json).
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-1b", 16, 2048, 32, 8, 8192, 128256, 8192, tied=True),
        _llama("llama3-3b", 28, 3072, 24, 8, 8192, 128256, 8192, tied=True),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        # Small Llama-style models for CPU tests and single-GPU benchmarks (ours).
        _llama("tiny", 4, 128, 4, 2, 352, 256, 128, tied=True),
        _llama("small", 8, 512, 8, 4, 1408, 4096, 512),
    ]
}

_MODEL_ALIASES = {
    "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "gpt3-175b": "gpt3-175b",
    "llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b", "llama3.1-405b": "llama3-405b",
    "llama3.2-1b": "llama3-1b", "llama3.2-3b": "llama3-3b", "gpt-1008b": "gpt-1t", "llama-1b": "llama3-1b",
    "llama-3b": "llama3-3b", "llama-8b": "llama3-8b",
}

_OWN_KEYS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len")
_HF_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions", "max_seq_len"),
}


def _norm_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


# Expert-count keys of the Hugging Face MoE configs: Mixtral (num_local_experts), Qwen-MoE and
# OLMoE (num_experts), DeepSeek-V2/V3 (n_routed_experts), DBRX-style (moe_num_experts).
_HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_HF_TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k")
_INT_KEYS = ("n_experts", "top_k", "moe_ffn_hidden", "shared_ffn_hidden", "n_dense_layers", "q_lora_rank",
             "kv_lora_rank", "qk_rope_dim", "v_head_dim")


def _first_int(d: dict, keys) -> int:
    return next((int(d[k]) for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), 0)


def _hf_moe_fields(d: dict, ffn_hidden: int, source: str) -> dict:
    """Return the ModelSpec MoE and MLA fields a Hugging Face config states (empty for dense, MHA).

    Mixtral: ``num_local_experts``, ``num_experts_per_tok``, experts as wide as
    ``intermediate_size``. Qwen2/3-MoE: ``num_experts``, ``moe_intermediate_size``,
    ``shared_expert_intermediate_size`` (one shared expert), ``mlp_only_layers``.
    DeepSeek-V2/V3: ``n_routed_experts``, ``moe_intermediate_size``, ``n_shared_experts``
    (each as wide as a routed one), ``first_k_dense_replace`` dense layers, and MLA
    (``q_lora_rank``, ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``).
    OLMoE: ``num_experts`` of ``intermediate_size``.
    """
    out: dict = {}
    experts = _first_int(d, _HF_EXPERT_KEYS)
    if experts > 1:
        top_k = _first_int(d, _HF_TOP_K_KEYS)
        if not top_k:
            raise TrainperfError(f"{source}: a mixture of experts ({experts} experts) without num_experts_per_tok")
        width = _first_int(d, ("moe_intermediate_size",)) or ffn_hidden
        shared = _first_int(d, ("shared_expert_intermediate_size",)) or _first_int(d, ("n_shared_experts",)) * width
        dense = _first_int(d, ("first_k_dense_replace",))
        if not dense and isinstance(d.get("mlp_only_layers"), list):
            dense = len(d["mlp_only_layers"])  # Qwen-MoE: dense layers listed (placement not modelled)
        out.update(n_experts=experts, top_k=top_k, moe_ffn_hidden=width, shared_ffn_hidden=shared,
                   n_dense_layers=dense)
    if _first_int(d, ("kv_lora_rank",)):
        nope, rope = _first_int(d, ("qk_nope_head_dim",)), _first_int(d, ("qk_rope_head_dim",))
        out.update(q_lora_rank=_first_int(d, ("q_lora_rank",)), kv_lora_rank=int(d["kv_lora_rank"]),
                   qk_rope_dim=rope, v_head_dim=_first_int(d, ("v_head_dim",)) or nope, head_dim=nope + rope)
    return out


# Hugging Face ``model_type`` values whose architecture the plan's model covers: decoder-only
# transformers (dense, GQA, MoE, MLA). Encoder-only (BERT), encoder-decoder (T5) and state-space
# (Mamba) models have other FLOP and memory structures, so they are refused rather than planned
# as decoders.
SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2", "phi3",
    "olmo", "olmo2", "olmoe", "deepseek_v2", "deepseek_v3", "gpt2", "gpt_neox", "opt", "bloom", "falcon",
)


def model_from_dict(d: dict, name: str = "custom", source: str = "config") -> ModelSpec:
    """Return a ModelSpec from our JSON keys or a Hugging Face ``config.json`` dict.

    Raises TrainperfError naming ``source`` and the first missing field.
    """
    if all(k in d for k in ("n_layers", "hidden")):  # our own format
        missing = [k for k in _OWN_KEYS if k not in d and k != "n_kv_heads"]
        if missing:
            raise TrainperfError(f"{source}: missing field {missing[0]!r} (needs {', '.join(_OWN_KEYS)})")
        kw = {k: int(d[k]) for k in _OWN_KEYS if k in d}
        kw.setdefault("n_kv_heads", kw["n_heads"])
        for opt in ("gated_mlp", "tied_embeddings", "linear_bias", "learned_pos_emb"):
            if opt in d:
                kw[opt] = bool(d[opt])
        for opt in ("head_dim", *_INT_KEYS):
            if opt in d:
                kw[opt] = int(d[opt])
        if "norm" in d:
            kw["norm"] = str(d["norm"])
        return ModelSpec(name=str(d.get("name", name)), **kw)
    # Hugging Face config.json
    model_type = str(d.get("model_type", ""))
    if model_type and model_type not in SUPPORTED_MODEL_TYPES:
        raise TrainperfError(f"{source}: model_type {model_type!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    kw = {}
    for ours, theirs in _HF_KEYS.items():
        for key in theirs:
            if key in d and d[key] is not None:
                kw[ours] = int(d[key])
                break
        else:
            if ours == "ffn_hidden" and "hidden" in kw:
                kw[ours] = 4 * kw["hidden"]  # GPT-2 style configs leave n_inner null: 4h
                continue
            raise TrainperfError(f"{source}: missing field {theirs[0]!r} (a Hugging Face config.json needs it)")
    kw["n_kv_heads"] = int(d.get("num_key_value_heads") or kw["n_heads"])
    act = str(d.get("hidden_act", d.get("activation_function", "silu")))
    gated = model_type in {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2"} \
        or act in {"silu", "swiglu", "geglu"}
    if model_type in {"gpt2", "gpt_neox", "opt", "bloom", "falcon"}:
        gated = False
    if model_type.startswith("deepseek") or model_type in {"qwen2_moe", "qwen3_moe", "olmoe"}:
        gated = True
    moe = _hf_moe_fields(d, kw["ffn_hidden"], source)
    hd = moe.pop("head_dim", None) or d.get("head_dim")
    return ModelSpec(
        name=str(d.get("_name_or_path") or name), gated_mlp=gated,
        tied_embeddings=bool(d.get("tie_word_embeddings", model_type == "gpt2")),
        head_dim=int(hd) if hd else 0, **moe,
        norm="layernorm" if model_type in {"gpt2", "gpt_neox", "opt", "bloom", "falcon"} else "rmsnorm",
        linear_bias=bool(d.get("attention_bias", model_type in {"gpt2", "opt", "bloom"})),
        learned_pos_emb=model_type in {"gpt2", "opt"},
        **kw,
    )


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """Return a ModelSpec from a preset name or a JSON file (ours or Hugging Face's).

    Raises TrainperfError with the list of presets for an unknown name, or naming the file
    and what is wrong with it.
    """
    key = _norm_name(str(name_or_path))
    key = _MODEL_ALIASES.get(key, key)
    if key in MODEL_PRESETS:
        spec = MODEL_PRESETS[key]
    else:
        path = Path(name_or_path)
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"
        if not path.is_file():
            raise TrainperfError(
                f"unknown model {str(name_or_path)!r}: not a preset and not a file "
                f"(presets: {', '.join(MODEL_PRESETS)})"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TrainperfError(f"{path}: not a readable JSON model config ({e})") from None
        if not isinstance(data, dict):
            raise TrainperfError(f"{path}: a model config must be a JSON object")
        try:
            spec = model_from_dict(data, name=path.stem if path.name != "config.json" else path.parent.name,
                                   source=str(path))
        except (TypeError, ValueError) as e:
            raise TrainperfError(f"{path}: bad value in model config ({e})") from None
    return spec.with_seq_len(seq_len) if seq_len else spec


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class Cluster:
    """A fixed hardware budget: n_gpus accelerators, gpus_per_node per node, and the links.

    Link bandwidths are per GPU, one direction, in GB/s (1e9 bytes/s). ``scaleup_domain`` is
    how many GPUs share the fast scale-up fabric (NVLink/xGMI/ICI); groups that fit inside it
    use ``scaleup_gbps``, groups that span it use ``scaleout_gbps`` (the NIC).
    """

    accelerator: "Accelerator"
    n_gpus: int
    gpus_per_node: int
    scaleup_gbps: float
    scaleout_gbps: float
    scaleup_domain: int
    usd_per_gpu_hour: float
    power_cap_w: float | None = None  # board power limit (W); below TDP it lowers the sustained clock
    fabric: str = "ib"                # scale-out fabric: ib or roce (priced alike: Gangidi et al. SIGCOMM'24)

    def __post_init__(self) -> None:
        if self.n_gpus <= 0 or self.gpus_per_node <= 0:
            raise TrainperfError("gpus and gpus-per-node must be positive")
        if self.n_gpus > self.gpus_per_node and self.n_gpus % self.gpus_per_node:
            raise TrainperfError(
                f"{self.n_gpus} GPUs is not a whole number of {self.gpus_per_node}-GPU nodes"
            )

    @property
    def n_nodes(self) -> int:
        """Number of nodes (at least 1)."""
        return max(1, self.n_gpus // self.gpus_per_node)

    @property
    def clock_scale(self) -> float:
        """Sustained tensor-core clock under ``power_cap_w`` as a fraction of the rated clock."""
        from trainperf.hardware import clock_scale

        return clock_scale(self.accelerator, self.power_cap_w)


def make_cluster(gpu: str, n_gpus: int, gpus_per_node: int | None = None,
                 scaleup_gbps: float | None = None, scaleout_gbps: float | None = None,
                 usd_per_gpu_hour: float | None = None, *, power_cap_w: float | None = None,
                 nic_gbit_per_gpu: float | None = None, fabric: str | None = None) -> Cluster:
    """Return a Cluster of ``n_gpus`` accelerators, catalog links unless overridden.

    ``gpu`` is a catalog name or a free-text description ("H100-SXM 80GB HBM3, 700W, RoCE
    400Gbps"); what the description states (power limit, NIC Gb/s per GPU, fabric, GPUs per
    node) applies unless the matching argument is given. ``scaleout_gbps`` is GB/s,
    ``nic_gbit_per_gpu`` Gb/s (as NICs are sold); the first wins when both are given.
    """
    from trainperf.hardware import FABRICS, parse_gpu_description

    desc = parse_gpu_description(gpu)
    acc = desc.accelerator
    fabric = (fabric or desc.fabric or "ib").lower()
    if fabric not in FABRICS:
        raise TrainperfError(f"fabric must be one of {', '.join(FABRICS)}, not {fabric!r}")
    power = power_cap_w if power_cap_w is not None else desc.power_cap_w
    if power is not None and power <= 0:
        raise TrainperfError(f"power cap must be positive watts, got {power}")
    nic = nic_gbit_per_gpu if nic_gbit_per_gpu is not None else desc.nic_gbit_per_gpu
    if scaleout_gbps is None and nic is not None:
        scaleout_gbps = float(nic) / 8.0
    gpn = min(int(gpus_per_node or desc.gpus_per_node or acc.gpus_per_node), int(n_gpus))
    # A scale-up fabric larger than a node (NVL72, a TPU pod) keeps its size; one that lives
    # inside a node (NVLink in an HGX board) cannot be larger than the node the user names.
    domain = acc.scaleup_domain if acc.scaleup_domain > acc.gpus_per_node else min(acc.scaleup_domain, gpn)
    return Cluster(
        accelerator=acc, n_gpus=int(n_gpus), gpus_per_node=gpn,
        scaleup_gbps=float(scaleup_gbps if scaleup_gbps is not None else acc.scaleup_gbps),
        scaleout_gbps=float(scaleout_gbps if scaleout_gbps is not None else acc.scaleout_gbps),
        scaleup_domain=int(domain),
        usd_per_gpu_hour=float(usd_per_gpu_hour if usd_per_gpu_hour is not None else acc.usd_per_hour),
        power_cap_w=float(power) if power is not None else None, fabric=fabric,
    )


# --------------------------------------------------------------------------- layout

RECOMPUTE_MODES = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")


@dataclass(frozen=True)
class Layout:
    """How one training job is laid out on its GPUs; the planner, trainer and diagnoser share it.

    ``dp`` is the data-parallel degree (0: fill the remaining GPUs). ``zero`` is the ZeRO
    stage: 0 plain DDP, 1 optimizer states sharded (Megatron's distributed optimizer),
    2 + gradients, 3 + weights (= FSDP full shard). ``grad_accum`` 0 means derived from the
    global batch: global_batch / (dp * mbs). ``dp_shard`` is the hybrid-sharding group: the
    ZeRO/FSDP states are sharded over ``dp_shard`` data-parallel ranks and replicated over
    ``dp / dp_shard`` such groups, whose gradients are all-reduced (HSDP: torchtitan's
    dp_shard x dp_replicate, Paxml/MaxText's ICI fsdp x DCN data); 0 shards over all of dp.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 0
    cp: int = 1
    vpp: int = 1
    sp: bool = False
    zero: int = 1
    recompute: str = "none"
    mbs: int = 1
    grad_accum: int = 0
    precision: str = "bf16"
    ep: int = 1        # expert parallel: each MoE layer's experts split over ep ranks of the data-parallel group
    etp: int = 0       # expert tensor parallel: each expert split over etp ranks (0: same as tp)
    dp_shard: int = 0  # ZeRO/FSDP shard group (data-parallel ranks); the rest replicate (HSDP); 0: all of dp

    def __post_init__(self) -> None:
        if self.etp < 0:
            raise TrainperfError(f"layout: etp must be >= 0 (0: same as tp), got {self.etp}")
        if self.dp_shard < 0:
            raise TrainperfError(f"layout: dp_shard must be >= 0 (0: all data-parallel ranks), got {self.dp_shard}")
        for f in ("tp", "pp", "cp", "vpp", "mbs", "ep"):
            if int(getattr(self, f)) < 1:
                raise TrainperfError(f"layout: {f} must be >= 1, got {getattr(self, f)}")
        if self.dp < 0 or self.grad_accum < 0:
            raise TrainperfError("layout: dp and grad_accum must be >= 0")
        if self.zero not in (0, 1, 2, 3):
            raise TrainperfError(f"layout: zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.recompute not in RECOMPUTE_MODES:
            raise TrainperfError(f"layout: recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.precision not in PRECISIONS:
            raise TrainperfError(f"layout: precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.vpp > 1 and self.pp == 1:
            raise TrainperfError("layout: vpp > 1 needs pp > 1 (interleaving splits pipeline stages)")

    @property
    def model_parallel(self) -> int:
        """GPUs holding one model replica (tp * pp * cp)."""
        return self.tp * self.pp * self.cp

    @property
    def fsdp(self) -> bool:
        """True when weights are sharded over data parallel (ZeRO-3 / FSDP)."""
        return self.zero == 3

    @property
    def expert_tp(self) -> int:
        """Tensor parallel degree inside each expert (etp, or tp when etp is 0)."""
        return self.etp or self.tp

    def world_size(self) -> int:
        """Return tp * pp * cp * dp (GPUs); dp must be resolved (non-zero)."""
        return self.model_parallel * self.dp

    def resolve(self, n_gpus: int, global_batch: int | None = None) -> "Layout":
        """Return a copy with dp and grad_accum filled in for ``n_gpus`` GPUs and the batch.

        Raises TrainperfError naming the factor that does not divide.
        """
        mp = self.model_parallel
        if n_gpus % mp:
            raise TrainperfError(
                f"layout: tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {mp} does not divide {n_gpus} GPUs"
            )
        dp = self.dp or n_gpus // mp
        if mp * dp != n_gpus:
            raise TrainperfError(f"layout: tp*pp*cp*dp = {mp}*{dp} = {mp * dp} is not the {n_gpus} GPUs")
        grad_accum = self.grad_accum
        if global_batch is not None:
            if global_batch % (dp * self.mbs):
                raise TrainperfError(
                    f"layout: global batch {global_batch} is not divisible by dp*mbs = {dp}*{self.mbs}"
                )
            grad_accum = global_batch // (dp * self.mbs)
        return replace(self, dp=dp, grad_accum=max(grad_accum, 1))

    def to_string(self) -> str:
        """Return the canonical layout string (the form `--layout` and `trainperf train` accept)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}", f"vpp={self.vpp}",
                 f"sp={int(self.sp)}", f"recompute={self.recompute}", f"zero={self.zero}",
                 f"mbs={self.mbs}"]
        if self.grad_accum:
            parts.append(f"ga={self.grad_accum}")
        parts.append(f"precision={self.precision}")
        if self.ep > 1 or self.etp:
            parts.append(f"ep={self.ep}" + (f",etp={self.etp}" if self.etp else ""))
        if self.dp_shard:
            parts.append(f"dp_shard={self.dp_shard}")
        return ",".join(parts)

    def to_dict(self) -> dict:
        """Return the layout as a plain dict."""
        return asdict(self)


_LAYOUT_KEYS = {f.name for f in fields(Layout)}
_LAYOUT_ALIASES = {"ga": "grad_accum", "micro_batch": "mbs", "fsdp": "zero", "sequence_parallel": "sp"}
_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}


def parse_layout(text: str, **defaults) -> Layout:
    """Return a Layout from ``"tp=8,pp=16,cp=1,vpp=1,mbs=1,sp=1,recompute=selective,zero=1"``.

    Keys left out take ``defaults`` or the Layout defaults; ``fsdp=1`` means ``zero=3``.
    Raises TrainperfError naming the bad key or value.
    """
    kw: dict = dict(defaults)
    for typed, k, v in _layout_items(text):
        try:
            if typed == "fsdp":
                kw["zero"] = 3 if v in _TRUE else kw.get("zero", 1)
            elif k == "sp":
                if v not in _TRUE | _FALSE:
                    raise ValueError(v)
                kw[k] = v in _TRUE
            elif k in ("recompute", "precision"):
                kw[k] = v
            else:
                kw[k] = int(v)
        except ValueError:
            raise TrainperfError(f"layout: bad value {v!r} for {k}") from None
    return Layout(**kw)


def _layout_items(text: str):
    """Yield (key as typed, Layout field, value) of each ``key=value`` of a layout text, lower-cased; raise
    TrainperfError for an item that is not key=value or names no field."""
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise TrainperfError(f"layout: {item!r} is not key=value")
        typed, v = (s.strip().lower() for s in item.split("=", 1))
        k = _LAYOUT_ALIASES.get(typed, typed)
        if k not in _LAYOUT_KEYS:
            raise TrainperfError(f"layout: unknown key {k!r} (keys: tp, pp, dp, cp, vpp, sp, recompute, zero, mbs, ga, "
                                 "precision, ep, etp, dp_shard)")
        yield typed, k, v


def stated_layout_keys(text: str) -> frozenset[str]:
    """Return the Layout fields a layout text names (``"fsdp=1,ga=4"`` -> zero, grad_accum); the rest are implied.
    Raises TrainperfError as parse_layout does for an item that is not a known key=value."""
    return frozenset(k for _, k, _ in _layout_items(text))


# ------------------------------------------------------------ layouts as arrays, validity

RECOMPUTE_CODE = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAME = {v: k for k, v in RECOMPUTE_CODE.items()}


@dataclass(frozen=True, kw_only=True)
class LayoutArrays:
    """Many layouts at once: one NumPy array per ``Layout`` field, all the same length.

    ``recompute`` holds ``RECOMPUTE_CODE`` integers and ``precision`` is replaced by the
    boolean ``fp8`` (the only precision the time model distinguishes); everything else
    carries Layout's own names, so the planner's formulas read like the dataclass.
    """

    tp: object
    pp: object
    dp: object
    cp: object
    vpp: object
    sp: object
    zero: object
    recompute: object
    mbs: object
    grad_accum: object
    fp8: object
    ep: object = 1
    etp: object = 0    # resolved: the expert tensor parallel degree (never 0)
    dp_shard: object = 0  # ZeRO/FSDP shard group in dp ranks; 0: all of dp (``shard_group`` resolves it)

    def shard_group(self):
        """Return the data-parallel ranks one ZeRO/FSDP shard spans (dp_shard, or dp where it is 0)."""
        import numpy as np

        dps = np.asarray(self.dp_shard, dtype=float)
        return np.where(dps > 0, dps, np.asarray(self.dp, dtype=float))

    @classmethod
    def of(cls, layout: Layout) -> "LayoutArrays":
        """Return the one-element (scalar) arrays of a resolved ``layout``."""
        import numpy as np

        return cls(tp=np.asarray(layout.tp), pp=np.asarray(layout.pp), dp=np.asarray(layout.dp),
                   cp=np.asarray(layout.cp), vpp=np.asarray(layout.vpp), sp=np.asarray(layout.sp),
                   zero=np.asarray(layout.zero), recompute=np.asarray(RECOMPUTE_CODE[layout.recompute]),
                   mbs=np.asarray(layout.mbs), grad_accum=np.asarray(layout.grad_accum),
                   fp8=np.asarray(layout.precision == "fp8"), ep=np.asarray(layout.ep),
                   etp=np.asarray(layout.expert_tp), dp_shard=np.asarray(layout.dp_shard))

    def at(self, i: int, precision: str = "bf16") -> Layout:
        """Return element ``i`` as a Layout (``precision`` names the non-fp8 precision)."""
        import numpy as np

        def v(name):
            a = np.asarray(getattr(self, name))
            return a.reshape(-1)[i] if a.ndim else a

        tp, etp = int(v("tp")), int(v("etp"))
        return Layout(tp=tp, pp=int(v("pp")), dp=int(v("dp")), cp=int(v("cp")), vpp=int(v("vpp")),
                      sp=bool(v("sp")), zero=int(v("zero")), recompute=RECOMPUTE_NAME[int(v("recompute"))],
                      mbs=int(v("mbs")), grad_accum=int(v("grad_accum")),
                      precision="fp8" if bool(v("fp8")) else precision, ep=int(v("ep")),
                      etp=0 if etp in (0, tp) else etp, dp_shard=int(v("dp_shard")))

    def take(self, index) -> "LayoutArrays":
        """Return the layouts at ``index`` (integer or boolean array); scalar fields stay shared."""
        import numpy as np

        def pick(v):
            return np.asarray(v)[index] if np.ndim(v) else v

        return LayoutArrays(**{f.name: pick(getattr(self, f.name)) for f in fields(self)})

    def __len__(self) -> int:
        return int(getattr(self.tp, "size", 1))


def layout_problems(spec: ModelSpec, layout: Layout, n_gpus: int, *, for_trainer: bool = False) -> list[str]:
    """Return every reason ``layout`` cannot run ``spec`` on ``n_gpus`` GPUs (empty: it can).

    The one validity rule set of the planner, the search and the trainer. The planner allows
    tp > kv heads (Megatron replicates KV heads); the reference trainer (``for_trainer``)
    shards heads with DTensor, so tp must divide every head count, and it runs only dp, tp,
    zero, recompute, mbs, grad_accum and bf16/fp32.
    """
    out: list[str] = []
    mp = layout.model_parallel
    if n_gpus % mp:
        out.append(f"tp*pp*cp = {layout.tp}*{layout.pp}*{layout.cp} = {mp} does not divide {n_gpus} GPUs")
    elif layout.dp and mp * layout.dp != n_gpus:
        out.append(f"tp*pp*cp*dp = {mp}*{layout.dp} = {mp * layout.dp} is not the {n_gpus} GPUs")
    tp = layout.tp
    if spec.n_heads % tp:
        out.append(f"tp={tp} does not divide the model's {spec.n_heads} attention heads")
    if for_trainer:
        if spec.n_kv_heads % tp:
            out.append(f"tp={tp} does not divide the model's {spec.n_kv_heads} kv heads")
    elif spec.n_kv_heads % tp and tp % spec.n_kv_heads:
        out.append(f"tp={tp} and the model's {spec.n_kv_heads} kv heads: neither divides the other")
    if spec.ffn_hidden % tp:
        out.append(f"tp={tp} does not divide ffn_hidden {spec.ffn_hidden}")
    if layout.pp * layout.vpp > spec.n_layers:
        out.append(f"pp*vpp = {layout.pp}*{layout.vpp} exceeds the model's {spec.n_layers} layers")
    if layout.cp > 1 and spec.seq_len % (2 * layout.cp):
        out.append(f"cp={layout.cp} needs the sequence length {spec.seq_len} divisible by 2*cp")
    if layout.vpp > 1 and layout.grad_accum and layout.grad_accum % layout.pp:
        out.append(f"interleaving (vpp={layout.vpp}) needs micro batches per step ({layout.grad_accum}) "
                   f"divisible by pp={layout.pp}")
    if layout.dp_shard:
        dp = layout.dp or (n_gpus // mp if n_gpus % mp == 0 else 0)
        if layout.zero == 0:
            out.append(f"dp_shard={layout.dp_shard} needs sharded states (zero >= 1); zero=0 replicates everything")
        elif dp and dp % layout.dp_shard:
            out.append(f"dp_shard={layout.dp_shard} does not divide dp={dp} (shard groups must tile the data-parallel ranks)")
    if layout.ep > 1 or layout.etp:
        if not spec.is_moe:
            out.append(f"ep={layout.ep}/etp={layout.etp} needs a mixture-of-experts model; {spec.name} is dense")
        else:
            etp = layout.expert_tp
            if spec.n_experts % layout.ep:
                out.append(f"ep={layout.ep} does not divide the model's {spec.n_experts} experts")
            if spec.moe_ffn_hidden % etp:
                out.append(f"etp={etp} does not divide the expert width {spec.moe_ffn_hidden}")
            dp = layout.dp or (n_gpus // mp if n_gpus % mp == 0 else 0)
            if dp and (layout.tp * layout.cp * dp) % (etp * layout.ep):
                out.append(f"etp*ep = {etp}*{layout.ep} does not divide tp*cp*dp = "
                           f"{layout.tp}*{layout.cp}*{dp} (the ranks that hold one copy of the experts)")
    if for_trainer:
        if layout.ep > 1 or layout.etp:
            out.append("ep/etp (expert parallelism) is not run by the reference trainer")
        for name in ("pp", "cp", "vpp"):
            if getattr(layout, name) != 1:
                out.append(f"{name}={getattr(layout, name)} is not run by the reference trainer "
                           "(it runs dp, tp, zero, recompute, mbs, ga, precision)")
        if layout.sp and tp == 1:
            out.append("sp=1 (sequence parallel) needs tp > 1")
        if layout.sp and spec.seq_len % tp:
            out.append(f"sp=1 needs seq_len {spec.seq_len} divisible by tp={tp}")
        dp = layout.dp or (n_gpus // mp if n_gpus % mp == 0 else 1)
        if tp > 1 and dp > 1 and layout.zero == 0:
            out.append("tp>1 with dp>1 needs zero>=1 (FSDP over dp); DDP over DTensor is not supported")
        if layout.precision in ("fp8", "fp16"):
            out.append(f"precision={layout.precision} is not run by the reference trainer (bf16 or fp32)")
        if layout.dp_shard:
            out.append("dp_shard (hybrid sharding) is not run by the reference trainer")
    return out
