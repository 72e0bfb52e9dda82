"""Commands of the `bench` verb (registered on the main app by trainperf.cli).

`trainperf bench kernels`: every fused kernel against PyTorch eager, torch.compile and Liger,
forward and forward+backward, with GB/s, TFLOP/s and distance to the roofline.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

bench_app = typer.Typer(help="A/B benchmarks of the fused kernels against eager, torch.compile and Liger.",
                        no_args_is_help=True)


def _split(text: Optional[str]) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


@bench_app.command("kernels")
def kernels_cmd(
    device: Optional[str] = typer.Option(None, help="cuda or cpu (default: cuda when visible, else cpu)."),
    kernels: Optional[str] = typer.Option(None, help="Comma-separated kernels (default: all)."),
    shapes: Optional[str] = typer.Option(None, help="Comma-separated shapes, e.g. 4096x8192,8192x4096x128256 "
                                                    "(each applies to the kernels of its rank)."),
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    impls: Optional[str] = typer.Option(None, help="Comma-separated among trainperf,eager,compile,liger "
                                                   "(default: all on cuda; trainperf,eager on cpu)."),
    passes: str = typer.Option("fwd,fwd+bwd", help="fwd and/or fwd+bwd."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON instead of a table."),
    store: Optional[str] = typer.Option(None, help="Run-record store (default: $TRAINPERF_STORE or .trainperf)."),
    record: bool = typer.Option(True, help="Write a run record (kind=bench) to the store."),
    html: Optional[str] = typer.Option(None, help="Also write a self-contained HTML report here."),
) -> None:
    """Benchmark the fused kernels; print a table (or JSON) and write a run record."""
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from trainperf.bench.report import HEADER, table_rows, write_html
    from trainperf.bench.run import CPU_WARNING, run_bench, to_record
    from trainperf.bench.cases import parse_shapes
    from trainperf.errors import TrainperfError

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise TrainperfError(f"--device must be cuda or cpu, got {device!r}")
    impl_list = tuple(_split(impls) or (("trainperf", "eager", "compile", "liger") if device == "cuda"
                                        else ("trainperf", "eager")))
    pass_list = tuple(_split(passes) or ())
    for p in pass_list:
        if p not in ("fwd", "fwd+bwd"):
            raise TrainperfError(f"--passes: {p!r} is not fwd or fwd+bwd")
    err = Console(stderr=True)
    if device == "cpu":
        err.print(f"[yellow]{CPU_WARNING}[/]")
    with Progress(console=err, transient=True, disable=json_out) as progress:
        task = progress.add_task("benchmarking", total=None)
        result = run_bench(device, _split(kernels), parse_shapes(shapes) if shapes else None, dtype, impl_list,
                           pass_list, progress=lambda what: progress.update(task, description=what))
    where = None
    if record:
        from trainperf.store import write_run

        where = write_run(to_record(result), store)
    if html:
        write_html(result, html)
    if json_out:
        data = result.to_dict()
        data["record"] = where
        typer.echo(json.dumps(data, indent=1))
        return
    out = Console()
    if not out.is_terminal:  # piped into a log: do not squeeze the table to 80 columns
        out = Console(width=200)
    tbl = Table(title=f"{result.device_name} {result.dtype}: copy bandwidth {result.copy_gbps:.0f} GB/s")
    for h in HEADER:
        tbl.add_column(h, justify="left" if h in ("kernel", "shape", "pass", "impl") else "right")
    for row in table_rows(result):
        tbl.add_row(*row)
    out.print(tbl)
    for note in result.notes:
        out.print(f"note: {note}", highlight=False)
    if where:
        out.print(f"run record: {where}", highlight=False)
    if html:
        out.print(f"report: {html}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.add_typer(bench_app, name="bench")
