"""The one entry point, `trainperf`: a sub-command per verb.

Thin by design: each verb's module registers its commands (parse, call one API function,
print). User errors (TrainperfError) print one line and exit 2; bugs stay tracebacks.
"""

from __future__ import annotations

import math
import sys
import warnings
from functools import lru_cache

import typer
from rich.console import Console

try:  # typer >= 0.20 vendors click as typer._click; older typer depends on click itself
    from typer._click.exceptions import BadParameter, UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import BadParameter, UsageError

from trainperf import __version__
from trainperf.errors import TrainperfError

# Every number ends up in numpy / torch as a float64 or an int64: a value outside them (NaN,
# infinity, 2**64) is refused at the command line rather than failing deep inside a verb.
INT64_MAX = 2**63 - 1

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
    from trainperf.corpus import cli as corpus_cli
    from trainperf.diagnose import diff_cli
    from trainperf.compare import cli as compare_cli
    from trainperf.diagnose import roofline_cli

    for module in (plan_cli, diagnose_cli, train_cli, bench_cli, store_cli, fleet_cli, corpus_cli, diff_cli,
                   compare_cli, roofline_cli):
        module.register(app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"trainperf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan, measure, diagnose, speed up and guard large-model training performance."""


_register_verbs()


def _finite(value):
    """Return ``value`` (a parsed option value) or raise BadParameter for NaN, infinity or beyond int64."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, float) and not math.isfinite(v):
            raise BadParameter(f"{v} is not a finite number")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX:
            raise BadParameter(f"{v} is out of range (at most {INT64_MAX:,} in magnitude)")
    return value


def _with_finite_check(callback):
    def checked(ctx, param, value):
        value = _finite(value)
        return callback(ctx, param, value) if callback is not None else value
    return checked


# Options that name a file or folder: help shows <path> whether the verb reads them as str or Path.
_PATH_OPTIONS = {"--html", "--json-out", "--out", "--perfetto", "--csv", "--calibration"}
# Options that name a file to write (a report, JSON): checked here, while parsing, so that every verb
# refuses an unusable one before its work, not after it (a verb that forgets is still covered).
_OUTPUT_FILE_OPTIONS = ("--html", "--json-out", "--perfetto")


def _with_output_check(callback, option: str):
    def checked(ctx, param, value):
        if value is not None and not ctx.resilient_parsing:
            from trainperf.atomic import check_output_file

            check_output_file(value, option)
        return callback(ctx, param, value) if callback is not None else value
    return checked


def _tidy(command) -> None:
    """Apply the entry point's rules to every parameter of ``command`` and its sub-commands.

    Numbers must be finite and fit in int64; an output file (--html, --json-out, --perfetto) must be
    writable, checked before the verb's work; in help, a flag shows no value type (typer >= 0.20
    prints `<bool>`), a ranged number shows `<int> [x>=1]` rather than `<int range> [x>=1]` and a
    file or folder shows `<path>`.
    """
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub)
    get_help_option = command.get_help_option

    def help_option(ctx):
        opt = get_help_option(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    command.get_help_option = help_option
    for p in command.params:
        p.callback = _with_finite_check(p.callback)
        output = next((o for o in _OUTPUT_FILE_OPTIONS if p.param_type_name == "option" and o in p.opts), None)
        if output is not None:
            p.callback = _with_output_check(p.callback, output)
        desc = getattr(p, "type_descriptor", None)  # typer >= 0.20 only
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        elif desc is not None and desc.is_ranged and p.metavar is None:
            p.metavar = f"<{p.bare_type()}>"
        elif p.param_type_name == "option" and _PATH_OPTIONS & set(p.opts) and p.metavar is None:
            p.metavar = "<path>"


@lru_cache(maxsize=1)
def click_command():
    """Return the click command of the whole CLI, with the entry point's rules applied (built once:
    building it inspects every verb's signature, ~20 ms)."""
    cmd = typer.main.get_command(app)
    _tidy(cmd)
    return cmd


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the CLI shows it: "warning: <message>", without the source line Python adds."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a TrainperfError or a usage error becomes one line on stderr and exit code 2."""
    warnings.formatwarning = _one_line_warning
    try:
        # standalone_mode=False hands click's usage errors (bad value, out of range, unknown
        # option) to us, so they print as one line like every other user error.
        rc = click_command()(args=argv, prog_name="trainperf", standalone_mode=False)
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
    """Print ``message`` as one line: control characters escaped, brackets shown as typed (not rich markup)."""
    from rich.markup import escape

    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    Console(stderr=True).print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
