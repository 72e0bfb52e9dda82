"""Exact layout search: enumerate every valid layout, price them in NumPy blocks, rank the fitting ones.

The space: tp (powers of two dividing the heads, kv heads and ffn, within the scale-up
domain), ep for mixture-of-experts models (powers of two dividing the experts and dp x cp;
expert tensor parallel = tp), cp (powers of two, sequence divisible by 2 cp), pp (divisors of the GPU count up to
the layer count), vpp (interleaving: the busiest stage's layers divisible by it, micro
batches a multiple of pp; uneven stages as Llama 3 405B's 126 layers on 16 stages), sequence parallel on/off, ZeRO 0-3 (2 and 3 only without pipeline
parallelism, as Megatron and DeepSpeed require), recompute none/selective/full, micro batch
1-16 (powers of two dividing the per-replica batch). dp fills the remaining GPUs and must
divide the global batch. Every candidate's memory is computed; the time model
(``estimate_arrays``) runs on those that fit, block by block, and the ranking is the one an
evaluation of every layout gives (tests/plan/test_plan_search.py checks both).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.plan import memory
from trainperf.plan.efficiency import Efficiency
from trainperf.plan.estimate import Estimate, estimate_arrays, estimate_at
from trainperf.plan.stacks import Software
from trainperf.specs import Cluster, Layout, LayoutArrays, ModelSpec, layout_problems, make_cluster

MAX_MBS = 16
MAX_VPP = 16
# Layouts per evaluation block: each intermediate array stays ~128 KiB, so NumPy reuses freed heap
# memory instead of mapping fresh pages for every temporary (DeepSeek-V3 on 2,048 GPUs, 134,778
# layouts: ~45 ms of page faults per search with one block, ~10 with blocks of 16,384).
CHUNK = 16384


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


class _Gathered(dict):
    """Columns of ``cols`` at the rows ``row``, gathered on first access: a mask reads only its own columns."""

    def __init__(self, cols: dict, row: np.ndarray, extra: dict):
        super().__init__(extra)
        self._cols, self._row = cols, row

    def __missing__(self, key: str) -> np.ndarray:
        self[key] = self._cols[key][self._row]
        return self[key]


def _expand(cols: dict, name: str, values, keep=None) -> dict:
    """Return ``cols`` with each row repeated once per value of the new column ``name`` (rows outer,
    values inner, so the order stays lexicographic), keeping the rows where ``keep(columns)`` holds.

    The mask is computed on the columns it names; every column is then gathered once at the kept
    rows (repeating all columns before masking allocated ~10x the final arrays).
    """
    values = np.asarray(values, dtype=np.int64)
    n_rows = len(next(iter(cols.values())))
    row = np.repeat(np.arange(n_rows), values.size)
    new = np.tile(values, n_rows)
    if keep is not None:
        mask = keep(_Gathered(cols, row, {name: new}))
        row, new = row[mask], new[mask]
    out = {k: v[row] for k, v in cols.items()}
    out[name] = new
    return out


def enumerate_layouts(m: ModelSpec, cluster: Cluster, global_batch: int, precision: str = "bf16") -> LayoutArrays:
    """Return the valid layouts as equal-length integer arrays with Layout's field names.

    Built column by column (each new field repeats the rows so far and drops the invalid
    combinations at once) instead of one NumPy grid per (tp, cp, pp): the same layouts in the
    same order, without the Python loop that cost ~45 ms of a 100 ms search.
    """
    n, L = cluster.n_gpus, m.n_layers
    tp_limit = min(64, max(cluster.scaleup_domain, 1), n)
    # the model-side rules (heads, kv heads, ffn; sequence for cp) are specs.layout_problems', the
    # one rule set the planner and the trainer use; the GPU-count and batch rules follow below
    tps = [t for t in _powers_of_two(tp_limit) if not layout_problems(m, Layout(tp=t), t)]
    cps = [c for c in _powers_of_two(min(64, n)) if not layout_problems(m, Layout(cp=c), c)]
    cols = _expand({"tp": np.asarray(tps, dtype=np.int64)}, "cp", cps, lambda c: n % (c["tp"] * c["cp"]) == 0)
    cols = _expand(cols, "pp", [d for d in _divisors(n) if d <= L],
                   lambda c: n % (c["tp"] * c["cp"] * c["pp"]) == 0)
    cols["dp"] = n // (cols["tp"] * cols["cp"] * cols["pp"])
    cols = {k: v[global_batch % cols["dp"] == 0] for k, v in cols.items()}
    cols = _expand(cols, "mbs", _powers_of_two(MAX_MBS), lambda c: (global_batch // c["dp"]) % c["mbs"] == 0)
    cols["grad_accum"] = global_batch // (cols["dp"] * cols["mbs"])

    def vpp_ok(c):  # interleaving: the busiest stage's layers divisible by vpp, micro batches a multiple of pp
        stage = -(-L // c["pp"])
        return (c["vpp"] == 1) | ((c["pp"] > 1) & (stage % c["vpp"] == 0) & (c["pp"] * c["vpp"] <= L)
                                  & (c["grad_accum"] % c["pp"] == 0))

    cols = _expand(cols, "vpp", range(1, MAX_VPP + 1), vpp_ok)
    cols = _expand(cols, "sp", [0, 1], lambda c: (c["sp"] == 0) | (c["tp"] > 1))
    # ZeRO 2 and 3 only without pipeline parallelism (Megatron, DeepSpeed); none to shard over with dp*cp = 1
    cols = _expand(cols, "zero", [0, 1, 2, 3],
                   lambda c: (c["zero"] == 0) | ((c["dp"] * c["cp"] > 1) & ((c["pp"] == 1) | (c["zero"] <= 1))))
    cols = _expand(cols, "recompute", [0, 1, 2])
    # expert parallel: powers of two dividing the experts and the data-parallel ranks (etp = tp)
    eps = [e for e in _powers_of_two(m.n_experts) if m.n_experts % e == 0] if m.is_moe else [1]
    cols = _expand(cols, "ep", eps, lambda c: (c["dp"] * c["cp"]) % c["ep"] == 0)
    cols["etp"] = cols["tp"]
    cols["fp8"] = np.full(cols["tp"].size, precision == "fp8")
    cols["sp"] = cols["sp"].astype(bool)
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


@dataclass(frozen=True, kw_only=True)
class Evaluated:
    """Every valid layout's memory, how many fit, and the time model of the fastest that fit."""

    layouts: LayoutArrays
    memory_bytes: np.ndarray   # per GPU with allocator margin, one per layout
    n_fit: int                 # layouts whose memory fits in HBM
    rows: np.ndarray           # indices into ``layouts`` of the ranked candidates, fastest first
    out: dict                  # estimate_arrays of layouts[rows] (memory_bytes included)


