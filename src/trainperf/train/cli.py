"""Commands of the `train` verb (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from typing import List, Optional

import typer

from trainperf.cli_options import given, older_name


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""

    @app.command("train")
    def train_cmd(
        model: str = typer.Option("tiny", help="Model preset (tiny, small, llama3-1b, ...) or a JSON config file."),
        steps: int = typer.Option(50, min=1, help="Optimizer steps to reach (a resumed run continues up to it)."),
        nproc: int = typer.Option(1, min=1, max=1024, help="Processes on this machine; > 1 starts torchrun (gloo on CPU, NCCL on GPU)."),
        layout: str = typer.Option("", help='Layout string as `trainperf plan` prints it, e.g. "tp=2,zero=3,mbs=2".'),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the model's)."),
        compile: bool = typer.Option(False, "--compile", help="torch.compile every transformer block."),
        compile_backend: str = typer.Option("inductor", help="torch.compile backend (aot_eager compiles fast)."),
        kernels: bool = typer.Option(False, "--fused-kernels", help="Swap in trainperf's fused Triton kernels."),
        kernels_older: Optional[bool] = older_name("--kernels", "--fused-kernels"),
        ckpt_every: int = typer.Option(0, min=0, help="Save a checkpoint every N steps (0: never)."),
        ckpt_keep: int = typer.Option(3, min=1, help="Complete checkpoints to keep."),
        sync_ckpt: bool = typer.Option(False, "--sync-ckpt", help="Save checkpoints synchronously (default: async)."),
        resume: bool = typer.Option(True, "--resume/--no-resume",
                                    help="Continue from the newest complete checkpoint in --out (default on)."),
        profile_steps: Optional[str] = typer.Option(None, help="Trace steps A to B (inclusive) of every rank into OUT/traces/."),
        profile_modules: bool = typer.Option(False, "--profile-modules",
                                             help="Record nn.Module spans in the traces (with_stack: costs host "
                                                  "time) for `diagnose --modules`, and Python's garbage "
                                                  "collections (torch 2.9+) for its gc_stall."),
        gc_every: int = typer.Option(0, "--gc-every", min=0,
                                     help="Python's automatic garbage collection off after start-up (what it made "
                                          "frozen: gc.freeze), the young generations collected every N steps on "
                                          "every rank at once, as torchtitan does (0: automatic, the default). "
                                          "Each step's collector pauses are recorded either way (gc_pause_s)."),
        out: str = typer.Option("train_out", help="Run folder (metrics.jsonl, traces/, checkpoints/, report.html)."),
        text: Optional[List[str]] = typer.Option(None, help="Text files or folders to train on (default: shipped sample)."),
        synthetic: bool = typer.Option(False, "--synthetic", help="Random tokens instead of text (no I/O)."),
        lr: float = typer.Option(3e-3, min=0.0, help="Peak learning rate (linear warm-up, cosine decay)."),
        warmup_steps: int = typer.Option(5, min=0, help="Warm-up steps."),
        num_workers: int = typer.Option(0, min=0, max=256, help="DataLoader worker processes."),
        device: str = typer.Option("auto", help="auto, cpu or cuda."),
        gpu: Optional[str] = typer.Option(None, help="Catalog name of the GPU for peak FLOP/s (default: detected)."),
        peak_tflops: Optional[float] = typer.Option(None, min=0.0, help="Peak TFLOP/s of one device (overrides the catalog)."),
        max_restarts: int = typer.Option(0, min=0, max=1000, help="torchrun restarts after a failure (each resumes from a checkpoint)."),
        seed: int = typer.Option(0, min=0, max=2**32 - 1, help="Seed of the weights and the data order."),
        eval_every: int = typer.Option(0, "--eval-every", min=0,
                                       help="Held-out loss every N steps and at the last step (0: never); "
                                            "recorded as eval_loss in metrics.jsonl and the run record."),
        eval_batches: int = typer.Option(4, "--eval-batches", min=1,
                                         help="Micro-batches per rank of the fixed held-out split per evaluation."),
        job: str = typer.Option("train", help="Job name in the run record."),
        store: Optional[str] = typer.Option(None, help="Run-record store (default: $TRAINPERF_STORE or ./.trainperf)."),
        fault: Optional[List[str]] = typer.Option(
            None, "--fault", metavar="KIND[=VALUE]",
            help="Inject a known problem (repeatable), for judging diagnoses: "
                 "slow-data=MS (the dataset sleeps MS ms per micro-batch); "
                 "item-sync (loss.item() after every micro-step's forward: a host sync); "
                 "slow-rank=R:MS[:sleep] (rank R does MS ms of extra matrix products, or sleeps, each step); "
                 "sync-ckpt=N (a synchronous checkpoint every N steps); "
                 "tiny-batch[=M] (micro batch M, default 1, grad accumulation raised to keep the global batch); "
                 "sync-every-micro (gradients synchronised after every accumulation micro-step: no no_sync); "
                 "gc-collect[=N[:R]] (gc.collect() every N steps, default 1, on every rank or rank R only: a full "
                 "garbage collection); "
                 "numerics bugs for `trainperf compare`: norm-eps=EPS (every RMSNorm uses EPS), "
                 "no-ga-scale (micro-step losses not divided by grad accumulation before backward)."),
        fault_steps: Optional[str] = typer.Option(
            None, "--fault-steps", metavar="A:B",
            help="Apply the faults in steps A..B only (the steps before A are the clean twin; tiny-batch holds "
                 "for the whole run)."),
    ) -> None:
        """Train the reference Llama-style model and measure it: tokens/s, MFU, memory, goodput."""
        from rich.console import Console

        from trainperf.errors import TrainperfError
        from trainperf.train.trainer import TrainConfig

        from trainperf.atomic import ensure_dir

        if peak_tflops == 0:  # 0 would silently mean "the catalog / measured peak"
            raise TrainperfError("--peak-tflops 0: must be > 0 (leave it out to use the catalog or the measured peak)")
        ensure_dir(out)  # an unusable --out fails here, in one line, before any work or launch
        from trainperf.train.faults import parse_faults

        parse_faults(fault, fault_steps)  # a bad --fault fails here, before any launch
        cfg = TrainConfig(model=model, seq_len=seq_len, steps=steps, layout=layout, lr=lr, warmup_steps=warmup_steps,
                          compile=compile, compile_backend=compile_backend, kernels=given(kernels, kernels_older),
                          ckpt_every=ckpt_every,
                          ckpt_keep=ckpt_keep, ckpt_async=not sync_ckpt, resume=resume, profile_steps=profile_steps,
                          profile_modules=profile_modules, gc_every=gc_every,
                          out=out, text=list(text) if text else None, synthetic=synthetic, num_workers=num_workers,
                          device=device, gpu=gpu, peak_tflops=peak_tflops, seed=seed, job=job, store=store,
                          faults=list(fault) if fault else None, fault_steps=fault_steps,
                          eval_every=eval_every, eval_batches=eval_batches)
        from trainperf.train.launch import preflight

        preflight(cfg, nproc)  # model, device, --gpu, layout for --nproc, a finished run in --out: before any launch
        console = Console()
        if nproc > 1:
            from trainperf.train.launch import last_error, launch

            rc = launch(cfg, nproc, max_restarts)
            if rc != 0 and (msg := last_error(cfg)):
                raise TrainperfError(msg)
            if rc != 0:
                raise TrainperfError(f"torchrun exited with code {rc} (see the ranks' errors above); "
                                     f"rerun the same command to resume from {out}/checkpoints")
            import json
            from pathlib import Path

            result = json.loads((Path(out) / "summary.json").read_text())
        else:
            from trainperf.train.trainer import train

            result = train(cfg)
        print_summary(console, result)


def print_summary(console, result: dict) -> None:
    """Print a run summary: throughput, MFU, memory, goodput split, predicted vs measured."""
    from rich.markup import escape
    from rich.table import Table

    from trainperf.store.record import peak_text
    from trainperf.train.report import pct, title_text

    gp = result.get("goodput", {})
    t = Table(title=title_text(result), show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right", overflow="fold")
    t.add_row("layout", result["layout"])
    t.add_row("median step time", f"{result['step_time_s'] * 1e3:.1f} ms" if result.get("step_time_s") else "-")
    t.add_row("tokens/s (all ranks)", f"{result['tokens_per_s']:,.0f}" if result.get("tokens_per_s") else "-")
    t.add_row("MFU / HFU", f"{pct(result.get('mfu'))} / {pct(result.get('hfu'))}")
    peak = peak_text(result.get("peak_flops"), result.get("peak_source", ""))
    if peak:  # what MFU is relative to (on CPU: measured, and how steady)
        t.add_row("  of peak", peak)
    t.add_row("peak memory / rank", f"{(result.get('mem_peak_bytes') or 0) / 2**30:.2f} GiB")
    t.add_row("final loss", f"{result['final_loss']:.4f}" if result.get("final_loss") is not None else "-")
    if result.get("final_eval_loss") is not None:
        t.add_row("final held-out loss", f"{result['final_eval_loss']:.4f}")
    if result.get("gc_pause_s"):
        by_rank = [r["gc_pause_s"] for r in result.get("ranks") or [] if r.get("gc_pause_s") is not None]
        spread = (f"; ranks {min(by_rank) * 1e3:.2f}-{max(by_rank) * 1e3:.2f} ms" if len(by_rank) > 1 else "")
        t.add_row("Python GC pauses", f"{result['gc_pause_s'] * 1e3:.2f} ms a step (longest step "
                                      f"{(result.get('gc_pause_max_s') or 0) * 1e3:.1f} ms{spread})")
    t.add_row("goodput", pct(gp.get("goodput")))
    for k in ("startup_s", "data_wait_s", "checkpoint_s", "restart_s", "lost_work_s", "other_s"):
        t.add_row(f"  badput: {k[:-2].replace('_', ' ')}", f"{gp.get(k, 0.0):.2f} s")
    pred = result.get("predicted") or {}
    if "predicted" in pred:
        p, m = pred["predicted"], pred["measured"]
        t.add_row("step time predicted / measured", f"{p['step_time_s'] * 1e3:.1f} / {m['step_time_s'] * 1e3:.1f} ms")
        t.add_row("memory predicted / measured",
                  f"{p['mem_peak_bytes'] / 2**30:.2f} / {(m['mem_peak_bytes'] or 0) / 2**30:.2f} GiB")
    console.print(t)
    if pred.get("note"):
        console.print(f"[dim]{escape(pred['note'])}[/]")
    if result.get("contention_note"):
        console.print(f"[yellow]note:[/] {escape(result['contention_note'])}", highlight=False)
    if result.get("resumed_from"):
        console.print(f"resumed from {result['resumed_from']}")
    console.print(f"run folder: {result['run_dir']} (metrics.jsonl, report.html, traces/, checkpoints/)")
    if result.get("record_note"):
        console.print(f"[dim]{escape(result['record_note'])}[/]")
