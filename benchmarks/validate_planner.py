"""Predict published training runs at their published layouts; fit the constants; judge them out of source.

Usage:

    .venv/bin/python benchmarks/validate_planner.py                 # shipped constants, every row
    .venv/bin/python benchmarks/validate_planner.py --loso          # + leave-one-source-out and in-sample fits
    .venv/bin/python benchmarks/validate_planner.py --csv FILE ...  # other row files (same columns)

Rows come from ../shared/data/published_runs/runs.csv and benchmarks/data/planner_dev_runs.csv
(the dev rows this repository adds; each names its source and how every figure was derived).

How a row becomes a planner input (no per-row factors, only what the source states):

* Model: the row's shape; empty kv heads = heads (MHA), empty ffn = 4h, empty vocab = 51200;
  mixture-of-experts and MLA columns (n_experts, top_k, moe_ffn_hidden, ...) as ModelSpec's.
  ``arch`` (dev file) or the name picks the block: "llama" = RMSNorm, gated (SwiGLU) MLP,
  rotary, untied; "gpt" = LayerNorm, 4h GELU MLP, linear biases (and dropout), tied
  embeddings, learned positions. Nemotron-4 is neither (LayerNorm, squared-ReLU 2-matrix MLP).
  ``head_dim`` where the source sets it apart from hidden / heads (MaxText).
* Layout: empty cp/vpp/mbs = 1; empty sequence_parallel and recompute "not stated"/empty are
  filled by plan/implied.py, as `trainperf plan --layout` fills what a user leaves out (sp on
  when tp > 1; the least recompute whose predicted memory fits, since the job ran); dp_sharding "distributed
  optimizer" = zero 1, "none (DDP...)" = zero 0, "FSDP" = zero 3 (with the row's tp, if any);
  ``dp_shard`` (dev file) where the source shards over part of the data-parallel ranks and
  replicates over the rest (hybrid sharding), empty = over all of them.
* Software stack: the dev file's ``stack`` column; otherwise 2021-22 Megatron-LM rows
  (Narayanan et al., Korthikanti et al.) are ``megatron-2021``, MaxText rows ``jax``, the
  rest ``megatron-core`` (their sources state TE, flash attention and overlap switches).
* Target: the published step time when there is one; else tokens/s per GPU; else the
  published TFLOP/s per GPU divided by the source's own FLOP count per token (Megatron-Core,
  NeMo and MaxText count attention non-causally: ``model_flops_per_token(causal=False)``).

Constants and how they are judged (``--loso``): the planner has a few fitted constants, each
with a physical meaning (``CONSTANTS``). ``fit`` chooses them by coordinate descent on a set
of rows (objective: mean |log error| + 0.5 x its 90th percentile). Leave-one-source-out fits them
on every source but one and predicts the held-out source. A generation's GEMM constant is its
efficiency at the clock its parts sustain under their board power (``clock_fraction``), and
its flash attention runs at the catalog's published share of that GEMM rate (same tensor cores,
same clock: plan/efficiency.resolve), so no fit can trade a faster attention for slower GEMMs; a
generation with no row in the training sources gets the mean of the fitted generations' (same
vendor first: ``generation_prior``), never the shipped value fitted with the held-out rows;
other constants without a training row keep their prior (``PRIORS``). The constant-MFU
baseline (model FLOPs / peak x one MFU, the training rows' median) is judged the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.errors import TrainperfError
from trainperf.plan.efficiency import Efficiency
from trainperf.plan.estimate import Estimate, check_layout, estimate, estimate_arrays
from trainperf.plan.implied import estimate_as_run, implied_layout
from trainperf.plan.stacks import Software, get_stack
from trainperf.specs import Cluster, Layout, LayoutArrays, ModelSpec, make_cluster, model_flops_per_token

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSVS = (ROOT / "../shared/data/published_runs/runs.csv", ROOT / "benchmarks/data/planner_dev_runs.csv")


def _int(v: str | None, default: int) -> int:
    v = (v or "").strip()
    return int(float(v)) if v else default


# ------------------------------------------------------------------------------- rows


MOE_COLUMNS = ("n_experts", "top_k", "moe_ffn_hidden", "shared_ffn_hidden", "n_dense_layers", "q_lora_rank",
               "kv_lora_rank", "qk_rope_dim", "v_head_dim")


def row_model(r: dict) -> ModelSpec:
    """Return the ModelSpec a published row describes."""
    name = r["model_name"]
    low = name.lower()
    arch = (r.get("arch") or "").strip().lower() or ("gpt" if low.startswith("gpt") or "mt-nlg" in low
                                                     else "llama" if "llama" in low else "nemotron")
    gpt = arch == "gpt"
    h = _int(r["hidden"], 0)
    heads = _int(r["n_heads"], 0)
    return ModelSpec(
        name=name, n_layers=_int(r["n_layers"], 0), hidden=h, n_heads=heads,
        n_kv_heads=_int(r["n_kv_heads"], heads), ffn_hidden=_int(r["ffn_hidden"], 4 * h),
        vocab=_int(r["vocab"], 51200), seq_len=_int(r["seq_len"], 0), gated_mlp=arch == "llama",
        tied_embeddings=gpt, norm="rmsnorm" if arch == "llama" else "layernorm",
        linear_bias=gpt, learned_pos_emb=gpt, head_dim=_int(r.get("head_dim"), 0),
        **{k: _int(r.get(k), 0) for k in MOE_COLUMNS},
    )


def row_layout(r: dict) -> tuple[Layout, frozenset[str]]:
    """Return (the Layout a published row states, the fields it states); the rest are implied (plan/implied.py)."""
    shard = r["dp_sharding"].lower()
    fsdp = shard.startswith("fsdp")
    tp = _int(r["tp"], 1)
    pp = 1 if fsdp else _int(r["pp"], 1)
    sp_txt = r["sequence_parallel"].strip().lower()
    rc_txt = r["recompute"].strip().lower()
    rc = "full" if rc_txt.startswith("full") else "selective" if rc_txt.startswith("selective") else "none"
    zero = 3 if fsdp else 0 if shard.startswith("none") else 1
    stated = {"tp", "pp", "dp", "cp", "vpp", "zero", "mbs", "ep", "etp", "dp_shard", "precision"}
    stated |= {"sp"} if sp_txt else set()
    stated |= set() if rc_txt in ("", "not stated") else {"recompute"}
    lay = Layout(tp=tp, pp=pp, dp=0, cp=_int(r["cp"], 1), vpp=_int(r["vpp"], 1), sp=sp_txt == "y" and tp > 1,
                 zero=zero, recompute=rc, mbs=_int(r["micro_batch"], 1), ep=_int(r.get("ep"), 1),
                 etp=_int(r.get("etp"), 0), dp_shard=_int(r.get("dp_shard"), 0),
                 precision="fp8" if r["precision"].strip().lower().startswith("fp8") else "bf16")
    return lay, frozenset(stated)


def row_software(r: dict) -> Software:
    """Return the software stack of the row (its ``stack`` column, else by source)."""
    if (r.get("stack") or "").strip():
        return get_stack(r["stack"])
    src = r["source"].lower()
    if "narayanan" in src or "korthikanti" in src:
        return get_stack("megatron-2021")
    if "maxtext" in src or "maxtext" in r["model_name"].lower():
        return get_stack("jax")
    return get_stack("megatron-core")


def plan_argv(r: dict, model_file: Path) -> list[str]:
    """Return the `trainperf plan` arguments a user would type for the row: what it states, nothing more.

    ``model_file``: where the row's model (``row_model``) was written as a JSON config. The layout text
    names only the fields the row states; the command fills the rest (plan/implied.py).
    """
    lay, stated = row_layout(r)
    names = {"grad_accum": "ga"}
    skip = {"dp", "grad_accum"} | ({"etp"} if not lay.etp else set()) | ({"dp_shard"} if not lay.dp_shard else set())
    text = ",".join(f"{names.get(k, k)}={int(v) if isinstance(v, bool) else v}" for k, v in asdict(lay).items()
                    if k in stated and k not in skip)
    return ["plan", "--model", str(model_file), "--gpu", r["gpu_type"], "--gpus", r["n_gpus"],
            "--gpus-per-node", str(_int(r["gpus_per_node"], 8)), "--seq-len", r["seq_len"],
            "--global-batch", r["global_batch_size"], "--layout", text, "--stack", row_software(r).name, "--json"]


def as_user_errors(cases: list[Case]) -> list[dict]:
    """Return, per case, the error of `trainperf plan` run as a user would run it (``plan_argv``) and its
    prediction / the validation's own at the shipped constants - 1 (0: the command predicts what is validated)."""
    import tempfile

    from typer.testing import CliRunner

    from trainperf.cli import app

    runner, shipped, out = CliRunner(), shipped_params(), []
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            model_file = Path(tmp) / f"model{c.index}.json"
            model_file.write_text(json.dumps(asdict(c.model)))
            argv = plan_argv(c.row, model_file)
            res = runner.invoke(app, argv)
            if res.exit_code:
                out.append({"index": c.index, "argv": argv, "failed": res.output.strip()[-300:]})
                continue
            d = json.loads(res.output)
            value = d[c.kind]
            out.append({"index": c.index, "argv": argv, "assumed": d["assumed"], "error": rel_error(c, value),
                        "vs_validation": value / predicted_value(c, shipped) - 1.0})
    return out