def _top(key: np.ndarray, mem: np.ndarray, k: int) -> np.ndarray:
    """Return the indices of the ``k`` smallest ``key`` (ties: less ``mem`` first, then index), in order.

    Exact: every element with a key up to the k-th smallest is kept before the final sort.
    """
    if key.size > 4 * k:
        kth = np.partition(key, k - 1)[k - 1]
        cand = np.flatnonzero(key <= kth)
    else:
        cand = np.arange(key.size)
    return cand[np.lexsort((mem[cand], key[cand]))][:k]


def evaluate_fitting(m: ModelSpec, cluster: Cluster, global_batch: int, precision: str = "bf16", *,
                     eff: Efficiency | None = None, sw: Software | None = None, top: int = 10) -> Evaluated:
    """Return every valid layout's memory and the estimate arrays of the ``top`` fastest that fit in HBM.

    Memory first: a layout that does not fit is never ranked, so the time model runs on the
    fitting ones only (45% of DeepSeek-V3's 134,778 layouts on 2,048 H800, 24% of
    llama3-405b's 19,350 on 16,384 H100). Evaluated in blocks of ``CHUNK`` layouts, each
    keeping its ``top`` fastest: the overall ``top`` are among them, so the ranking is the
    exhaustive one's (step time, then memory, then enumeration order).
    """
    sw = sw or Software()
    arrays = enumerate_layouts(m, cluster, global_batch, precision)
    mems, rows, outs, n_fit = [], [], [], 0
    for lo in range(0, len(arrays), CHUNK):
        block = arrays.take(slice(lo, lo + CHUNK))
        mem = memory.stack_memory_bytes(m, block, sw, cluster.accelerator)  # as estimate_arrays prices it
        fit = np.flatnonzero(mem <= cluster.accelerator.hbm_bytes)
        mems.append(mem)
        n_fit += fit.size
        if fit.size:
            out = estimate_arrays(m, cluster, block.take(fit), eff, sw, with_memory=False)
            out["memory_bytes"] = mem[fit]
            best = _top(out["step_time_s"], out["memory_bytes"], top)
            outs.append({k: np.asarray(v)[best] for k, v in out.items()})
            rows.append(fit[best] + lo)
    mem = np.concatenate(mems) if mems else np.empty(0)
    if not outs:
        return Evaluated(layouts=arrays, memory_bytes=mem, n_fit=0, rows=np.empty(0, dtype=np.int64), out={})
    out = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
    best = _top(out["step_time_s"], out["memory_bytes"], top)
    return Evaluated(layouts=arrays, memory_bytes=mem, n_fit=n_fit, rows=np.concatenate(rows)[best],
                     out={k: v[best] for k, v in out.items()})


def search(m: ModelSpec, cluster: Cluster, global_batch: int | None = None, *, objective: str = "time",
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
        ev = evaluate_fitting(m, cl, gb, precision, eff=eff, sw=sw, top=max(top, 1))
        if len(ev.layouts) == 0:
            continue
        total += len(ev.layouts)
        min_mem = min(min_mem, float(ev.memory_bytes.min()))
        fit += ev.n_fit
        hbm, name = cl.accelerator.hbm_bytes, (sw or Software()).name
        for j, i in enumerate(ev.rows):  # fastest first; cost: GPU-seconds per token, the same order
            step = float(ev.out["step_time_s"][j])
            key = step if objective == "time" else step * n / (gb * m.seq_len)
            ranked.append((key, estimate_at(ev.out, j, ev.layouts.at(int(i), precision), hbm, name), n))
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
