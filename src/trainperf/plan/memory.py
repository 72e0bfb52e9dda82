"""Memory per GPU: model states by ZeRO stage, activations (Korthikanti et al.), allocator margin.

All functions accept NumPy arrays (one element per layout) or numbers and return bytes.

Model states per parameter (mixed precision with Adam): bf16 weights 2 B, gradients
``grad_bytes`` (bf16 grad buffers in Megatron-Core DDP / FSDP2: 2 B; 4 with fp32 reduction),
optimizer 12 B (fp32 master weights,
Adam m and v). ZeRO-1 (Megatron distributed optimizer) shards the optimizer over dp,
ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights (all over the dp x cp ranks that
hold the same weights) (plus two unsharded layers of
prefetch buffer).

Activations per layer and token, generalising Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", eq. 1-5: ``sbh(34 + 5as/h)`` without parallelism,
``sbh(10 + 24/t + 5as/(ht))`` with tensor parallelism, ``sbh(34/t)`` with sequence
parallelism and selective recompute, ``2sbh`` per layer input with full recompute) to GQA
and gated MLPs:

* hidden-width tensors split over tp only with sequence parallelism (or where the compiler shards
  the residual stream over the tensor axis, GSPMD/MaxText: ``MemoryFeatures.tp_shards_activations``): two norm inputs
  (2h + 2h), QKV and MLP inputs (2h + 2h), and with dropout two masks (h + h);
* always tp-split: Q, K, V (2q + 2kv + 2kv), attention output (2q), MLP: plain 2f + 2f
  (activation in and out), gated 2f + 2f + 2f (gate, up, product);
* score matrix, unless flash attention or selective recompute drop it: 5 a s / t
  (softmax 2, dropout mask 1, dropout output 2 bytes per score);
* full recompute keeps only each layer's input (2h, split over tp with sp) plus one layer's
  full activations during its backward;
* mixture of experts: each expert choice keeps its permuted input (2h, the grouped GEMM's input)
  and, where the combine multiplies the experts' outputs by the routing probabilities (the
  gradient of a probability needs the output it weighted), that output (2h). Megatron-Core >= 0.13
  applies the probabilities in the experts' activation function instead (its MoE README: "moving
  the probs multiplication from unpermutation to activation function of GroupedMLP";
  ``MemoryFeatures.moe_probs_in_activation``), so its combine keeps nothing;
* eager PyTorch (unfused elementwise, ``MemoryFeatures.eager_activations``; the operator
  sequences the time model prices in plan/stacks.py): an RMSNorm written as Hugging Face's
  ``LlamaRMSNorm`` (``x.float()``, ``pow``, ``mean``, ``* rsqrt``, ``.to(bf16)``, ``weight *``)
  keeps the fp32 copy of its input (4h, for pow and the normalising multiply) and the bf16
  normalised tensor (2h, for the weight multiply) where a fused norm keeps its bf16 input (2h):
  +4h per norm, +8h per layer; ``silu(gate) * up`` also keeps silu's output (+2f). Grouped-query
  attention through SDPA after ``repeat_kv`` also keeps K and V expanded to every head; not
  counted (flash-attn's own kernel does not expand them);
* fp8 (stacks whose fp8 casts are fused, ``Software.fp8_cast_fused``): the linear layers keep
  the fp8 copy of their input for the weight gradient (TransformerEngine's Linear /
  LayerNormLinear / LayerNormMLP / GroupedLinear save the quantised tensor), 1 B instead of 2 for
  the QKV and MLP inputs (hidden wide), the attention output, the MLP product / activation output
  and the routed experts' permuted input (DeepSeek-V3 dispatches it in fp8, report sec. 3.3.3).

Pipeline: stage ``r`` of ``p`` runs its warm-up forwards before its first backward, and holds
that many plus one micro batches' activations (Megatron-LM ``schedules.py``). 1F1B: ``p - r - 1``
warm-up, so the first stage holds ``min(m, p)`` micro batches of its layers. Interleaved with ``v``
model chunks of ``L/(p v)`` layers: ``2 (p - r - 1) + (v - 1) p`` warm-up chunk forwards, so the
first stage holds ``min(m v, v p + p - 1)`` chunks, which for ``m >= p`` is Korthikanti eq. 6's
``p (1 + (p-1)/(p v))`` micro batches of its layers (Megatron's ``theoretical_memory_usage.py``
uses the same penalty). The last stage adds the fp32 logits (4 s b V / t). Context parallelism
divides tokens by cp.

Selective recompute (Megatron-Core ``--recompute-granularity selective --recompute-modules``): what
each module frees per token and layer (``recompute_dropped``). ``core_attn`` (the default) re-runs
the attention core: the score matrix is not kept. ``mlp`` / ``moe`` re-run the dense / MoE MLP
from its input (normal checkpointing): only the input, already counted as the norm output, stays.
``layernorm``, ``mla_up_proj`` and ``moe_act`` use output-discarding checkpointing
(``CheckpointWithoutOutput``): the module's output is freed once its consumer has run and rebuilt
before the consumer's backward, so the two norm outputs (the QKV and MLP GEMM inputs), MLA's Q, K,
V (only the compressed latents stay), or the routed experts' activation output (the fc2 input)
are not held. DeepSeek-V3 (report sec. 3.2.3) recomputes RMSNorm and the MLA up-projections the
same way.

Model states by stack (``MemoryFeatures.fp32_params``): Megatron-Core and DeepSpeed keep bf16
parameters plus an fp32 master copy inside the optimizer (2 + 4 + 8 B); PyTorch FSDP2 with
``MixedPrecisionPolicy(param_dtype=bf16)``, DDP under autocast and JAX/MaxText keep the parameters
themselves in fp32 (they are the master weights; the bf16 copies are cast or gathered per layer
and freed), so weights take 4 B and the optimizer only Adam's m and v (8 B).

Allocator margin: the runtime reserve is the accelerator's (``Accelerator.runtime_reserved_gib``:
CUDA/ROCm context, NCCL and cuBLAS workspaces on GPUs, ``RESERVED_BYTES``; the TPU runtime's
share of HBM on TPUs). The caching
allocator's fragmentation ``FRAGMENTATION`` applies to the transient allocations only
(activations, logits, FSDP's gathered layers), which are freed and reallocated in varying sizes
every micro batch; the model states are allocated once, as contiguous buffers (Megatron-Core's
param/grad buffers and distributed-optimizer shards, FSDP2's sharded parameters), and do not
fragment. XLA has no caching allocator (its buffer assignment is fixed when the step is
compiled): stacks without one (``MemoryFeatures.fragmentation`` 0) pay none. A layout fits when the
total with margin is within the HBM capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.hardware import Accelerator
from trainperf.plan.stacks import Software, recompute_module_set
from trainperf.specs import (LayoutArrays, ModelSpec, active_ffn_width, embedding_params, expert_params_per_layer,
                             final_norm_params, layer_params, lm_head_params)

RESERVED_BYTES = 2.0 * 2**30   # CUDA context + NCCL buffers + cuBLAS/TE workspaces (bytes)
FRAGMENTATION = 0.08           # caching-allocator fragmentation, fraction of allocated bytes
WEIGHT_BYTES = 2.0             # bf16 weights
OPTIMIZER_BYTES = 12.0         # fp32 master + Adam m + v
ADAM_BYTES = 8.0               # Adam m + v alone (fp32), where the parameters are the fp32 master weights


@dataclass(frozen=True, kw_only=True)
class MemoryFeatures:
    """What a stack and an accelerator change in the memory model (bytes, fractions, module names)."""

    fp32_params: bool = False          # parameters kept in fp32 as the master weights (FSDP2, JAX): 4 + 8 B
    recompute_modules: str = "core_attn"  # selective recompute's modules, "+"-joined (stacks.RECOMPUTE_MODULES)
    eager_activations: bool = False  # unfused norms and SwiGLU keep their intermediates (eager PyTorch)
    moe_probs_in_activation: bool = False  # routing probabilities applied in the experts' activation (Megatron-Core
                                           # >= 0.13): the combine keeps no expert outputs
    tp_shards_activations: bool = False  # hidden-wide activations split over tp even without sp (GSPMD: MaxText
                                         # maps 'activation_embed' to the tensor axis)
    fragmentation: float = FRAGMENTATION  # caching-allocator overhead on transient bytes (0: XLA)
    reserved_bytes: float = RESERVED_BYTES  # runtime reserve of the accelerator (bytes)


def _mlp_inner_bytes(m: ModelSpec, eager: bool) -> float:
    """Return the MLP activation bytes kept per ffn element: fc1 output(s) and the activation output
    (gated: gate, up, product 6 B; eager SwiGLU also keeps silu's output, +2 B; plain: 4 B)."""
    return (6.0 if m.gated_mlp else 4.0) + (2.0 if eager and m.gated_mlp else 0.0)


def _norm_extra_bytes(eager: bool) -> float:
    """Return the bytes per hidden element an eager layer's two norms keep beyond fused ones (+4h each)."""
    return 8.0 if eager else 0.0


def activation_parts(m: ModelSpec, tp, sp, flash=True, dropout=False, seq: int | None = None, fp8=False,
                     eager=False, probs_in_activation=False):
    """Return (kept, scores, layer_input): activation bytes per token per layer on one GPU.

    ``kept``: what a layer without recompute stores besides its attention scores (or, with flash
    attention, the softmax statistics); ``scores``: those; ``layer_input``: the layer input full
    recompute keeps instead. ``fp8``: the linear layers' inputs are kept in fp8 (1 B less per
    element of the four GEMM inputs). ``eager``: unfused norms and SwiGLU (module docstring).
    ``probs_in_activation``: the routing probabilities multiply the experts' activation, so the
    combine keeps no copy of the experts' outputs (module docstring).
    """
    s = m.seq_len if seq is None else seq
    tp = np.asarray(tp, dtype=float)
    saved8 = np.asarray(fp8, dtype=bool)
    rep = (8.0 + (2.0 if dropout else 0.0) - np.where(saved8, 2.0, 0.0) + _norm_extra_bytes(eager)) * m.hidden \
        / np.where(sp, tp, 1.0)
    inner = _mlp_inner_bytes(m, eager)
    mlp = inner * active_ffn_width(m) - np.where(saved8, 1.0, 0.0) * active_ffn_width(m)
    if m.is_moe:  # per expert choice: the permuted input (the grouped GEMM's input, fp8 like the dense GEMM
        # inputs) and, where the combine weights them by the routing probabilities, the expert's output
        routed = (2.0 - np.where(saved8, 1.0, 0.0) + (0.0 if probs_in_activation else 2.0)) * m.hidden * m.top_k
        mlp = mlp + routed * m.n_moe_layers / m.n_layers
    split = ((4.0 - np.where(saved8, 1.0, 0.0)) * m.q_dim + 4.0 * m.kv_dim + mlp) / tp
    if m.mla:  # the compressed latents (down-projections replicated over tp): latent norm input and output
        rep = rep + 4.0 * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_dim)
    if flash:
        scores = 4.0 * m.n_heads / tp  # fp32 logsumexp per head
    else:
        scores = 5.0 * m.n_heads * s / tp
    return rep + split, scores, 2.0 * m.hidden / np.where(sp, tp, 1.0)


