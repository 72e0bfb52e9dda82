"""The in-loop monitor: per-step time, data wait, phases, tokens/s, MFU/HFU, memory, garbage-collector pauses,
goodput.

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
    summary = mon.summary()                       # medians, goodput split
    mon.close()

Rank 0 appends one JSON object per step to ``<out>/metrics.jsonl`` and the job's events
(attempt starts, checkpoints) to ``<out>/events.jsonl``, so a relaunched job in the same
folder is accounted for as one job (goodput counts the restart and the lost work).

Cost (``benchmarks/bench_monitor.py --breakdown``; docs/benchmarks.md): per step two
``perf_counter`` reads per block, on CPU two system calls (reset the peak RSS, read it back:
see ``memory``), one dict; ~60 us a step right after CPU compute, where the first version
(a @contextmanager per block, /proc/self/status read and one json.dumps + write + flush per
step) spent ~150 us. Metrics lines are written in batches, flushed every
``flush_every_steps`` steps or ``flush_every_s`` seconds (checked at each step's end), before
every checkpoint, by ``summary()``/``flush()``/``close()``, at interpreter exit and on SIGTERM
(unless the program has its own handler). A process killed by SIGKILL therefore loses only the lines of the
steps that ended within ``flush_every_s`` of the last flush (fewer than
``flush_every_steps``), never a step at or before its last checkpoint. On CUDA, events around
phases and one synchronisation at the end of the step (needed to time the step at all).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from trainperf.monitor.gc_pauses import GcClock
from trainperf.monitor.goodput import Goodput, compute_goodput
from trainperf.monitor.memory import peak_reader, peak_resetter
from trainperf.monitor.metadata import process_start_time
from trainperf.specs import ModelSpec, hardware_flops_per_token, model_flops_per_token

_perf_counter = time.perf_counter
_wall_time = time.time


def read_jsonl(path: Path) -> list[dict]:
    """Return the JSON objects of a JSONL file (none if it is absent), skipping lines a crash cut."""
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


def _plain(o):
    """JSON fallback for values a loop may put in ``extra``: tensors and NumPy scalars become
    numbers, anything else its ``str`` (a metrics line must never stop training)."""
    if hasattr(o, "item"):
        try:
            return o.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(o)


_encode = json.JSONEncoder(default=_plain).encode  # json.dumps' format, with the fallback above

# Monitors with lines not yet on disk; flushed at interpreter exit (a normal exit loses nothing).
_open_monitors: "weakref.WeakSet[Monitor]" = weakref.WeakSet()


@atexit.register
def _flush_open_monitors() -> None:
    for mon in list(_open_monitors):
        try:
            mon.flush()
        except Exception:  # noqa: BLE001 - at exit, one broken file must not hide the others
            pass


def _flush_then_terminate(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    _flush_open_monitors()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the same signal, as if no handler had run


def _flush_on_sigterm() -> None:
    """Flush open monitors when SIGTERM arrives (torchrun sends it to the surviving ranks when
    one dies), then terminate as before. Installed only from the main thread and only over the
    default disposition: a handler the user set is left alone."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _flush_then_terminate)


# The blocks below are small classes rather than @contextmanager generators: right after
# training compute (cold caches) a generator-based block costs ~11 us to enter and leave,
# these ~5 us (data + 3 phases: 45 -> 20 us a step, benchmarks/bench_monitor.py --breakdown).
class _DataBlock:
    """``with st.data():`` adds the block's wall time to the step's data wait."""

    __slots__ = ("_timer", "_t")

    def __init__(self, timer: "StepTimer"):
        self._timer = timer

    def __enter__(self) -> None:
        self._t = _perf_counter()

    def __exit__(self, *exc) -> bool:
        self._timer.data_wait_s += _perf_counter() - self._t
        return False


class _CpuPhase:
    """``with st.phase(name):`` on the host clock; repeats of one name add up."""

    __slots__ = ("_phases", "_name", "_t")

    def __init__(self, phases: dict, name: str):
        self._phases, self._name = phases, name

    def __enter__(self) -> None:
        self._t = _perf_counter()

    def __exit__(self, *exc) -> bool:
        dt = _perf_counter() - self._t
        phases = self._phases
        phases[self._name] = phases.get(self._name, 0.0) + dt
        return False


class _CudaPhase:
    """``with st.phase(name):`` timed by CUDA events on the current stream (read after the step's sync)."""

    __slots__ = ("_events", "_name", "_start", "_end")

    def __init__(self, events: list, name: str):
        import torch

        self._events, self._name = events, name
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def __enter__(self) -> None:
        self._start.record()

    def __exit__(self, *exc) -> bool:
        self._end.record()
        self._events.append((self._name, self._start, self._end))
        return False


