"""The one entry point, `trainperf`: a sub-command per verb.

Thin by design: each verb's module registers its commands (parse, call one API function,
print). User errors (TrainperfError) print one line and exit 2; bugs stay tracebacks.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

try:  # typer >= 0.20 vendors click as typer._click; older typer depends on click itself
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError

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
    """Run the CLI; a TrainperfError or a usage error becomes one line on stderr and exit code 2."""
    try:
        # standalone_mode=False hands click's usage errors (bad value, out of range, unknown
        # option) to us, so they print as one line like every other user error.
        rc = app(args=argv, prog_name="trainperf", standalone_mode=False)
    except TrainperfError as e:
        _print_error(str(e))
        sys.exit(e.exit_code)
    except UsageError as e:
        if not e.format_message():  # no arguments at all: click's no_args_is_help shows the help
            e.show()
            sys.exit(e.exit_code)
        command = e.ctx.command_path if e.ctx is not None else "trainperf"
        _print_error(f"{command}: {e.format_message()} (see {command} --help)")
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


def _print_error(message: str) -> None:
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