def activation_bytes_per_token_layer(m: ModelSpec, tp, sp, recompute_code, flash=True, dropout=False,
                                     seq: int | None = None, fp8=False):
    """Return activation bytes stored per token per layer on one GPU (bytes).

    ``recompute_code``: 0 none, 1 selective (no scores), 2 full (stored layer input only).
    """
    kept, scores, layer_input = activation_parts(m, tp, sp, flash, dropout, seq, fp8)
    rc = np.asarray(recompute_code)
    return np.where(rc == 2, layer_input, kept + np.where(rc == 1, 0.0, scores))


def recompute_dropped(m: ModelSpec, tp, sp, modules, fp8=False, probs_in_activation=False, eager=False):
    """Return the activation bytes per token per layer on one GPU that selective recompute of
    ``modules`` frees besides the attention scores (module docstring; ``core_attn`` frees only those).

    The norm outputs and the activation output are kept at 1 B where fp8 layouts keep GEMM inputs in fp8.
    ``eager``: what activation_parts counts for unfused norms and SwiGLU is freed with its module too.
    """
    mods = recompute_module_set(modules)
    tp = np.asarray(tp, dtype=float)
    b8 = np.where(np.asarray(fp8, dtype=bool), 1.0, 0.0)
    out = np.zeros_like(tp)
    if "layernorm" in mods:  # QKV and MLP inputs (and an eager norm's fp32 copies)
        out = out + (4.0 - 2.0 * b8 + _norm_extra_bytes(eager)) * m.hidden / np.where(sp, tp, 1.0)
    if "mla_up_proj" in mods and m.mla:  # Q, K, V as activation_parts counts them
        out = out + (2.0 * m.q_dim + 4.0 * m.kv_dim) / tp
    inner = _mlp_inner_bytes(m, eager)  # fc1 output(s) and activation output, bytes per ffn element
    dense_share = m.n_dense_layers / m.n_layers if m.is_moe else 1.0
    moe_share = m.n_moe_layers / m.n_layers
    if "mlp" in mods:
        out = out + (inner - b8) * m.ffn_hidden * dense_share / tp
    if "moe" in mods and m.is_moe:
        width = m.top_k * m.moe_ffn_hidden + m.shared_ffn_hidden
        routed = (2.0 - b8 + (0.0 if probs_in_activation else 2.0)) * m.hidden * m.top_k
        out = out + ((inner - b8) * width + routed) * moe_share / tp
    elif "moe_act" in mods and m.is_moe:
        out = out + (2.0 - b8) * m.top_k * m.moe_ffn_hidden * moe_share / tp
    return out