class _Aside:
    """``with st.aside(name):`` work done during the step that is not part of it (an evaluation):
    its wall time is recorded as ``<name>_s`` and left out of the step time. On CUDA the
    device is drained on entry and exit, so the step's own work is not counted as the aside's."""

    __slots__ = ("_timer", "_name", "_t")

    def __init__(self, timer: "StepTimer", name: str):
        self._timer, self._name = timer, name

    def __enter__(self) -> None:
        if self._timer.mon._cuda:
            import torch

            torch.cuda.synchronize()
        self._t = _perf_counter()

    def __exit__(self, *exc) -> bool:
        if self._timer.mon._cuda:
            import torch

            torch.cuda.synchronize()
        aside = self._timer._aside
        aside[self._name] = aside.get(self._name, 0.0) + _perf_counter() - self._t
        return False


class StepTimer:
    """One step being measured: ``data()``, ``phase(name)`` and ``aside(name)`` blocks, ``loss``, ``extra``."""

    def __init__(self, mon: "Monitor", step: int, tokens: int):
        self.mon = mon
        self.step = step
        self.tokens = tokens
        self.loss = None
        self.extra: dict = {}
        self.data_wait_s = 0.0
        self.comm_wait_s = 0.0
        self._cpu_phases: dict[str, float] = {}
        self._events: list[tuple[str, object, object]] = []
        self._aside: dict[str, float] = {}
        self.gc_pauses = (0.0, 0, 0)  # the collector's (seconds, collections, full collections) in the step

    def __enter__(self) -> "StepTimer":
        self.mon._reset_peak()
        self.mon._gc.take()  # collections before the step are not the step's
        self.t0 = _perf_counter()
        return self

    def data(self) -> _DataBlock:
        """Return a context manager timing its block as data wait (the loop is blocked on its next batch)."""
        return _DataBlock(self)

    def add_data_wait(self, seconds: float) -> None:
        """Add data wait measured elsewhere (e.g. by a prefetcher), in seconds."""
        self.data_wait_s += float(seconds)

    def add_comm_wait(self, seconds: float) -> None:
        """Add time this rank sat blocked in collectives inside its phases (seconds), measured by
        the loop; recorded as ``comm_wait_s`` and taken out of the step's busy time."""
        self.comm_wait_s += float(seconds)

    def phase(self, name: str):
        """Return a context manager timing its block as phase ``name`` (CUDA events on GPU, wall
        time on CPU; seconds); repeats of one name add up."""
        if self.mon._cuda:
            return _CudaPhase(self._events, name)
        return _CpuPhase(self._cpu_phases, name)

    def aside(self, name: str) -> _Aside:
        """Return a context manager for work inside the step that is not the step's (e.g. an
        evaluation): its seconds go to ``<name>_s`` in the record, not into ``step_time_s``."""
        return _Aside(self, name)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        phases = self._cpu_phases
        if self._events:
            import torch

            torch.cuda.synchronize()
            phases = dict(phases)
            for name, start, end in self._events:
                phases[name] = phases.get(name, 0.0) + start.elapsed_time(end) / 1e3
        elif self.mon._cuda:
            import torch

            torch.cuda.synchronize()
        step_time = _perf_counter() - self.t0
        self.gc_pauses = self.mon._gc.take()
        if self._aside:
            step_time -= sum(self._aside.values())
            self.extra = {**self.extra, **{f"{k}_s": v for k, v in self._aside.items()}}
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
    # Python's garbage collector in the measured steps: its mean pause a step and the longest step's (s). A mean, not
    # a median: a full collection every few hundred steps is a cost every step pays a share of, and a median is 0
    gc_pause_s: float | None = None
    gc_pause_max_s: float | None = None
    phases_s: dict = field(default_factory=dict)
    # one {"rank", "host", "busy_s"} per rank (Monitor.gather_ranks; this rank alone without it)
    ranks: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """Return the summary as a plain dict (goodput split and per-rank busy times included)."""
        d = {k: getattr(self, k) for k in ("steps", "step_time_s", "tokens_per_s", "mfu", "hfu", "mem_peak_bytes",
                                           "data_wait_s", "final_loss", "gc_pause_s", "gc_pause_max_s")}
        d["phases_s"] = self.phases_s
        d["goodput"] = self.goodput.to_dict()
        d["ranks"] = self.ranks
        return d


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def step_busy_s(rec: dict, phase_keys) -> float:
    """Return a step's busy time in seconds: the rank's own compute in the step, collective waits
    excluded. With phases recorded it is their sum (the trainer's forward_s + backward_s +
    optimizer_s) less ``comm_wait_s`` (time measured blocked in collectives inside those phases);
    without phases, step_time_s less data_wait_s and comm_wait_s. Data wait, asides (evaluation)
    and anything outside the phases (the trainer's loss all-reduce) are never in it."""
    phases = [rec[k] for k in phase_keys if rec.get(k) is not None]
    total = sum(phases) if phases else rec["step_time_s"] - (rec.get("data_wait_s") or 0.0)
    return max(total - (rec.get("comm_wait_s") or 0.0), 0.0)


