"""Commands of the `plan` verb: `trainperf plan` and `trainperf calibrate` (thin: parse, call, print)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trainperf.atomic import check_output_file
from trainperf.cli_options import given, json_option, older_name
from trainperf.errors import TrainperfError
from trainperf.plan.stacks import DEFAULT_STACK, STACKS, get_stack  # light: dataclasses only


def _number(text: str | None, what: str) -> float | None:
    """Parse '1e12', '15T', '300B', '2M' into a float (tokens)."""
    if text is None:
        return None
    t = text.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(t[-1:], 1.0)
    try:
        v = float(t[:-1] if scale != 1.0 else t) * scale
    except ValueError:
        raise TrainperfError(f"{what}: not a number: {text!r} (e.g. 15T, 300B, 1e12)") from None
    if v <= 0:
        raise TrainperfError(f"{what} must be positive, got {text!r}")
    return v


def plan(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Preset name or a JSON config (ours or Hugging Face)."),
    gpu: str = typer.Option("h100", "--gpu", help="Accelerator from the catalog (see --list-gpus) or a description "
                            "such as 'H100-SXM 80GB HBM3, 700W, RoCE 400Gbps'."),
    gpus: int = typer.Option(8, "--gpus", min=1, help="Number of GPUs."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node (catalog default)."),
    seq: Optional[int] = typer.Option(None, "--seq-len", min=1, help="Sequence length in tokens (model default)."),
    seq_older: Optional[int] = older_name("--seq", "--seq-len", min=1),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Sequences per step (default ~4M tokens)."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Tokens to train (e.g. 15T) for time/cost figures."),
    top: int = typer.Option(10, "--top", min=1, help="How many layouts to show."),
    objective: str = typer.Option("time", "--objective", help="Rank by 'time' or 'cost' ($ per token)."),
    as_json: bool = json_option("the plan"),
    layout: Optional[str] = typer.Option(None, "--layout", help='Evaluate one layout, e.g. "tp=8,pp=16,zero=1".'),
    compare: Optional[str] = typer.Option(None, "--compare-hardware", help="Comma-separated accelerators to compare."),
    list_gpus: bool = typer.Option(False, "--list-gpus", help="Print the accelerator catalog."),
    list_models: bool = typer.Option(False, "--list-models", help="Print the model presets."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Profile from `trainperf calibrate`."),
    usd_per_hour: Optional[float] = typer.Option(None, "--usd-per-hour", min=0.0, help="Override $ per GPU-hour."),
    precision: str = typer.Option("bf16", "--precision", help="bf16 or fp8 (GEMMs) for the search."),
    stack: str = typer.Option(DEFAULT_STACK, "--stack", help=f"Software stack: {', '.join(STACKS)}; "
                              "name:feature=value,... overrides a feature (see --list-stacks)."),
    list_stacks: bool = typer.Option(False, "--list-stacks", help="Print the software stacks and their features."),
    power_cap_w: Optional[float] = typer.Option(None, "--power-cap-w", min=1.0,
                                                help="GPU power limit in W (lowers the sustained clock)."),
    nic_gbit: Optional[float] = typer.Option(None, "--nic-gbit", min=0.1, help="Scale-out NIC Gb/s per GPU (e.g. 400)."),
    fabric: Optional[str] = typer.Option(None, "--fabric", help="Scale-out fabric: ib or roce."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
) -> None:
    """Rank parallel layouts of a model on a GPU budget by predicted step time, memory and cost."""
    from rich.console import Console
    from rich.markup import escape

    from trainperf.plan import api, render

    console = Console(width=max(Console().width, 132))
    if list_gpus or list_models or list_stacks:
        data = api.catalog_listing(list_gpus, list_models, list_stacks)
        if as_json:
            print(json.dumps(data, indent=1))
        else:
            for table in render_listing(data):
                console.print(table)
        return
    if not model:
        raise TrainperfError("--model is required (a preset, see --list-models, or a JSON config file)")
    if objective not in ("time", "cost"):
        raise TrainperfError(f"--objective must be time or cost, not {objective!r}")
    if precision not in ("bf16", "fp8", "fp16"):
        raise TrainperfError(f"--precision must be bf16, fp16 or fp8, not {precision!r}")
    if top < 1 or gpus < 1:
        raise TrainperfError("--top and --gpus must be >= 1")
    n_tokens = _number(tokens, "--tokens")
    get_stack(stack)  # an unknown stack is a one-line error before any work
    if html:
        check_output_file(html, "--html")
    seq = given(seq, seq_older)
    req = api.PlanRequest(model=model, gpu=gpu, n_gpus=gpus, gpus_per_node=gpus_per_node, seq=seq,
                          global_batch=global_batch, tokens=n_tokens, top=top, objective=objective,
                          calibration=calibration, usd_per_hour=usd_per_hour, precision=precision,
                          stack=stack, power_cap_w=power_cap_w, nic_gbit_per_gpu=nic_gbit, fabric=fabric)
    if compare:
        names = [g.strip() for g in compare.split(",") if g.strip()]
        options, tok = api.run_compare(req, names)
        if as_json:
            print(json.dumps({"tokens": tok, "options": [o.to_dict() for o in options]}, indent=1))
        else:
            console.print(render.compare_table(options, tok))
        if html:
            render.html_report(html, options=options, tokens=tok)
        return
    if layout:
        est, extra = api.run_layout(req, layout)
        if as_json:
            print(json.dumps(dict(est.to_dict(), **extra), indent=1))
        else:
            console.print(render.breakdown_table(est))
            fits = "fits" if est.fits else "[red]does NOT fit[/]"
            console.print(f"step {est.step_time_s:.3f} s, {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {est.mfu:.1%} "
                          f"(HFU {est.hfu:.1%}), memory {est.memory_gib_per_gpu:.1f} of {est.hbm_bytes / 2**30:.1f} GiB: "
                          f"{fits}; dominant overhead {render.overhead_label(est)}; stack {est.stack}")
            if extra["assumed"]:
                console.print("not in --layout, assumed: " + "; ".join(f"{k}={v}" for k, v in extra["assumed"].items()))
            if "why_not_fit" in extra:
                console.print(f"[red]does NOT fit[/]: {escape(extra['why_not_fit'])}")
            if "train_hours" in extra:
                console.print(f"{extra['tokens']:.3g} tokens: {extra['train_hours'] / 24:,.1f} days, "
                              f"${extra['usd']:,.0f}, {render.format_energy(extra['kwh'])}")
        if html:
            render.html_report(html, est=est)
        return
    res = api.run_search(req)
    if as_json:
        print(json.dumps(api.search_json(res, req), indent=1))
    else:
        console.print(render.search_table(res))
        console.print(f"{res.n_candidates:,} valid layouts evaluated in {res.elapsed_s * 1e3:.0f} ms, {res.n_fit:,} fit "
                      f"in {res.cluster.accelerator.hbm_bytes / 2**30:.0f} GiB; stack: {res.stack} (--stack); "
                      f"efficiency: {res.efficiency_source}")
    if html:
        render.html_report(html, res=res)


def render_listing(data: dict):
    """Return rich tables for the catalog listing."""
    from rich.table import Table

    out = []
    if "gpus" in data:
        t = Table(title="accelerators (dense peaks; --usd-per-hour overrides the price)", title_justify="left")
        for c in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM TB/s", "scale-up GB/s x domain",
                  "NIC GB/s", "TDP W", "$/h"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for g in data["gpus"]:
            t.add_row(g["name"], f"{g['bf16_tflops']:g}", f"{g['fp8_tflops'] or '-'}", f"{g['hbm_gb']:g}",
                      f"{g['hbm_tbps']:g}", f"{g['scaleup_gbps']:g} x {g['scaleup_domain']}", f"{g['scaleout_gbps']:g}",
                      f"{g['tdp_w']:g}", f"{g['usd_per_hour']:.2f}")
        out.append(t)
    if "models" in data:
        t = Table(title="model presets", title_justify="left")
        for c in ("name", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq"):
            t.add_column(c, justify="left" if c == "name" else "right")
        for m in data["models"]:
            t.add_row(m["name"], f"{m['params'] / 1e9:.2f}B", str(m["n_layers"]), str(m["hidden"]),
                      f"{m['n_heads']}/{m['n_kv_heads']}", str(m["ffn_hidden"]), str(m["vocab"]), str(m["seq_len"]))
        out.append(t)
    if "stacks" in data:
        t = Table(title="software stacks (--stack)", title_justify="left")
        for c in ("name", "attention", "norm/rope/act B", "kernels/layer", "TP overlap", "DP overlap", "description"):
            t.add_column(c)
        for s in data["stacks"]:
            t.add_row(s["name"], s["attention"], f"{s['norm_bytes']:g}/{s['rope_bytes']:g}/{s['act_bytes']:g}",
                      f"{s['kernels_per_layer']:g}", f"{s['tp_overlap']:.0%}", "yes" if s["dp_overlap"] else "no",
                      s["description"])
        out.append(t)
    return out


def calibrate_cmd(
    out: Path = typer.Option(Path("calibration.json"), "--out", "-o", help="Where to write the JSON profile."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer shapes, shorter timing (seconds)."),
) -> None:
    """Measure GEMM TFLOP/s, copy bandwidth (and all-reduce bus bandwidth) into a planner profile.

    Under `torchrun --nproc-per-node N -m trainperf.cli calibrate` it also measures the
    all-reduce bus bandwidth across the N ranks (gloo on CPU, NCCL on CUDA); rank 0 writes.
    """
    from rich.console import Console

    from trainperf.plan.calibrate import (calibrate, check_device, is_rank_zero, leave_distributed,
                                          save_profile)

    check_device(device)  # both checked before minutes of measuring
    check_output_file(out, "--out")
    console = Console()
    with console.status(f"measuring on {device} ..."):
        prof = calibrate(device, quick)
    writes = is_rank_zero()
    leave_distributed()  # a process group left open at exit can abort the interpreter (SIGABRT)
    if not writes:
        return
    path = save_profile(prof, out)
    e = prof["efficiency"]
    console.print(f"{prof['device']}: GEMM best {e['measured_gemm_tflops']:.3g} TFLOP/s ({prof['dtype']}), "
                  f"half-rate dimension {e['gemm_dim_half']:.0f}, copy {prof['copy_tbps'] * 1e3:.1f} GB/s"
                  + (f", all-reduce busbw {prof['allreduce_busbw_gbps']:.1f} GB/s" if prof["allreduce_busbw_gbps"] else ""))
    console.print(f"wrote {path}; use it with: trainperf plan --calibration {path} ...")


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.command("plan")(plan)
    app.command("calibrate")(calibrate_cmd)
