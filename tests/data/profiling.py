"""The profiling loop the test-data scripts share (tests/data/*/make_traces.py): real CPU profiles, torch.profiler."""

from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, schedule


def profile_training(out: Path, name: str, loss_of_step: Callable[[int], torch.Tensor], opt: torch.optim.Optimizer,
                     steps: int, *, wait: int = 1, warmup: int = 1, record_shapes: bool = False,
                     gc_events: bool = False) -> None:
    """Train `steps` steps (loss_of_step(i), backward, opt.step, zero_grad) under the CPU profiler (``wait``
    skipped, ``warmup``, the rest recorded) and write the trace to out/name.json. One cycle (repeat=1): a later
    cycle's export at exit would overwrite it. gc_events: Python's garbage collections recorded as "Python GC" spans
    (with_stack=True and record_python_gc_info, PyTorch 2.9+)."""
    gc_config = dict(with_stack=True, experimental_config=_ExperimentalConfig(record_python_gc_info=True)) \
        if gc_events else {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes, **gc_config,
                 schedule=schedule(wait=wait, warmup=warmup, active=steps - wait - warmup, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"{name}.json"))) as prof:
        for i in range(steps):
            loss_of_step(i).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
