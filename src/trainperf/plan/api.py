"""The Python API behind `trainperf plan`: one request, one function per mode."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.hardware import Accelerator
from trainperf.plan.compare import HardwareOption, compare_hardware, train_cost
from trainperf.plan.efficiency import Efficiency, load_calibration
from trainperf.plan.stacks import DEFAULT_STACK, Software, get_stack
from trainperf.plan.estimate import Estimate
from trainperf.plan.implied import estimate_as_run
from trainperf.plan.search import SearchResult, default_global_batch, search
from trainperf.specs import (MODEL_PRESETS, Cluster, ModelSpec, load_model, make_cluster, param_count, parse_layout,
                            stated_layout_keys)

DEFAULT_TOKENS = 1e12


@dataclass
class PlanRequest:
    """What the user asked for (GPU counts, sequences, tokens, $ per GPU-hour)."""

    model: str
    gpu: str = "h100"
    n_gpus: int = 8
    gpus_per_node: int | None = None
    seq: int | None = None
    global_batch: int | None = None
    tokens: float | None = None
    top: int = 10
    objective: str = "time"
    calibration: Path | None = None
    usd_per_hour: float | None = None
    precision: str = "bf16"
    stack: str = DEFAULT_STACK
    power_cap_w: float | None = None      # board power limit (W)
    nic_gbit_per_gpu: float | None = None  # scale-out NIC Gb/s per GPU
    fabric: str | None = None              # ib or roce


def _software(req: PlanRequest) -> Software:
    return get_stack(req.stack)


def _efficiency(req: PlanRequest) -> Efficiency:
    return load_calibration(req.calibration) if req.calibration else Efficiency()


def _setup(req: PlanRequest) -> tuple[ModelSpec, Cluster]:
    m = load_model(req.model, req.seq)
    cluster = make_cluster(req.gpu, req.n_gpus, req.gpus_per_node, usd_per_gpu_hour=req.usd_per_hour,
                           power_cap_w=req.power_cap_w, nic_gbit_per_gpu=req.nic_gbit_per_gpu, fabric=req.fabric)
    check_precision(cluster.accelerator, req.precision)
    return m, cluster


def check_precision(acc, precision: str) -> None:
    """Raise a one-line TrainperfError when ``precision`` is fp8 and the accelerator ``acc`` has no fp8 peak."""
    from trainperf.hardware import catalog

    if precision != "fp8" or acc.fp8_tflops:
        return
    with_fp8 = ", ".join(name for name, a in catalog().items() if a.fp8_tflops)
    raise TrainperfError(f"--precision fp8: {acc.name} has no fp8 tensor cores in the catalog; "
                         f"use --precision bf16, or one of {with_fp8}")


def run_search(req: PlanRequest) -> SearchResult:
    """Return the ranked layouts for the request."""
    m, cluster = _setup(req)
    return search(m, cluster, req.global_batch, objective=req.objective, top=req.top, precision=req.precision,
                  eff=_efficiency(req), sw=_software(req))


def run_layout(req: PlanRequest, layout_text: str) -> tuple[Estimate, dict]:
    """Return (Estimate of one layout, extras: tokens, hours, USD, kWh when --tokens was given)."""
    m, cluster = _setup(req)
    lay = parse_layout(layout_text, precision=req.precision)
    gb = req.global_batch
    if gb is None and lay.grad_accum == 0:
        gb = default_global_batch(m.seq_len)
    sw = _software(req)
    est, assumed = estimate_as_run(m, cluster, lay, stated_layout_keys(layout_text), gb, _efficiency(req), sw)
    extra: dict = {"model": m.name, "gpu": cluster.accelerator.name, "n_gpus": cluster.n_gpus,
                   "cluster": cluster_json(cluster),
                   "global_batch": est.layout.dp * est.layout.mbs * est.layout.grad_accum, "assumed": assumed}
    if req.tokens:
        hours, usd, kwh, per_m = train_cost(est, cluster.n_gpus, req.tokens, cluster.usd_per_gpu_hour,
                                            cluster.accelerator.tdp_w, sw.pue)
        extra.update(tokens=req.tokens, train_hours=hours, usd=usd, kwh=kwh, usd_per_million_tokens=per_m, pue=sw.pue)
    if not est.fits:
        extra["memory_terms_bytes"] = memory_terms(m, est, sw, cluster.accelerator)
        extra["why_not_fit"] = why_not_fit(extra["memory_terms_bytes"], est.hbm_bytes)
    return est, extra


def run_compare(req: PlanRequest, gpus: list[str]) -> tuple[list[HardwareOption], float]:
    """Return (one option per accelerator, cheapest per token first; tokens used)."""
    if not gpus:
        raise TrainperfError("--compare-hardware needs at least one accelerator name (see --list-gpus)")
    m = load_model(req.model, req.seq)
    tokens = req.tokens or DEFAULT_TOKENS
    opts = compare_hardware(m, gpus, req.n_gpus, tokens, req.global_batch, req.gpus_per_node, req.usd_per_hour,
                            req.objective, req.precision, _efficiency(req), _software(req))
    return opts, tokens


def cluster_json(cluster: Cluster) -> dict:
    """Return what differs between two clusters of one GPU: node size, links, power cap, clock, fabric."""
    return {"gpus_per_node": cluster.gpus_per_node, "scaleup_gbps": cluster.scaleup_gbps,
            "scaleup_domain": cluster.scaleup_domain, "scaleout_gbps": cluster.scaleout_gbps,
            "fabric": cluster.fabric, "power_cap_w": cluster.power_cap_w, "clock_scale": cluster.clock_scale}


def memory_terms(m: ModelSpec, est: Estimate, sw: Software, acc: Accelerator) -> dict[str, float]:
    """Return the peak-memory terms (bytes) of one layout's fullest stage; they sum to est.memory_bytes_per_gpu.

    Weights, gradients, optimizer state, activations and buffers (with fragmentation), reserved
    margin: plan/memory.py's ``memory_terms`` under stack ``sw`` on accelerator ``acc`` (its runtime
    reserve), the terms of the number the estimate reports.
    """
    from trainperf.plan import memory
    from trainperf.specs import LayoutArrays

    return {k: float(v) for k, v in memory.stack_memory_terms(m, LayoutArrays.of(est.layout), sw, acc).items()}


def why_not_fit(terms: dict[str, float], hbm_bytes: float) -> str:
    """Return 'needs X GiB of Y GiB (Z GiB over): largest term first' for a layout that does not fit."""
    total = sum(terms.values())
    parts = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in sorted(terms.items(), key=lambda kv: -kv[1]))
    return (f"needs {total / 2**30:.1f} GiB of {hbm_bytes / 2**30:.1f} GiB ({(total - hbm_bytes) / 2**30:.1f} GiB over): "
            f"{parts}")


def step_cost(est: Estimate, n_gpus: int, usd_per_gpu_hour: float) -> tuple[float, float]:
    """Return ($ per training step, $ per million tokens) of ``est`` on ``n_gpus`` GPUs (via compare.train_cost)."""
    _, usd_per_gpu_step, _, usd_per_mtok = train_cost(est, 1, est.tokens_per_s_per_gpu * est.step_time_s,
                                                      usd_per_gpu_hour, 0.0, 1.0)
    return usd_per_gpu_step * n_gpus, usd_per_mtok


def search_json(res: SearchResult, req: PlanRequest) -> dict:
    """Return the JSON object of a search: the request, the space covered and the ranked layouts."""
    layouts = []
    for e, used in zip(res.best, res.extra.get("n_gpus_used", [])):
        d = e.to_dict()
        d["n_gpus"] = used
        d["usd_per_step"], d["usd_per_million_tokens"] = step_cost(e, used, res.usd_per_gpu_hour)
        if req.tokens:
            hours, usd, kwh, per_m = train_cost(e, used, req.tokens, res.usd_per_gpu_hour,
                                                res.cluster.accelerator.tdp_w, get_stack(res.stack).pue)
            d.update(train_hours=hours, usd=usd, kwh=kwh, usd_per_million_tokens=per_m)
        layouts.append(d)
    out = {"model": res.model.name, "gpu": res.cluster.accelerator.name, "n_gpus": res.cluster.n_gpus,
           "seq_len": res.model.seq_len, "global_batch": res.global_batch, "objective": res.objective,
           "n_candidates": res.n_candidates, "n_fit": res.n_fit, "search_time_s": res.elapsed_s,
           "usd_per_gpu_hour": res.usd_per_gpu_hour, "efficiency_source": res.efficiency_source, "stack": res.stack, "cluster": cluster_json(res.cluster),
           "layouts": layouts}
    out.update({k: layouts[0][k] for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_gib_per_gpu",
                                            "fits", "breakdown", "layout")})
    return out


def catalog_listing(gpus: bool, models: bool, stacks: bool = False) -> dict:
    """Return {'gpus': [...], 'models': [...], 'stacks': [...]} describing the catalog, presets and stacks."""
    from dataclasses import asdict

    from trainperf.hardware import catalog

    out: dict = {}
    if gpus:
        out["gpus"] = [dict(asdict(a), aliases=list(a.aliases)) for a in catalog().values()]
    if models:
        out["models"] = [dict(m.to_dict(), params=param_count(m)) for m in MODEL_PRESETS.values()]
    if stacks:
        from trainperf.plan.stacks import STACKS

        out["stacks"] = [s.to_dict() for s in STACKS.values()]
    return out
