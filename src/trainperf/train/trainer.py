"""The reference training loop: one function, ``train(cfg)``, for one process or a torchrun job.

It orchestrates components that each do one thing (torchtitan style): the model
(train.model), the data (train.data), the layout (train.parallel), the checkpoints
(train.checkpoint) and the measurements (trainperf.monitor). Under torchrun every rank
runs ``train``; rank 0 writes the run folder's shared files.
"""

from __future__ import annotations

import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from trainperf.atomic import atomic_write_text
from trainperf.errors import TrainperfError


@dataclass
class TrainConfig:
    """Everything a training run needs; JSON-able (torchrun workers read it from the run folder)."""

    model: str = "tiny"
    seq_len: int | None = None
    steps: int = 50
    layout: str = ""  # a `trainperf plan` layout string; keys left out take the defaults
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    compile: bool = False
    compile_backend: str = "inductor"
    kernels: bool = False
    ckpt_every: int = 0
    ckpt_keep: int = 3
    ckpt_async: bool = True
    resume: bool = True  # auto-resume from the newest complete checkpoint in the run folder
    profile_steps: str | None = None
    profile_modules: bool = False  # traces record nn.Module spans (with_stack) for `diagnose --modules`
    gc_every: int = 0  # Python's automatic garbage collection off, a young-generation collection every N steps (0: on)
    out: str = "train_out"
    text: list[str] | None = None
    synthetic: bool = False
    num_workers: int = 0
    device: str = "auto"  # auto, cpu, cuda
    gpu: str | None = None  # catalog name for the peak FLOP/s (default: detected)
    peak_tflops: float | None = None  # overrides the catalog / CPU measurement
    job: str = "train"
    store: str | None = None
    record: bool = True
    log_every: int = 0  # 0: about ten lines per run
    progress: bool = True
    eval_every: int = 0  # held-out loss every N steps (0: never)
    eval_batches: int = 4  # micro-batches of the held-out split per evaluation
    faults: list[str] | None = None  # --fault values (train.faults), e.g. ["slow-data=30", "item-sync"]
    fault_steps: str | None = None  # "A:B": the faults hold in steps A..B only
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        """Return the config as JSON."""
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "TrainConfig":
        """Return the config from ``to_json`` output."""
        return cls(**json.loads(text))


# ------------------------------------------------------------------------ helpers


def _init_distributed(device_type: str):
    """Initialise the process group when launched by torchrun; return (rank, world, local_rank)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise TrainperfError(f"--nproc: local rank {local_rank} has no GPU (this machine has "
                                 f"{torch.cuda.device_count()}); use at most one process per GPU")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), local_rank


def _device_type(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise TrainperfError("--device cuda: no CUDA device is available here")
    if requested not in ("cpu", "cuda"):
        raise TrainperfError(f"--device {requested!r}: expected auto, cpu or cuda")
    return requested


@dataclass(frozen=True)
class CpuPeak:
    """The fp32 GEMM rates (FLOP/s) of ``repeats`` timings of one n x n x n matmul, fastest first."""

    n: int
    rates: tuple[float, ...]

    @property
    def best_flops(self) -> float:
        """The peak MFU is measured against: the fastest repeat (a busy moment only slows a repeat down)."""
        return self.rates[0]

    @property
    def median_flops(self) -> float:
        return self.rates[len(self.rates) // 2]

    @property
    def spread(self) -> float:
        """How far the slowest repeat fell below the best one (0 = every repeat equal)."""
        return 1.0 - self.rates[-1] / self.rates[0]

    def statement(self) -> str:
        """What the CPU peak is and how stable it was, for the run summary and the run record."""
        return (f"measured: the best of {len(self.rates)} fp32 {self.n}^3 matmuls at start-up (median "
                f"{self.median_flops / 1e9:.0f}, slowest {self.rates[-1] / 1e9:.0f} GFLOP/s: {self.spread:.0%} "
                f"below the best); CPU has no catalog peak")


def measure_cpu_peak(n: int = 1024, repeats: int = 12) -> CpuPeak:
    """Time ``repeats`` fp32 n x n x n matmuls after one untimed warm-up call (FLOP/s = 2 n^3 / seconds).

    The CPU has no catalog peak; MFU on CPU is relative to the best of these rates. Best of many
    repeats of a large square GEMM, so that a busy moment at start-up does not understate the
    peak (a small or single timing let the tiny model read MFU > 100%); the spread says how
    steady the CPU was while measuring (84 to 200 GFLOP/s between runs on a shared 2-core VM).
    """
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        rates.append(2.0 * n**3 / max(time.perf_counter() - t, 1e-12))
    return CpuPeak(n=n, rates=tuple(sorted(rates, reverse=True)))


def measure_cpu_gemm_flops(n: int = 1024, repeats: int = 12) -> float:
    """Return the best fp32 GEMM rate of this process on an n x n x n matmul (FLOP/s): measure_cpu_peak's best."""
    return measure_cpu_peak(n, repeats).best_flops


