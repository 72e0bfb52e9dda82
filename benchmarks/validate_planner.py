"""Predict every published run in ../shared/data/published_runs/runs.csv at its published layout.

Prints per-row predicted vs measured step time (or tokens/s per GPU where only a TFLOP/s
figure was published) and the median / max relative error. Usage:

    .venv/bin/python benchmarks/validate_planner.py [--csv PATH] [--json OUT]

How a row becomes a planner input (no per-row factors, only what the source states):

* Model: the row's shape; empty kv heads = heads (MHA), empty ffn = 4h, empty vocab = 51200.
  "llama" models use a gated (SwiGLU) MLP, GPT and Nemotron-4 do not (squared ReLU); GPT
  models have linear biases (and dropout), tied embeddings and learned positions.
* Layout: empty cp/vpp/mbs = 1; empty sequence_parallel = on when tp > 1 (NeMo/Megatron-Core
  default); recompute "none" = none, "not stated"/empty = the least recompute (none,
  selective, full) whose predicted memory fits, since the job ran; dp_sharding "distributed optimizer" =
  zero 1, "none (DDP/DP=1)" = zero 0, "FSDP" = zero 3 with tp = pp = 1.
* Software: rows from Narayanan et al. 2021 and Korthikanti et al. 2022 ran 2021-22
  Megatron-LM on A100: no flash attention, no TP/DP/P2P overlap. All H100 rows (Megatron-Core,
  NeMo, DGX Cloud recipes, MaxText) ran with flash attention and communication overlap
  (the sources state tp_comm_overlap / overlap_grad_reduce / overlap_p2p_comm).
* Target: the published step time when there is one; otherwise tokens/s per GPU from the
  published TFLOP/s per GPU divided by the source's own FLOP count per token (Megatron-Core
  and NeMo count attention non-causally: ``model_flops_per_token(causal=False)``).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.errors import TrainperfError
from trainperf.plan.efficiency import Efficiency
from trainperf.plan.stacks import Software, get_stack
from trainperf.plan.estimate import estimate
from trainperf.specs import Layout, ModelSpec, make_cluster, model_flops_per_token

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "../shared/data/published_runs/runs.csv"


def _int(v: str, default: int) -> int:
    v = (v or "").strip()
    return int(float(v)) if v else default


def row_model(r: dict) -> ModelSpec:
    """Return the ModelSpec a published row describes."""
    name = r["model_name"]
    low = name.lower()
    gpt = low.startswith("gpt") or "mt-nlg" in low
    h = _int(r["hidden"], 0)
    heads = _int(r["n_heads"], 0)
    return ModelSpec(
        name=name, n_layers=_int(r["n_layers"], 0), hidden=h, n_heads=heads,
        n_kv_heads=_int(r["n_kv_heads"], heads), ffn_hidden=_int(r["ffn_hidden"], 4 * h),
        vocab=_int(r["vocab"], 51200), seq_len=_int(r["seq_len"], 0), gated_mlp="llama" in low,
        tied_embeddings=gpt, norm="layernorm" if not "llama" in low else "rmsnorm",
        linear_bias=gpt, learned_pos_emb=gpt,
    )


def row_layout(r: dict) -> Layout:
    """Return the Layout a published row states (defaults as in the module docstring)."""
    shard = r["dp_sharding"].lower()
    fsdp = shard.startswith("fsdp")
    tp = 1 if fsdp else _int(r["tp"], 1)
    pp = 1 if fsdp else _int(r["pp"], 1)
    sp_txt = r["sequence_parallel"].strip().lower()
    sp = (sp_txt == "y") if sp_txt else tp > 1
    rc_txt = r["recompute"].strip().lower()
    rc = "full" if rc_txt.startswith("full") else "selective" if rc_txt.startswith("selective") else "none"
    zero = 3 if fsdp else 0 if shard.startswith("none") else 1
    return Layout(tp=tp, pp=pp, dp=0, cp=_int(r["cp"], 1), vpp=_int(r["vpp"], 1), sp=sp, zero=zero,
                  recompute=rc, mbs=_int(r["micro_batch"], 1),
                  precision="fp8" if r["precision"].strip().lower().startswith("fp8") else "bf16")


def row_software(r: dict) -> Software:
    """Return the framework features of the row's source (2021-22 Megatron on A100 vs today's)."""
    src = r["source"].lower()
    if "narayanan" in src or "korthikanti" in src:
        return get_stack("megatron-2021")
    return get_stack("megatron-core")


def measured(r: dict, m: ModelSpec) -> tuple[str, float] | None:
    """Return ('step_time_s', s) or ('tokens_per_s_per_gpu', t) as published, or None."""
    if r["step_time_s"].strip():
        return "step_time_s", float(r["step_time_s"])
    if r["measured_tokens_per_sec_per_gpu"].strip():
        return "tokens_per_s_per_gpu", float(r["measured_tokens_per_sec_per_gpu"])
    if r["measured_tflops_per_gpu"].strip():
        return "tokens_per_s_per_gpu", float(r["measured_tflops_per_gpu"]) * 1e12 / model_flops_per_token(m, causal=False)
    return None


def validate(csv_path: Path, eff: Efficiency | None = None) -> list[dict]:
    """Return one dict per row: prediction, measurement, relative error or the reason it was skipped."""
    rows = list(csv.DictReader(csv_path.open()))
    out = []
    for i, r in enumerate(rows):
        rec = {"row": i, "model": r["model_name"], "gpu": r["gpu_type"].split(" (")[0], "n_gpus": int(r["n_gpus"])}
        try:
            m = row_model(r)
            cluster = make_cluster(r["gpu_type"], int(r["n_gpus"]), _int(r["gpus_per_node"], 8))
            lay = row_layout(r)
            target = measured(r, m)
            if target is None:
                rec["skipped"] = "no measured step time, tokens/s or TFLOP/s"
                out.append(rec)
                continue
            gb = _int(r["global_batch_size"], 0)
            sw = row_software(r)
            est = estimate(m, cluster, lay, gb, eff, sw)
            rc_txt = r["recompute"].strip().lower()
            if rc_txt in ("", "not stated"):
                # unknown recompute: the least recompute whose memory fits, as the job had to
                for rc in ("selective", "full"):
                    if est.fits:
                        break
                    est = estimate(m, cluster, replace(lay, recompute=rc), gb, eff, sw)
        except TrainperfError as e:
            rec["skipped"] = str(e)
            out.append(rec)
            continue
        kind, value = target
        pred = est.step_time_s if kind == "step_time_s" else est.tokens_per_s_per_gpu
        # baseline (llm-analysis / spreadsheet style): model FLOPs / peak at one constant MFU
        peak = cluster.accelerator.peak_flops(est.layout.precision)
        flops_tps = peak / model_flops_per_token(m)  # tokens/s/GPU at MFU = 1
        rec["measured_mfu"] = (value if kind != "step_time_s" else
                               gb * m.seq_len / value / cluster.n_gpus) / flops_tps
        rec["flops_tps_at_mfu1"] = flops_tps
        rec.update(layout=est.layout.to_string(), kind=kind, measured=value, predicted=pred,
                   rel_error=pred / value - 1.0, mfu=est.mfu, memory_gib=est.memory_gib_per_gpu, fits=est.fits,
                   dominant=est.dominant_overhead, breakdown=est.breakdown)
        out.append(rec)
    return out


def add_constant_mfu_baseline(recs: list[dict]) -> float:
    """Add 'baseline_error' to each row: prediction at one MFU for all rows (their median).

    This is the best any constant-MFU estimate (FLOPs / peak x MFU, no bubble, no
    communication) can do on this file; returns that MFU.
    """
    rows = [r for r in recs if "rel_error" in r]
    mfu0 = statistics.median(r["measured_mfu"] for r in rows)
    for r in rows:
        tps = mfu0 * r["flops_tps_at_mfu1"]
        meas_tps = r["measured_mfu"] * r["flops_tps_at_mfu1"]
        r["baseline_error"] = (meas_tps / tps - 1.0) if r["kind"] == "step_time_s" else (tps / meas_tps - 1.0)
    return mfu0


def summary(recs: list[dict]) -> dict:
    """Return median and max absolute relative error over the predicted rows (and the baseline's)."""
    errs = [abs(r["rel_error"]) for r in recs if "rel_error" in r]
    base = [abs(r["baseline_error"]) for r in recs if "baseline_error" in r]
    return {"baseline_median_abs_rel_error": statistics.median(base) if base else None,
            "baseline_max_abs_rel_error": max(base) if base else None,"rows": len(recs), "predicted": len(errs), "median_abs_rel_error": statistics.median(errs),
            "max_abs_rel_error": max(errs), "within_10pct": sum(e <= 0.10 for e in errs),
            "within_25pct": sum(e <= 0.25 for e in errs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--json", type=Path, default=None, help="write per-row results here")
    args = ap.parse_args(argv)
    if not args.csv.is_file():
        print(f"error: {args.csv}: not found", file=sys.stderr)
        return 2
    recs = validate(args.csv)
    mfu0 = add_constant_mfu_baseline(recs)
    print(f"{'row':>3} {'model':30} {'gpu':14} {'gpus':>5} {'what':5} {'measured':>10} {'predicted':>10} {'err':>7} "
          f"{'base':>7}  dominant overhead")
    for r in recs:
        if "skipped" in r:
            print(f"{r['row']:>3} {r['model'][:30]:30} {r['gpu'][:14]:14} {r['n_gpus']:>5} skipped: {r['skipped']}")
            continue
        what = "step" if r["kind"] == "step_time_s" else "tok/s"
        print(f"{r['row']:>3} {r['model'][:30]:30} {r['gpu'][:14]:14} {r['n_gpus']:>5} {what:5} {r['measured']:>10.4g} "
              f"{r['predicted']:>10.4g} {r['rel_error']:>+7.1%} {r['baseline_error']:>+7.1%}  {r['dominant']}{'' if r['fits'] else ' (OOM predicted)'}")
    s = summary(recs)
    print(f"\n{s['predicted']}/{s['rows']} rows predicted; median |error| {s['median_abs_rel_error']:.1%}, "
          f"max {s['max_abs_rel_error']:.1%}; within 10%: {s['within_10pct']}, within 25%: {s['within_25pct']}")
    print(f"baseline 'model FLOPs / peak at one MFU' (MFU {mfu0:.3f}, the rows' median, i.e. fitted): median |error| "
          f"{s['baseline_median_abs_rel_error']:.1%}, max {s['baseline_max_abs_rel_error']:.1%}")
    if args.json:
        atomic_write_text(args.json, json.dumps({"summary": s, "rows": recs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
