"""Commands of the `bench` verb (registered on the main app by trainperf.cli).

`trainperf bench kernels`: every fused kernel against PyTorch eager, torch.compile and Liger,
forward and forward+backward, with GB/s, TFLOP/s and distance to the roofline.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainperf.cli_options import json_option

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
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32 (inputs and kernels)."),
    impls: Optional[str] = typer.Option(None, help="Comma-separated among trainperf,eager,compile,liger "
                                                   "(default: all on cuda; trainperf,eager on cpu)."),
    passes: str = typer.Option("fwd,fwd+bwd", help="fwd and/or fwd+bwd."),
    json_out: bool = json_option("the results"),
    store: Optional[str] = typer.Option(None, help="Run-record store (default: $TRAINPERF_STORE or .trainperf)."),
    record: bool = typer.Option(True, help="Write a run record (kind=bench) to the store."),
    html: Optional[str] = typer.Option(None, help="Also write a self-contained HTML report here."),
) -> None:
    """Benchmark the fused kernels; print a table (or JSON) and write a run record."""
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from trainperf.bench.report import HEADER, ceilings, table_rows, write_html
    from trainperf.bench.run import CPU_WARNING, run_bench, to_record
    from trainperf.bench.cases import parse_shapes

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    impl_list = tuple(_split(impls) or (("trainperf", "eager", "compile", "liger") if device == "cuda"
                                        else ("trainperf", "eager")))
    pass_list = tuple(_split(passes) or ())
    shape_list = parse_shapes(shapes) if shapes else None
    _check_args(device, _split(kernels), shape_list, dtype, impl_list, pass_list, html)
    err = Console(stderr=True)
    if device == "cpu":
        err.print(f"[yellow]{CPU_WARNING}[/]")
    with Progress(console=err, transient=True, disable=json_out) as progress:
        task = progress.add_task("benchmarking", total=None)
        result = run_bench(device, _split(kernels), shape_list, dtype, impl_list,
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
    tbl = Table(title=f"{result.device_name} {result.dtype}: {ceilings(result)}")
    for h in HEADER:
        tbl.add_column(h, justify="left" if h in ("kernel", "shape", "pass", "impl") else "right")
    for row in table_rows(result):
        tbl.add_row(*row)
    out.print(tbl)
    for note in result.notes:
        if not (device == "cpu" and note == CPU_WARNING):  # printed on stderr before the run
            out.print(f"note: {note}", highlight=False)
    if where:
        out.print(f"run record: {where}", highlight=False)
    if html:
        out.print(f"report: {html}", highlight=False)


def _check_args(device: str, kernels: list[str] | None, shapes: list[tuple[int, ...]] | None, dtype: str,
                impls: tuple[str, ...], passes: tuple[str, ...], html: str | None) -> None:
    """Refuse every unusable argument in one line, before any note is printed or any work starts."""
    from pathlib import Path

    import torch

    from trainperf.atomic import ensure_dir
    from trainperf.bench.cases import IMPLS, KERNELS, SHAPE_RANK
    from trainperf.bench.run import DTYPES
    from trainperf.errors import TrainperfError

    def unknown(option: str, what: str, given: list[str] | tuple[str, ...], known: tuple[str, ...]) -> None:
        bad = [g for g in given if g not in known]
        if bad:
            raise TrainperfError(f"{option}: unknown {what} {', '.join(map(repr, bad))} (known: {', '.join(known)})")

    if device not in ("cuda", "cpu"):
        raise TrainperfError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainperfError("--device cuda: no CUDA device is visible (use --device cpu for the smoke run)")
    unknown("--dtype", "dtype", [dtype], tuple(DTYPES))
    unknown("--kernels", "kernel", kernels or [], KERNELS)
    unknown("--impls", "implementation", impls, IMPLS)
    unknown("--passes", "pass", passes, ("fwd", "fwd+bwd"))
    if not impls or not passes:
        raise TrainperfError("--impls and --passes need at least one value each")
    if shapes and not any(len(s) == SHAPE_RANK[k] for k in kernels or KERNELS for s in shapes):
        ranks = sorted({SHAPE_RANK[k] for k in kernels or KERNELS})
        raise TrainperfError(f"--shapes: no shape fits the kernels (they take {' or '.join(map(str, ranks))}-D shapes)")
    if html:
        if Path(html).is_dir():
            raise TrainperfError(f"{html}: is a directory, expected a file path to write")
        ensure_dir(Path(html).parent)  # an unusable --html fails now, not after the benchmark


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
    app.add_typer(bench_app, name="bench")
