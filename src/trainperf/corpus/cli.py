"""The `evaluate` verb: score diagnose on a labeled corpus (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add this verb's command to app."""

    @app.command("evaluate")
    def evaluate_cmd(
        corpus: Path = typer.Argument(..., help="Corpus folder (`make corpus`): one sub-folder per case with "
                                                "labels.json and traces/."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Write the scores (and per-case findings) here."),
        min_severity: str = typer.Option("low", "--min-severity",
                                         help="Lowest finding severity that counts as a prediction: "
                                              "low, medium, high."),
    ) -> None:
        """Score diagnose's findings on a labeled corpus: per-kind precision/recall/F1, top-1, false
        findings on healthy cases, what-if error."""
        import json

        from rich.console import Console

        from trainperf.atomic import atomic_write_text
        from trainperf.corpus.evaluate import run_cases, score
        from trainperf.corpus.report import print_scores

        score([], min_severity)  # a bad --min-severity fails before the (long) diagnosing
        results = run_cases(corpus, progress=True)
        scores = score(results, min_severity)
        print_scores(scores, Console())
        if json_out:
            cases = [{"name": r.name, "kind": r.kind, "ranks": r.ranks, "true_gain_pct": r.true_gain_pct,
                      "severity": r.severity, "base": r.base, "findings": r.findings, "seconds": round(r.seconds, 2)}
                     for r in results]
            atomic_write_text(json_out, json.dumps({**scores, "cases": cases}, indent=1))
