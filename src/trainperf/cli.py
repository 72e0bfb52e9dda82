"""The one entry point, `trainperf`: a sub-command per verb.

Thin by design: each verb's module registers its commands (parse, call one API function,
print). User errors (TrainperfError) print one line and exit 2; bugs stay tracebacks.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from trainperf.errors import TrainperfError

app = typer.Typer(
    name="trainperf",
    help="Plan, measure, diagnose, speed up and guard large-model training performance.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_verbs() -> None:
    # Each verb module keeps heavy imports (torch, triton, pyarrow) inside its command bodies
    # so that `trainperf --help` and `trainperf plan` start fast.
    from trainperf.plan import cli as plan_cli
    from trainperf.diagnose import cli as diagnose_cli
    from trainperf.train import cli as train_cli
    from trainperf.bench import cli as bench_cli
    from trainperf.store import cli as store_cli
    from trainperf.fleet import cli as fleet_cli

    for module in (plan_cli, diagnose_cli, train_cli, bench_cli, store_cli, fleet_cli):
        module.register(app)


_register_verbs()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a TrainperfError becomes one line on stderr and exit code 2."""
    try:
        app(args=argv, prog_name="trainperf")
    except TrainperfError as e:
        Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
