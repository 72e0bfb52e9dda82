"""The `diff` verb: compare a baseline and a candidate trace (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainperf.cli_options import LegacyJsonFileCommand, json_option, json_out_option


def register(app: typer.Typer) -> None:
    """Add the `diff` command to app."""

    @app.command("diff", cls=LegacyJsonFileCommand)
    def diff_cmd(
        baseline: Path = typer.Argument(..., help="Baseline: a Kineto trace or a folder with one file per rank."),
        candidate: Path = typer.Argument(..., help="Candidate: a Kineto trace or a folder with one file per rank."),
        as_json: bool = json_option(),
        json_out: Optional[Path] = json_out_option(),
        html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
        top: int = typer.Option(10, "--top", min=1, help="Kernels and operators to print (JSON keeps 30)."),
        findings: bool = typer.Option(True, "--findings/--no-findings",
                                      help="Also diagnose both sides and list findings that appear or disappear."),
    ) -> None:
        """What changed between two runs: step time, its decomposition, the kernels and operators that moved."""
        from rich.console import Console

        from trainperf.atomic import atomic_write_text, ensure_dir
        from trainperf.cli_options import dumps, print_json
        from trainperf.diagnose.diff import diff

        for out in (json_out, html):
            if out is not None:
                ensure_dir(Path(out).parent)  # an unusable output path fails now, not after the work
        result = diff(baseline, candidate, progress=not as_json, findings=findings)
        if as_json:
            print_json(result.to_json())
        else:
            print_diff(result, Console(), top)
        if json_out:
            atomic_write_text(json_out, dumps(result.to_json()))
        if html:
            from trainperf.report.diff import write_report

            write_report(result, html)


def print_diff(d, console, top: int = 10) -> None:
    """Terminal summary of a diagnose.diff.TraceDiff: step times, buckets, the names that moved most."""
    from rich.markup import escape
    from rich.table import Table

    from trainperf.diagnose.diff import memory_change_text, work_change_text
    from trainperf.diagnose.units import fmt_us

    j = d.to_json(top=top)
    console.print(f"[bold]{escape(j['headline'])}[/]", highlight=False)
    for side in ("baseline", "candidate"):
        s = j[side]
        lo, hi = s["step_time_interval_us"]
        console.print(f"{side:9s} {fmt_us(s['step_time_us']):>10s}/step (95% interval {fmt_us(lo)} - {fmt_us(hi)}; "
                      f"{len(s['step_times_us'])} steps, {len(s['ranks'])} rank(s))  {s['source']}", highlight=False)
    for label, text in (("memory", memory_change_text(d.baseline.memory, d.candidate.memory)),
                        ("work", work_change_text(d.baseline, d.candidate))):
        if text:
            console.print(f"{label:9s} {text}", highlight=False)
    lo, hi = j["step_time_delta_interval_us"]
    console.print(f"change    {j['step_time_delta_pct']:+.2f}% (shift {fmt_us(j['step_time_delta_hl_us'], True)}, "
                  f"95% interval {fmt_us(lo, True)} to {fmt_us(hi, True)}); decomposition explains "
                  f"{j['explained_pct']:.1f}% of the mean's change", highlight=False)
    t = Table(title="where the change went (per step, per rank)", title_justify="left")
    for c in ("bucket", "baseline", "candidate", "delta"):
        t.add_column(c, justify="left" if c == "bucket" else "right")
    for x in j["decomposition"][:top]:
        t.add_row(x["category"], fmt_us(x["baseline_us"]), fmt_us(x["candidate_us"]), fmt_us(x["delta_us"], True))
    console.print(t)
    t = Table(title="kernels and operators that moved most", title_justify="left")
    for c in ("name", "category", "delta/step", "count/step base", "count/step cand"):
        t.add_column(c, justify="left" if c in ("name", "category") else "right")
    for c in j["contributions"]:
        tag = " [green](new)[/]" if c["count_baseline_per_step"] == 0 else (
            " [red](gone)[/]" if c["count_candidate_per_step"] == 0 else "")
        t.add_row(escape(c["name"][:70]) + tag, c["category"], fmt_us(c["delta_us_per_step"], True),
                  f"{c['count_baseline_per_step']:.2f}", f"{c['count_candidate_per_step']:.2f}")
    console.print(t)
    console.print(f"{len(j['new'])} names new, {len(j['gone'])} gone (all in JSON / --html)", highlight=False)
    for f in j["findings"]:
        console.print(f"finding {f['kind']}: {f['change']} ({f['baseline_severity'] or '-'} -> "
                      f"{f['candidate_severity'] or '-'}; gain {f['baseline_gain_pct']:.1f}% -> "
                      f"{f['candidate_gain_pct']:.1f}%)", highlight=False)
    for n in j["notes"]:
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
