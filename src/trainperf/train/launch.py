"""Start a multi-process run: ``trainperf train --nproc N`` runs torchrun itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.train.trainer import TrainConfig


def torchrun_command(config_path: Path, nproc: int, max_restarts: int = 0) -> list[str]:
    """Return the torchrun command line that runs the worker on ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
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
    from trainperf.train.worker import ERROR_FILE

    (out / ERROR_FILE).unlink(missing_ok=True)
    run_env = dict(os.environ if env is None else env)
    run_env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(torchrun_command(path, nproc, max_restarts), env=run_env)
