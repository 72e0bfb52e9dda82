"""Terminal view of an evaluation (the scores dict of corpus.evaluate.score)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _f(x, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if pct else f"{x:.2f}"


def print_scores(s: dict, console: Console) -> None:
    """Per-kind table, then top-1, healthy false findings and what-if error lines."""
    t = Table(title=f"diagnose on the corpus ({s['n_cases']} cases, {s['n_healthy']} healthy; "
                    f"findings >= {s['min_severity']})")
    for c in ("kind", "precision", "recall", "F1", "n", "TP", "FP", "FN", "precision vs twin"):
        t.add_column(c, justify="left" if c == "kind" else "right")
    for k, v in s["kinds"].items():
        t.add_row(k, _f(v["precision"]), _f(v["recall"]), _f(v["f1"]), str(v["n"]), str(v["tp"]), str(v["fp"]),
                  str(v["fn"]), _f(v.get("precision_vs_twin")))
    console.print(t)
    console.print("precision vs twin: a base's own finding (its untouched twin shows it) counted once, on the twin")
    console.print(f"top-1 accuracy: {_f(s['top1_accuracy'])} (among kinds the untouched twin does not show: "
                  f"{_f(s.get('top1_accuracy_vs_twin'))})")
    h = s["healthy_false_findings"]
    console.print(f"false findings on healthy cases: high {h['high']}, medium {h['medium']}, low {h['low']}")
    console.print(f"what-if |predicted - true gain| (pp, over {s['whatif_n']} detected cases): median "
                  f"{_f(s['whatif_median_abs_error_pct'], True)}, max {_f(s['whatif_max_abs_error_pct'], True)}; "
                  f"the fix priced alone, as the truth is: median {_f(s.get('whatif_alone_median_abs_error_pct'), True)}"
                  f", max {_f(s.get('whatif_alone_max_abs_error_pct'), True)}; less the twin's own gain of the kind: "
                  f"median {_f(s.get('whatif_beyond_twin_median_abs_error_pct'), True)}, "
                  f"max {_f(s.get('whatif_beyond_twin_max_abs_error_pct'), True)}")
    console.print(f"found at the labeled severity: {_f(s.get('severity_agreement'))} of the detected cases")
    if s["other_predicted_kinds"]:
        console.print("kinds found that no case is labeled with (cases): "
                      + ", ".join(f"{k} {n}" for k, n in s["other_predicted_kinds"].items()))
