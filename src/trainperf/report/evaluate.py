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


VERDICTS = ("right", "right vs twin", "wrong")


def write_report(doc: dict, path: str | Path) -> Path:
    """Write the self-contained HTML report of an evaluation (the JSON `trainperf evaluate --json` prints: scores and
    cases with top_kind, top1, top1_vs_twin) to path; return the path."""
    sick = [c for c in doc["cases"] if c["kind"] != "healthy"]
    rep = Report("trainperf evaluate", f"{doc['n_cases']} cases ({doc['n_healthy']} healthy); findings of at least "
                                       f"{doc['min_severity']} severity count")
    _add_scores(rep, doc, len(sick))
    _add_top_findings(rep, doc, sick)
    _add_whatif(rep, sick)
    _add_severity(rep, doc)
    rep.add("Cases", table([[c["name"], c["kind"], c["severity"], _pct(c["true_gain_pct"]), _finding(_top(c)),
                             _pct(c["labeled_gain_pct"]), _pct(c["labeled_gain_alone_pct"]), _verdict(c)]
                            for c in sick],
                           ["case", "labeled kind", "severity", "true gain %", "top finding",
                            "labeled kind's gain %", "its gain alone %", "top-1"]))
    healthy = [c for c in doc["cases"] if c["kind"] == "healthy"]
    if healthy:
        rep.add("Healthy cases (every finding is a false one)",
                table([[c["name"], "; ".join(_finding(f) for f in c["findings"]) or "none"] for c in healthy],
                      ["case", "findings"]))
    return rep.write(path)


def _add_scores(rep: Report, doc: dict, n_sick: int) -> None:
    """The headline figures, then precision and recall per kind (chart and table)."""
    kinds, false = doc["kinds"], doc["healthy_false_findings"]
    rep.add("Scores",
            paragraph(f"top finding names the labeled kind: {_share(doc['top1_accuracy'])} of {n_sick} cases; "
                      f"{_share(doc.get('top1_accuracy_vs_twin'))} among the kinds the case's untouched twin does not "
                      f"show (a base's own cost, found on its twin, can outrank a smaller injected fault). "
                      f"False findings on healthy cases: high {false['high']}, medium {false['medium']}, "
                      f"low {false['low']}."),
            paragraph(f"what-if |predicted - true gain| over {doc['whatif_n']} cases whose labeled kind was found: "
                      f"median {_pct(doc['whatif_median_abs_error_pct'])} pp, max "
                      f"{_pct(doc['whatif_max_abs_error_pct'])} pp; the fix priced alone, as the truth is: median "
                      f"{_pct(doc.get('whatif_alone_median_abs_error_pct'))} pp, max "
                      f"{_pct(doc.get('whatif_alone_max_abs_error_pct'))} pp; less what the same kind's fix gains on "
                      f"the base's untouched twin: median "
                      f"{_pct(doc.get('whatif_beyond_twin_median_abs_error_pct'))} pp, max "
                      f"{_pct(doc.get('whatif_beyond_twin_max_abs_error_pct'))} pp."),
            grouped_bar_chart(list(kinds), {"precision": [v["precision"] for v in kinds.values()],
                                            "recall": [v["recall"] for v in kinds.values()],
                                            "precision vs twin": [v.get("precision_vs_twin") for v in kinds.values()]},
                              "share of cases", value_range=(0.0, 1.05)),
            table([[k, _share(v["precision"]), _share(v["recall"]), _share(v["f1"]), v["n"], v["tp"], v["fp"], v["fn"],
                    _share(v.get("precision_vs_twin"))] for k, v in kinds.items()],
                  ["kind", "precision", "recall", "F1", "n", "TP", "FP", "FN", "precision vs twin"]),
            paragraph("precision vs twin: a base's own finding (its untouched twin shows it) is counted false once, on "
                      "the twin, not again on every case injected into that base.", "note"))


def _verdict_counts(sick: list[dict], field: str, values: list[str]) -> dict[str, list[int]]:
    """verdict -> cases per value of the cases' field (their labeled kind, their base), in the order of values."""
    return {v: [sum(1 for c in sick if c[field] == x and _verdict(c) == v) for x in values] for v in VERDICTS}


def _add_top_findings(rep: Report, doc: dict, sick: list[dict]) -> None:
    """Each labeled kind's and each base's cases by their top finding."""
    labeled = sorted({c["kind"] for c in sick})
    misses = doc.get("top1_misses", {})
    rep.add("Top finding per labeled kind",
            stacked_bar_chart(labeled, _verdict_counts(sick, "kind", labeled), axis_title="cases"),
            table([[k, ", ".join(f"{got} {n}" for got, n in sorted(misses[k].items(), key=lambda x: -x[1]))]
                   for k in sorted(misses)], ["labeled kind", "ranked first instead (cases)"]),
            paragraph("right vs twin: a kind the untouched twin also shows (the base's own cost) ranked first; the "
                      "labeled kind is the first of the rest.", "note"))
    by_base = doc.get("top1_by_base", {})
    if by_base:
        bases = list(by_base)
        rep.add("Top finding per base trace (a base's own costs stay in every case injected into it)",
                stacked_bar_chart(bases, _verdict_counts(sick, "base", bases), axis_title="cases"),
                table([[b or "(none)", v["n"], _share(v["top1_accuracy"]), _share(v["top1_accuracy_vs_twin"])]
                       for b, v in by_base.items()], ["base", "cases", "top-1", "top-1 vs twin"]))


def _add_whatif(rep: Report, sick: list[dict]) -> None:
    """The predicted gain of the labeled kind's fix alone against the true gain, a point per case found."""
    found = [c for c in sick if c["labeled_gain_pct"] is not None]
    by_kind = {k: [c for c in found if c["kind"] == k] for k in sorted({c["kind"] for c in sick})}
    rep.add("What-if: predicted against true gain",
            scatter_chart({k: Points(xs=[c["true_gain_pct"] for c in cs], ys=[c["labeled_gain_alone_pct"] for c in cs],
                                     texts=[f"{c['name']}: reported {_pct(c['labeled_gain_pct'])} %" for c in cs])
                           for k, cs in by_kind.items()},
                          "true gain (% of step time)", "predicted gain of the fix alone (% of step time)",
                          diagonal=True),
            paragraph("Each point is a case whose labeled kind was found: its truth is the step time of the untouched "
                      "trace, the fault alone; the prediction is the gain of that kind's fix priced alone. The "
                      "reported gain (in the hover) is what the fix adds after the fixes ranked before it.", "note"))


def _add_severity(rep: Report, doc: dict) -> None:
    """The severity each labeled kind was found at against its label."""
    conf = doc.get("severity_confusion", {})
    if not conf:
        return
    found_at = list(next(iter(conf.values())))
    rep.add("Severity: as labeled (rows) against as found (columns)",
            table([[sev, *(row[g] for g in found_at)] for sev, row in conf.items()], ["labeled", *found_at]),
            paragraph(f"the labeled kind's finding has the labeled severity in {_share(doc.get('severity_agreement'))} "
                      f"of the cases it was found in; a finding whose gain is only an upper bound is rated one level "
                      f"lower than its gain alone would rate it.", "note"))
