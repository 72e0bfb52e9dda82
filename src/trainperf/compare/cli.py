"""The `compare` verb (registered on the main app by trainperf.cli)."""

from __future__ import annotations

from typing import Optional

import typer

from trainperf.cli_options import LegacyJsonFileCommand, json_option, json_out_option, older_name


def register(app: typer.Typer) -> None:
    """Add this verb's command to app."""

    @app.command("compare", cls=LegacyJsonFileCommand)
    def compare_cmd(
        a: str = typer.Argument(..., metavar="A", help="Baseline: run folder or store run id; repeats separated by commas."),
        b: str = typer.Argument(..., metavar="B", help="Candidate: run folder or store run id; repeats separated by commas."),
        as_json: bool = json_option(),
        json_out: Optional[str] = json_out_option(),
        html_out: Optional[str] = typer.Option(None, "--html", help="Write the HTML page (loss curves with the band) to FILE."),
        target_loss: Optional[float] = typer.Option(None, "--target-loss", min=0.0,
                                                    help="Loss (>= 0, cross-entropy in nats) for time-to-target (default: the worse end point of A and B)."),
        reference: Optional[str] = typer.Option(None, "--reference",
                                                help="A run in higher precision: |reference - A| is the numerics band."),
        min_rel_change: str = typer.Option("1%", "--min-rel-change",
                                           help="Smallest relative throughput change called faster/slower, e.g. "
                                                "1% or 0.01."),
        min_effect_older: Optional[str] = older_name("--min-effect", "--min-rel-change"),
        store: Optional[str] = typer.Option(None, "--store", help="Run store for run ids (default: $TRAINPERF_STORE or ./.trainperf)."),
    ) -> None:
        """Is B faster than A (with a 95% interval), and is it still the same training (loss inside the noise band)?"""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from trainperf.atomic import atomic_write_text
        from trainperf.cli_options import dumps, parse_fraction, print_json
        from trainperf.compare.api import compare_runs
        from trainperf.compare.report import numerics_rows, perf_notes, perf_rows, write_html
        from trainperf.compare.runs import load_side

        min_effect = (parse_fraction(min_rel_change, "--min-rel-change") if min_effect_older is None else
                      parse_fraction(min_effect_older, "--min-effect"))
        a_runs, b_runs = load_side(a, store), load_side(b, store)
        res = compare_runs(a_runs, b_runs, store=store, target_loss=target_loss, reference=reference,
                           min_effect=min_effect)
        con = Console()
        if as_json:
            print_json(res.to_dict())
        else:
            con.print(f"[bold]{escape(res.headline)}[/]", highlight=False, soft_wrap=True)
            for title, header, rows in (("performance", ["metric", "A", "B", "change [95% interval]"], perf_rows(res)),
                                        ("numerics", ["", "A", "B"], numerics_rows(res))):
                t = Table(title=title, title_justify="left")
                for h in header:
                    t.add_column(h, justify="left" if h in ("metric", "") else "right")
                for row in rows:
                    t.add_row(*map(str, row))
                con.print(t)
            for note in perf_notes(res):
                con.print(f"[dim]performance: {escape(note)}[/]", highlight=False, soft_wrap=True)
            con.print(f"[dim]numerics: {escape(res.numerics.reason)}[/]", highlight=False, soft_wrap=True)
        if json_out:
            atomic_write_text(json_out, dumps(res.to_dict()))
        if html_out:
            write_html(res, html_out, a_runs, b_runs)
