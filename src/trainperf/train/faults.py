"""Known problems injected into the reference trainer's real runs: ``trainperf train --fault``.

Each fault is a real cause of lost time, put where it happens in real jobs, so that a run
(and its traces) carries the problem at a known size, the truth for judging ``diagnose``:

- ``slow-data=MS``: the dataset sleeps MS milliseconds per micro-batch (in the DataLoader
  worker when ``--num-workers`` > 0, where prefetching can hide it, as in real jobs); the
  loop's data wait grows by MS x grad_accum a step when nothing hides it.
- ``item-sync``: ``loss.item()`` after every micro-step's forward (the host waits for the
  device: a host sync on GPU).
- ``slow-rank=R:MS[:sleep]``: rank R does MS ms of extra work a step in its forward (matrix
  products; ``:sleep`` idles instead); the other ranks wait for it in their collectives.
- ``sync-ckpt=N``: a synchronous checkpoint every N steps (the loop blocks while it saves).
- ``tiny-batch[=M]``: micro batch M (default 1) with gradient accumulation raised so that
  the global batch, the samples and (up to summation order) the losses stay the same.
- ``sync-every-micro``: the gradients are synchronised after every micro-step of gradient
  accumulation (DDP without ``no_sync``, FSDP2 without ``set_requires_gradient_sync(False)``):
  grad_accum - 1 wasted all-reduces or reduce-scatters a step. Needs grad_accum > 1.
- ``gc-collect[=N[:R]]``: ``gc.collect()`` at the end of every N-th step (default every step) on every rank, or on
  rank R only, the cleanup some training scripts call each step: a full collection of Python's garbage collector,
  which walks every live Python object (hundreds of thousands once torch is imported); on one rank, the others wait
  for it at the next collective. Recorded in the traces as "Python GC" spans with ``--profile-modules`` (torch 2.9+).

Two numerics faults are the broken changes ``trainperf compare`` must catch (they cost no
time, they change the training):

- ``norm-eps=EPS``: every RMSNorm uses epsilon EPS (a wrong constant in a rewritten kernel).
- ``no-ga-scale``: the micro-step losses are not divided by grad_accum before backward
  (gradients grad_accum times too large; the logged loss stays the true mean).

``--fault-steps A:B`` limits the faults to steps A..B (inclusive), so one run holds its own
clean twin (steps before A) measured on the same machine at the same time; ``tiny-batch``
changes the layout and so holds for the whole run, as do the numerics faults. Metrics lines of faulty steps carry
``"fault": 1``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trainperf.errors import TrainperfError

FAULT_KINDS = ("slow-data", "item-sync", "slow-rank", "sync-ckpt", "tiny-batch", "sync-every-micro", "gc-collect",
               "norm-eps", "no-ga-scale")


@dataclass(kw_only=True, frozen=True, slots=True)
class Faults:
    """The faults of one run (all off by default) and the steps they hold for."""

    slow_data_ms: float = 0.0
    item_sync: bool = False
    slow_rank: int | None = None
    slow_rank_ms: float = 0.0
    slow_rank_sleep: bool = False  # False: extra compute
    sync_ckpt_every: int = 0
    tiny_mbs: int = 0  # 0: off
    sync_every_micro: bool = False
    gc_collect_every: int = 0  # 0: off
    gc_collect_rank: int | None = None  # None: every rank
    norm_eps: float | None = None
    no_ga_scale: bool = False
    first_step: int = 1
    last_step: int | None = None  # None: to the end

    @property
    def any(self) -> bool:
        """True when at least one fault is switched on."""
        return bool(self.slow_data_ms or self.item_sync or self.slow_rank is not None or self.sync_ckpt_every
                    or self.tiny_mbs or self.sync_every_micro or self.gc_collect_every or self.norm_eps is not None
                    or self.no_ga_scale)

    def active(self, step: int) -> bool:
        """True when the step-windowed faults hold at optimizer step ``step`` (from 1)."""
        return self.any and step >= self.first_step and (self.last_step is None or step <= self.last_step)


def _number(kind: str, text: str, what: str, cast=float, minimum: float = 0.0):
    try:
        v = cast(text)
    except ValueError:
        raise TrainperfError(f"--fault {kind}: {what} {text!r} is not a number") from None
    if v < minimum:
        raise TrainperfError(f"--fault {kind}: {what} {text!r} must be >= {minimum:g}")
    return v


def parse_faults(specs: list[str] | None, steps: str | None = None) -> Faults:
    """Return the Faults named by ``--fault`` values (e.g. ``["slow-data=30", "item-sync"]``) and
    ``--fault-steps A:B``; raise TrainperfError naming a value that is not understood."""
    kw: dict = {}
    for spec in specs or []:
        kind, _, value = str(spec).strip().partition("=")
        if kind == "slow-data":
            kw["slow_data_ms"] = _number(kind, value, "milliseconds")
        elif kind in ("item-sync", "no-ga-scale", "sync-every-micro"):
            if value:
                raise TrainperfError(f"--fault {kind} takes no value (got {value!r})")
            kw[kind.replace("-", "_")] = True
        elif kind == "norm-eps":
            kw["norm_eps"] = _number(kind, value, "epsilon")
        elif kind == "slow-rank":
            parts = value.split(":")
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("sleep", "compute")):
                raise TrainperfError(f"--fault slow-rank={value}: expected R:MS or R:MS:sleep, e.g. slow-rank=1:50")
            kw["slow_rank"] = _number(kind, parts[0], "rank", int)
            kw["slow_rank_ms"] = _number(kind, parts[1], "milliseconds")
            kw["slow_rank_sleep"] = len(parts) == 3 and parts[2] == "sleep"
        elif kind == "sync-ckpt":
            kw["sync_ckpt_every"] = _number(kind, value, "every N steps", int, 1)
        elif kind == "gc-collect":
            every, _, rank = value.partition(":")
            kw["gc_collect_every"] = _number(kind, every, "every N steps", int, 1) if every else 1
            if rank:
                kw["gc_collect_rank"] = _number(kind, rank, "rank", int)
        elif kind == "tiny-batch":
            kw["tiny_mbs"] = _number(kind, value, "micro batch", int, 1) if value else 1
        else:
            raise TrainperfError(f"--fault {spec!r}: unknown fault; expected one of {', '.join(FAULT_KINDS)}")
    if steps:
        from trainperf.monitor.profiler import parse_steps

        try:
            kw["first_step"], kw["last_step"] = parse_steps(steps)
        except TrainperfError:
            raise TrainperfError(f"--fault-steps {steps!r}: expected A:B with 1 <= A <= B, e.g. 6:10") from None
    return Faults(**kw)


def fault_layout(layout, faults: Faults, world_size: int):
    """Return the layout the run takes with ``faults`` (``tiny-batch``: micro batch M, grad_accum
    raised to keep the global batch), after checking the faults against the job's ``world_size``."""
    if faults.slow_rank is not None and faults.slow_rank >= world_size:
        raise TrainperfError(f"--fault slow-rank={faults.slow_rank}:...: the job has ranks 0..{world_size - 1}")
    if faults.gc_collect_rank is not None and faults.gc_collect_rank >= world_size:
        raise TrainperfError(f"--fault gc-collect=...:{faults.gc_collect_rank}: the job has ranks 0..{world_size - 1}")
    out = layout
    if faults.tiny_mbs:
        m = faults.tiny_mbs
        if m >= layout.mbs or layout.mbs % m:
            raise TrainperfError(f"--fault tiny-batch={m}: needs a layout micro batch that {m} divides and is larger "
                                 f"than {m} (the layout has mbs={layout.mbs}; e.g. --layout mbs=8)")
        from dataclasses import replace

        out = replace(layout, mbs=m, grad_accum=layout.grad_accum * (layout.mbs // m))
    if faults.sync_every_micro and out.grad_accum < 2:
        raise TrainperfError("--fault sync-every-micro: needs gradient accumulation (the layout has ga=1; e.g. "
                             "--layout ga=4, or --fault tiny-batch=M with a larger micro batch)")
    return out


def patch_model(model, faults: Faults) -> None:
    """Apply the numerics faults that live in the model (``norm-eps``) to ``model`` in place."""
    if faults.norm_eps is None:
        return
    from trainperf.train.model import RMSNorm

    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.eps = faults.norm_eps


class SlowSamples:
    """A dataset that sleeps ``ms`` before the first sample of every micro-batch of the faulty steps.

    Sample ``g`` is the global index of ``train.data.RankSampler``: its micro-batch counter is
    ``g // (dp * mbs)``, its optimizer step ``counter // grad_accum + 1``, and the first
    sample of a micro-batch has ``g % mbs == 0``.
    """

    def __init__(self, dataset, faults: Faults, *, dp: int, mbs: int, grad_accum: int):
        self.dataset, self.faults = dataset, faults
        self.dp, self.mbs, self.grad_accum = dp, mbs, grad_accum

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, g: int):
        if g % self.mbs == 0 and self.faults.active(g // (self.dp * self.mbs) // self.grad_accum + 1):
            time.sleep(self.faults.slow_data_ms / 1e3)
        return self.dataset[g]


class ExtraWork:
    """Rank R's slowdown: ``ms`` of matrix products (or of sleep) each faulty step.

    On CPU the products run until ``ms`` of wall time has passed; on CUDA (asynchronous) the
    number of products per millisecond is measured once at start.
    """

    N = 256  # 256^3 products: ~0.1-1 ms each on a CPU core, microseconds on a GPU
    SPAN = "trainperf.fault.slow_rank"  # the profiler span around the extra work (a trace shows it)

    def __init__(self, faults: Faults, rank: int, device):
        import torch

        self.on = faults.slow_rank == rank and faults.slow_rank_ms > 0
        self.faults, self.device = faults, device
        self.a = self.per_ms = None
        if not self.on or faults.slow_rank_sleep:
            return
        self.a = torch.randn(self.N, self.N, device=device)
        if device.type == "cuda":
            k = 50
            torch.cuda.synchronize(device)
            t = time.perf_counter()
            for _ in range(k):
                self.a @ self.a
            torch.cuda.synchronize(device)
            self.per_ms = k / max((time.perf_counter() - t) * 1e3, 1e-6)

    def __call__(self, step: int) -> None:
        """Do this rank's extra work for optimizer step ``step`` (nothing when the fault is off there),
        inside a profiler span named ``SPAN``; on CPU every product starts within ``ms`` of the span's start."""
        if not self.on or not self.faults.active(step):
            return
        import torch

        ms = self.faults.slow_rank_ms
        end = time.perf_counter() + ms / 1e3  # before the span opens: products start before span start + ms
        with torch.profiler.record_function(self.SPAN):
            if self.faults.slow_rank_sleep:
                time.sleep(ms / 1e3)
                return
            with torch.no_grad():
                if self.per_ms is not None:
                    for _ in range(max(1, round(ms * self.per_ms))):
                        self.a @ self.a
                    return
                while time.perf_counter() < end:
                    self.a @ self.a
