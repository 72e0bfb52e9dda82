"""Shared by the trainer tests: read a run folder's per-step losses."""

import json
from pathlib import Path


def losses_by_step(run_dir: Path) -> list[float]:
    """Return the loss of each optimizer step in ``run_dir/metrics.jsonl`` (a resumed step's last line wins)."""
    latest = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        latest[r["step"]] = r["loss"]
    return [latest[k] for k in sorted(latest)]
