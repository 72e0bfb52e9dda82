"""Exhaustive layout search: enumerate every valid layout, evaluate all of them at once (NumPy).

The space: tp (powers of two dividing the heads, kv heads and ffn, within the scale-up
domain), ep for mixture-of-experts models (powers of two dividing the experts and dp x cp;
expert tensor parallel = tp), cp (powers of two, sequence divisible by 2 cp), pp (divisors of the GPU count up to
the layer count), vpp (interleaving: the busiest stage's layers divisible by it, micro
batches a multiple of pp; uneven stages as Llama 3 405B's 126 layers on 16 stages), sequence parallel on/off, ZeRO 0-3 (2 and 3 only without pipeline
parallelism, as Megatron and DeepSpeed require), recompute none/selective/full, micro batch
1-16 (powers of two dividing the per-replica batch). dp fills the remaining GPUs and must
divide the global batch. Every candidate is evaluated by ``estimate_arrays`` in one call;
those whose memory does not fit are dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.plan.efficiency import Efficiency
from trainperf.plan.estimate import Estimate, estimate_arrays, estimate_at
from trainperf.plan.stacks import Software
from trainperf.specs import Cluster, Layout, LayoutArrays, ModelSpec, layout_problems, make_cluster

MAX_MBS = 16
MAX_VPP = 16


@dataclass
class SearchResult:
    """Ranked layouts of one search and what the search covered."""

    model: ModelSpec
    cluster: Cluster
    global_batch: int
    objective: str
    best: list[Estimate]
    n_candidates: int
    n_fit: int
    min_memory_gib: float
    elapsed_s: float
    usd_per_gpu_hour: float
    efficiency_source: str = ""  # where the efficiency constants came from (Efficiency.source)
    stack: str = "megatron-core"  # the software stack assumed (plan/stacks.py)
    extra: dict = field(default_factory=dict)


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def default_global_batch(seq_len: int, tokens: int = 4 * 2**20) -> int:
    """Return a power-of-two global batch (sequences) of about ``tokens`` tokens (4 Mi by default)."""
    return max(1, 2 ** int(round(np.log2(max(tokens / seq_len, 1)))))


def enumerate_layouts(m: ModelSpec, cluster: Cluster, global_batch: int, precision: str = "bf16") -> LayoutArrays:
    """Return the valid layouts as equal-length integer arrays with Layout's field names."""
    n = cluster.n_gpus
    tp_limit = min(64, max(cluster.scaleup_domain, 1), n)
    # the model-side rules (heads, kv heads, ffn; sequence for cp) are specs.layout_problems', the
    # one rule set the planner and the trainer use; the GPU-count and batch rules follow below
    tps = [t for t in _powers_of_two(tp_limit) if not layout_problems(m, Layout(tp=t), t)]
    cps = [c for c in _powers_of_two(min(64, n)) if not layout_problems(m, Layout(cp=c), c)]
    mbs_all = np.array(_powers_of_two(MAX_MBS))
    parts: list[np.ndarray] = []
    for tp in tps:
        for cp in cps:
            if n % (tp * cp):
                continue
            for pp in _divisors(n // (tp * cp)):
                if pp > m.n_layers:
                    break
                dp = n // (tp * cp * pp)
                if global_batch % dp:
                    continue
                per_replica = global_batch // dp
                mbs = mbs_all[(per_replica % mbs_all) == 0]
                if mbs.size == 0:
                    continue
                grad_accum = per_replica // mbs
                stage = -(-m.n_layers // pp)
                vpps = [1] if pp == 1 else [v for v in range(1, MAX_VPP + 1) if stage % v == 0 and pp * v <= m.n_layers]
                sps = [0, 1] if tp > 1 else [0]
                zeros = ([0] if dp * cp == 1 else [0, 1]) if pp > 1 else ([0] if dp * cp == 1 else [0, 1, 2, 3])
                # expert parallel: powers of two dividing the experts and the data-parallel ranks (etp = tp)
                eps = [e for e in _powers_of_two(min(m.n_experts, dp * cp)) if m.n_experts % e == 0
                       and (dp * cp) % e == 0] if m.is_moe else [1]
                grid = np.array(np.meshgrid(np.arange(mbs.size), vpps, sps, zeros, [0, 1, 2], eps,
                                            indexing="ij")).reshape(6, -1)
                mi, vpp, sp, zero, rc, ep = grid
                ok = (vpp == 1) | (grad_accum[mi] % pp == 0)
                k = int(ok.sum())
                if k == 0:
                    continue
                block = np.empty((13, k), dtype=np.int64)
                block[0], block[1], block[2], block[3] = tp, pp, dp, cp
                block[4], block[5], block[6], block[7] = vpp[ok], sp[ok], zero[ok], rc[ok]
                block[8], block[9] = mbs[mi[ok]], grad_accum[mi[ok]]
                block[10] = precision == "fp8"
                block[11], block[12] = ep[ok], tp
                parts.append(block)
    names = ("tp", "pp", "dp", "cp", "vpp", "sp", "zero", "recompute", "mbs", "grad_accum", "fp8", "ep", "etp")
    allv = np.concatenate(parts, axis=1) if parts else np.empty((13, 0), dtype=np.int64)
    cols = dict(zip(names, allv))
    cols["sp"], cols["fp8"] = cols["sp"].astype(bool), cols["fp8"].astype(bool)
    return LayoutArrays(**cols)


def _impossible_reason(m: ModelSpec, cluster: Cluster, global_batch: int) -> str:
    n = cluster.n_gpus
    if global_batch <= 0:
        return f"global batch must be positive, got {global_batch}"
    dps = [n // mp for mp in _divisors(n)]
    if not any(global_batch % d == 0 for d in dps):
        return f"global batch {global_batch} shares no data-parallel factor with {n} GPUs"
    return (f"no layout of {m.name} ({m.n_heads} heads, {m.n_kv_heads} kv heads, {m.n_layers} layers) "
            f"divides {n} GPUs with global batch {global_batch}: try a global batch that is a multiple of "
            f"{n // min(n, cluster.scaleup_domain)}")


def evaluate_all(m: ModelSpec, cluster: Cluster, global_batch: int, precision: str = "bf16",
                 eff: Efficiency | None = None, sw: Software | None = None) -> tuple[LayoutArrays, dict]:
    """Return (layout arrays, estimate arrays) for every valid layout (no memory filter)."""
    arrays = enumerate_layouts(m, cluster, global_batch, precision)
    if len(arrays) == 0:
        return arrays, {}
    return arrays, estimate_arrays(m, cluster, arrays, eff, sw)


def search(m: ModelSpec, cluster: Cluster, global_batch: int | None = None, objective: str = "time",
           top: int = 10, precision: str = "bf16", eff: Efficiency | None = None,
           sw: Software | None = None) -> SearchResult:
    """Return the ``top`` fitting layouts ranked by step time (or by $ per token for ``cost``).

    ``cost`` also tries 1/2, 1/4 and 1/8 of the GPUs (whole nodes): fewer GPUs with less
    communication can be cheaper per token though slower. Raises TrainperfError when no
    layout is valid (naming the factor) or none fits (smallest memory vs the GPU's).
    """
    if objective not in ("time", "cost"):
        raise TrainperfError(f"objective must be time or cost, not {objective!r}")
    t0 = time.perf_counter()
    gb = int(global_batch or default_global_batch(m.seq_len))
    sizes = [cluster.n_gpus]
    if objective == "cost":
        for div in (2, 4, 8):
            k = cluster.n_gpus // div
            if cluster.n_gpus % div == 0 and k >= 1 and (k % cluster.gpus_per_node == 0 or k < cluster.gpus_per_node):
                sizes.append(k)
    ranked: list[tuple[float, Estimate, int]] = []
    total = fit = 0
    min_mem = float("inf")
    for n in sizes:
        cl = cluster if n == cluster.n_gpus else make_cluster(
            cluster.accelerator.name, n, min(cluster.gpus_per_node, n), cluster.scaleup_gbps, cluster.scaleout_gbps,
            cluster.usd_per_gpu_hour, power_cap_w=cluster.power_cap_w, fabric=cluster.fabric)
        arrays, out = evaluate_all(m, cl, gb, precision, eff, sw)
        if not out:
            continue
        total += len(arrays)
        mem = out["memory_bytes"]
        min_mem = min(min_mem, float(mem.min()))
        ok = np.flatnonzero(mem <= cl.accelerator.hbm_bytes)
        fit += ok.size
        if ok.size == 0:
            continue
        step = out["step_time_s"][ok]
        key = step if objective == "time" else step * n / (gb * m.seq_len)  # cost: GPU-seconds per token
        picked = np.lexsort((mem[ok], key))[: max(top, 1)]  # ties: less memory first
        for j in picked:
            i = int(ok[j])
            est = estimate_at(out, i, arrays.at(i, precision), cl.accelerator.hbm_bytes, (sw or Software()).name)
            ranked.append((float(key[j]), est, n))
    elapsed = time.perf_counter() - t0
    if total == 0:
        raise TrainperfError(_impossible_reason(m, cluster, gb))
    if fit == 0:
        raise TrainperfError(
            f"no layout of {m.name} fits on {cluster.accelerator.name}: the smallest needs "
            f"{min_mem / 2**30:.1f} GiB per GPU (with allocator margin), the GPU has "
            f"{cluster.accelerator.hbm_bytes / 2**30:.1f} GiB; use more GPUs or a shorter sequence")
    ranked.sort(key=lambda r: (r[0], r[1].memory_bytes_per_gpu))
    best = [r[1] for r in ranked[:top]]
    res = SearchResult(model=m, cluster=cluster, global_batch=gb, objective=objective, best=best,
                       n_candidates=total, n_fit=fit, min_memory_gib=min_mem / 2**30, elapsed_s=elapsed,
                       usd_per_gpu_hour=cluster.usd_per_gpu_hour, efficiency_source=(eff or Efficiency()).source,
                       stack=(sw or Software()).name)
    res.extra["n_gpus_used"] = [r[2] for r in ranked[:top]]
    return res
