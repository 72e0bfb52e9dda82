"""Compute time of one transformer layer on one GPU: GEMMs, attention core, elementwise kernels.

Every function takes NumPy arrays (one element per candidate layout) or plain numbers and
returns seconds, so the scalar estimate and the vectorised search share one formula.

* GEMMs: ``2*M*N*K`` FLOPs at ``peak * gemm_eff_max * sat(M) sat(N) sat(K)`` (small and
  tp-split dimensions run below peak), but never faster than their HBM traffic allows.
  fp8 speeds up GEMMs only, by ``fp8_gemm_speedup`` (never by more than the peak ratio).
* Attention core: flash attention at ``attn_eff`` of peak, causal (half the score matrix),
  backward costs ``attn_bwd_flops_ratio`` x the forward; without flash, batched GEMMs over
  the full score matrix plus the softmax/dropout traffic of that matrix in HBM.
* Elementwise (norms, residual adds, activation, rotary, fp8 casts): bytes / HBM bandwidth.
"""

from __future__ import annotations

import numpy as np

from trainperf.plan.efficiency import Efficiency
from trainperf.plan.stacks import Software
from trainperf.specs import ModelSpec, active_ffn_width, attention_gemms


def gemm_rate_flops(peak_flops: float, eff: Efficiency, m, n, k):
    """Return the achieved FLOP/s of an (m x k) @ (k x n) GEMM (FLOP/s, array-friendly)."""
    d0 = eff.gemm_dim_half
    sat = (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))
    top = eff.measured_gemm_tflops * 1e12 if eff.measured_gemm_tflops > 0 else peak_flops * eff.gemm_eff_max
    return top * sat


def hbm_rate_bytes(hbm_tbps: float, eff: Efficiency) -> float:
    """Return the achieved HBM bandwidth for streaming kernels (bytes/s)."""
    if eff.measured_hbm_tbps > 0:
        return eff.measured_hbm_tbps * 1e12
    return hbm_tbps * 1e12 * eff.hbm_eff


def gemm_time_s(m, n, k, peak_flops: float, hbm_bps: float, eff: Efficiency, speedup=1.0,
                bytes_per_el: float = 2.0):
    """Return seconds for one GEMM: max(compute at shape efficiency / speedup, HBM traffic)."""
    t_flops = 2.0 * m * n * k / (gemm_rate_flops(peak_flops, eff, m, n, k) * speedup)
    t_bytes = bytes_per_el * (m * k + k * n + m * n) / hbm_bps
    return np.maximum(t_flops, t_bytes)


def fp8_speedup(acc_peak_bf16: float, acc_peak_fp8: float, eff: Efficiency) -> float:
    """Return the GEMM speed-up of fp8 over bf16 on this accelerator (ratio, >= 1)."""
    return float(max(1.0, min(eff.fp8_gemm_speedup, acc_peak_fp8 / acc_peak_bf16)))


def attention_gemm_fwd_s(m: ModelSpec, tokens, tp, peak_flops: float, hbm_bps: float, eff: Efficiency, speedup=1.0):
    """Return forward seconds of one layer's attention projections on one TP rank (specs.attention_gemms)."""
    t = 0.0
    for n, k, split in attention_gemms(m):
        t = t + gemm_time_s(tokens, n / tp if split == "n" else n, k / tp if split == "k" else k, peak_flops,
                            hbm_bps, eff, speedup)
    return t


def dense_mlp_fwd_s(m: ModelSpec, width: int, tokens, tp, peak_flops: float, hbm_bps: float, eff: Efficiency,
                    speedup=1.0):
    """Return forward seconds of one MLP of ``width`` on one TP rank (up/gate column-, down row-parallel)."""
    up = width * (2 if m.gated_mlp else 1)
    t = gemm_time_s(tokens, up / tp, m.hidden, peak_flops, hbm_bps, eff, speedup)
    return t + gemm_time_s(tokens, m.hidden, width / tp, peak_flops, hbm_bps, eff, speedup)


def moe_mlp_fwd_s(m: ModelSpec, tokens, tp, ep, etp, peak_flops: float, hbm_bps: float, eff: Efficiency,
                  speedup=1.0):
    """Return forward seconds of one MoE layer's MLP on one GPU: router, routed experts, shared experts.

    The ``tokens`` of a micro batch on this GPU enter expert compute as ``tokens * etp / tp``
    (sequence-parallel shards gathered over the expert-TP group); each is sent to ``top_k``
    experts, so each of the ``n_experts / ep`` local experts sees ``tokens_e * top_k * ep /
    n_experts`` rows on average, at ``1/etp`` of its width. The busiest rank paces the layer:
    routed-expert time is scaled by ``eff.moe_imbalance`` (max / mean tokens per rank).
    """
    tokens_e = tokens * etp / tp
    rows = tokens_e * m.top_k * ep / m.n_experts
    local = m.n_experts / ep
    routed = local * dense_mlp_fwd_s(m, m.moe_ffn_hidden, rows, etp, peak_flops, hbm_bps, eff, speedup)
    router = gemm_time_s(tokens / tp, m.n_experts, m.hidden, peak_flops, hbm_bps, eff)
    shared = dense_mlp_fwd_s(m, m.shared_ffn_hidden, tokens, tp, peak_flops, hbm_bps, eff, speedup) \
        if m.shared_ffn_hidden else 0.0
    return eff.moe_imbalance * routed + router + shared


