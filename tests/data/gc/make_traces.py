"""Write the two real CPU profiles of a training step that keeps Python objects alive, kept here.

A small MLP trains while the process holds many long-lived Python objects (LIVE lists made at start-up: a dataset or
an index kept as Python objects) and each step keeps KEPT more (per-sample bookkeeping appended to a cache). The
objects each step keeps reach the collector's oldest generation, and every full collection walks every live object,
the start-up's included. gc_on.json.gz: automatic collection on (CPython's defaults); gc_off.json.gz: the fix,
gc.freeze() after the start-up and automatic collection off during the profiled steps. Both profiled with
with_stack=True and experimental_config=_ExperimentalConfig(record_python_gc_info=True), which records each
collection as a "Python GC" span. The script also times the same steps unprofiled both ways, interleaved, and prints
the medians (what the fix gains).
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-07):
`python tests/data/gc/make_traces.py OUT_DIR`, then `gzip -9` each file.
"""

import gc
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling import profile_training  # noqa: E402

LIVE = 200_000   # long-lived objects made at start-up
KEPT = 20_000    # objects each step keeps
STEPS = 12       # profiled: 1 wait, 1 warm-up, 10 recorded


def loop(seed: int = 0):
    """The model, its optimizer and one step's loss (keeping KEPT more objects) as a function of the step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    index = [[i] for i in range(LIVE)]
    cache = []

    def loss_of_step(i: int) -> torch.Tensor:
        cache.extend([[i, j] for j in range(KEPT)])
        return model(x).pow(2).mean() + 0 * len(index)
    return loss_of_step, opt


def profile_both(out: Path) -> None:
    """gc_on.json and gc_off.json under out."""
    loss_of_step, opt = loop()
    profile_training(out, "gc_on", loss_of_step, opt, STEPS, gc_events=True)
    loss_of_step, opt = loop()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        profile_training(out, "gc_off", loss_of_step, opt, STEPS, gc_events=True)
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


def step_ms(collect: bool, steps: int = 40, chunks: int = 5) -> float:
    """The unprofiled training step (ms), automatic collection on or off: the median of `chunks` chunks' mean."""
    loss_of_step, opt = loop()
    gc.collect()
    if not collect:
        gc.freeze()
        gc.disable()
    means = []
    try:
        for _ in range(chunks):
            t0 = time.perf_counter()
            for i in range(steps):
                loss_of_step(i).backward()
                opt.step()
                opt.zero_grad()
            means.append(1e3 * (time.perf_counter() - t0) / steps)
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()
    return statistics.median(means)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    profile_both(out)
    on, off = [], []
    for _ in range(3):  # interleaved
        on.append(step_ms(True))
        off.append(step_ms(False))
    print(f"unprofiled step ms, automatic collection on: {[round(x, 2) for x in on]}, "
          f"off (the fix): {[round(x, 2) for x in off]}; median gain "
          f"{100 * (1 - statistics.median(off) / statistics.median(on)):.1f} %")
