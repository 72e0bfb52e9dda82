"""Build the labeled diagnosis corpus (issue 9) from the HTA test traces: `make corpus`.

Usage: python benchmarks/build_corpus.py [OUT] [--hta DIR] [--h200 DIR] [--bases a,b] [--kinds a,b] [--no-real]
    [--no-compound] [--seed-salt S] [--targets low=2.5,medium=8,high=30]
--seed-salt and --targets draw a fresh corpus: every injection placed anew and sized to other gains, so that
diagnose's thresholds (tuned on the default corpus) meet cases they were never chosen on.
Writes OUT/<case>/{traces/rank<R>.json.gz, labels.json} and OUT/manifest.json. The injected cases are
deterministic (same inputs, same bytes); the real runs' timings are measured, so they vary from build to build.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.corpus.build import TARGET_PCT, build_corpus, default_bases, h200_bases
from trainperf.corpus.compound import build_compound
from trainperf.corpus.inject import INJECTORS
from trainperf.corpus.real import REAL_BASES, build_real


def _targets(text: str) -> dict:
    """{severity: target gain %} from "low=2.5,medium=8,high=30"; exits with a one-line error on anything else."""
    out = dict(TARGET_PCT)
    for item in text.split(","):
        sev, _, value = item.partition("=")
        try:
            pct = float(value)
        except ValueError:
            pct = -1.0
        if sev not in TARGET_PCT or not 0 < pct < 100:
            raise SystemExit(f"build_corpus: --targets {text!r}: expected severity=percent with severities "
                             f"{', '.join(TARGET_PCT)} and 0 < percent < 100")
        out[sev] = pct
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="corpus")
    ap.add_argument("--hta", default=str(Path(__file__).resolve().parents[1] / "../shared/data/traces/hta"))
    ap.add_argument("--h200", default=str(Path(__file__).resolve().parents[1] / "tests/data/h200_faults"),
                    help="the H200 fault traces, whose healthy loops are bases too (corpus.build.h200_bases)")
    ap.add_argument("--bases", default="", help="comma-separated base names, HTA or real:... (default: all)")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (injected, real-run, healthy; default: all)")
    ap.add_argument("--severities", default="low,medium,high")
    ap.add_argument("--no-real", action="store_true", help="skip the real trainer runs (2 ranks, gloo, ~1 min each)")
    ap.add_argument("--no-compound", action="store_true",
                    help="skip the cases with two planted problems (corpus.compound; built unless --kinds is given)")
    ap.add_argument("--seed-salt", default="", help="prefix of every case's seed: another draw of the injections")
    ap.add_argument("--targets", default="", help="target gains per severity, e.g. low=2.5,medium=8,high=30 "
                    "(default: corpus.build.TARGET_PCT)")
    a = ap.parse_args()
    targets = _targets(a.targets) if a.targets else None
    bases, real = default_bases(a.hta) + h200_bases(a.h200), () if a.no_real else REAL_BASES
    if a.bases:
        keep = set(a.bases.split(","))
        unknown = keep - {b.name for b in bases} - {b.name for b in REAL_BASES}
        if unknown:
            raise SystemExit(f"build_corpus: unknown base(s) {', '.join(sorted(unknown))}")
        bases = [b for b in bases if b.name in keep]
        real = tuple(b for b in real if b.name in keep)
    t = time.perf_counter()

    def log(s: str) -> None:
        print(f"[{time.perf_counter() - t:7.1f} s] {s}", flush=True)

    kinds = tuple(k for k in a.kinds.split(",") if k)
    injected = tuple(k for k in kinds if k in INJECTORS) if kinds else tuple(INJECTORS)
    labels = []
    if bases and injected:
        labels += build_corpus(a.out, bases, kinds=injected, severities=tuple(a.severities.split(",")), log=log,
                               targets=targets, seed_salt=a.seed_salt)
        if not kinds and not a.no_compound:
            labels += build_compound(a.out, bases, log=log, seed_salt=a.seed_salt)
    if real:
        labels += build_real(a.out, Path(a.out) / "_runs", real, log=log, kinds=kinds)
    n_cases = sum(1 for _ in Path(a.out).glob("*/labels.json"))
    atomic_write_text(Path(a.out) / "manifest.json", json.dumps(
        {"cases": n_cases, "built_now": len(labels), "build_seconds": round(time.perf_counter() - t, 1)}, indent=1))
    print(f"{len(labels)} cases built in {a.out} ({n_cases} there in all, {time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