def layer_gemm_fwd_s(m: ModelSpec, tokens, tp, peak_flops: float, hbm_bps: float, eff: Efficiency,
                     speedup=1.0, ep=1, etp=None):
    """Return forward seconds of the average layer's GEMMs on one GPU (attention projections + MLP).

    ``tokens`` is the micro batch's tokens on this GPU (mbs * seq / cp). Backward is two
    GEMMs of the same three dimensions per forward GEMM, hence 2x this. A mixture of experts
    averages its dense first layers and its MoE layers.
    """
    t = attention_gemm_fwd_s(m, tokens, tp, peak_flops, hbm_bps, eff, speedup)
    dense = dense_mlp_fwd_s(m, m.ffn_hidden, tokens, tp, peak_flops, hbm_bps, eff, speedup)
    if not m.is_moe:
        return t + dense
    moe = moe_mlp_fwd_s(m, tokens, tp, ep, tp if etp is None else etp, peak_flops, hbm_bps, eff, speedup)
    return t + (m.n_dense_layers * dense + m.n_moe_layers * moe) / m.n_layers


def attention_fwd_s(m: ModelSpec, mbs, seq: int, tp, cp, peak_flops: float, hbm_bps: float,
                    eff: Efficiency, flash: bool = True, score_bytes: float = 9.0):
    """Return forward seconds of one layer's attention core (QK^T, softmax, PV) on one GPU.

    Causal with flash attention: each of the cp ranks computes 1/cp of the lower triangle
    (load-balanced context parallelism). Without flash: full score matrix as batched GEMMs
    plus ``score_bytes`` of HBM traffic per score element between them (the stack's softmax
    path, plan/stacks.py: Megatron's fused scale-mask-softmax with dropout ~9 B, eager ~22 B).
    """
    heads_local = m.n_heads / tp
    s_local = seq / cp
    if flash:
        # causal: half of 2*s*s*(d_qk + d_v) per head
        flops = mbs * s_local * seq * heads_local * (m.head_dim + (m.v_head_dim or m.head_dim))
        # head_dim 128 is flash attention's best tile; 64 runs ~17% slower (hd / (hd + 32)).
        head_factor = (m.head_dim / (m.head_dim + 32.0)) / (128.0 / 160.0)
        # short sequences run flash attention below its asymptotic rate (per-tile setup, the causal
        # diagonal, softmax rescaling): s / (s + attn_seq_half) of it
        rate = peak_flops * eff.attn_eff * head_factor * (s_local / (s_local + eff.attn_seq_half))
        if eff.measured_gemm_tflops > 0:
            rate = rate * eff.measured_gemm_tflops * 1e12 / (peak_flops * eff.gemm_eff_max)
        return flops / rate
    n_mats = mbs * heads_local
    t = n_mats * 2 * gemm_time_s(s_local, seq, m.head_dim, peak_flops, hbm_bps, eff)
    t = t + score_bytes * mbs * heads_local * s_local * seq / hbm_bps
    return t


def attention_bwd_over_fwd(eff: Efficiency, flash: bool = True) -> float:
    """Return backward/forward time ratio of the attention core.

    Flash: 2.5x the FLOPs (it recomputes P) at ``attn_bwd_rate_ratio`` of the forward rate.
    """
    return eff.attn_bwd_flops_ratio / eff.attn_bwd_rate_ratio if flash else 2.0


def layer_elementwise_fwd_s(m: ModelSpec, tokens, tp, sp, hbm_bps: float, fp8=False, dropout: bool = False,
                            sw: Software | None = None):
    """Return forward seconds of one layer's memory-bound kernels on one TP rank.

    Bytes per token, from the stack's per-element byte counts (plan/stacks.py): two norms
    (``norm_bytes`` per hidden element each), two residual adds (read 2, write 1: 6 B),
    dropout masks and applications (GPT: 12 B), rotary on q and k (``rope_bytes``), the MLP
    activation (gated: ``act_bytes`` per ffn element; plain GELU read + write: 4 B).
    Hidden-width work is split over tp only with sequence parallelism; head/ffn-width work
    always is. fp8 adds a cast pass (read 2 B, write 1 B row-wise and 1 B column-wise) of
    the attention output only when the stack fuses the others into their producers
    (``sw.fp8_cast_fused``, plan/stacks.py), of every GEMM input otherwise.
    """
    sw = sw or Software()
    h_bytes = 2.0 * sw.norm_bytes + 12.0 + (12.0 if dropout else 0.0)
    f_bytes = sw.act_bytes if m.gated_mlp else 4.0
    rope = 0.0 if m.learned_pos_emb else sw.rope_bytes * (m.q_dim + m.kv_dim)
    per_token = h_bytes * m.hidden / np.where(sp, tp, 1) + (f_bytes * active_ffn_width(m) + rope) / tp
    cast_elements = m.q_dim / tp if sw.fp8_cast_fused else 2 * m.hidden + (m.q_dim + m.ffn_hidden) / tp
    cast = np.where(fp8, 4.0 * cast_elements, 0.0)
    return tokens * (per_token + cast) / hbm_bps


def lm_head_fwd_bwd_s(m: ModelSpec, tokens, tp, peak_flops: float, hbm_bps: float, eff: Efficiency,
                      ce_bytes_per_logit: float = 24.0):
    """Return forward+backward seconds of the output projection and cross-entropy on one TP rank.

    GEMM (tokens x hidden) @ (hidden x vocab/tp) three times (fwd, dgrad, wgrad), plus
    ``ce_bytes_per_logit`` for the cross-entropy passes (fused: ~24 B, bf16 logits up-cast
    to fp32, max, exp-sum, softmax gradient written back in bf16); the input embedding
    lookup and its gradient are ~6 bytes per hidden element.
    """
    gemm = 3.0 * gemm_time_s(tokens, m.vocab / tp, m.hidden, peak_flops, hbm_bps, eff)
    ce = ce_bytes_per_logit * tokens * m.vocab / tp / hbm_bps
    emb = 6.0 * tokens * m.hidden / hbm_bps
    return gemm + ce + emb