def layers_per_stage(m: ModelSpec, pp, vpp):
    """Return the layers on the busiest pipeline stage (count; uneven splits round up)."""
    pp = np.asarray(pp, dtype=float)
    vpp = np.asarray(vpp, dtype=float)
    return np.ceil(m.n_layers / (pp * vpp)) * vpp


def stage_expert_params(m: ModelSpec, pp, vpp, ep, etp):
    """Return the routed-expert weights on the busiest stage per GPU (count; sharded over ep x etp)."""
    ep = np.asarray(ep, dtype=float)
    etp = np.asarray(etp, dtype=float)
    return layers_per_stage(m, pp, vpp) * expert_params_per_layer(m) / (ep * etp)


def stage_params(m: ModelSpec, tp, pp, vpp):
    """Return (params on the first stage, params on the last stage) per GPU (count), routed experts excluded.

    The routed experts are sharded over ep x etp instead of tp: ``stage_expert_params``.
    """
    tp = np.asarray(tp, dtype=float)
    per_layer = layer_params(m) - expert_params_per_layer(m)
    layers = layers_per_stage(m, pp, vpp) * per_layer / tp
    emb = embedding_params(m) / tp
    head = (lm_head_params(m) if not m.tied_embeddings else m.vocab * m.hidden) / tp
    norm = final_norm_params(m)  # replicated on every tp rank of the last stage
    single = np.asarray(pp) == 1
    first = np.where(single, m.n_layers * per_layer / tp + emb + lm_head_params(m) / tp + norm, layers + emb)
    last = np.where(single, first, layers + head + norm)
    return first, last


