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
        print(f"error: {e}", file=sys.stderr)
        if os.environ.get("RANK", "0") == "0":  # the launcher reports it as one line
            from trainperf.atomic import atomic_write_text

            atomic_write_text(Path(cfg.out) / ERROR_FILE, str(e))
        return 2
    return 0


ERROR_FILE = "last_error.txt"


if __name__ == "__main__":  # the guard DCP's process-based async save needs
    sys.exit(main(sys.argv[1:]))
