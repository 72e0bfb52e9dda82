"""Write the two real CPU profiles of a compiled MLP training step kept here (torch.compile, dynamic=False).

recompile.json.gz: the batch size changes every step and automatic dynamic shapes are off, so every
profiled step recompiles (Torch-Compiled Region 0/2, 0/3, 0/4; `_compile.compile_inner (dynamo_timed)`
114-134 ms of 232-244 ms steps). steady.json.gz: one batch size, compiled during the profiler's wait
step, so the profiled steps run the compiled code (88-96 ms steps, no compile span). first_step.json.gz: one
batch size, profiled from the first call (no wait, no warm-up step), so only the first profiled step compiles
(113.2 ms, 106.9 of them compiling; then 1.1-1.3 ms steps; made on a quieter machine than the other two).
graph_breaks.json.gz: an MLP of 8 Linear+GELU blocks whose forward breaks the graph twice between its halves
(torch._dynamo.graph_break(), an eager scale and shift between), compiled in the wait step, 6 steps profiled; the
script also times the same loop compiled whole and broken, unprofiled, and prints both (2026-12-06).
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-03):
`python tests/data/compile/make_traces.py OUT_DIR [--graph-breaks-only]`, then `gzip -9` each file.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling import profile_training  # noqa: E402


def profile_steps(out: Path, name: str, batch_sizes: list[int], wait: int = 1, warmup: int = 1) -> None:
    """Profile one compiled MLP step per batch size (``wait``, ``warmup``, then the rest recorded) into
    out/name.json."""
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, dynamic=False)

    profile_training(out, name, lambda i: compiled(torch.randn(batch_sizes[i], 64)).pow(2).mean(), opt,
                     len(batch_sizes), wait=wait, warmup=warmup)


class BrokenMLP(nn.Module):
    """8 Linear+GELU blocks of width 64; with ``breaks``, two graph breaks and an eager scale and shift between the
    first four blocks and the last four."""

    def __init__(self, breaks: bool):
        super().__init__()
        self.breaks = breaks
        self.first = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)])
        self.second = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)])

    def forward(self, x):
        x = self.first(x)
        if self.breaks:
            torch._dynamo.graph_break()
            x = x * 1.0001 + 0.01
            torch._dynamo.graph_break()
        return self.second(x)


def step_ms(breaks: bool, steps: int = 200, chunks: int = 5) -> float:
    """The unprofiled training step of BrokenMLP compiled (ms): the median of `chunks` chunks' mean step."""
    torch._dynamo.reset()
    model = BrokenMLP(breaks)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model)
    x = torch.randn(32, 64)
    means = []
    for c in range(chunks + 1):
        t0 = time.perf_counter()
        for _ in range(steps):
            compiled(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        if c:  # the first chunk compiles
            means.append(1e3 * (time.perf_counter() - t0) / steps)
    return statistics.median(means)


def profile_graph_breaks(out: Path) -> None:
    """The broken MLP's profile (graph_breaks.json), then both loops timed unprofiled."""
    torch._dynamo.reset()
    model = BrokenMLP(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model)
    profile_training(out, "graph_breaks", lambda i: compiled(torch.randn(32, 64)).pow(2).mean(), opt, 8)
    print(f"unprofiled step: broken {step_ms(True):.3f} ms, whole {step_ms(False):.3f} ms")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    torch.manual_seed(0)
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.cache_size_limit = 64
    if "--graph-breaks-only" not in sys.argv[2:]:
        profile_steps(out, "recompile", [8, 9, 10, 11, 12])
        torch._dynamo.reset()
        profile_steps(out, "steady", [16] * 5)
        torch._dynamo.reset()
        profile_steps(out, "first_step", [16] * 4, wait=0, warmup=0)
    profile_graph_breaks(out)
