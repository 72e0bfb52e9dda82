"""The `evaluate` verb: score diagnose on a labeled corpus (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainperf.cli_options import LegacyJsonFileCommand, json_option, json_out_option


def register(app: typer.Typer) -> None:
    """Add this verb's command to app."""

    @app.command("evaluate", cls=LegacyJsonFileCommand)
    def evaluate_cmd(
        corpus: Path = typer.Argument(..., help="Corpus folder (`make corpus`): one sub-folder per case with "
                                                "labels.json and traces/."),
        as_json: bool = json_option("the scores and per-case findings"),
        json_out: Optional[Path] = json_out_option("the scores and per-case findings"),
        min_severity: str = typer.Option("low", "--min-severity",
                                         help="Lowest finding severity that counts as a prediction: "
                                              "low, medium, high."),
        unprofiled: bool = typer.Option(False, "--unprofiled", help="Give diagnose each case's step time measured "
                                        "without the profiler (labels.json's faulty_step_ms) where it has one."),
        html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report: per-kind "
                                            "precision and recall, predicted against true gains, every case's top "
                                            "finding."),
    ) -> None:
        """Score diagnose's findings on a labeled corpus: per-kind precision/recall/F1, top-1, false
        findings on healthy cases, what-if error."""
        from rich.console import Console

        from trainperf.atomic import atomic_write_text, check_output_file
        from trainperf.cli_options import dumps, print_json
        from trainperf.corpus.evaluate import case_outcomes, run_cases, score
        from trainperf.corpus.report import print_scores

        score([], min_severity)  # a bad --min-severity or output path fails before the (long) diagnosing
        for option, out in (("--json-out", json_out), ("--html", html)):
            if out:
                check_output_file(out, option)
        results = run_cases(corpus, progress=not as_json, unprofiled=unprofiled)
        scores = score(results, min_severity)
        cases = [{"name": r.name, "kind": r.kind, "ranks": r.ranks, "true_gain_pct": r.true_gain_pct,
                  "severity": r.severity, "base": r.base, **o.to_json(), "findings": r.findings,
                  "seconds": round(r.seconds, 2)}
                 for r, o in zip(results, case_outcomes(results, min_severity))]
        if as_json:
            print_json({**scores, "cases": cases})
        else:
            print_scores(scores, Console())
        if json_out:
            atomic_write_text(json_out, dumps({**scores, "cases": cases}))
        if html:
            from trainperf.report.evaluate import write_report

            write_report({**scores, "cases": cases}, html)