def measured(r: dict, m: ModelSpec) -> tuple[str, float] | None:
    """Return ('step_time_s', s) or ('tokens_per_s_per_gpu', t) as published, or None."""
    if r["step_time_s"].strip():
        return "step_time_s", float(r["step_time_s"])
    if r["measured_tokens_per_sec_per_gpu"].strip():
        return "tokens_per_s_per_gpu", float(r["measured_tokens_per_sec_per_gpu"])
    if r["measured_tflops_per_gpu"].strip():
        return "tokens_per_s_per_gpu", float(r["measured_tflops_per_gpu"]) * 1e12 / model_flops_per_token(m, causal=False)
    return None


def source_key(source: str) -> str:
    """Return the publication a row comes from: its repository ('owner/name') or the paper's authors.

    Leave-one-source-out holds out whole publications: every recipe of one repository (all
    of NVIDIA/dgxc-benchmarking, all of NVIDIA/NeMo's pages) goes together.
    """
    repo = re.match(r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)", source.strip())
    if repo:
        return repo.group(1)
    return re.split(r"[;(]", source)[0].strip()


# ------------------------------------------------------------------------------ cases


@dataclass(frozen=True, kw_only=True)
class Case:
    """One published row turned into planner input and its measured target."""

    index: int
    file: str
    source: str
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    global_batch: int
    stack: Software
    kind: str            # step_time_s or tokens_per_s_per_gpu
    value: float
    generation: str      # accelerator generation (which fitted GEMM efficiency applies)
    arrays: LayoutArrays  # the resolved layout, as estimate_arrays takes it (fits skip re-resolving)
    row: dict             # the published row itself (``--as-user`` builds the command line from it)


