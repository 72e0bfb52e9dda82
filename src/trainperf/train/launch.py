"""Start a multi-process run: ``trainperf train --nproc N`` runs torchrun itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.train.trainer import TrainConfig


def torchrun_command(config_path: Path, nproc: int, max_restarts: int = 0) -> list[str]:
    """Return the torchrun command line that runs the worker on ``nproc`` local processes.

    It is torchrun's own ``run`` behind ``torchrun_main``, which leaves out torchrun's traceback
    when rank 0 recorded a user error (the launcher prints that error as one line).
    """
    return [sys.executable, "-m", "trainperf.train.launch", "--standalone", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "trainperf.train.worker", str(config_path)]


def last_error(cfg: TrainConfig) -> str | None:
    """Return the user error (TrainperfError) rank 0 reported in the last launch, or None."""
    from trainperf.train.worker import ERROR_FILE

    path = Path(cfg.out) / ERROR_FILE
    return path.read_text().strip() if path.is_file() else None


def launch(cfg: TrainConfig, nproc: int, max_restarts: int = 0, env: dict | None = None) -> int:
    """Write the config into the run folder and run torchrun on it; return torchrun's exit code.

    The config lives in ``<out>/train_config.json`` so that a relaunch (by hand, by torchrun's
    ``--max-restarts`` or by a scheduler) finds everything it needs beside the checkpoints.
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(out / "train_config.json", cfg.to_json())
    from trainperf.train.worker import ERROR_FILE, LAUNCHER_REPORTS_ENV

    (out / ERROR_FILE).unlink(missing_ok=True)
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env[LAUNCHER_REPORTS_ENV] = "1"  # rank 0's user error is printed once, by the caller
    return subprocess.call(torchrun_command(path, nproc, max_restarts), env=run_env)


def finished_run(out: str | Path) -> tuple[Path, int | None] | None:
    """Return (the file that shows it, the step it reached) when ``out`` holds a finished run, else None.

    ``summary.json`` is written last, by rank 0, once every step ran; the step reached is the
    last line of ``metrics.jsonl`` (None when that file is missing or unreadable).
    """
    import json

    summary = Path(out) / "summary.json"
    if not summary.is_file():
        return None
    reached = None
    try:
        lines = (Path(out) / "metrics.jsonl").read_text().strip().splitlines()
        reached = int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    return summary, reached


def check_windows(cfg: TrainConfig) -> None:
    """Raise TrainperfError when ``--profile-steps`` or ``--fault-steps`` lies past the run's last step
    (``--steps``): the run would end without the trace or the fault asked for, and say nothing."""
    from trainperf.errors import TrainperfError
    from trainperf.monitor.profiler import parse_steps

    for option, text in (("--profile-steps", cfg.profile_steps), ("--fault-steps", cfg.fault_steps)):
        window = parse_steps(text)  # already checked for form by the command (A:B, 1 <= A <= B)
        if window and window[0] > cfg.steps:
            raise TrainperfError(f"{option} {text}: starts after the run's last step (--steps {cfg.steps})")
        if window and option == "--profile-steps" and window[1] > cfg.steps:  # a fault may run to the end
            raise TrainperfError(f"{option} {text}: ends after the run's last step (--steps {cfg.steps}): "
                                 f"the trace would hold fewer steps than its name says")


def preflight(cfg: TrainConfig, nproc: int) -> None:
    """Check everything a run needs that can be checked without starting it; raise TrainperfError.

    Runs before torchrun starts (a wrong layout otherwise surfaces once per rank around a
    torchrun traceback): the model, the device, the GPU name, the layout for ``nproc``
    processes, the training text (under torchrun), and that ``cfg.out`` does not hold a finished run this one would silently
    retrain (a second copy of its steps in metrics.jsonl, the first run counted as lost work).
    """
    from trainperf.errors import TrainperfError
    from trainperf.specs import load_model, parse_layout
    from trainperf.train.checkpoint import complete_checkpoints
    from trainperf.train.parallel import resolve_layout
    from trainperf.train.trainer import _device_type

    spec = load_model(cfg.model, seq_len=cfg.seq_len)
    device_type = _device_type(cfg.device)
    if cfg.gpu:
        from trainperf.hardware import get_accelerator

        get_accelerator(cfg.gpu)
    layout = parse_layout(cfg.layout or "", precision="bf16" if device_type == "cuda" else "fp32", zero=0)
    resolve_layout(layout, spec, nproc)
    check_windows(cfg)
    if cfg.record:  # the record is written when the run ends: an unusable --store would surface only then
        from trainperf.store.api import check_writable

        check_writable(cfg.store)
    if nproc > 1:  # one process finds a bad --text itself, at once; under torchrun every rank would
        from trainperf.train import data as data_mod

        data_mod.make_dataset(data_mod.DataConfig(cfg.text, cfg.synthetic, cfg.seed, cfg.num_workers),
                              spec.vocab, spec.seq_len)
    if (done := finished_run(cfg.out)) is None:
        return
    shown_by, reached = done
    ckpts = complete_checkpoints(Path(cfg.out) / "checkpoints")
    if ckpts and cfg.resume and cfg.steps > ckpts[-1][0]:
        return  # continues the finished run from its last checkpoint up to --steps
    at = f" at step {reached}" if reached is not None else ""
    if not ckpts:
        how = "pass another --out (it has no checkpoint to continue from)"
    else:
        how = (f"pass another --out, or {'--resume with ' if not cfg.resume else ''}--steps above "
               f"{ckpts[-1][0]} to continue it from its last checkpoint")
    raise TrainperfError(f"--out {cfg.out}: holds a run that finished{at} ({shown_by} exists); {how}")


def torchrun_main(argv: list[str]) -> int:
    """Run torchrun (``torch.distributed.run``) with ``argv``; return 1 without a traceback when the
    job failed on a user error rank 0 recorded beside the config (``worker.ERROR_FILE``).

    torchrun itself prints a ~40-line ChildFailedError traceback around the ranks' one-line
    error (issue 14); any other failure keeps that traceback, which then shows a bug.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from trainperf.train.worker import ERROR_FILE

    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError:
        if args.training_script_args and (Path(args.training_script_args[-1]).parent / ERROR_FILE).is_file():
            return 1
        raise
    return 0


if __name__ == "__main__":  # a guard DCP's process-based async save needs (see worker.py)
    sys.exit(torchrun_main(sys.argv[1:]))