def inflight_micro_batches(pp, vpp, grad_accum, last: bool = False):
    """Return the micro batches whose activations a pipeline stage holds at its peak (count, per stage layer).

    Multiply by the stage's layers and one micro batch's activations per layer. ``last`` selects
    the last stage (rank p-1), otherwise the first (rank 0), which holds the most.
    """
    pp = np.asarray(pp, dtype=float)
    vpp = np.asarray(vpp, dtype=float)
    grad_accum = np.asarray(grad_accum, dtype=float)
    rank = pp - 1.0 if last else 0.0
    plain = np.minimum(grad_accum, pp - rank)                          # 1F1B: p - r - 1 warm-up + 1
    chunks = np.minimum(grad_accum * vpp, 2.0 * (pp - rank - 1.0) + (vpp - 1.0) * pp + 1.0)
    return np.where(vpp > 1, chunks / vpp, plain)


def expert_dp(lay: LayoutArrays):
    """Return the expert data-parallel degree: ranks holding the same expert shard (tp*cp*dp / (ep*etp))."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    return np.maximum(f(lay.tp) * f(lay.cp) * f(lay.dp) / (f(lay.ep) * f(lay.etp)), 1.0)


def model_state_terms(params, dp, zero, grad_bytes: float = 2.0, fp32_params: bool = False):
    """Return (weights, gradients, optimizer states) bytes for ``params`` on one GPU under ZeRO ``zero``.

    ``fp32_params``: the parameters are the fp32 master weights (4 B, optimizer m and v 8 B)
    instead of bf16 weights beside an fp32 master copy in the optimizer (2 B + 12 B).
    """
    dp = np.asarray(dp, dtype=float)
    zero = np.asarray(zero)
    w_bytes, o_bytes = (4.0, ADAM_BYTES) if fp32_params else (WEIGHT_BYTES, OPTIMIZER_BYTES)
    w = w_bytes * params / np.where(zero >= 3, dp, 1.0)
    g = grad_bytes * params / np.where(zero >= 2, dp, 1.0)
    o = o_bytes * params / np.where(zero >= 1, dp, 1.0)
    return w, g, o


def model_state_bytes(params, dp, zero, grad_bytes: float = 2.0, fp32_params: bool = False):
    """Return bytes of weights + gradients + optimizer states for ``params`` on one GPU."""
    return sum(model_state_terms(params, dp, zero, grad_bytes, fp32_params))


MEMORY_TERMS = ("weights", "gradients", "optimizer state", "activations and buffers",
                "runtime reserve (context, collective buffers, workspaces)")


def _stage_memory(m: ModelSpec, lay: LayoutArrays, flash, dropout, grad_bytes: float, fp8_saved: bool,
                  feat: MemoryFeatures):
    """Return ((weights, gradients, optimizer) bytes, transient bytes) of the first and of the last stage."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731  (converted once: the search passes 10^5 layouts)
    tp, pp, vpp, cp, grad_accum = f(lay.tp), f(lay.pp), f(lay.vpp), f(lay.cp), f(lay.grad_accum)
    sp, zero, rc = np.asarray(lay.sp, dtype=bool) | feat.tp_shards_activations, np.asarray(lay.zero), \
        np.asarray(lay.recompute)
    tokens = f(lay.mbs) * m.seq_len / cp
    fp8 = np.asarray(lay.fp8, dtype=bool) & fp8_saved
    kept, scores, layer_input = activation_parts(m, tp, sp, flash, dropout, m.seq_len, fp8, feat.eager_activations,
                                                 feat.moe_probs_in_activation)
    whole = kept + scores
    mods = recompute_module_set(feat.recompute_modules)
    selective = kept + (0.0 if "core_attn" in mods else scores) \
        - recompute_dropped(m, tp, sp, mods, fp8, feat.moe_probs_in_activation, feat.eager_activations)
    per_layer = tokens * np.where(rc == 2, layer_input, np.where(rc == 1, selective, whole))
    stage_layers = layers_per_stage(m, pp, vpp)
    # with full recompute one layer's whole activation set is rebuilt during its backward
    working = np.where(rc == 2, tokens * whole, 0.0)
    act_first = stage_layers * per_layer * inflight_micro_batches(pp, vpp, grad_accum) + working
    logits = 4.0 * tokens * m.vocab / tp
    act_last = np.where(pp == 1, act_first,
                        stage_layers * per_layer * inflight_micro_batches(pp, vpp, grad_accum, last=True) + working) + logits
    p_first, p_last = stage_params(m, tp, pp, vpp)
    per_layer_gpu = (layer_params(m) - expert_params_per_layer(m)) / tp
    shard = lay.shard_group() * cp  # cp ranks hold the same weights; hybrid sharding shards over its group only
    first = model_state_terms(p_first, shard, zero, grad_bytes, feat.fp32_params)
    last = model_state_terms(p_last, shard, zero, grad_bytes, feat.fp32_params)
    if m.is_moe:  # routed experts: sharded over ep x etp, their states over the expert data-parallel ranks
        ep_etp = f(lay.ep) * f(lay.etp)
        per_layer_gpu = per_layer_gpu + expert_params_per_layer(m) / ep_etp
        experts = model_state_terms(stage_expert_params(m, pp, vpp, lay.ep, lay.etp), expert_dp(lay), zero, grad_bytes,
                                    feat.fp32_params)
        first = tuple(a + b for a, b in zip(first, experts))
        last = tuple(a + b for a, b in zip(last, experts))
    fsdp_buffer = np.where(zero >= 3, 2.0 * WEIGHT_BYTES * per_layer_gpu, 0.0)  # two gathered layers
    frag = 1.0 + feat.fragmentation
    return (first, (act_first + fsdp_buffer) * frag), (last, (act_last + fsdp_buffer) * frag)


