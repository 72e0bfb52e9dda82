"""Build the labeled diagnosis corpus (issue 9) from the HTA test traces: `make corpus`.

Usage: python benchmarks/build_corpus.py [OUT] [--hta DIR] [--bases a,b] [--kinds a,b] [--no-real]
Writes OUT/<case>/{traces/rank<R>.json.gz, labels.json} and OUT/manifest.json; deterministic.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.corpus.build import build_corpus, default_bases
from trainperf.corpus.inject import INJECTORS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="corpus")
    ap.add_argument("--hta", default=str(Path(__file__).resolve().parents[1] / "../shared/data/traces/hta"))
    ap.add_argument("--bases", default="", help="comma-separated base names (default: all)")
    ap.add_argument("--kinds", default=",".join(INJECTORS))
    ap.add_argument("--severities", default="low,medium,high")
    ap.add_argument("--no-real", action="store_true", help="skip the real trainer runs (2 ranks, gloo, ~1 min each)")
    a = ap.parse_args()
    bases = default_bases(a.hta)
    if a.bases:
        keep = set(a.bases.split(","))
        bases = [b for b in bases if b.name in keep]
    t = time.perf_counter()
    labels = build_corpus(a.out, bases, kinds=tuple(a.kinds.split(",")),
                          severities=tuple(a.severities.split(",")),
                          log=lambda s: print(f"[{time.perf_counter() - t:7.1f} s] {s}", flush=True))
    if not a.no_real:
        from trainperf.corpus.real import build_real

        labels += build_real(a.out, Path(a.out) / "_runs",
                             log=lambda s: print(f"[{time.perf_counter() - t:7.1f} s] {s}", flush=True))
    atomic_write_text(Path(a.out) / "manifest.json", json.dumps(
        {"cases": len(labels), "build_seconds": round(time.perf_counter() - t, 1)}, indent=1))
    print(f"{len(labels)} cases in {a.out} ({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
