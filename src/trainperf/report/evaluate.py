"""HTML report of `trainperf evaluate`: per-kind precision and recall, each case's top finding, predicted against true
gains, from the evaluation's JSON (corpus.evaluate.score's scores with the cases and their outcomes)."""

from __future__ import annotations

from pathlib import Path

from trainperf.report.html import (Points, Report, grouped_bar_chart, paragraph, scatter_chart, stacked_bar_chart,
                                   table)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _finding(f: dict | None) -> str:
    return "none" if f is None else f"{f['kind']} ({f['severity']}, {_pct(f.get('gain_pct'))} %)"


def _top(case: dict) -> dict | None:
    """The case's top finding (the first of its kind top_kind: of at least the evaluation's severity floor)."""
    return next((f for f in case["findings"] if f["kind"] == case["top_kind"]), None)


def _verdict(case: dict) -> str:
    if case["top1"]:
        return "right"
    return "right vs twin" if case.get("top1_vs_twin") else "wrong"


def write_report(doc: dict, path: str | Path) -> Path:
    """Write the self-contained HTML report of an evaluation (the JSON `trainperf evaluate --json` prints: scores and
    cases with top_kind, top1, top1_vs_twin) to path; return the path."""
    kinds = doc["kinds"]
    cases = doc["cases"]
    sick = [c for c in cases if c["kind"] != "healthy"]
    healthy = [c for c in cases if c["kind"] == "healthy"]
    false = doc["healthy_false_findings"]
    rep = Report("trainperf evaluate", f"{doc['n_cases']} cases ({doc['n_healthy']} healthy); findings of at least "
                                       f"{doc['min_severity']} severity count")
    rep.add("Scores",
            paragraph(f"top finding names the labeled kind: {_share(doc['top1_accuracy'])} of {len(sick)} cases; "
                      f"{_share(doc.get('top1_accuracy_vs_twin'))} among the kinds the case's untouched twin does not "
                      f"show (a base's own cost, found on its twin, can outrank a smaller injected fault). "
                      f"False findings on healthy cases: high {false['high']}, medium {false['medium']}, "
                      f"low {false['low']}."),
            paragraph(f"what-if |predicted - true gain| over {doc['whatif_n']} cases whose labeled kind was found: "
                      f"median {_pct(doc['whatif_median_abs_error_pct'])} pp, max "
                      f"{_pct(doc['whatif_max_abs_error_pct'])} pp; the fix priced alone, as the truth is: median "
                      f"{_pct(doc.get('whatif_alone_median_abs_error_pct'))} pp, max "
                      f"{_pct(doc.get('whatif_alone_max_abs_error_pct'))} pp."),
            grouped_bar_chart(list(kinds), {"precision": [v["precision"] for v in kinds.values()],
                                            "recall": [v["recall"] for v in kinds.values()],
                                            "precision vs twin": [v.get("precision_vs_twin") for v in kinds.values()]},
                              "share of cases", value_range=(0.0, 1.05)),
            table([[k, _share(v["precision"]), _share(v["recall"]), _share(v["f1"]), v["n"], v["tp"], v["fp"], v["fn"],
                    _share(v.get("precision_vs_twin"))] for k, v in kinds.items()],
                  ["kind", "precision", "recall", "F1", "n", "TP", "FP", "FN", "precision vs twin"]),
            paragraph("precision vs twin: a base's own finding (its untouched twin shows it) is counted false once, on "
                      "the twin, not again on every case injected into that base.", "note"))
    labeled = sorted({c["kind"] for c in sick})
    verdicts = ("right", "right vs twin", "wrong")
    counts = {v: [sum(1 for c in sick if c["kind"] == k and _verdict(c) == v) for k in labeled] for v in verdicts}
    misses = doc.get("top1_misses", {})
    rep.add("Top finding per labeled kind",
            stacked_bar_chart(labeled, counts, axis_title="cases"),
            table([[k, ", ".join(f"{got} {n}" for got, n in sorted(misses[k].items(), key=lambda x: -x[1]))]
                   for k in sorted(misses)], ["labeled kind", "ranked first instead (cases)"]),
            paragraph("right vs twin: a kind the untouched twin also shows (the base's own cost) ranked first; the "
                      "labeled kind is the first of the rest.", "note"))
    by_base = doc.get("top1_by_base", {})
    if by_base:
        bases = list(by_base)
        rep.add("Top finding per base trace (a base's own costs stay in every case injected into it)",
                stacked_bar_chart(bases, {v: [sum(1 for c in sick if c["base"] == b and _verdict(c) == v)
                                              for b in bases] for v in verdicts}, axis_title="cases"),
                table([[b or "(none)", v["n"], _share(v["top1_accuracy"]), _share(v["top1_accuracy_vs_twin"])]
                       for b, v in by_base.items()], ["base", "cases", "top-1", "top-1 vs twin"]))
    found = [c for c in sick if c["labeled_gain_pct"] is not None]
    by_kind = {k: [c for c in found if c["kind"] == k] for k in labeled}
    rep.add("What-if: predicted against true gain",
            scatter_chart({k: Points(xs=[c["true_gain_pct"] for c in cs], ys=[c["labeled_gain_alone_pct"] for c in cs],
                                     texts=[f"{c['name']}: reported {_pct(c['labeled_gain_pct'])} %" for c in cs])
                           for k, cs in by_kind.items()},
                          "true gain (% of step time)", "predicted gain of the fix alone (% of step time)",
                          diagonal=True),
            paragraph("Each point is a case whose labeled kind was found: its truth is the step time of the untouched "
                      "trace, the fault alone; the prediction is the gain of that kind's fix priced alone. The "
                      "reported gain (in the hover) is what the fix adds after the fixes ranked before it.", "note"))
    conf = doc.get("severity_confusion", {})
    if conf:
        got = list(next(iter(conf.values())))
        rep.add("Severity: as labeled (rows) against as found (columns)",
                table([[labeled, *(row[g] for g in got)] for labeled, row in conf.items()], ["labeled", *got]),
                paragraph(f"the labeled kind's finding has the labeled severity in "
                          f"{_share(doc.get('severity_agreement'))} of the cases it was found in; a finding whose gain "
                          f"is only an upper bound is rated one level lower than its gain alone would rate it.",
                          "note"))
    rep.add("Cases", table([[c["name"], c["kind"], c["severity"], _pct(c["true_gain_pct"]), _finding(_top(c)),
                             _pct(c["labeled_gain_pct"]), _pct(c["labeled_gain_alone_pct"]), _verdict(c)]
                            for c in sick],
                           ["case", "labeled kind", "severity", "true gain %", "top finding",
                            "labeled kind's gain %", "its gain alone %", "top-1"]))
    if healthy:
        rep.add("Healthy cases (every finding is a false one)",
                table([[c["name"], "; ".join(_finding(f) for f in c["findings"]) or "none"] for c in healthy],
                      ["case", "findings"]))
    return rep.write(path)
