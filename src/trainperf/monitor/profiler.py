"""Kineto traces of chosen steps for every rank: ``<out>/traces/rank{R}.step{A}-{B}.json``.

Steps are numbered from 1 like the training loop's optimizer steps; ``A:B`` is a Python
slice, so ``10:12`` traces steps 10 and 11, after one warm-up step (9) whose events are
dropped, as torch.profiler's schedule recommends.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

from trainperf.errors import TrainperfError


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """Return (first, end) from ``"A:B"`` (steps A..B-1), or None for an empty value."""
    if not text:
        return None
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise TrainperfError(f"--profile-steps {text!r}: expected A:B, e.g. 10:12 (steps 10 and 11)") from None
    if a < 1 or b <= a:
        raise TrainperfError(f"--profile-steps {text!r}: need 1 <= A < B")
    return a, b


def trace_path(out_dir: str | Path, rank: int, first: int, end: int) -> Path:
    """Return the trace file of ``rank`` for steps ``first:end`` under ``out_dir/traces``."""
    return Path(out_dir) / "traces" / f"rank{rank}.step{first}-{end}.json"


class StepProfiler:
    """torch.profiler driven by a schedule; call ``step()`` once after every optimizer step.

    ``next_step`` is the number of the first step this process will run (after a resume it
    is not 1). A window already in the past, or None, profiles nothing.
    """

    def __init__(self, out_dir: str | Path, steps: tuple[int, int] | None, rank: int, next_step: int = 1,
                 device_type: str = "cpu"):
        self.prof = None
        self.path: Path | None = None
        if steps is None or steps[0] < next_step:
            self._ctx = nullcontext()
            return
        import torch.profiler as tp

        first, end = steps
        self.path = trace_path(out_dir, rank, first, end)
        offset = first - next_step  # profiler steps (0-based) before the first traced step
        warmup = 1 if offset >= 1 else 0
        activities = [tp.ProfilerActivity.CPU]
        if device_type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        self.prof = tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=offset - warmup, warmup=warmup, active=end - first, repeat=1),
            on_trace_ready=self._write,
            record_shapes=True,
            with_stack=False,
        )
        self._ctx = self.prof

    def _write(self, prof) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, self.path)  # readers never see a half-written trace

    def __enter__(self) -> "StepProfiler":
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def step(self) -> None:
        """Advance the schedule by one optimizer step."""
        if self.prof is not None:
            self.prof.step()
