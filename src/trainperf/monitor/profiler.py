"""Kineto traces of chosen steps for every rank: ``<out>/traces/rank{R}.step{A}-{B}.json``.

Steps are numbered from 1 like the training loop's optimizer steps and ``A:B`` is
inclusive (as in ``trainperf diagnose --steps``): ``10:12`` traces steps 10, 11 and 12,
after one warm-up step (9) whose events are dropped, as torch.profiler's schedule
recommends. The trace's ``ProfilerStep#N`` spans carry the optimizer step number N, also
after a resume.
"""

from __future__ import annotations

import os
import warnings
from contextlib import nullcontext
from pathlib import Path

from trainperf.atomic import atomic_path
from trainperf.errors import TrainperfError

# Kineto prints `USDT:... profiler_start` / `profiler_stop` on stderr around every trace: its USDT
# messages (level 5) pass the ERROR level (3) torch sets, and only a level above them is quiet. It
# reads KINETO_LOG_LEVEL when the first profiler starts; a value the user set is kept.
KINETO_QUIET_LEVEL = 6


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """Return (first, last) from ``"A:B"`` (steps A..B inclusive), or None for an empty value."""
    if not text:
        return None
    try:
        a, b = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise TrainperfError(f"--profile-steps {text!r}: expected A:B, e.g. 10:12 (steps 10 to 12)") from None
    if a < 1 or b < a:
        raise TrainperfError(f"--profile-steps {text!r}: need 1 <= A <= B")
    return a, b


def trace_path(out_dir: str | Path, rank: int, first: int, last: int) -> Path:
    """Return the trace file of ``rank`` for steps ``first..last`` under ``out_dir/traces``."""
    return Path(out_dir) / "traces" / f"rank{rank}.step{first}-{last}.json"


def gc_events_config(tp):
    """torch.profiler's experimental config that records Python's garbage collections as "Python GC" spans beside
    the Python frames (record_python_gc_info: PyTorch 2.9+, pytorch/pytorch#161209), or None where this torch has
    no such option. tp: the torch.profiler module."""
    try:
        return tp._ExperimentalConfig(record_python_gc_info=True)
    except (AttributeError, TypeError):  # no _ExperimentalConfig, or one without the option
        return None


class StepProfiler:
    """torch.profiler driven by a schedule; call ``step()`` once after every optimizer step.

    ``next_step`` is the number of the first step this process will run (after a resume it
    is not 1). A window that starts in the past, or None, profiles nothing. ``record_modules``
    records every nn.Module forward as a span (torch's with_stack=True; its with_modules=True
    records none in eager mode), which `trainperf diagnose --modules` attributes time to, and, where
    torch can (2.9+), each collection of Python's garbage collector (a "Python GC" span:
    diagnose's gc_stall); off by default for its cost (docs/benchmarks.md, "GPU time per nn.Module").
    """

    def __init__(self, out_dir: str | Path, steps: tuple[int, int] | None, rank: int, next_step: int = 1,
                 device_type: str = "cpu", record_modules: bool = False):
        self.prof = None
        self.path: Path | None = None
        self._last = 0
        if steps is None or steps[0] < next_step:
            self._ctx = nullcontext()
            return
        os.environ.setdefault("KINETO_LOG_LEVEL", str(KINETO_QUIET_LEVEL))
        import torch.profiler as tp

        first, last = steps
        self._last = last
        self.path = trace_path(out_dir, rank, first, last)
        warmup = 1 if first - 1 >= next_step else 0
        activities = [tp.ProfilerActivity.CPU]
        if device_type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        # The schedule is written in optimizer-step numbers: step first-1 warms up,
        # steps first..last are recorded, then the trace is written once.
        with warnings.catch_warnings():  # no warm-up step exists when a resume lands on the window
            warnings.simplefilter("ignore", UserWarning)
            sched = tp.schedule(skip_first=first - warmup, wait=0, warmup=warmup, active=last - first + 1, repeat=1)
        # on a GPU the allocator's samples too (profile_memory: one "[memory]" event per allocation and free), from
        # which diagnose reads the step's peak against the device and whether a larger batch fits
        # (diagnose/memory.py); not on CPU runs, whose host tensors' samples say nothing about a device
        stack = {"with_stack": True, "experimental_config": gc_events_config(tp)} if record_modules else {}
        self.prof = tp.profile(activities=activities, schedule=sched, on_trace_ready=self._write,
                               record_shapes=True, profile_memory=device_type == "cuda", **stack)
        # Number the profiler's steps like the optimizer steps (it counts from 0), so that the
        # trace's ProfilerStep#N is step N: the same state profile.__init__ sets up for step 0.
        self.prof.step_num = next_step
        self.prof.current_action = sched(next_step)
        if hasattr(self.prof, "_prev_schedule_action"):
            self.prof._prev_schedule_action = self.prof.current_action
        self._ctx = self.prof

    def _write(self, prof) -> None:
        with atomic_path(self.path) as tmp:  # readers never see a half-written trace
            prof.export_chrome_trace(str(tmp))

    def __enter__(self) -> "StepProfiler":
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def step(self) -> None:
        """Advance the schedule by one optimizer step (nothing once the window's trace is written)."""
        prof = self.prof
        if prof is not None and prof.step_num <= self._last:
            # After the window torch's step() would still cost ~10 us a step (schedule, step
            # counter, a ProfilerStep record_function) for the rest of the run: skip it.
            prof.step()