def generation(cluster: Cluster) -> str:
    """Return the accelerator generation a GEMM-efficiency constant is shared by."""
    fam = cluster.accelerator.family
    for gen, fams in (("ampere", ("a100", "a800")), ("hopper", ("h100", "h200", "h800", "h20")),
                      ("blackwell", ("b200", "gb200", "b300", "gb300")), ("tpu", ("v4", "v5p", "v5e", "v6e")),
                      ("cdna", ("mi250x", "mi300x", "mi325x", "mi350x", "mi355x"))):
        if fam in fams:
            return gen
    return fam or cluster.accelerator.name


def load_cases(paths) -> tuple[list[Case], list[dict]]:
    """Return (cases, skipped rows with their reason) from the row files."""
    cases, skipped = [], []
    for path in paths:
        for i, r in enumerate(csv.DictReader(Path(path).open())):
            where = {"file": Path(path).name, "row": i, "model": r["model_name"], "source": source_key(r["source"])}
            try:
                m = row_model(r)
                target = measured(r, m)
                if target is None:
                    skipped.append(dict(where, skipped="no measured step time, tokens/s or TFLOP/s"))
                    continue
                cluster = make_cluster(r["gpu_type"], int(r["n_gpus"]), _int(r["gpus_per_node"], 8))
                (lay, stated), sw, gb = row_layout(r), row_software(r), _int(r["global_batch_size"], 0)
                # what the row leaves unsaid, filled as `trainperf plan --layout` fills it (plan/implied.py)
                est, _ = estimate_as_run(m, cluster, lay, stated, gb, None, sw)
                lay = replace(implied_layout(lay, stated, sw), recompute=est.layout.recompute)
            except TrainperfError as e:
                skipped.append(dict(where, skipped=str(e)))
                continue
            cases.append(Case(index=len(cases), file=Path(path).name, source=where["source"], model=m, cluster=cluster,
                              layout=lay, global_batch=gb, stack=sw, kind=target[0], value=target[1],
                              generation=generation(cluster),
                              arrays=LayoutArrays.of(check_layout(m, cluster, lay, gb)), row=r))
    return cases, skipped