def memory_bytes(m: ModelSpec, lay: LayoutArrays, flash=True, dropout=False, grad_bytes: float = 2.0,
                 fp8_saved: bool = True, features: MemoryFeatures | None = None):
    """Return the peak memory per GPU including the allocator margin (bytes) of arrays of layouts.

    The peak is the larger of the first pipeline stage (most micro batches in flight) and
    the last (LM head weights and fp32 logits). ``fp8_saved``: fp8 layouts keep their linear
    layers' inputs in fp8 (the stack fuses its fp8 casts). ``features``: the stack's and the
    accelerator's memory features (default: Megatron-Core on a GPU).
    """
    feat = features or MemoryFeatures()
    (s1, t1), (s2, t2) = _stage_memory(m, lay, flash, dropout, grad_bytes, fp8_saved, feat)
    return np.maximum(sum(s1) + t1, sum(s2) + t2) + feat.reserved_bytes


def memory_terms(m: ModelSpec, lay: LayoutArrays, flash=True, dropout=False, grad_bytes: float = 2.0,
                 fp8_saved: bool = True, features: MemoryFeatures | None = None) -> dict:
    """Return {MEMORY_TERMS name: bytes} of the stage with the peak; they add up to ``memory_bytes``."""
    feat = features or MemoryFeatures()
    (s1, t1), (s2, t2) = _stage_memory(m, lay, flash, dropout, grad_bytes, fp8_saved, feat)
    last = sum(s2) + t2 > sum(s1) + t1
    values = [np.where(last, b, a) for a, b in zip(s1 + (t1,), s2 + (t2,))]
    return dict(zip(MEMORY_TERMS, values + [np.full_like(values[0], feat.reserved_bytes)]))


