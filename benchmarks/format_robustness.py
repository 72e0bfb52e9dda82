"""Do diagnose's findings depend on the trace's format? The labeled corpus rewritten as other set-ups write it.

Each variant of trainperf.corpus.formats (ROCm names, no flow events, no operator ids, no distributedInfo, ranks'
clocks apart, no Python stack, PyTorch 1.8 categories, no ProfilerSteps, host spans as begin/end pairs, copies'
bandwidth written as Infinity) rewrites every case's traces and changes no time stamp but
by a constant per rank, so the right diagnosis is the same. The script scores `trainperf evaluate`'s figures on
each rewritten corpus beside the untouched one, in the same run, and lists every case whose top finding changed.

    .venv/bin/python benchmarks/format_robustness.py corpus --json /tmp/formats.json
    .venv/bin/python benchmarks/format_robustness.py corpus --variants rocm,clock_skew --keep /tmp/fmt

Cases are rewritten into a temporary folder (or --keep DIR); the corpus is not touched.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

from trainperf.atomic import atomic_write_text
from trainperf.corpus.evaluate import case_folders, run_cases, score
from trainperf.corpus.formats import VARIANTS
from trainperf.corpus.kineto import read_events
from trainperf.trace.load import rank_from_name


def rewrite_corpus(corpus: Path, out: Path, variant: str) -> Path:
    """Copy of the corpus under out/variant with every trace rewritten by the variant; returns that folder."""
    fn = VARIANTS[variant]
    dest = out / variant
    for case in track(case_folders(corpus), description=f"rewriting ({variant})"):
        traces = case / "traces"
        (dest / case.name / "traces").mkdir(parents=True, exist_ok=True)
        shutil.copy2(case / "labels.json", dest / case.name / "labels.json")
        for f in sorted(traces.iterdir()):
            if not f.name.endswith((".json", ".json.gz")):
                continue
            rank = rank_from_name(f) or 0
            # plain JSON: gzip costs more than the diagnosing of most cases, and the loader reads both
            name = f.name[:-3] if f.name.endswith(".gz") else f.name
            atomic_write_text(dest / case.name / "traces" / name, json.dumps(fn(read_events(f), rank)))
    return dest


def top1(case: dict) -> str:
    """The top finding's kind of a scored case ('-' when none)."""
    return case["findings"][0]["kind"] if case["findings"] else "-"


def summarise(scores: dict) -> dict:
    """The figures compared across variants: top-1, mean F1 over labeled kinds, healthy false findings."""
    kinds = scores["kinds"]
    return {"top1": scores["top1_accuracy"],
            "mean_f1": round(sum(k["f1"] for k in kinds.values()) / len(kinds), 4) if kinds else 0.0,
            "healthy_high_medium": scores["healthy_false_findings"]["high"]
            + scores["healthy_false_findings"]["medium"],
            "whatif_median": scores["whatif_median_abs_error_pct"]}


def scored(folder: Path) -> tuple[dict, dict[str, dict]]:
    """evaluate's scores and its per-case results (by name) on one corpus folder."""
    results = run_cases(folder, progress=True)
    cases = {r.name: {"kind": r.kind, "findings": r.findings} for r in results}
    return score(results), cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--keep", type=Path, help="write the rewritten corpora here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write the figures and the changed cases here")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    out = a.keep or Path(tempfile.mkdtemp(prefix="trainperf-formats-"))
    base_scores, base_cases = scored(a.corpus)
    rows = {"untouched": {**summarise(base_scores), "changed_top1": []}}
    for v in variants:
        folder = rewrite_corpus(a.corpus, out, v)
        s, cases = scored(folder)
        changed = [{"case": n, "label": c["kind"], "untouched": top1(base_cases[n]), "variant": top1(c)}
                   for n, c in cases.items() if top1(c) != top1(base_cases[n])]
        rows[v] = {**summarise(s), "changed_top1": changed}
        if not a.keep:
            shutil.rmtree(folder)
    table = Table(title=f"diagnose on {a.corpus} rewritten in other formats ({len(base_cases)} cases)")
    for col in ("variant", "top-1", "mean F1", "healthy high+medium", "what-if median pp", "top finding changed"):
        table.add_column(col)
    def figure(x, digits: int) -> str:  # "-" where a corpus has no case to score it on (healthy cases only)
        return "-" if x is None else f"{x:.{digits}f}"

    for v, r in rows.items():
        table.add_row(v, figure(r["top1"], 3), figure(r["mean_f1"], 3), str(r["healthy_high_medium"]),
                      figure(r["whatif_median"], 2), str(len(r["changed_top1"])))
    Console().print(table)
    for v, r in rows.items():
        for c in r["changed_top1"]:
            print(f"{v}: {c['case']} (label {c['label']}): {c['untouched']} -> {c['variant']}")
    if a.json:
        atomic_write_text(a.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