class Monitor:
    """Per-step instrumentation of a training loop (see the module doc for the usage).

    ``tokens`` given to ``step()`` are the global tokens of the step (all data-parallel
    ranks); MFU = tokens/s / world_size * model FLOPs per token / ``peak_flops`` (FLOP/s
    of one device), with the planner's FLOP count (``trainperf.specs``). HFU adds the
    recompute FLOPs of ``recompute``. A model that is no ModelSpec passes its training
    ``flops_per_token`` instead (then HFU = MFU). ``out_dir`` None keeps everything in memory.
    ``skip_first`` steps (compile, warm-up) are left out of the medians. Metrics lines reach
    the disk at least every ``flush_every_steps`` steps and every ``flush_every_s`` seconds
    (see the module doc for what a killed process can lose).
    """

    def __init__(self, out_dir: str | Path | None = None, *, model: ModelSpec | None = None,
                 seq_len: int | None = None, peak_flops: float | None = None, world_size: int = 1, rank: int = 0,
                 recompute: str = "none", device_type: str = "cpu", skip_first: int = 1,
                 start_time: float | None = None, echo=None, flops_per_token: float | None = None,
                 flush_every_steps: int = 100, flush_every_s: float = 1.0):
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rank, self.world_size = rank, world_size
        self.device_type = device_type
        self._cuda = device_type == "cuda"
        self._reset_peak = peak_resetter(device_type)
        self._peak_bytes = peak_reader(device_type)
        self._gc = GcClock()
        self.peak_flops = peak_flops
        self.skip_first = skip_first
        self.echo = echo  # callable(dict) for live display, rank 0 only
        self.flops_per_token = self.hw_flops_per_token = flops_per_token
        if model is not None:
            self.flops_per_token = model_flops_per_token(model, seq_len)
            self.hw_flops_per_token = hardware_flops_per_token(model, recompute, seq_len)
        self.records: list[dict] = []
        self.ranks: list[dict] = []  # every rank's entry once gather_ranks() ran
        self.checkpoint_events: list[dict] = []
        self.phase_names: set[str] = set()  # "forward_s", ... as recorded
        self._phase_keys: dict[str, str] = {}  # "forward" -> "forward_s"
        self.t_start = start_time if start_time is not None else process_start_time()
        self.writes = self.out_dir is not None and rank == 0
        self.attempt = 0
        self.flush_every_steps = max(int(flush_every_steps), 1)
        self.flush_every_s = float(flush_every_s)
        self._n_written = 0  # records[:_n_written] are in metrics.jsonl
        self._t_flushed = _wall_time()
        if self.writes:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            prior = [e for e in read_jsonl(self.out_dir / "events.jsonl") if e.get("kind") == "attempt_start"]
            self.attempt = 1 + max((int(e["attempt"]) for e in prior), default=-1)
            self._metrics = _open_append(self.out_dir / "metrics.jsonl")
            self._events = _open_append(self.out_dir / "events.jsonl")
            self._event({"kind": "attempt_start", "attempt": self.attempt, "t": self.t_start, "t_monitor": time.time()})
            _open_monitors.add(self)
            _flush_on_sigterm()

    # -- recording ----------------------------------------------------------------

    def _event(self, ev: dict) -> None:
        if self.writes:  # events are rare: written and flushed at once
            self._events.write(_encode(ev) + "\n")
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
        mem = self._peak_bytes()  # first: the /proc read is the step's end of the peak window
        loss = st.loss
        if loss is not None and hasattr(loss, "item"):
            loss = loss.item()
        tps = st.tokens / step_time if step_time > 0 and st.tokens else None
        mfu = hfu = None
        if tps is not None and self.peak_flops and self.flops_per_token:
            per_device = tps / self.world_size
            mfu = per_device * self.flops_per_token / self.peak_flops
            hfu = per_device * self.hw_flops_per_token / self.peak_flops
        rec = {
            "step": st.step, "attempt": self.attempt, "loss": loss, "step_time_s": step_time,
            "data_wait_s": st.data_wait_s, "tokens": st.tokens, "tokens_per_s": tps, "mfu": mfu, "hfu": hfu,
            "mem_peak_bytes": mem, "gc_pause_s": st.gc_pauses[0], "gc_collections": st.gc_pauses[1],
            "gc_full_collections": st.gc_pauses[2],
        }
        if phases:
            keys = self._phase_keys
            for name, seconds in phases.items():
                key = keys.get(name)
                if key is None:
                    key = keys[name] = f"{name}_s"
                    self.phase_names.add(key)
                rec[key] = seconds
        if st.comm_wait_s:
            rec["comm_wait_s"] = st.comm_wait_s
        if st.extra:
            rec.update(st.extra)
        rec["t_end"] = t_end = _wall_time()
        self.records.append(rec)
        if self.writes and (len(self.records) - self._n_written >= self.flush_every_steps
                            or t_end - self._t_flushed >= self.flush_every_s):
            self.flush()
        if self.echo is not None and self.rank == 0:
            self.echo(rec)

    def flush(self) -> None:
        """Write the metrics lines not yet on disk and flush them to the OS (rank 0; no-op elsewhere)."""
        if not self.writes or self._metrics.closed:
            return
        pending = self.records[self._n_written:]
        if pending:
            # One write for the batch: serialising records back to back runs with warm caches,
            # ~4x cheaper per record than one json.dumps right after each training step.
            self._metrics.write("".join([_encode(r) + "\n" for r in pending]))
            self._metrics.flush()
            self._n_written += len(pending)
        self._t_flushed = _wall_time()

    @contextmanager
    def checkpoint(self, step: int | None = None) -> Iterator[None]:
        """Time the block as checkpoint badput (the loop's blocking part of a save).

        The metrics of every step so far are flushed first (not timed), so a checkpoint on
        disk never covers a step whose metrics line a crash could still lose."""
        self.flush()
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
            self.flush()
            steps = read_jsonl(self.out_dir / "metrics.jsonl")
            events = read_jsonl(self.out_dir / "events.jsonl")
        else:
            steps = self.records
            events = [{"kind": "attempt_start", "attempt": self.attempt, "t": self.t_start}, *self.checkpoint_events]
        gp = compute_goodput(steps, events, end_time=end_time if end_time is not None else time.time())
        gc_mean_s, gc_max_s = self.gc_pauses()
        return MonitorSummary(
            steps=len(self.records),
            step_time_s=_median([r["step_time_s"] for r in measured]),
            tokens_per_s=_median([r["tokens_per_s"] for r in measured]),
            mfu=_median([r["mfu"] for r in measured]),
            hfu=_median([r["hfu"] for r in measured]),
            mem_peak_bytes=max((r["mem_peak_bytes"] for r in self.records), default=None),
            data_wait_s=_median([r["data_wait_s"] for r in measured]),
            gc_pause_s=gc_mean_s,
            gc_pause_max_s=gc_max_s,
            final_loss=self.records[-1]["loss"] if self.records else None,
            goodput=gp,
            phases_s={k: _median([r.get(k) for r in measured]) for k in phase_keys},
            ranks=self.ranks or ([self.rank_entry()] if self.records else []),
        )

    def busy_s(self) -> float | None:
        """Return this rank's median busy time per step in seconds (``step_busy_s`` over the
        measured steps), None before any step."""
        measured = self.records[self.skip_first:] or self.records
        keys = sorted(self.phase_names)
        return _median([step_busy_s(r, keys) for r in measured])

    def gc_pauses(self) -> tuple[float | None, float | None]:
        """This rank's garbage-collector pauses over the measured steps (s): the mean a step and the longest step's;
        (None, None) before any step."""
        measured = self.records[self.skip_first:] or self.records
        pauses = [r["gc_pause_s"] for r in measured if r.get("gc_pause_s") is not None]
        return (sum(pauses) / len(pauses), max(pauses)) if pauses else (None, None)

    def rank_entry(self) -> dict:
        """Return this rank's entry of the run summary's ``ranks``: rank, host name, median busy s, mean collector
        pause a step (s: a rank that collects more holds the others at every collective)."""
        import socket

        return {"rank": self.rank, "host": socket.gethostname(), "busy_s": self.busy_s(),
                "gc_pause_s": self.gc_pauses()[0]}

    def gather_ranks(self) -> list[dict]:
        """Collect every rank's ``rank_entry`` (a collective: call it on every rank, after the last
        step, with torch.distributed initialised; one process alone needs no group). Sets and
        returns ``self.ranks``, sorted by rank, which ``summary()`` then reports."""
        entry = self.rank_entry()
        try:
            import torch.distributed as dist

            distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        except ImportError:
            distributed = False
        if not distributed:
            self.ranks = [entry]
            return self.ranks
        got: list = [None] * dist.get_world_size()
        dist.all_gather_object(got, entry)
        self.ranks = sorted(got, key=lambda e: e["rank"])
        return self.ranks

    def close(self) -> None:
        """Flush and close the files (idempotent)."""
        if self.writes:
            self.flush()
            for f in (self._metrics, self._events):
                if not f.closed:
                    f.close()
            _open_monitors.discard(self)
