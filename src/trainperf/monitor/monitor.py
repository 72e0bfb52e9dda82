"""The in-loop monitor: per-step time, data wait, phases, tokens/s, MFU/HFU, memory, goodput.

Usable from any training loop::

    mon = Monitor("runs/r1", model=spec, peak_flops=989e12, world_size=8, rank=rank)
    for step in range(1, n + 1):
        with mon.step(step, tokens=global_batch * seq_len) as st:
            with st.data():
                x, y = next(batches)              # time blocked here = data wait
            with st.phase("forward"):
                loss = model(x, y)
            with st.phase("backward"):
                loss.backward()
            with st.phase("optimizer"):
                opt.step(); opt.zero_grad()
            st.loss = loss                        # a tensor is read after the step's sync
        if step % 100 == 0:
            with mon.checkpoint():
                save(...)
    summary = mon.finish()                        # goodput, run record

Rank 0 appends one JSON object per step to ``<out>/metrics.jsonl`` and the job's events
(attempt starts, checkpoints) to ``<out>/events.jsonl``, so a relaunched job in the same
folder is accounted for as one job (goodput counts the restart and the lost work).

Cost: on CPU a few ``perf_counter`` calls, one /proc read and one line written per step;
on CUDA, events around phases and one synchronisation at the end of the step (needed to
time the step at all). ``benchmarks/bench_monitor.py`` measures it.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from trainperf.monitor.goodput import Goodput, compute_goodput
from trainperf.monitor.memory import peak_bytes, reset_peak
from trainperf.monitor.metadata import process_start_time
from trainperf.specs import ModelSpec, hardware_flops_per_token, model_flops_per_token


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash: the rest of the file still counts
            continue
    return out


def _open_append(path: Path):
    """Open a JSONL file for appending; a last line cut by a crash is ended first, so the
    next record starts on a line of its own."""
    f = open(path, "a+b")
    if f.tell() > 0:
        f.seek(-1, 2)
        if f.read(1) != b"\n":
            f.write(b"\n")
    f.close()
    return open(path, "a")


class StepTimer:
    """One step being measured: ``data()`` and ``phase(name)`` blocks, ``loss``, ``extra``."""

    def __init__(self, mon: "Monitor", step: int, tokens: int):
        self.mon = mon
        self.step = step
        self.tokens = tokens
        self.loss = None
        self.extra: dict = {}
        self.data_wait_s = 0.0
        self._cpu_phases: dict[str, float] = {}
        self._events: list[tuple[str, object, object]] = []

    def __enter__(self) -> "StepTimer":
        reset_peak(self.mon.device_type)
        self.t0 = time.perf_counter()
        return self

    @contextmanager
    def data(self) -> Iterator[None]:
        """Time the block as data wait (the loop is blocked on its next batch)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.data_wait_s += time.perf_counter() - t

    def add_data_wait(self, seconds: float) -> None:
        """Add data wait measured elsewhere (e.g. by a prefetcher), in seconds."""
        self.data_wait_s += float(seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (CUDA events on GPU, wall time on CPU); repeats add up."""
        if self.mon.device_type == "cuda":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
        else:
            t = time.perf_counter()
            try:
                yield
            finally:
                self._cpu_phases[name] = self._cpu_phases.get(name, 0.0) + time.perf_counter() - t

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        phases = dict(self._cpu_phases)
        if self.mon.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
            for name, start, end in self._events:
                phases[name] = phases.get(name, 0.0) + start.elapsed_time(end) / 1e3
        step_time = time.perf_counter() - self.t0
        self.mon._record(self, step_time, phases)


@dataclass
class MonitorSummary:
    """What a monitored run achieved: medians over the measured steps and the goodput split."""

    steps: int
    step_time_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    hfu: float | None
    mem_peak_bytes: float | None
    data_wait_s: float | None
    final_loss: float | None
    goodput: Goodput
    phases_s: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Return the summary as a plain dict (goodput split included)."""
        d = {k: getattr(self, k) for k in ("steps", "step_time_s", "tokens_per_s", "mfu", "hfu", "mem_peak_bytes",
                                           "data_wait_s", "final_loss")}
        d["phases_s"] = self.phases_s
        d["goodput"] = self.goodput.to_dict()
        return d


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


class Monitor:
    """Per-step instrumentation of a training loop (see the module doc for the usage).

    ``tokens`` given to ``step()`` are the global tokens of the step (all data-parallel
    ranks); MFU = tokens/s / world_size * model FLOPs per token / ``peak_flops`` (FLOP/s
    of one device), with the planner's FLOP count (``trainperf.specs``). HFU adds the
    recompute FLOPs of ``recompute``. A model that is no ModelSpec passes its training
    ``flops_per_token`` instead (then HFU = MFU). ``out_dir`` None keeps everything in memory.
    ``skip_first`` steps (compile, warm-up) are left out of the medians.
    """

    def __init__(self, out_dir: str | Path | None = None, *, model: ModelSpec | None = None,
                 seq_len: int | None = None, peak_flops: float | None = None, world_size: int = 1, rank: int = 0,
                 recompute: str = "none", device_type: str = "cpu", skip_first: int = 1,
                 start_time: float | None = None, echo=None, flops_per_token: float | None = None):
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rank, self.world_size = rank, world_size
        self.device_type = device_type
        self.peak_flops = peak_flops
        self.skip_first = skip_first
        self.echo = echo  # callable(dict) for live display, rank 0 only
        self.flops_per_token = self.hw_flops_per_token = flops_per_token
        if model is not None:
            self.flops_per_token = model_flops_per_token(model, seq_len)
            self.hw_flops_per_token = hardware_flops_per_token(model, recompute, seq_len)
        self.records: list[dict] = []
        self.checkpoint_events: list[dict] = []
        self.phase_names: set[str] = set()  # "forward_s", ... as recorded
        self.t_start = start_time if start_time is not None else process_start_time()
        self.writes = self.out_dir is not None and rank == 0
        self.attempt = 0
        if self.writes:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            prior = [e for e in _read_jsonl(self.out_dir / "events.jsonl") if e.get("kind") == "attempt_start"]
            self.attempt = 1 + max((int(e["attempt"]) for e in prior), default=-1)
            self._metrics = _open_append(self.out_dir / "metrics.jsonl")
            self._events = _open_append(self.out_dir / "events.jsonl")
            self._event({"kind": "attempt_start", "attempt": self.attempt, "t": self.t_start, "t_monitor": time.time()})

    # -- recording ----------------------------------------------------------------

    def _event(self, ev: dict) -> None:
        if self.writes:
            self._events.write(json.dumps(ev) + "\n")
            self._events.flush()

    def note(self, **fields) -> None:
        """Append a free-form event (e.g. ``resumed_from=10``) to events.jsonl."""
        self._event({"kind": "note", "attempt": self.attempt, "t": time.time(), **fields})

    def step(self, step: int | None = None, tokens: int = 0) -> StepTimer:
        """Return the context manager that measures step ``step`` of ``tokens`` global tokens."""
        if step is None:
            step = (self.records[-1]["step"] + 1) if self.records else 1
        return StepTimer(self, int(step), int(tokens))

    def _record(self, st: StepTimer, step_time: float, phases: dict) -> None:
        loss = st.loss
        if loss is not None and hasattr(loss, "item"):
            loss = loss.item()
        tps = st.tokens / step_time if step_time > 0 and st.tokens else None
        mfu = hfu = None
        if tps is not None and self.peak_flops and self.flops_per_token:
            per_device = tps / self.world_size
            mfu = per_device * self.flops_per_token / self.peak_flops
            hfu = per_device * self.hw_flops_per_token / self.peak_flops
        self.phase_names.update(f"{k}_s" for k in phases)
        rec = {
            "step": st.step, "attempt": self.attempt, "loss": loss, "step_time_s": step_time,
            "data_wait_s": st.data_wait_s, "tokens": st.tokens, "tokens_per_s": tps, "mfu": mfu, "hfu": hfu,
            "mem_peak_bytes": peak_bytes(self.device_type),
            **{f"{k}_s": v for k, v in phases.items()}, **st.extra, "t_end": time.time(),
        }
        self.records.append(rec)
        if self.writes:
            self._metrics.write(json.dumps(rec) + "\n")
            self._metrics.flush()
        if self.echo is not None and self.rank == 0:
            self.echo(rec)

    @contextmanager
    def checkpoint(self, step: int | None = None) -> Iterator[None]:
        """Time the block as checkpoint badput (the loop's blocking part of a save)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            blocking = time.perf_counter() - t
            last = step if step is not None else (self.records[-1]["step"] if self.records else 0)
            ev = {"kind": "checkpoint", "attempt": self.attempt, "step": last, "blocking_s": blocking, "t": time.time()}
            self.checkpoint_events.append(ev)
            self._event(ev)

    # -- summary ------------------------------------------------------------------

    def summary(self, end_time: float | None = None) -> MonitorSummary:
        """Return medians over this attempt's steps (after ``skip_first``) and the job's goodput."""
        measured = self.records[self.skip_first:] or self.records
        phase_keys = sorted(self.phase_names)
        if self.writes:
            steps = _read_jsonl(self.out_dir / "metrics.jsonl")
            events = _read_jsonl(self.out_dir / "events.jsonl")
        else:
            steps = self.records
            events = [{"kind": "attempt_start", "attempt": self.attempt, "t": self.t_start}, *self.checkpoint_events]
        gp = compute_goodput(steps, events, end_time=end_time if end_time is not None else time.time())
        return MonitorSummary(
            steps=len(self.records),
            step_time_s=_median([r["step_time_s"] for r in measured]),
            tokens_per_s=_median([r["tokens_per_s"] for r in measured]),
            mfu=_median([r["mfu"] for r in measured]),
            hfu=_median([r["hfu"] for r in measured]),
            mem_peak_bytes=max((r["mem_peak_bytes"] for r in self.records), default=None),
            data_wait_s=_median([r["data_wait_s"] for r in measured]),
            final_loss=self.records[-1]["loss"] if self.records else None,
            goodput=gp,
            phases_s={k: _median([r.get(k) for r in measured]) for k in phase_keys},
        )

    def close(self) -> None:
        """Close the files (idempotent)."""
        if self.writes:
            for f in (self._metrics, self._events):
                if not f.closed:
                    f.close()
