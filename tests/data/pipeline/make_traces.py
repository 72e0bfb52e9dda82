"""Write real 2-rank CPU profiles (gloo) of a 2-stage GPipe pipeline (torch.distributed.pipelining).

gpipe/: 8 Linear+GELU layers split 4 / 4, the last stage also holding the head (a 9th Linear) and the loss; 4
micro-batches of 8 x 512 a step, ScheduleGPipe; 5 profiled steps (after 3 unprofiled and 1 warm-up).
torch.distributed.pipelining records each micro-batch's `Forward i` / `Backward i` and its batched send/recv as
`c10d::send` / `c10d::recv_` calls whose `gloo:send` / `gloo:recv` spans sit on the loop thread itself, the thread
waiting inside them for the transfer. Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-06):
`torchrun --nproc-per-node 2 tests/data/pipeline/make_traces.py OUT_DIR`, then `gzip -9` each file.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.profiler import ProfilerActivity, profile, schedule

WIDTH, LAYERS, MICRO_BATCH, MICRO_BATCHES = 512, 8, 8, 4


def main(out: Path) -> None:
    """Profile the pipeline's steps into out/gpipe/rank<r>.json."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(LAYERS)]
    per = LAYERS // world
    mine = layers[rank * per:(rank + 1) * per] + ([nn.Linear(WIDTH, WIDTH)] if rank == world - 1 else [])
    module = nn.Sequential(*mine)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    pipe = ScheduleGPipe(stage, n_microbatches=MICRO_BATCHES, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    x, target = torch.randn(MICRO_BATCH * MICRO_BATCHES, WIDTH), torch.randn(MICRO_BATCH * MICRO_BATCHES, WIDTH)

    def step() -> None:
        opt.zero_grad()
        if rank == 0:
            pipe.step(x)
        elif rank == world - 1:
            pipe.step(target=target, losses=[])
        else:
            pipe.step()
        opt.step()

    for _ in range(3):
        step()
    path = out / "gpipe" / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=5, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(6):
            step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
