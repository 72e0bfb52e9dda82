"""The labeled corpus read from Nsight Systems exports: does diagnose find the same faults when a job was profiled
with nsys instead of the PyTorch profiler?

Each case with GPU work is written as one nsys SQLite export (its ranks the processes of one report, as
`nsys profile torchrun` writes them; tests/trace/nsys_builder.py: what nsys records, so no Python frames, no
operators' input shapes, no flows), beside a copy of the untouched case, and both sets are scored with
`trainperf evaluate`'s scoring. Cases without device work (the CPU-only reference-trainer runs) have no nsys
export and are left out of both sets.

    .venv/bin/python benchmarks/nsys_corpus.py corpus [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from rich.progress import track

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "trace"))
sys.path.insert(0, str(REPO / "benchmarks"))
from format_robustness import scored, top1  # noqa: E402
from nsys_builder import read_doc, write_nsys  # noqa: E402

from trainperf.atomic import atomic_write_text  # noqa: E402
from trainperf.corpus.evaluate import case_folders  # noqa: E402
from trainperf.trace.load import rank_from_name  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def write_sets(corpus: Path, out: Path) -> tuple[Path, Path, int]:
    """(untouched subset, its nsys rewrite, cases left out): the cases with device work, copied and exported."""
    plain, nsys = out / "untouched", out / "nsys"
    left_out = 0
    for case in track(case_folders(corpus), description="writing nsys exports"):
        files = sorted(f for f in (case / "traces").iterdir() if f.name.endswith((".json", ".json.gz")))
        docs = [read_doc(f) for f in files]
        if not any(e.get("cat") in DEVICE_CATS for d in docs for e in d["traceEvents"]):
            left_out += 1
            continue
        shutil.copytree(case, plain / case.name)
        (nsys / case.name / "traces").mkdir(parents=True)
        shutil.copy2(case / "labels.json", nsys / case.name / "labels.json")
        ranks = [rank_from_name(f) or 0 for f in files]
        write_nsys(docs, nsys / case.name / "traces" / "job.sqlite", pids=[10_000 + r for r in ranks])
    return plain, nsys, left_out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--keep", type=Path, help="write both sets here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write the figures and the changed cases here")
    a = ap.parse_args(argv)
    out = a.keep or Path(tempfile.mkdtemp(prefix="trainperf-nsys-corpus-"))
    plain, nsys, left_out = write_sets(a.corpus, out)
    rows = {}
    cases = {}
    for name, folder in (("kineto", plain), ("nsys", nsys)):
        scores, cases[name] = scored(folder)
        rows[name] = {"top1": scores["top1_accuracy"], "healthy": scores["healthy_false_findings"],
                      "whatif_median": scores["whatif_median_abs_error_pct"],
                      "kinds": {k: {"precision": v["precision"], "recall": v["recall"], "n": v["n"]}
                                for k, v in scores["kinds"].items()}}
    changed = [{"case": n, "label": c["kind"], "kineto": top1(c), "nsys": top1(cases["nsys"][n])}
               for n, c in cases["kineto"].items() if top1(c) != top1(cases["nsys"][n])]
    result = {"cases": len(cases["kineto"]), "left_out_without_device_work": left_out, **rows, "changed": changed}
    print(json.dumps({k: v for k, v in result.items() if k != "changed"}, indent=1))
    for c in changed:
        print(f"{c['case']} (label {c['label']}): {c['kineto']} -> {c['nsys']}")
    if a.json:
        atomic_write_text(a.json, json.dumps(result, indent=1))
    if not a.keep:
        shutil.rmtree(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