# -------------------------------------------------------------------------- constants

GENERATIONS = ("ampere", "hopper", "blackwell", "tpu", "cdna")
GEMM_GRID = [round(0.50 + 0.01 * k, 2) for k in range(50)]  # 0.50 .. 0.99 (0.03 steps moved whole folds by 5%)
CONSTANTS: dict[str, tuple[list[float], str]] = {
    **{f"gemm_eff:{g}": (GEMM_GRID, f"large bf16 GEMM rate / (dense peak x sustained clock fraction) on {g} "
                         "accelerators") for g in GENERATIONS},
    "attn_seq_half": ([96.0, 256.0, 512.0, 1024.0, 2048.0], "tokens per rank at which flash attention runs at half rate"),
    "gemm_dim_half": ([32.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0], "GEMM dimension at which the rate halves"),
    "fp8_gemm_speedup": ([1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9], "fp8 / bf16 GEMM rate including scaling"),
    "tp_overlap": ([0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], "share of TP comm hidden (stacks that overlap TP)"),
    "comm_sm_share": ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], "compute lost while hidden collectives run (NCCL SMs, HBM)"),
}


# The starting point of every fit: the estimates the catalog and the model carried before any
# fit on these rows (vendor figures and the 2021-24 runs of runs.csv). Starting from the shipped,
# fitted values instead would leak a held-out source into its own prediction through the
# generations only it has. A generation's GEMM constant is its efficiency at the clock the part
# sustains (hardware.sustained_clock_fraction: the board power, not the rated boost clock, sets
# how fast a dense GEMM runs); a generation no training row has gets the mean of the fitted
# generations' (``generation_prior``).
PRIORS = {"gemm_eff:ampere": 0.82, "gemm_eff:hopper": 0.88, "gemm_eff:blackwell": 0.97, "gemm_eff:tpu": 0.70,
          "gemm_eff:cdna": 0.72, "gemm_dim_half": 96.0, "fp8_gemm_speedup": 1.7,
          "attn_seq_half": 96.0, "tp_overlap": 0.6, "comm_sm_share": 0.0}
# the catalog part whose gemm_eff carries each generation's fitted constant
GENERATION_PART = {"ampere": "a100", "hopper": "h100", "blackwell": "gb200", "tpu": "tpu-v5p", "cdna": "mi355x"}