def device_peak_flops(cfg: TrainConfig, device_type: str, precision: str) -> tuple[float, str, str | None]:
    """Return (peak FLOP/s of one device for ``precision``, where the figure comes from, catalog name)."""
    if device_type == "cpu":
        if cfg.peak_tflops:
            return cfg.peak_tflops * 1e12, "--peak-tflops", None
        peak = measure_cpu_peak()
        return peak.best_flops, peak.statement(), None
    import torch

    from trainperf.hardware import accelerator_for_torch_device, get_accelerator

    dev = torch.cuda.get_device_name()
    acc = None
    if cfg.gpu:
        try:
            acc = get_accelerator(cfg.gpu)
        except TrainperfError:
            pass  # an unknown --gpu falls back to the detected device, as before
    acc = acc or accelerator_for_torch_device()
    if cfg.peak_tflops:  # the catalog name is still wanted, for the planner's prediction
        return cfg.peak_tflops * 1e12, "--peak-tflops", acc.name if acc else None
    if acc is None:
        raise TrainperfError(f"GPU {dev!r} is not in the hardware catalog: pass --gpu NAME or --peak-tflops")
    return acc.peak_flops(precision), f"catalog {acc.name} ({precision})", acc.name


def _lr_lambda(cfg: TrainConfig):
    import math

    def f(i: int) -> float:  # i = optimizer steps taken so far; linear warm-up, then cosine
        if i < cfg.warmup_steps:
            return (i + 1) / (cfg.warmup_steps + 1)
        frac = min((i - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1), 1.0)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    return f


def _apply_kernels(model) -> None:
    try:
        from trainperf.kernels import apply
    except ImportError as e:
        raise TrainperfError(f"--fused-kernels: trainperf.kernels.apply is not available ({e})") from None
    apply(model)


# -------------------------------------------------------------------------- train


@dataclass(kw_only=True)
class TrainRun:
    """A set-up training job on this process: what ``train_step``, ``evaluate`` and ``finish`` use."""

    cfg: TrainConfig
    spec: object  # ModelSpec
    layout: object  # Layout, resolved for the world size
    dims: object  # parallel.ParallelDims
    rank: int
    world: int
    device: object  # torch.device
    device_type: str
    out: Path
    model: object
    params: list
    optimizer: object
    scheduler: object
    ckpt: object  # Checkpointer
    batches: object  # DevicePrefetcher
    held_out: list  # the fixed held-out micro-batches of this rank ([] without --eval-every)
    mon: object  # Monitor
    profiler: object  # StepProfiler
    progress: object  # _Progress on rank 0, else None
    faults: object  # train.faults.Faults
    extra_work: object  # train.faults.ExtraWork
    autocast: object  # torch dtype or None
    start_step: int
    data_position: int
    resumed_from: str | None
    tokens_per_step: int
    peak: float
    peak_source: str
    accel: str | None
    metadata: dict
    comparable: dict  # what `trainperf compare` needs to decide comparability
    grad_ready: list | None = None  # [perf_counter of this rank's last gradient] (DDP on CPU), see _grad_ready_clock


