"""Options several verbs share: one name, one value type, one help text per concept (docs/cli.md).

Imported by the verb modules while they register their commands, so it imports nothing heavy and
nothing of trainperf.cli (which imports the verb modules).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from typer.core import TyperCommand


def json_option(what: str = "the full result") -> Any:
    """`--json`: a flag, print ``what`` as JSON on stdout instead of the tables (every verb)."""
    return typer.Option(False, "--json", help=f"Print {what} as JSON on stdout instead of the tables.")


def json_out_option(what: str = "the full result") -> Any:
    """`--json-out FILE`: write ``what`` as JSON to FILE, the tables still printed.

    diagnose, diff, compare and evaluate took `--json FILE` before; their LegacyJsonFileCommand still
    reads that older form as `--json-out FILE`."""
    return typer.Option(None, "--json-out", help=f"Also write {what} as JSON to this file.")


class LegacyJsonFileCommand(TyperCommand):
    """A command whose `--json` took a FILE before it became the flag every verb has (docs/cli.md).

    `--json=FILE`, and `--json FILE` when FILE is one positional argument too many for the command,
    are read as `--json-out FILE`, so older command lines and scripts keep working; a bare `--json`
    (or `--json` before the command's own arguments) is the flag."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self.legacy_json_file(list(args)))

    def legacy_json_file(self, args: list[str]) -> list[str]:
        """``args`` with an older `--json FILE` spelled `--json-out FILE`."""
        args = [f"--json-out={a[len('--json='):]}" if a.startswith("--json=") else a for a in args]
        if "--json" not in args:
            return args
        takes_value = {o for p in self.params if p.param_type_name == "option" and not p.is_flag for o in p.opts}
        n_arguments = sum(p.param_type_name == "argument" for p in self.params)
        positional, i = [], 0
        while i < len(args):
            a = args[i]
            if a == "--":
                positional += range(i + 1, len(args))
                break
            if a.startswith("-") and a != "-":
                i += 2 if a in takes_value else 1
                continue
            positional.append(i)
            i += 1
        at = args.index("--json")
        if at + 1 in positional and len(positional) > n_arguments:
            return [*args[:at], "--json-out", *args[at + 1:]]
        return args


def older_name(option: str, newer: str, **kwargs) -> Any:
    """A hidden option: ``option`` is the older name of ``newer``, still accepted (not shown in help) so
    that older command lines keep working; read it with ``given``."""
    return typer.Option(None, option, hidden=True, help=f"Older name of {newer}.", **kwargs)


def given(value: Any, older: Any) -> Any:
    """The value of an option renamed in place: the one under its older name when that was given."""
    return value if older is None else older


def parse_fraction(text: str, name: str) -> float:
    """Return a relative change written '2%' or '0.02' as 0.02; raise TrainperfError for anything else."""
    from trainperf.errors import TrainperfError

    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise TrainperfError(f"{name}: {text!r} is not a fraction like 2% or 0.02") from None
    if not 0 <= v < 10:
        raise TrainperfError(f"{name}: {text!r} must be between 0 and 1000%")
    return v


def dumps(doc: Any) -> str:
    """The JSON text every verb prints or writes (indent 1; dates and paths as strings)."""
    return json.dumps(doc, indent=1, default=str)


def print_json(doc: Any) -> None:
    """Print ``doc`` as JSON on stdout (the only thing a `--json` run prints there)."""
    sys.stdout.write(dumps(doc) + "\n")
    sys.stdout.flush()
