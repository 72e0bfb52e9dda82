"""Checkpoint cost seen by the training loop: async (thread) vs synchronous DCP saves.

Builds the model and its AdamW state (one step), then saves it ``--reps`` times each way
into a temp run folder, alternating. Reports the median time the loop is blocked (the
stall the trainer books as checkpoint badput), the median time until the async save is
committed, and the checkpoint size.

    python benchmarks/bench_checkpoint.py --model small --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)

    import torch

    from trainperf.specs import load_model, param_count
    from trainperf.train.checkpoint import Checkpointer, complete_checkpoints
    from trainperf.train.model import build_model

    spec = load_model(args.model)
    model = build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, spec.vocab, (1, min(spec.seq_len, 256)))
    model(x, x).backward()
    opt.step()
    blocked = {"async": [], "sync": []}
    committed = []
    with tempfile.TemporaryDirectory() as tmp:
        ck = {mode: Checkpointer(Path(tmp) / mode, {"model": {}, "layout": {}}, keep=1, async_save=mode == "async")
              for mode in ("async", "sync")}
        step = 0
        for _ in range(args.reps):
            for mode in ("async", "sync"):
                step += 1
                t = time.perf_counter()
                ck[mode].save(step, model, opt, {"data_position": step})
                blocked[mode].append(time.perf_counter() - t)
                if mode == "async":
                    ck[mode].wait()
                    committed.append(time.perf_counter() - t)
        last = complete_checkpoints(Path(tmp) / "sync" / "checkpoints")[-1][1]
        size = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    ma, ms = statistics.median(blocked["async"]), statistics.median(blocked["sync"])
    print(f"model {spec.name} ({param_count(spec) / 1e6:.1f} M params + AdamW state), checkpoint {size / 2**20:.0f} MiB, "
          f"{args.reps} saves each")
    print(f"loop blocked: async {ma * 1e3:.0f} ms, sync {ms * 1e3:.0f} ms (async/sync {ma / ms:.2f}); "
          f"async committed after {statistics.median(committed) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
