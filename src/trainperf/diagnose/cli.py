"""Commands of the `diagnose` verb (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainperf.cli_options import LegacyJsonFileCommand, given, json_option, json_out_option, older_name


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""

    @app.command("diagnose", cls=LegacyJsonFileCommand)
    def diagnose_cmd(
        path: Path = typer.Argument(..., help="A trace (Kineto .json/.json.gz, rocprofv3, JAX .xplane.pb, nsys "
                                               "SQLite export) or a folder of them, one per rank."),
        rank: Optional[int] = typer.Option(None, "--rank", min=0, help="Show only this rank."),
        steps: Optional[str] = typer.Option(None, "--step-window", help="Profiler steps A:B (inclusive) to analyse."),
        steps_older: Optional[str] = older_name("--steps", "--step-window"),
        as_json: bool = json_option(),
        json_out: Optional[Path] = json_out_option(),
        top: int = typer.Option(5, "--top", min=1, help="Number of findings to print (JSON and --html keep all)."),
        html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
        perfetto: Optional[Path] = typer.Option(None, "--perfetto", help="Write every rank's trace, clocks aligned, "
                                                "with the findings as annotated slices, as one Perfetto JSON (.gz ok)."),
        modules: bool = typer.Option(False, "--modules", help="Also show GPU time per nn.Module (needs a trace "
                                     "recorded with with_stack=True; CPU op time on CPU-only traces)."),
        unprofiled_step_ms: Optional[float] = typer.Option(
            None, "--unprofiled-step-ms", min=0.0,
            help="The step time measured without the profiler (ms; trainperf monitor's, a training log's): the "
                 "profiler's overhead is taken off the host and every gain priced on that host."),
    ) -> None:
        """Find the bottleneck in profiler traces: per-rank breakdown, findings with evidence and gain."""
        from rich.console import Console

        from trainperf.atomic import atomic_write_text, check_output_file
        from trainperf.cli_options import dumps, print_json
        from trainperf.diagnose.api import diagnose
        from trainperf.diagnose.render import print_summary

        for option, out in (("--json-out", json_out), ("--html", html), ("--perfetto", perfetto)):
            if out:  # unusable output paths are refused before the traces are read
                check_output_file(out, option)
        # --top limits the print only; the progress bar (on stdout) stays out of the JSON
        result = diagnose(path, rank=rank, steps=given(steps, steps_older), top=10_000, progress=not as_json,
                          modules="type" if modules else None, unprofiled_step_ms=unprofiled_step_ms)
        if as_json:
            print_json(result.to_json())
        else:
            print_summary(result, Console(), top)
            if modules:
                from trainperf.diagnose.modules_render import print_modules

                print_modules(result.modules, Console())
        if json_out:
            atomic_write_text(json_out, dumps(result.to_json()))
        if html:
            from trainperf.report.diagnose import write_report

            write_report(result, html)
        if perfetto:
            from trainperf.diagnose.perfetto import write_job_timeline

            write_job_timeline(perfetto, result)
