"""Write real 2-rank CPU profiles (gloo DDP, record_shapes=False) of gradient accumulation over 3 micro-batches.

every_microbatch/: DDP synchronises the gradients after every micro-batch's backward (3 all-reduce rounds a step).
no_sync/: the first two backward passes run under model.no_sync(), so only the last one all-reduces.
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-03):
`torchrun --nproc-per-node 2 tests/data/grad_sync/make_traces.py OUT_DIR`, then `gzip -9` each file.
"""

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule

MICRO = 3


def profile_steps(out: Path, name: str, no_sync: bool) -> None:
    """Profile 3 steps (after 1 wait and 1 warm-up) of MICRO micro-batches each into out/name/rank<r>.json."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    (out / name).mkdir(parents=True, exist_ok=True)
    path = out / name / f"rank{dist.get_rank()}.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(5):
            for m in range(MICRO):
                quiet = model.no_sync() if no_sync and m < MICRO - 1 else contextlib.nullcontext()
                with quiet:
                    model(torch.randn(64, 256)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    profile_steps(out, "every_microbatch", no_sync=False)
    profile_steps(out, "no_sync", no_sync=True)
    dist.destroy_process_group()
