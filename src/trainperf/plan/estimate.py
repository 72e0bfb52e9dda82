"""Step time, memory and MFU of layouts: one formula for one layout and for a million.

``estimate_arrays`` takes the layout fields as NumPy arrays (one element per candidate)
and returns every breakdown term as an array; ``estimate`` wraps it for one ``Layout``
and returns an ``Estimate``. The breakdown terms (seconds per step, they add up to the step
time) are:

compute        forward + backward of the transformer layers (GEMMs, attention, elementwise)
recompute      activation recomputation (selective: attention core; full: whole forward)
tp_comm        tensor-parallel collectives not hidden behind GEMMs
cp_comm        context-parallel KV exchange not hidden behind attention
ep_comm        expert-parallel all-to-all (token dispatch and combine) of MoE layers, on the
               link the EP group crosses, paced by the busiest rank (``moe_imbalance``)
pp_bubble      pipeline fill and drain, (p-1)/v micro-batch times of one stage
pp_p2p         pipeline sends on the critical path
dp_comm        data-parallel / FSDP collectives not hidden behind backward / forward
embedding_lm_head   input embedding, output projection and cross-entropy (last stage)
optimizer      Adam step over this GPU's shard of the parameters (memory-bound)
host_overhead  kernel launch gaps and host-bound issue time (the stack's kernels per layer)
comm_contention  compute slowed by collectives it hides: NCCL's channels take SMs and HBM
               bandwidth while they run (``comm_sm_share`` of the hidden communication time)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.plan import comm, compute, memory, pipeline
from trainperf.plan.efficiency import Efficiency, resolve
from trainperf.plan.stacks import Software
from trainperf.specs import (RECOMPUTE_CODE, RECOMPUTE_NAME, Cluster, Layout, LayoutArrays, ModelSpec,  # noqa: F401
                             hardware_flops_per_token, layout_problems, model_flops_per_token)

TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_p2p", "dp_comm",
         "embedding_lm_head", "optimizer", "host_overhead", "comm_contention")
OVERHEADS = TERMS[1:]


@dataclass
class Estimate:
    """The planner's prediction for one layout (seconds, bytes, fractions)."""

    layout: Layout
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    memory_bytes_per_gpu: float
    hbm_bytes: float
    breakdown: dict[str, float] = field(default_factory=dict)
    stack: str = "megatron-core"  # the software stack the prediction assumes (plan/stacks.py)

    @property
    def fits(self) -> bool:
        """True when the predicted peak memory (with allocator margin) fits in HBM."""
        return self.memory_bytes_per_gpu <= self.hbm_bytes

    @property
    def memory_gib_per_gpu(self) -> float:
        """Peak memory per GPU including allocator margin (GiB)."""
        return self.memory_bytes_per_gpu / 2**30

    @property
    def dominant_overhead(self) -> str:
        """Name of the largest breakdown term other than compute."""
        return max(OVERHEADS, key=lambda k: self.breakdown.get(k, 0.0))

    def to_dict(self) -> dict:
        """Return the JSON form: step_time_s, tokens_per_s_per_gpu, mfu, memory, fits, breakdown, layout."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "hbm_gib_per_gpu": self.hbm_bytes / 2**30,
            "fits": self.fits,
            "dominant_overhead": self.dominant_overhead,
            "breakdown": dict(self.breakdown),
            "layout": self.layout.to_string(),
            "layout_fields": self.layout.to_dict(),
            "stack": self.stack,
        }


def estimate_arrays(m: ModelSpec, cluster: Cluster, lay: LayoutArrays, eff: Efficiency | None = None,
                    sw: Software | None = None, *, with_memory: bool = True) -> dict:
    """Return {term: seconds array, 'step_time_s', 'memory_bytes', ...} for arrays of layouts.

    ``lay`` holds one array per Layout field (all resolved: dp and grad_accum non-zero);
    ``grad_accum`` is the number of micro batches per step per pipeline. ``with_memory=False``
    leaves out 'memory_bytes' (a third of the cost; constant fits need only the time).
    """
    acc = cluster.accelerator
    sw = sw or Software()
    eff = resolve(eff or Efficiency(), acc, sw.attention)
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    tp, pp, dp, cp, vpp, mbs, grad_accum = map(f, (lay.tp, lay.pp, lay.dp, lay.cp, lay.vpp, lay.mbs, lay.grad_accum))
    ep, etp = f(lay.ep), f(lay.etp)
    sp = np.asarray(lay.sp, dtype=bool) & (tp > 1)
    zero = np.asarray(lay.zero)
    rc = np.asarray(lay.recompute)
    fp8 = np.asarray(lay.fp8, dtype=bool)
    dropout = sw.uses_dropout(m.linear_bias)
    seq = m.seq_len

    peak_nominal = acc.peak_flops("bf16")
    peak = peak_nominal * cluster.clock_scale  # a power cap lowers the sustained clock, not HBM
    hbm = compute.hbm_rate_bytes(acc.hbm_tbps, eff)
    speed = np.where(fp8, compute.fp8_speedup(peak_nominal, acc.peak_flops("fp8"), eff), 1.0)
    tokens = mbs * seq / cp

    # ---- one layer, one micro batch, one GPU
    t_gemm = compute.layer_gemm_fwd_s(m, tokens, tp, peak, hbm, eff, speed, ep, etp)
    t_attn = compute.attention_fwd_s(m, mbs, seq, tp, cp, peak, hbm, eff, sw.flash_attention, sw.score_bytes)
    t_elem = compute.layer_elementwise_fwd_s(m, tokens, tp, sp, hbm, fp8, dropout, sw)
    bwd_ratio = compute.attention_bwd_over_fwd(eff, sw.flash_attention)
    layer_fwd = t_gemm + t_attn + t_elem
    layer_bwd = 2.0 * t_gemm + bwd_ratio * t_attn + 2.0 * t_elem
    layer_recompute = np.where(rc == 2, layer_fwd, np.where(rc == 1, t_attn, 0.0))
    # host: kernels per layer forward (backward 2x, full recompute another forward); a GPU gap
    # per kernel, plus whatever issuing them takes beyond the GPU work they launch
    k_fwd = sw.kernels_per_layer
    k_rec = np.where(rc == 2, k_fwd, np.where(rc == 1, 1.0, 0.0))
    layer_host = (3.0 * k_fwd + k_rec) * eff.kernel_gap_s \
        + np.maximum(0.0, k_fwd * sw.host_s_per_kernel - layer_fwd) \
        + np.maximum(0.0, (2.0 * k_fwd + k_rec) * sw.host_s_per_kernel - layer_bwd - layer_recompute)

    # tensor parallel: 2 all-reduces (or all-gather + reduce-scatter pairs) forward, 2 backward
    tp_bw, tp_alpha = comm.group_link(cluster, eff, 1.0, tp)
    ar = comm.all_reduce_s(tokens * m.hidden * 2.0, tp, tp_bw, tp_alpha)
    tp_raw = ar * (4.0 + np.where(rc == 2, 2.0, 0.0))
    hidden_share = np.where(sp, sw.tp_overlap, 0.0)
    layer_tp = tp_raw * (1.0 - hidden_share)
    layer_tp_hidden = tp_raw * hidden_share

    # context parallel: TransformerEngine's p2p ring, step by step: K and V (forward), K, V, dK, dV
    # (backward), each step's send behind that step's share of the attention
    cp_bw, cp_alpha = comm.ring_p2p_link(cluster, eff, tp, cp)
    kv_bytes = 2.0 * tokens * m.kv_dim / tp * 2.0
    ring = comm.ring_attention_s(kv_bytes, cp, cp_bw, cp_alpha, t_attn, bwd_ratio * t_attn)
    layer_cp = ring.fwd_exposed * np.where(rc == 2, 2.0, 1.0) + ring.bwd_exposed
    layer_cp_hidden = ring.fwd_sent * np.where(rc == 2, 2.0, 1.0) + ring.bwd_sent - layer_cp

    # expert parallel: dispatch and combine all-to-alls, forward and backward (again with full
    # recompute), of top_k hidden-wide copies per token; the busiest rank (imbalance) paces them
    layer_ep = 0.0
    if m.is_moe:
        a2a_bytes = tokens * etp / tp * m.top_k * m.hidden * 2.0 * eff.moe_imbalance
        a2a = comm.all_to_all_s(cluster, eff, a2a_bytes, tp * cp, ep)
        layer_ep = a2a * (4.0 + np.where(rc == 2, 2.0, 0.0)) * m.n_moe_layers / m.n_layers * (1.0 - sw.ep_overlap)

    # ---- stages
    stage_layers = memory.layers_per_stage(m, pp, vpp)
    head = compute.lm_head_fwd_bwd_s(m, tokens, tp, peak, hbm, eff, sw.ce_bytes_per_logit)
    per_layer = layer_fwd + layer_bwd + layer_recompute + layer_tp + layer_cp + layer_host + layer_ep
    t_mb_avg = m.n_layers / pp * per_layer + head / pp

    out = {
        "compute": grad_accum * stage_layers * (layer_fwd + layer_bwd),
        "recompute": grad_accum * stage_layers * layer_recompute,
        "tp_comm": grad_accum * stage_layers * layer_tp,
        "cp_comm": grad_accum * stage_layers * layer_cp,
        "host_overhead": grad_accum * stage_layers * layer_host,
        "ep_comm": grad_accum * stage_layers * layer_ep,
        "embedding_lm_head": grad_accum * head,
        "pp_bubble": pipeline.bubble_s(pp, vpp, t_mb_avg),
    }
    p2p_bw, p2p_alpha = comm.p2p_link(cluster, eff, tp * cp * dp)
    t_send = comm.p2p_s(tokens * m.hidden * 2.0 / tp, p2p_bw, p2p_alpha)
    out["pp_p2p"] = pipeline.p2p_exposed_s(pp, grad_accum, vpp, t_send, sw.p2p_overlap)

    # ---- data parallel (gradients are reduced over dp x cp: cp ranks hold the same weights).
    # ZeRO/FSDP shard over the group of cp x dp_shard ranks (hybrid sharding: dp_shard < dp);
    # the dp / dp_shard replicas of a shard all-reduce it once per step (HSDP).
    p_first, p_last = memory.stage_params(m, tp, pp, vpp)
    params = np.maximum(p_first, p_last)
    p_expert = memory.stage_expert_params(m, pp, vpp, ep, etp)
    n_dp = dp * cp
    hybrid = bool(np.any(np.asarray(lay.dp_shard)))  # the search never sets dp_shard: skip its links
    n_shard = lay.shard_group() * cp if hybrid else n_dp
    n_rep = n_dp / n_shard
    n_edp = memory.expert_dp(lay)
    dp_bw, dp_alpha = comm.group_link(cluster, eff, tp, n_dp)
    sh_bw, sh_alpha = comm.group_link(cluster, eff, tp, n_shard) if hybrid else (dp_bw, dp_alpha)
    edp_bw, edp_alpha = comm.group_link(cluster, eff, ep * etp, n_edp)
    gb = float(sw.grad_reduce_bytes)

    def experts(kind, nbytes):  # a dense model has no expert collective (not even its latency)
        return np.where(nbytes > 0, kind(nbytes, n_edp, edp_bw, edp_alpha), 0.0)

    def sync(kind, nbytes_dense, nbytes_expert):
        return kind(nbytes_dense, n_shard, sh_bw, sh_alpha) + experts(kind, nbytes_expert)

    ar_g = comm.all_reduce_s(params * gb, n_dp, dp_bw, dp_alpha) + experts(comm.all_reduce_s, p_expert * gb)
    rs_g = sync(comm.reduce_scatter_s, params * gb, p_expert * gb)
    ag_w = sync(comm.all_gather_s, params * 2.0, p_expert * 2.0)
    ar_rep = 0.0
    if hybrid:  # the replicas of each shard all-reduce it
        rep_bw, rep_alpha = comm.group_link(cluster, eff, tp * n_shard, n_rep)
        ar_rep = comm.all_reduce_s(params * gb / n_shard, n_rep, rep_bw, rep_alpha)
    bwd_window = stage_layers * (layer_bwd + layer_recompute)
    fwd_window = stage_layers * layer_fwd
    tail = 1.0 / np.maximum(stage_layers, 1.0)  # the last layer's bucket cannot overlap
    grad_sync = np.where(zero == 0, ar_g, rs_g + ar_rep)
    param_sync = np.where(zero == 0, 0.0, ag_w)
    # ZeRO-2 keeps only a gradient shard, so it must reduce-scatter after every micro batch
    grad_rounds = np.where(zero == 2, grad_accum, 1.0)
    if sw.dp_overlap:
        dp_12 = grad_rounds * np.maximum(grad_sync - bwd_window, grad_sync * tail) \
            + np.maximum(param_sync - fwd_window, param_sync * tail)
    else:
        dp_12 = grad_rounds * grad_sync + param_sync
    fsdp_mb = 2.0 * ag_w + rs_g  # gather for forward, again for backward, reduce-scatter grads
    t_mb_compute = stage_layers * (layer_fwd + layer_bwd + layer_recompute)
    if sw.dp_overlap:
        # the replicas' all-reduce of the last micro batch's gradient shards runs behind its backward
        dp_3 = grad_accum * np.maximum(0.0, fsdp_mb - t_mb_compute) + fsdp_mb * tail \
            + np.maximum(ar_rep - bwd_window, ar_rep * tail)
    else:
        dp_3 = grad_accum * fsdp_mb + ar_rep
    out["dp_comm"] = np.where(zero >= 3, dp_3, dp_12)
    dp_total = np.where(zero >= 3, grad_accum * fsdp_mb + ar_rep, grad_rounds * grad_sync + param_sync)
    hidden = grad_accum * stage_layers * (layer_tp_hidden + layer_cp_hidden) + (dp_total - out["dp_comm"])
    out["comm_contention"] = eff.comm_sm_share * hidden

    local_params = params / np.where(zero >= 1, n_shard, 1.0) + p_expert / np.where(zero >= 1, n_edp, 1.0)
    out["optimizer"] = local_params * sw.optimizer_bytes_per_param / hbm

    step = sum(out[k] for k in TERMS)
    global_tokens = dp * mbs * grad_accum * seq
    n_gpus = tp * pp * cp * dp
    tps = global_tokens / step / n_gpus
    peak_prec = np.where(fp8, acc.peak_flops("fp8"), peak_nominal)  # MFU: against the rated peak
    out["step_time_s"] = step
    out["tokens_per_s_per_gpu"] = tps
    out["mfu"] = tps * model_flops_per_token(m) / peak_prec
    hw = np.array([hardware_flops_per_token(m, RECOMPUTE_NAME[c]) for c in range(3)])
    out["hfu"] = tps * hw[rc] / peak_prec
    if with_memory:
        out["memory_bytes"] = memory.stack_memory_bytes(m, lay, sw, acc)
    return out


def check_layout(m: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int | None) -> Layout:
    """Return the layout resolved for the cluster and batch; raise TrainperfError naming every bad factor."""
    problems = layout_problems(m, layout, cluster.n_gpus)
    if not problems:
        layout = layout.resolve(cluster.n_gpus, global_batch)
        problems = layout_problems(m, layout, cluster.n_gpus)
    if problems:
        raise TrainperfError("layout: " + "; ".join(problems))
    return layout


def estimate(m: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int | None = None,
             eff: Efficiency | None = None, sw: Software | None = None) -> Estimate:
    """Return the Estimate of one layout (step time in s, memory in bytes, breakdown in s).

    ``global_batch`` (sequences) sets gradient accumulation; without it the layout's
    ``grad_accum`` (default 1) is used. Raises TrainperfError for an impossible layout.
    """
    lay = check_layout(m, cluster, layout, global_batch)
    sw = sw or Software()
    r = estimate_arrays(m, cluster, LayoutArrays.of(lay), eff, sw)
    return estimate_at(r, (), lay, cluster.accelerator.hbm_bytes, sw.name)


def estimate_at(out: dict, i, layout: Layout, hbm_bytes: float, stack: str = "megatron-core") -> Estimate:
    """Return the Estimate of element ``i`` of an ``estimate_arrays`` result (``i=()`` for scalar layouts)."""
    def value(k: str) -> float:
        return float(np.asarray(out[k])[i])

    return Estimate(layout=layout, step_time_s=value("step_time_s"), tokens_per_s_per_gpu=value("tokens_per_s_per_gpu"),
                    mfu=value("mfu"), hfu=value("hfu"), memory_bytes_per_gpu=value("memory_bytes"),
                    hbm_bytes=hbm_bytes, breakdown={k: value(k) for k in TERMS}, stack=stack)
