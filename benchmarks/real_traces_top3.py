"""The top 3 findings of `trainperf diagnose` on every real trace folder at hand, to see what a change moves.

The labeled corpus scores the rules on injected faults; this sweep is the check on traces nobody labeled: HTA's
test traces (../shared/data/traces/hta, each leaf folder one job) and the real H200 fault runs
(tests/data/h200_faults/*/traces). Save the sweep before a change, run it again after, and read the folders whose
top 3 (kind, severity, gain rounded to 0.1 %) moved:

    .venv/bin/python benchmarks/real_traces_top3.py --save /tmp/top3_before.json
    .venv/bin/python benchmarks/real_traces_top3.py --against /tmp/top3_before.json

A folder whose traces diagnose refuses shows its one-line error in place of findings.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from rich.console import Console
from rich.progress import track

from trainperf.atomic import atomic_write_text
from trainperf.diagnose.api import diagnose
from trainperf.errors import TrainperfError

ROOT = Path(__file__).resolve().parent.parent
HTA_TRACES = ROOT.parent / "shared" / "data" / "traces" / "hta"
H200_CASES = ROOT / "tests" / "data" / "h200_faults"
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def real_trace_folders() -> list[Path]:
    """Every folder holding trace files directly: HTA's leaf folders (when ../shared/data is here), then the H200 runs."""
    hta = sorted({p.parent for p in HTA_TRACES.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)}) \
        if HTA_TRACES.is_dir() else []
    return hta + sorted(H200_CASES.glob("*/traces"))


def top3(folder: Path) -> list[str]:
    """The first three findings of the folder's diagnosis as "kind severity gain%", or its one-line error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = diagnose(folder).findings[:3]
    except TrainperfError as e:
        return [f"error: {str(e).splitlines()[0]}"]
    return [f"{f.kind} {f.severity} {f.gain_pct:.1f}" for f in found]


def label(folder: Path) -> str:
    """The folder's name relative to the data root it came from."""
    for root in (HTA_TRACES, H200_CASES):
        if folder.is_relative_to(root):
            return f"{root.name}/{folder.relative_to(root)}"
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="write {folder: top 3} as JSON")
    ap.add_argument("--against", type=Path, help="a saved sweep: list only the folders whose top 3 changed")
    args = ap.parse_args(argv)
    before = json.loads(args.against.read_text()) if args.against else None
    sweep = {label(d): top3(d) for d in track(real_trace_folders(), description="diagnosing", transient=True)}
    out = Console(soft_wrap=True)
    changed = 0
    for name, now in sweep.items():
        was = before.get(name) if before is not None else None
        if before is not None and was == now:
            continue
        changed += before is not None
        out.print(f"[bold]{name}[/]: " + " | ".join(now) + (f"\n   was: {' | '.join(was or ['-'])}" if before else ""))
    if before is not None:
        out.print(f"{changed} of {len(sweep)} folders changed")
    if args.save:
        atomic_write_text(args.save, json.dumps(sweep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