def clock_fraction(cluster: Cluster) -> float:
    """Return the tensor clock the cluster's part sustains through large GEMMs / its rated clock."""
    from trainperf.hardware import sustained_clock_fraction

    return sustained_clock_fraction(cluster.accelerator)


def generation_prior(gen: str, vendor: str, params: dict, train: list[Case]) -> float:
    """Return the GEMM constant for a generation no row of ``train`` has: physics and the other generations.

    The constant is already per sustained clock (the power-limited clock is the part's own, from
    its catalog watts and peak), so what transfers between generations is the GEMM efficiency at
    that clock: the mean of the fitted generations of the same vendor (same tensor-core lineage
    and GEMM libraries), or of every fitted generation when the vendor has none.
    """
    fitted = {c.generation: c.cluster.accelerator.vendor for c in train}
    same = [g for g, v in fitted.items() if v == vendor] or list(fitted)
    return round(statistics.mean(params[f"gemm_eff:{g}"] for g in same), 2) if same else PRIORS[f"gemm_eff:{gen}"]


def shipped_params() -> dict:
    """Return the constants as shipped (catalog and Efficiency defaults): the starting point of a fit."""
    from trainperf.hardware import get_accelerator

    from trainperf.hardware import sustained_clock_fraction

    def per_clock(part: str) -> float:
        acc = get_accelerator(part)
        return round(acc.gemm_eff / sustained_clock_fraction(acc), 2)

    return {**{f"gemm_eff:{g}": per_clock(part) for g, part in GENERATION_PART.items()},
            "gemm_dim_half": Efficiency().gemm_dim_half, "fp8_gemm_speedup": Efficiency().fp8_gemm_speedup,
            "attn_seq_half": Efficiency().attn_seq_half,
            "tp_overlap": get_stack("megatron-core").tp_overlap, "comm_sm_share": Efficiency().comm_sm_share}


def _inputs(case: Case, params: dict) -> tuple[Efficiency, Software]:
    key = f"gemm_eff:{case.generation}"
    eff = Efficiency(gemm_eff_max=params[key] * clock_fraction(case.cluster) if key in params else 0.0,
                     gemm_dim_half=params["gemm_dim_half"], fp8_gemm_speedup=params["fp8_gemm_speedup"],
                     comm_sm_share=params["comm_sm_share"], attn_seq_half=params["attn_seq_half"])
    sw = replace(case.stack, tp_overlap=params["tp_overlap"]) if case.stack.tp_overlap > 0 else case.stack
    return eff, sw


def predict(case: Case, params: dict) -> Estimate:
    """Return the planner's estimate of ``case`` with the constants ``params``."""
    eff, sw = _inputs(case, params)
    return estimate(case.model, case.cluster, case.layout, case.global_batch, eff, sw)


def unused_constants(case: Case) -> set[str]:
    """Return the constants that cannot change ``case``'s prediction (other generations, fp8 on bf16, ...)."""
    skip = {k for k in CONSTANTS if k.startswith("gemm_eff:") and k != f"gemm_eff:{case.generation}"}
    if case.layout.precision != "fp8":
        skip.add("fp8_gemm_speedup")
    if case.stack.tp_overlap <= 0:
        skip.add("tp_overlap")
    return skip


_MEMO: dict = {}


def predicted_value(case: Case, params: dict) -> float:
    """Return the prediction in the row's own measure, memoised on the constants the case uses.

    The same numbers as ``predict`` (estimate_arrays on the resolved layout, without memory);
    a fit's sweep over one generation's constant then recomputes only that generation's rows.
    """
    skip = unused_constants(case)
    key = (case.index, case.file, tuple(sorted((k, v) for k, v in params.items() if k not in skip)))
    if key not in _MEMO:
        eff, sw = _inputs(case, params)
        out = estimate_arrays(case.model, case.cluster, case.arrays, eff, sw, with_memory=False)
        _MEMO[key] = float(out[case.kind])
    return _MEMO[key]


