"""The `roofline` verb: where each operator and each collective sits against the hardware's peaks
(registered on the main app by trainperf.cli; the analyses are roofline.py and collectives.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainperf.cli_options import given, json_option, json_out_option, older_name


def roofline_report(path: Path, accelerator: str | None = None, calibration: Path | None = None,
                    top: int = 20) -> dict:
    """{accelerator, ranks: {rank: RooflineSummary JSON}, collectives: [GroupStats JSON]} of a trace
    (a file or a folder of ranks): the traces are loaded once for both analyses."""
    from trainperf.diagnose.collectives import collective_stats
    from trainperf.diagnose.roofline import calibrated_accelerator, device_accelerator, rank_roofline
    from trainperf.hardware import get_accelerator
    from trainperf.trace.load import load_trace

    tables = load_trace(path)
    acc = get_accelerator(accelerator) if accelerator else device_accelerator(next(iter(tables.values())))
    if calibration is not None:
        acc = calibrated_accelerator(calibration, acc)
    return {"accelerator": acc.name if acc is not None else "",
            "ranks": {str(r): rank_roofline(t, acc).to_json(top) for r, t in tables.items()},
            "collectives": [g.to_json() for g in collective_stats(tables, acc)]}


def register(app: typer.Typer) -> None:
    """Add the `roofline` command to app."""

    @app.command("roofline")
    def roofline_cmd(
        trace: Path = typer.Argument(..., help="A trace (Kineto, rocprofv3, JAX .xplane.pb) or a folder of ranks."),
        accelerator: Optional[str] = typer.Option(None, "--gpu",
                                                  help="Accelerator from the catalog (default: the trace's "
                                                       "deviceProperties)."),
        accelerator_older: Optional[str] = older_name("--accelerator", "--gpu"),
        calibration: Optional[Path] = typer.Option(None, "--calibration",
                                                   help="A `trainperf calibrate` profile: its measured peaks."),
        top: int = typer.Option(20, "--top", min=1, help="Operator rows per rank."),
        as_json: bool = json_option(),
        json_out: Optional[Path] = json_out_option(),
    ) -> None:
        """Per-operator FLOP/s and TB/s against the peaks (from recorded shapes), and each collective's
        wait for the last rank, transfer time and bus bandwidth against its link."""
        from rich.console import Console

        from trainperf.atomic import atomic_write_text, check_output_file
        from trainperf.cli_options import dumps, print_json

        if json_out is not None:
            check_output_file(json_out, "--json-out")
        doc = roofline_report(trace, given(accelerator, accelerator_older), calibration, top)
        if as_json:
            print_json(doc)
        else:
            print_roofline(doc, Console())
        if json_out:
            atomic_write_text(json_out, dumps(doc))


def print_roofline(doc: dict, console) -> None:
    """Terminal tables of roofline_report: operators per rank, then collectives."""
    from rich.table import Table

    console.print(f"accelerator: {doc['accelerator'] or 'unknown (achieved rates only; name it with --gpu)'}",
                  highlight=False)
    for rank, s in doc["ranks"].items():
        if not s["rows"]:
            console.print(f"rank {rank}: no operator this roofline prices ran with recorded shapes "
                          "(profile with record_shapes=True)", highlight=False)
            continue
        t = Table(title=f"rank {rank}: operators by time lost to the roofline")
        for col in ("op", "shapes", "calls", "time ms", "TFLOP/s", "TB/s", "FLOP/B", "bound", "% of roof", "lost ms"):
            t.add_column(col, justify="left" if col in ("op", "shapes", "bound") else "right", overflow="fold",
                         min_width=14 if col == "op" else None)
        for r in s["rows"]:
            pct = r["roofline_pct"]
            t.add_row(r["op"], r["shapes"][:48], str(r["count"]), f"{r['time_us'] / 1e3:.3f}",
                      # 3 significant digits: a CPU run's rates are thousandths of a GPU's
                      f"{r['achieved_tflops']:.3g}", f"{r['achieved_tbps']:.3g}",
                      f"{r['intensity_flop_per_byte']:.1f}", r["bound"] or "-",
                      f"{pct:.1f}" if pct is not None else "-", f"{r['lost_us'] / 1e3:.3f}")
        console.print(t)
    if doc["collectives"]:
        t = Table(title="collectives (per process group)")
        for col in ("group", "count", "skew ms", "transfer ms", "median MB", "busbw GB/s", "link", "% of link"):
            t.add_column(col, justify="left" if col in ("group", "link") else "right")
        for g in doc["collectives"]:
            pct = g["busbw_pct_of_link"]
            t.add_row(g["group"], str(g["count"]), f"{g['skew_us'] / 1e3:.3f}", f"{g['transfer_us'] / 1e3:.3f}",
                      f"{g['bytes_median'] / 1e6:.2f}", f"{g['busbw_gbps_median']:.1f}" if g["bytes_median"] else "-",
                      f"{g['link']} {g['link_gbps'] or ''}".strip() or "-", f"{pct:.1f}" if pct is not None else "-")
        console.print(t)
