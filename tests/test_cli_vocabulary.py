"""One option vocabulary across verbs (docs/cli.md): each concept has one name, one value type.

Read from the CLI itself, so a verb added later is held to the same names."""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.cli import app, click_command  # noqa: E402


def _commands(cmd=None, path=()):
    cmd = cmd or click_command()
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def _options(name: str):
    """(command, option) for every command that has option ``name``, hidden aliases included."""
    return [(path, p) for path, cmd in _commands() for p in cmd.params
            if p.param_type_name == "option" and name in p.opts + p.secondary_opts]


def test_json_is_a_flag_on_every_verb_and_a_file_is_json_out():
    with_json = _options("--json")
    assert {path for path, _ in with_json} >= {"plan", "diagnose", "diff", "compare", "evaluate", "gate",
                                              "runs list", "fleet changes", "bench kernels"}
    not_flags = [path for path, p in with_json if not p.is_flag]
    assert not not_flags, f"--json takes a value in {not_flags}: a file is --json-out FILE (docs/cli.md)"
    assert all(not p.is_flag for _, p in _options("--json-out"))
    assert {path for path, _ in _options("--json-out")} >= {"diagnose", "diff", "compare", "evaluate"}


def _trace(path: Path) -> Path:
    b = TraceBuilder()
    for s in range(3):
        b.step(s, s * 1000.0, 1000)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", s * 1000.0 + 10, s * 1000.0 + 20, 600)
    return b.write(path)


def test_diagnose_json_prints_only_json_and_the_older_json_file_form_still_writes(tmp_path):
    trace = _trace(tmp_path / "t.json.gz")
    runner = CliRunner()
    r = runner.invoke(app, ["diagnose", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)  # nothing but the JSON on stdout (no table, no progress bar)
    assert printed["ranks"][0]["rank"] == 0
    # --json-out FILE, and the older --json FILE before or after the trace, and --json=FILE: the same JSON
    for i, args in enumerate((["--json-out", "{f}", str(trace)], ["--json", "{f}", str(trace)],
                              [str(trace), "--json", "{f}"], ["--json={f}", str(trace)])):
        f = tmp_path / f"out{i}.json"
        r = runner.invoke(app, ["diagnose", *[a.format(f=f) for a in args]])
        assert r.exit_code == 0, (args, r.output)
        assert json.loads(f.read_text()) == printed, args
        assert "trainperf diagnose" in r.stdout  # the tables are still printed


@pytest.mark.parametrize("args,expected", [
    (["t", "--json"], ["t", "--json"]),
    (["--json", "t"], ["--json", "t"]),
    (["--json", "o.json", "t"], ["--json-out", "o.json", "t"]),
    (["t", "--json", "o.json"], ["t", "--json-out", "o.json"]),
    (["--top", "3", "--json", "t"], ["--top", "3", "--json", "t"]),
    (["--json=o.json", "t"], ["--json-out=o.json", "t"]),
])
def test_legacy_json_file_rewrite(args, expected):
    """Only a value the command has no room for as an argument is read as the older --json FILE."""
    cmd = click_command().commands["diagnose"]
    assert cmd.legacy_json_file(args) == expected