def setup(cfg: TrainConfig) -> TrainRun:
    """Build everything a run needs (process group, model, optimizer, data, checkpoints, monitor)
    and write ``run.json``; resume from the newest complete checkpoint in ``cfg.out``."""
    import torch

    from trainperf.monitor import Monitor, StepProfiler, parse_steps
    from trainperf.monitor.metadata import process_start_time, run_metadata
    from trainperf.specs import load_model, param_count, parse_layout
    from trainperf.train import data as data_mod
    from trainperf.train import parallel
    from trainperf.train.checkpoint import Checkpointer
    from trainperf.train.faults import ExtraWork, SlowSamples, fault_layout, parse_faults, patch_model
    from trainperf.train.model import build_model

    t_process = process_start_time()
    device_type = _device_type(cfg.device)
    rank, world, local_rank = _init_distributed(device_type)
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    spec = load_model(cfg.model, seq_len=cfg.seq_len)
    default_precision = "bf16" if device_type == "cuda" else "fp32"
    layout = parse_layout(cfg.layout or "", precision=default_precision, zero=0)
    layout = parallel.resolve_layout(layout, spec, world)
    faults = parse_faults(cfg.faults, cfg.fault_steps)
    layout = fault_layout(layout, faults, world)
    profile = parse_steps(cfg.profile_steps)
    if cfg.steps < 1:
        raise TrainperfError(f"--steps {cfg.steps}: must be >= 1")
    if cfg.eval_every < 0 or cfg.eval_batches < 1:
        raise TrainperfError(f"--eval-every {cfg.eval_every} / --eval-batches {cfg.eval_batches}: need >= 0 / >= 1")
    mesh = parallel.build_mesh(layout, device_type)
    dims = parallel.ParallelDims(layout, world, rank, mesh)
    out = Path(cfg.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)

    # Model: built on meta, materialised and initialised identically on every rank, then
    # laid out (TP, AC, compile, FSDP/DDP). Kernels are patched in before compile.
    model = build_model(spec, device=device, seed=cfg.seed)
    patch_model(model, faults)
    if cfg.kernels:
        _apply_kernels(model)
    model = parallel.parallelize(model, dims, device, cfg.compile_backend if cfg.compile else None)
    params = [p for p in model.parameters() if p.requires_grad]
    # Foreach/fused AdamW cannot mix DTensor (TP shards) and plain tensors in one group.
    groups = [{"params": [p for p in params if hasattr(p, "device_mesh")]},
              {"params": [p for p in params if not hasattr(p, "device_mesh")]}]
    impl = {"fused": True} if device_type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(0.9, 0.95),
                                  weight_decay=cfg.weight_decay, eps=1e-8, **impl)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))

    fingerprint = {
        "model": {k: v for k, v in spec.to_dict().items() if k != "name"},
        "layout": {k: getattr(layout, k) for k in ("tp", "pp", "cp", "dp", "zero", "mbs", "grad_accum")},
    }
    ckpt = Checkpointer(out, fingerprint, keep=cfg.ckpt_keep,
                        async_save=cfg.ckpt_async and not faults.sync_ckpt_every, device=device)
    start_step, data_position = 0, 0
    resumed_from = None
    if cfg.resume and (latest := ckpt.latest()) is not None:
        train_state = ckpt.load(latest, model, optimizer,
                                {"lr_scheduler": scheduler.state_dict(), "data_position": 0})
        scheduler.load_state_dict(train_state["lr_scheduler"])
        start_step, data_position = int(train_state["step"]), int(train_state["data_position"])
        resumed_from = str(latest)

    data_cfg = data_mod.DataConfig(cfg.text, cfg.synthetic, cfg.seed, cfg.num_workers)
    dataset = data_mod.make_dataset(data_cfg, spec.vocab, spec.seq_len)
    held_out = (data_mod.eval_batches(dataset, dims.dp_rank, layout.dp, layout.mbs, cfg.eval_batches, device)
                if cfg.eval_every else [])
    comparable = comparability(cfg, spec, layout, dataset, device_type)
    if faults.slow_data_ms:
        dataset = SlowSamples(dataset, faults, dp=layout.dp, mbs=layout.mbs, grad_accum=layout.grad_accum)
    loader = data_mod.make_loader(dataset, data_cfg, dims.dp_rank, layout.dp, layout.mbs, data_position,
                                  pin_memory=device_type == "cuda")
    batches = data_mod.DevicePrefetcher(loader, device)

    peak, peak_source, accel = device_peak_flops(cfg, device_type, layout.precision)
    metadata = run_metadata(world, layout.to_string(), device_type)
    tokens_per_step = layout.dp * layout.mbs * layout.grad_accum * spec.seq_len
    mon = Monitor(out, model=spec, peak_flops=peak, world_size=world, rank=rank, recompute=layout.recompute,
                  device_type=device_type, skip_first=min(2, max(cfg.steps - start_step - 1, 0)),
                  start_time=t_process)
    if resumed_from:
        mon.note(resumed_from=resumed_from, step=start_step)
    if rank == 0:
        atomic_write_text(out / "run.json", json.dumps({
            "config": asdict(cfg), "model": spec.to_dict(), "params": param_count(spec),
            "layout": layout.to_string(), "strategy": dims.strategy, "world_size": world,
            "tokens_per_step": tokens_per_step, "peak_flops": peak, "peak_source": peak_source,
            "metadata": metadata, "resumed_from": resumed_from, "comparable": comparable,
        }, indent=1, default=str))
    return TrainRun(cfg=cfg, spec=spec, layout=layout, dims=dims, rank=rank, world=world, device=device,
                    device_type=device_type, out=out, model=model, params=params, optimizer=optimizer,
                    scheduler=scheduler, ckpt=ckpt, batches=batches, held_out=held_out, mon=mon,
                    profiler=StepProfiler(out, profile, rank, next_step=start_step + 1, device_type=device_type,
                                          record_modules=cfg.profile_modules),
                    progress=_Progress(cfg, rank, start_step) if rank == 0 else None, faults=faults,
                    extra_work=ExtraWork(faults, rank, device), autocast=parallel.autocast_dtype(dims),
                    start_step=start_step, data_position=data_position, resumed_from=resumed_from,
                    tokens_per_step=tokens_per_step, peak=peak, peak_source=peak_source, accel=accel,
                    metadata=metadata, comparable=comparable,
                    grad_ready=_grad_ready_clock(model, dims.strategy, device_type))