def rel_error(case: Case, est: Estimate | float) -> float:
    """Return predicted / measured - 1 in the row's own measure (``est``: an Estimate or the predicted value)."""
    if isinstance(est, Estimate):
        est = est.step_time_s if case.kind == "step_time_s" else est.tokens_per_s_per_gpu
    return est / case.value - 1.0


def objective(cases: list[Case], params: dict) -> float:
    """Return mean |log(1 + error)| + 0.5 x its 90th percentile.

    The tail term keeps the fit from sacrificing rows for the median; a percentile rather than
    the maximum keeps one row no constant can explain (a run whose software state differs)
    from steering every constant.
    """
    logs = sorted(abs(math.log1p(rel_error(c, predicted_value(c, params)))) for c in cases)
    return statistics.mean(logs) + 0.5 * logs[min(len(logs) - 1, int(0.9 * len(logs)))]


def fit(cases: list[Case], start: dict | None = None, sweeps: int = 8) -> dict:
    """Return the constants fitted on ``cases`` by coordinate descent over ``CONSTANTS``' grids.

    Sweeps repeat until one changes nothing (converged) or ``sweeps`` have run: two sweeps
    left some folds short of their optimum, and the held-out error then moved with any
    change to the model by more than the change itself.

    A generation's GEMM efficiency with no case of that generation is not fitted (run_loso gives
    it ``generation_prior``); tp_overlap without a stack that overlaps TP keeps its prior (``PRIORS``).
    """
    params = dict(start or PRIORS)
    gens = {c.generation for c in cases}
    free = [k for k in CONSTANTS if not (k.startswith("gemm_eff:") and k.split(":")[1] not in gens)
            and not (k == "tp_overlap" and not any(c.stack.tp_overlap > 0 and c.layout.sp for c in cases))
            and not (k == "fp8_gemm_speedup" and not any(c.layout.precision == "fp8" for c in cases))]
    best = objective(cases, params)
    for _ in range(sweeps):
        before = best
        for k in free:
            for v in CONSTANTS[k][0]:
                trial = dict(params, **{k: v})
                s = objective(cases, trial)
                if s < best - 1e-9:
                    best, params = s, trial
        if best >= before - 1e-9:
            break
    return params


# --------------------------------------------------------------------------- baseline


def mfu_of(case: Case) -> float:
    """Return the row's measured model-FLOPs utilisation (causal count, dense peak of its precision)."""
    peak = case.cluster.accelerator.peak_flops(case.layout.precision)
    tps = case.value if case.kind != "step_time_s" else \
        case.global_batch * case.model.seq_len / case.value / case.cluster.n_gpus
    return tps * model_flops_per_token(case.model) / peak


def baseline_error(case: Case, mfu0: float) -> float:
    """Return the constant-MFU prediction's error on ``case`` (predicted / measured - 1)."""
    ratio = mfu0 / mfu_of(case)  # predicted tokens/s over measured tokens/s
    return 1.0 / ratio - 1.0 if case.kind == "step_time_s" else ratio - 1.0


# ---------------------------------------------------------------------------- reports


def summarize(errs: list[float]) -> dict:
    """Return median / max |error| and the counts within 10% and 25% (NaN: not predicted, left out)."""
    a = [abs(e) for e in errs if not math.isnan(e)]
    if not a:
        return {"n": 0}
    return {"n": len(a), "median": statistics.median(a), "max": max(a), "within_10pct": sum(e <= 0.10 for e in a),
            "within_25pct": sum(e <= 0.25 for e in a)}


