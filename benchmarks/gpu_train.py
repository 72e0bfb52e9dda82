"""Train a ~1B Llama-style model on one GPU for ~30 steps (bf16 + torch.compile); record tokens/s,
MFU and memory.

    python benchmarks/gpu_train.py --out $OUT/train            # H200: llama3-1b, seq 8192, mbs 2
    python benchmarks/gpu_train.py --device cpu --tiny --out /tmp/smoke   # CPU smoke (seconds)

Writes one file, ``<out>/gpu_train.json`` (the figures, the per-step records and the exact
config: the device machine returns only a few files); the full run folder (metrics.jsonl,
summary.json, report.html) goes to ``--run-dir`` (default: a temp folder). Expected to
finish in ~2-3 minutes on an H200 (one inductor compile of the block graph, reused by every
layer, then 30 steps).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gpu_train.json")
    ap.add_argument("--run-dir", default=None, help="run folder (default: a new temp folder)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny model, 6 steps, aot_eager compile (CPU smoke)")
    ap.add_argument("--model", default="llama3-1b")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also swap in trainperf's fused Triton kernels")
    args = ap.parse_args(argv)

    from trainperf.train.trainer import TrainConfig, train

    import tempfile

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="trainperf_gpu_train_"))
    if args.tiny:
        model, seq, mbs, steps, backend = "tiny", None, 2, 6, "aot_eager"
    else:
        model, seq, mbs, steps, backend = args.model, args.seq_len, args.mbs, args.steps, "inductor"
    cfg = TrainConfig(model=model, seq_len=seq, steps=steps, layout=f"mbs={mbs},recompute={args.recompute}"
                      + (",precision=bf16" if args.device == "cuda" else ""),
                      compile=not args.no_compile, compile_backend=backend, kernels=args.kernels,
                      out=str(run_dir), synthetic=True, num_workers=2 if args.device == "cuda" else 0,
                      device=args.device, resume=False, warmup_steps=2, lr=3e-4, record=False, progress=False,
                      log_every=5)
    t0 = time.time()
    result = train(cfg)
    wall = time.time() - t0
    figures = {
        "model": result["model"], "device": result["device"], "layout": result["layout"],
        "compile": cfg.compile, "kernels": cfg.kernels, "steps": steps, "seq_len": seq,
        "median_step_time_s": result["step_time_s"], "tokens_per_s": result["tokens_per_s"],
        "mfu": result["mfu"], "hfu": result["hfu"], "mem_peak_bytes": result["mem_peak_bytes"],
        "mem_peak_gib": (result["mem_peak_bytes"] or 0) / 2**30, "final_loss": result["final_loss"],
        "peak_flops": result["peak_flops"], "peak_source": result["peak_source"],
        "goodput": result["goodput"]["goodput"], "startup_s": result["goodput"]["startup_s"],
        "wall_s": wall, "predicted": result.get("predicted"), "run_dir": str(run_dir),
        "per_step": [{k: r.get(k) for k in ("step", "loss", "step_time_s", "tokens_per_s", "mfu", "mem_peak_bytes",
                                            "forward_s", "backward_s", "optimizer_s", "data_wait_s")}
                     for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())],
    }
    (out / "gpu_train.json").write_text(json.dumps(figures, indent=1, default=str))
    print(json.dumps({k: v for k, v in figures.items() if k != "per_step"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