def _grad_ready_clock(model, strategy: str, device_type: str) -> list | None:
    """Return [host clock at this rank's last gradient, at the wrapped module's forward start],
    set by hooks, for DDP on CPU; else None. DDP broadcasts its buffers before the wrapped forward
    runs (a collective: a rank ahead of a slower peer waits there) and launches its gradient
    all-reduce asynchronously as the buckets fill, blocking only at the end of backward: the time
    from calling the DDP model to its module's forward, and the backward's time after the last
    gradient, are time blocked in collectives, not this rank's compute. (On CUDA the host clock
    does not time the device; FSDP/TP collectives run inside the compute and are not split out.)"""
    if strategy != "ddp" or device_type != "cpu":
        return None
    clock = [0.0, 0.0]

    def ready(_p) -> None:
        clock[0] = time.perf_counter()

    def inner_forward(_m, _args) -> None:
        clock[1] = time.perf_counter()

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(ready)
    model.module.register_forward_pre_hook(inner_forward)
    return clock


def comparability(cfg: TrainConfig, spec, layout, dataset, device_type: str) -> dict:
    """Return what decides whether two runs train the same model on the same data (``trainperf
    compare``): model, data identity, seed, samples per step; and what may legitimately differ
    between an A and a B (precision, kernels, compile, stack, layout, learning rate, versions)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def ver(pkg: str) -> str | None:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    return {
        "model": {k: v for k, v in spec.to_dict().items() if k != "name"},
        "data": dataset.fingerprint(), "seed": cfg.seed, "seq_len": spec.seq_len,
        "samples_per_step": layout.dp * layout.mbs * layout.grad_accum,
        "precision": layout.precision, "kernels": cfg.kernels, "compile": cfg.compile_backend if cfg.compile else None,
        "stack": trainer_stack(cfg), "layout": layout.to_string(), "lr": cfg.lr, "steps": cfg.steps,
        "eval_batches": cfg.eval_batches if cfg.eval_every else 0, "faults": cfg.faults or [],
        "device": device_type, "versions": {"torch": torch.__version__, "triton": ver("triton"),
                                            "trainperf": ver("trainperf")},
    }


def trainer_stack(cfg: TrainConfig) -> str:
    """Return the planner's software stack (``trainperf plan --stack``) this trainer's run is."""
    return "pytorch-fsdp-compile" if cfg.compile else "pytorch-fsdp"


def forward_backward(run: TrainRun, x, y, micro: int, step: int, st) -> "object":
    """Run one micro-step (forward, backward) and return its loss, already divided by grad_accum."""
    import torch

    from trainperf.train import parallel

    ga, faults = run.layout.grad_accum, run.faults
    # --fault sync-every-micro: every micro-step synchronises its gradients (the bug no_sync avoids)
    skip_sync = micro < ga - 1 and not (faults.sync_every_micro and faults.active(step))
    with parallel.no_grad_sync(run.model, skip_sync):
        with st.phase("forward"), torch.autocast(run.device_type, dtype=run.autocast or torch.float32,
                                                 enabled=run.autocast is not None):
            if micro == 0:
                run.extra_work(step)  # --fault slow-rank
            t_call = time.perf_counter()
            loss = run.model(x, y) / ga
            if run.grad_ready is not None:  # DDP's buffer broadcast before its module's forward
                st.add_comm_wait(max(run.grad_ready[1] - t_call, 0.0))
            if faults.item_sync and faults.active(step):
                loss.item()  # --fault item-sync: the host waits for the loss
        with st.phase("backward"):
            (loss * ga if faults.no_ga_scale else loss).backward()  # --fault no-ga-scale: the bug
        if run.grad_ready is not None and micro == ga - 1:  # the gradient all-reduce's wait
            st.add_comm_wait(max(time.perf_counter() - run.grad_ready[0], 0.0))
    return loss


def train_step(run: TrainRun, step: int) -> dict:
    """Run optimizer step ``step`` (grad_accum micro-steps, clipping, AdamW, schedule) under the
    monitor, evaluating when ``--eval-every`` says so; return the step's metrics record."""
    import torch
    import torch.distributed as dist

    from trainperf.train import parallel

    cfg, ga = run.cfg, run.layout.grad_accum
    with run.mon.step(step, tokens=run.tokens_per_step) as st:
        loss_sum = torch.zeros((), device=run.device)
        for micro in range(ga):
            x, y = next(run.batches)
            st.add_data_wait(run.batches.wait_s)
            loss_sum += forward_backward(run, x, y, micro, step, st).detach()
        with st.phase("optimizer"):
            grad_norm = parallel.clip_grad_norm(run.params, cfg.grad_clip)
            lr = run.optimizer.param_groups[0]["lr"]  # the rate this step used
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.scheduler.step()
        run.data_position += run.layout.mbs * ga
        if run.world > 1:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            loss_sum /= run.world
        st.loss = loss_sum
        st.extra = {"lr": lr, "grad_norm": float(grad_norm), **({"fault": 1} if run.faults.active(step) else {})}
        if cfg.gc_every and step % cfg.gc_every == 0:
            gc.collect(1)  # the same step on every rank: they pause together, none waits for another's collection
        if _collects(run.faults, step, run.rank):
            gc.collect()  # --fault gc-collect: a full collection, as a script's per-step cleanup does
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            with st.aside("eval"):
                st.extra["eval_loss"] = evaluate(run)
    return run.mon.records[-1]