def run_loso(cases: list[Case], holdout: list[str] | None = None, sweeps: int = 8) -> dict:
    """Return per-case held-out errors (planner and constant-MFU baseline) and each fold's constants.

    ``holdout``: only the sources whose key contains one of these strings (case-insensitive),
    a quick check while iterating; the headline holds out every source.
    """
    out: dict = {"planner": {}, "baseline": {}, "folds": {}}
    for src in sorted({c.source for c in cases}):
        if holdout and not any(h.lower() in src.lower() for h in holdout):
            continue
        train = [c for c in cases if c.source != src]
        test = [c for c in cases if c.source == src]
        params = fit(train, sweeps=sweeps)
        for c in test:  # held-out generations: the GEMM efficiency per sustained clock of the others
            if c.generation not in {t.generation for t in train}:
                params[f"gemm_eff:{c.generation}"] = generation_prior(c.generation, c.cluster.accelerator.vendor,
                                                                      params, train)
        mfu0 = statistics.median(mfu_of(c) for c in train)
        out["folds"][src] = {"constants": params, "baseline_mfu": mfu0, "n_test": len(test)}
        for c in test:
            out["planner"][c.index] = rel_error(c, predicted_value(c, params))
            out["baseline"][c.index] = baseline_error(c, mfu0)
    return out


