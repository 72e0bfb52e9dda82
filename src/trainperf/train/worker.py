"""The torchrun entry point: ``python -m trainperf.train.worker CONFIG.json`` on every rank."""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Run ``train`` with the TrainConfig stored in ``argv[0]``; return the exit code."""
    from trainperf.errors import TrainperfError
    from trainperf.train.trainer import TrainConfig, train

    import os

    cfg = TrainConfig.from_json(Path(argv[0]).read_text())
    try:
        train(cfg)
    except TrainperfError as e:
        rank = os.environ.get("RANK", "0")
        if rank == "0":
            from trainperf.atomic import atomic_write_text

            atomic_write_text(Path(cfg.out) / ERROR_FILE, str(e))
        # `trainperf train` prints rank 0's error itself (one line); under a torchrun of your own,
        # every rank says its error
        if rank != "0" or not os.environ.get(LAUNCHER_REPORTS_ENV):
            print(f"error (rank {rank}): {e}", file=sys.stderr)
        return 2
    return 0


ERROR_FILE = "last_error.txt"
LAUNCHER_REPORTS_ENV = "TRAINPERF_LAUNCHER_REPORTS_ERRORS"  # set by launch.launch


if __name__ == "__main__":  # the guard DCP's process-based async save needs
    sys.exit(main(sys.argv[1:]))