def _collects(faults, step: int, rank: int) -> bool:
    """Whether --fault gc-collect calls gc.collect() on this rank at the end of optimizer step ``step``."""
    return (bool(faults.gc_collect_every) and faults.active(step) and step % faults.gc_collect_every == 0
            and faults.gc_collect_rank in (None, rank))


def evaluate(run: TrainRun) -> float:
    """Return the mean loss over the fixed held-out batches (all ranks), without training on them."""
    import torch
    import torch.distributed as dist

    total = torch.zeros((), device=run.device)
    with torch.no_grad(), torch.autocast(run.device_type, dtype=run.autocast or torch.float32,
                                         enabled=run.autocast is not None):
        for x, y in run.held_out:
            total += run.model(x, y).float()
    total /= len(run.held_out)
    if run.world > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total /= run.world
    return float(total)


def after_step(run: TrainRun, step: int, record: dict) -> None:
    """The work between steps: profiler schedule, checkpoints (async or --fault sync-ckpt), progress."""
    cfg, faults = run.cfg, run.faults
    run.profiler.step()
    run.ckpt.poll()
    if (cfg.ckpt_every and (step % cfg.ckpt_every == 0 or step == cfg.steps)) or \
            (faults.sync_ckpt_every and faults.active(step) and step % faults.sync_ckpt_every == 0):
        with run.mon.checkpoint(step):
            run.ckpt.save(step, run.model, run.optimizer,
                          {"lr_scheduler": run.scheduler.state_dict(), "data_position": run.data_position})
    if run.progress is not None:
        log_every = cfg.log_every or max(1, cfg.steps // 10)
        run.progress.update(record, log=(step % log_every == 0 or step == cfg.steps))


def finish(run: TrainRun) -> dict:
    """Drain the last checkpoint, summarise, record (store + run_record.json), write summary.json
    and report.html (rank 0); return the run summary."""
    from trainperf.monitor.metadata import cpu_contention, cpu_load
    from trainperf.monitor.record import build_run_record, save_run_record
    from trainperf.train.predict import predict_step

    cfg, mon = run.cfg, run.mon
    if run.ckpt.in_flight:
        with mon.checkpoint(cfg.steps):  # the loop waits for the last async save to commit
            run.ckpt.wait()
    if run.progress is not None:
        run.progress.close()
    mon.gather_ranks()  # every rank's host and median busy s (a collective): the summary's "ranks"
    summary = mon.summary()
    mon.close()
    n_steps = cfg.steps - run.start_step
    evals = [r["eval_loss"] for r in mon.records if r.get("eval_loss") is not None]
    result = {"run_dir": str(run.out), "model": run.spec.name, "layout": run.layout.to_string(),
              "strategy": run.dims.strategy, "world_size": run.world, "device": run.device_type, "steps_run": n_steps,
              "resumed_from": run.resumed_from, "peak_flops": run.peak, "peak_source": run.peak_source,
              **summary.to_dict(), "final_eval_loss": evals[-1] if evals else None}
    if run.device_type == "cpu" and (load := cpu_load()) is not None:  # CPU timings move with the load beside them
        result["cpu_load"] = load
        result["contention_note"] = cpu_contention(load["load_1min"], load["cpus"], load["threads"])
    result["predicted"] = predict_step(run.spec, run.layout, run.world, run.accel, summary, stack=trainer_stack(cfg))
    if run.rank == 0:
        if cfg.record and n_steps > 0:
            record = build_run_record(mon, summary, run.metadata, job=cfg.job, model=run.spec.name,
                                      layout=run.layout.to_string(), peak_source=run.peak_source,
                                      config={"steps": cfg.steps, "compile": cfg.compile, "kernels": cfg.kernels,
                                              "faults": cfg.faults, "fault_steps": cfg.fault_steps,
                                              "seq_len": run.spec.seq_len, "device": run.device_type,
                                              "strategy": run.dims.strategy, "resumed_from": run.resumed_from,
                                              "comparable": run.comparable, "final_eval_loss": result["final_eval_loss"],
                                              "eval": [[r["step"], r["eval_loss"]] for r in mon.records
                                                       if r.get("eval_loss") is not None]})
            result["record_store"], result["record_note"] = save_run_record(record, run.out, cfg.store)
        atomic_write_text(run.out / "summary.json", json.dumps(result, indent=1, default=str))
        from trainperf.train.report import write_report

        write_report(run.out, result)
    return result


@contextmanager
def scheduled_collection(every: int) -> Iterator[None]:
    """With ``every`` > 0, Python's garbage collector as torchtitan runs it (tools/utils.py GarbageCollection):
    automatic collection off inside the block, what start-up made collected once and frozen out of every later
    collection (gc.freeze), the loop collecting the young generations itself every ``every`` steps (train_step).
    Automatic collection starts on whichever rank crosses an allocation threshold first, and a full one walks every
    object start-up left: a pause on one rank the others wait for at the next collective (diagnose's gc_stall).
    Restored after the block; nothing changes with ``every`` 0."""
    if not every:
        yield
        return
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def train(cfg: TrainConfig) -> dict:
    """Train ``cfg.model`` for ``cfg.steps`` optimizer steps; return the run summary (rank 0's view).

    ``setup``, then ``train_step`` and ``after_step`` per step, then ``finish``. Writes into
    ``cfg.out``: metrics.jsonl (one object per step), events.jsonl, run.json (config, metadata,
    comparability), summary.json, report.html, traces/, checkpoints/, run_record.json.
    """
    import torch.distributed as dist

    try:
        run = setup(cfg)
        with run.profiler, scheduled_collection(cfg.gc_every):
            for step in range(run.start_step + 1, cfg.steps + 1):
                after_step(run, step, train_step(run, step))
        return finish(run)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class _Progress:
    """Rank 0's live view: a rich progress bar with loss, tokens/s and MFU."""

    def __init__(self, cfg: TrainConfig, rank: int, start_step: int):
        self.enabled = cfg.progress
        self.bar = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            TextColumn("{task.description}"), console=self.console, transient=True)
        self.task = self.bar.add_task("", total=cfg.steps, completed=start_step)
        self.bar.start()

    def update(self, rec: dict, log: bool) -> None:
        if not self.enabled:
            return
        mfu = f"{rec['mfu'] * 100:.1f}%" if rec.get("mfu") is not None else "-"
        text = (f"step {rec['step']:>5}  loss {rec['loss']:.4f}  {rec['step_time_s'] * 1e3:8.1f} ms  "
                f"{rec['tokens_per_s']:>10.0f} tok/s  MFU {mfu}")
        self.bar.update(self.task, completed=rec["step"], description=f"loss {rec['loss']:.3f}")
        if log:
            self.bar.console.print(text, highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