def _fmt(s: dict) -> str:
    return "n/a" if not s.get("n") else (f"median {s['median']:.1%}, max {s['max']:.1%} (n={s['n']}, "
                                          f"{s['within_10pct']} within 10%, {s['within_25pct']} within 25%)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, action="append", default=None, help="row file(s); default: runs.csv + dev rows")
    ap.add_argument("--loso", action="store_true", help="also fit in-sample and leave-one-source-out")
    ap.add_argument("--json", type=Path, default=None, help="write per-row results here")
    ap.add_argument("--holdout", action="append", default=None,
                    help="with --loso: hold out only sources whose key contains this (repeatable; quick check)")
    ap.add_argument("--sweeps", type=int, default=8,
                    help="at most this many coordinate-descent sweeps per fit (default 8; stops when converged)")
    ap.add_argument("--as-user", action="store_true",
                    help="also run every row through `trainperf plan` as a user types it (only what the row states)")
    args = ap.parse_args(argv)
    paths = args.csv or list(DEFAULT_CSVS)
    for p in paths:
        if not Path(p).is_file():
            print(f"error: {p}: not found", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    cases, skipped = load_cases(paths)
    shipped = shipped_params()
    rows = []
    for c in cases:
        est = predict(c, shipped)
        rows.append({"file": c.file, "source": c.source, "model": c.model.name, "gpu": c.cluster.accelerator.name,
                     "n_gpus": c.cluster.n_gpus, "stack": c.stack.name, "layout": est.layout.to_string(),
                     "kind": c.kind, "measured": c.value,
                     "predicted": est.step_time_s if c.kind == "step_time_s" else est.tokens_per_s_per_gpu,
                     "error": rel_error(c, est), "fits": est.fits, "memory_gib": est.memory_gib_per_gpu,
                     "dominant": est.dominant_overhead, "measured_mfu": mfu_of(c)})
    mfu_all = statistics.median(r["measured_mfu"] for r in rows)
    for c, r in zip(cases, rows):
        r["baseline_error_in_sample"] = baseline_error(c, mfu_all)
    report: dict = {"files": [str(p) for p in paths], "skipped": skipped, "rows": rows}
    print(f"{'#':>3} {'source':26} {'model':28} {'gpu':9} {'gpus':>5} {'stack':20} {'what':5} {'measured':>9} "
          f"{'predicted':>9} {'err':>7}" + ("  loso    base-loso" if args.loso else ""))
    if args.loso:
        fitted = fit(cases, sweeps=args.sweeps)
        loso = run_loso(cases, args.holdout, args.sweeps)
        report.update(in_sample_constants=fitted, loso_folds=loso["folds"])
        for c, r in zip(cases, rows):
            r["error_in_sample_fit"] = rel_error(c, predicted_value(c, fitted))
            r["error_loso"] = loso["planner"].get(c.index, math.nan)
            r["baseline_error_loso"] = loso["baseline"].get(c.index, math.nan)
    for i, r in enumerate(rows):
        what = "step" if r["kind"] == "step_time_s" else "tok/s"
        line = (f"{i:>3} {r['source'][:26]:26} {r['model'][:28]:28} {r['gpu'][:9]:9} {r['n_gpus']:>5} {r['stack'][:20]:20} "
                f"{what:5} {r['measured']:>9.4g} {r['predicted']:>9.4g} {r['error']:>+7.1%}")
        if args.loso:
            line += f" {r['error_loso']:>+7.1%} {r['baseline_error_loso']:>+7.1%}"
        print(line + ("" if r["fits"] else "  (OOM predicted)"))
    for s in skipped:
        print(f"skipped {s['file']} row {s['row']} ({s['model']}): {s['skipped']}")
    summary = {"shipped": summarize([r["error"] for r in rows]),
               "constant_mfu_in_sample": summarize([r["baseline_error_in_sample"] for r in rows])}
    print(f"\n{len(rows)} rows predicted, {len(skipped)} skipped; {len({c.source for c in cases})} sources")
    print(f"shipped constants:            {_fmt(summary['shipped'])}")
    print(f"constant MFU {mfu_all:.3f} (in-sample): {_fmt(summary['constant_mfu_in_sample'])}")
    if args.loso:
        summary.update(in_sample_fit=summarize([r["error_in_sample_fit"] for r in rows]),
                       loso=summarize([r["error_loso"] for r in rows]),
                       constant_mfu_loso=summarize([r["baseline_error_loso"] for r in rows]))
        print(f"in-sample fit (all rows):     {_fmt(summary['in_sample_fit'])}")
        print(f"leave-one-source-out:         {_fmt(summary['loso'])}")
        print(f"constant MFU, LOSO:           {_fmt(summary['constant_mfu_loso'])}")
        # a generation seen in one source only keeps its catalog prior when that source is held out
        seen = {g for g in GENERATIONS if len({c.source for c in cases if c.generation == g}) > 1}
        for r, c in zip(rows, cases):
            r["generation_in_other_sources"] = c.generation in seen
        for key, flag, label in (("seen", True, "generation fitted out of source"),
                                 ("unseen", False, "generation in one source only")):
            sub = [r for r in rows if r["generation_in_other_sources"] is flag]
            summary[f"loso_{key}"] = summarize([r["error_loso"] for r in sub])
            summary[f"constant_mfu_loso_{key}"] = summarize([r["baseline_error_loso"] for r in sub])
            print(f"  LOSO, {label:31}: {_fmt(summary['loso_' + key])}; "
                  f"constant MFU {_fmt(summary['constant_mfu_loso_' + key])}")
        by_stack: dict = {}
        for r in rows:
            by_stack.setdefault(r["stack"], []).append(r)
        summary["per_stack"] = {}
        for st, rs in sorted(by_stack.items()):
            summary["per_stack"][st] = {"loso": summarize([r["error_loso"] for r in rs]),
                                        "in_sample_fit": summarize([r["error_in_sample_fit"] for r in rs]),
                                        "constant_mfu_loso": summarize([r["baseline_error_loso"] for r in rs])}
            print(f"  {st:22} LOSO {_fmt(summary['per_stack'][st]['loso'])}; constant MFU LOSO "
                  f"{_fmt(summary['per_stack'][st]['constant_mfu_loso'])}")
        print("in-sample constants: " + ", ".join(f"{k}={v:g}" for k, v in fitted.items()))
    if args.as_user:
        user = as_user_errors(cases)
        report["as_user"] = user
        ok = [u for u in user if "error" in u]
        summary["as_user"] = summarize([u["error"] for u in ok])
        summary["as_user"].update(failed=len(user) - len(ok),
                                  differ_from_validation=sum(abs(u["vs_validation"]) > 0.005 for u in ok))
        print(f"as a user runs it (`trainperf plan ... --layout <what the row states> --json`): "
              f"{_fmt(summary['as_user'])}; {summary['as_user']['failed']} failed, "
              f"{summary['as_user']['differ_from_validation']} differ from the validation by > 0.5%")
    print(f"({time.perf_counter() - t0:.1f} s)")
    report["summary"] = summary
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