def stack_features(sw: Software, acc: Accelerator | None = None) -> MemoryFeatures:
    """Return the memory features of stack ``sw`` on accelerator ``acc`` (None: a GPU's runtime reserve).

    Reads the stack fields ``fp32_params``, ``caching_allocator``, ``recompute_modules``,
    ``tp_shards_activations``, ``eager_activations`` and ``moe_probs_in_activation`` (plan/stacks.py).
    """
    return MemoryFeatures(
        fp32_params=sw.fp32_params,
        recompute_modules=sw.recompute_modules,
        tp_shards_activations=sw.tp_shards_activations,
        eager_activations=sw.eager_activations,
        moe_probs_in_activation=sw.moe_probs_in_activation,
        fragmentation=FRAGMENTATION if sw.caching_allocator else 0.0,
        reserved_bytes=RESERVED_BYTES if acc is None else acc.runtime_reserved_bytes)


def _stack_args(m: ModelSpec, sw: Software) -> tuple:
    """Return the memory model's stack arguments: flash attention, dropout (None: models with linear
    biases use it), gradient width (bytes) and whether fp8 casts are fused."""
    return sw.flash_attention, sw.uses_dropout(m.linear_bias), float(sw.grad_reduce_bytes), sw.fp8_cast_fused


def stack_memory_bytes(m: ModelSpec, lay: LayoutArrays, sw: Software, acc: Accelerator | None = None):
    """Return ``memory_bytes`` of arrays of layouts under software stack ``sw`` on accelerator ``acc``
    (bytes, allocator margin included; ``acc`` None: a GPU's runtime reserve)."""
    return memory_bytes(m, lay, *_stack_args(m, sw), features=stack_features(sw, acc))


def stack_memory_terms(m: ModelSpec, lay: LayoutArrays, sw: Software, acc: Accelerator | None = None) -> dict:
    """Return ``memory_terms`` of arrays of layouts under software stack ``sw`` on ``acc`` (bytes per term)."""
    return memory_terms(m, lay, *_stack_args(m, sw), features=stack_features(sw, acc))
