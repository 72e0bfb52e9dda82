"""Nsight Systems exports beside the Kineto traces they were written from: load time and diagnosis.

Each Kineto trace given is written as an nsys SQLite export by the export's schema (tests/trace/nsys_builder.py:
what nsys records, no Python frames) and both are loaded, each in a fresh process (imports excluded, CPU seconds by
`time.process_time`, median of --repeat runs, the formats interleaved), then diagnosed: the top findings side by
side. Kineto's float µs timestamps are rounded as HTA rounds them (window.times_us), an export's are exact ns: gains
may differ by that rounding alone.

    .venv/bin/python benchmarks/bench_nsys.py TRACE.json.gz ... [--repeat 3]
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
c0 = time.process_time(); t = load_trace(sys.argv[1], workers=1)[0]; c1 = time.process_time()
print(c1 - c0, len(t))
'''


def load_seconds(path: Path) -> tuple[float, int]:
    """(CPU seconds, events) of one load of path in a fresh process."""
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True)
    sec, n = out.stdout.split()
    return float(sec), int(n)


def top_findings(path: Path) -> list[str]:
    """The first three findings of diagnose, "kind severity gain%"."""
    from trainperf.diagnose.api import diagnose

    return [f"{x.kind} {x.severity} {x.gain_pct:.1f}" for x in diagnose(path).findings[:3]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, trace in enumerate(args.traces):
            export = write_nsys([read_doc(trace)], Path(tmp) / f"t{i}.sqlite")
            times: dict[str, list[float]] = {"kineto": [], "nsys": []}
            for _ in range(args.repeat):
                for kind, path in (("kineto", trace), ("nsys", export)):
                    sec, n = load_seconds(path)
                    times[kind].append(sec)
                    rows_n = n if kind == "nsys" else None
            rows.append({"trace": str(trace), "events_nsys": rows_n, "mb_kineto_gz": trace.stat().st_size / 1e6,
                         "mb_nsys": export.stat().st_size / 1e6,
                         "load_s_kineto": statistics.median(times["kineto"]),
                         "load_s_nsys": statistics.median(times["nsys"]),
                         "findings_kineto": top_findings(trace), "findings_nsys": top_findings(export)})
            print(json.dumps(rows[-1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
