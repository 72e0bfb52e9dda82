"""Nsight Systems exports beside the Kineto traces they were written from: load time and diagnosis.

Each Kineto trace given (a file, or a folder of one file per rank: one report of one process per rank, as
`nsys profile torchrun` writes) is written as an nsys SQLite export by the export's schema
(tests/trace/nsys_builder.py: what nsys records, no Python frames) and both are loaded, each in a fresh process
(imports excluded, CPU seconds by `time.process_time`, median of --repeat runs, the formats interleaved), then
diagnosed: the top findings side by side. Kineto's float µs timestamps are rounded as HTA rounds them
(window.times_us), an export's are exact ns: gains may differ by that rounding alone. A trace whose export cannot be
diagnosed (no device work: nsys records none) is reported with its error.

    .venv/bin/python benchmarks/bench_nsys.py TRACE.json.gz|FOLDER ... [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "trace"))
from nsys_builder import read_doc, write_nsys  # noqa: E402

LOAD = r'''
import sys, time
from trainperf.trace.load import load_trace
c0 = time.process_time(); tables = load_trace(sys.argv[1], workers=1); c1 = time.process_time()
print(c1 - c0, sum(len(t) for t in tables.values()))
'''


def load_seconds(path: Path) -> tuple[float, int]:
    """(CPU seconds, events of all its ranks) of one load of path in a fresh process."""
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True)
    sec, n = out.stdout.split()
    return float(sec), int(n)


def top_findings(path: Path) -> list[str]:
    """The first three findings of diagnose, "kind severity gain%"."""
    from trainperf.diagnose.api import diagnose

    return [f"{x.kind} {x.severity} {x.gain_pct:.1f}" for x in diagnose(path).findings[:3]]


def main(argv: list[str] | None = None) -> int:
    from trainperf.errors import TrainperfError
    from trainperf.trace.load import trace_files

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for i, trace in enumerate(args.traces):
            row: dict = {"trace": str(trace)}
            try:
                files = [f for f in trace_files(trace) if f.name.endswith((".json", ".json.gz"))]
                row["ranks"] = len(files)
                export = write_nsys([read_doc(f) for f in files], Path(tmp) / f"t{i}.sqlite",
                                    pids=[10_000 + k for k in range(len(files))])
                row.update({"findings_kineto": top_findings(trace), "findings_nsys": top_findings(export)})
                times: dict[str, list[float]] = {"kineto": [], "nsys": []}
                for _ in range(args.repeat):
                    for kind, path in (("kineto", trace), ("nsys", export)):
                        times[kind].append(load_seconds(path)[0])
                row.update({"load_s_kineto": statistics.median(times["kineto"]),
                            "load_s_nsys": statistics.median(times["nsys"])})
            except (TrainperfError, ValueError) as e:
                row["error"] = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
