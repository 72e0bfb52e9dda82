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
    helps = {path: p.help for path, p in with_json}
    assert all(h.startswith("Print ") and h.endswith(" as JSON on stdout instead of the tables.")
               for h in helps.values()), helps
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


def _shown_type(p) -> str:
    """The value type help shows for option p: nothing for a flag, else its metavar or bare type."""
    return "flag" if p.is_flag else p.metavar or f"<{p.bare_type()}>"


def test_each_option_name_shown_in_help_has_one_value_type_across_verbs():
    """`--json` is a flag everywhere, `--html` a <path> everywhere, `--seq-len` an <int> ... (docs/cli.md)."""
    shown: dict[str, dict[str, list[str]]] = {}
    for path, cmd in _commands():
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                for o in p.opts + p.secondary_opts:
                    shown.setdefault(o, {}).setdefault(_shown_type(p), []).append(path)
    mixed = {o: types for o, types in shown.items() if len(types) > 1}
    # --steps: optimizer steps to reach (train) is the only one left; diagnose's window is --step-window
    assert mixed == {}, mixed


@pytest.mark.parametrize("older,newer,verbs", [
    ("--seq", "--seq-len", {"plan"}),
    ("--steps", "--step-window", {"diagnose"}),
    ("--kernels", "--fused-kernels", {"train"}),
    ("--accelerator", "--gpu", {"roofline"}),
    ("--min-effect", "--min-rel-change", {"gate", "compare"}),
    ("--min-effect", "--min-noise-multiple", {"fleet changes"}),
])
def test_renamed_options_keep_their_older_name_hidden(older, newer, verbs):
    for path, cmd in _commands():
        if path not in verbs:
            continue
        names = {o: p for p in cmd.params if p.param_type_name == "option" for o in p.opts}
        assert newer in names and not names[newer].hidden, (path, newer)
        assert older in names and names[older].hidden, (path, older)
    visible = {o for _, p in _options(older) if not p.hidden for o in p.opts}
    if older not in ("--kernels", "--steps"):  # bench kernels --kernels and train --steps are other concepts
        assert older not in visible, f"{older} is still shown in help somewhere"


def _json_of(args: list[str]) -> dict:
    r = CliRunner().invoke(app, args)
    assert r.exit_code in (0, 1), (args, r.output)
    return json.loads(r.stdout)


def test_older_names_give_the_same_result(tmp_path):
    plan = ["plan", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--json"]
    older, newer = _json_of([*plan, "--seq", "2048"]), _json_of([*plan, "--seq-len", "2048"])
    assert newer["seq_len"] == older["seq_len"] == 2048 and newer["layouts"] == older["layouts"]
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(str(1.0 + 0.001 * i) for i in range(10)))
    b.write_text("\n".join(str(1.1 + 0.001 * i) for i in range(10)))  # +10%
    gate = ["gate", "--baseline", str(a), "--candidate", str(b), "--json"]
    assert _json_of([*gate, "--min-effect", "50%"]) == _json_of([*gate, "--min-rel-change", "50%"])
    assert _json_of([*gate, "--min-rel-change", "50%"])["verdict"] == "no change"
    assert _json_of([*gate, "--min-rel-change", "2%"])["verdict"] == "regression"
    series = tmp_path / "s.csv"
    series.write_text("v\n" + "\n".join(str(1.0 + 0.01 * (i % 3) + (0.2 if i >= 20 else 0)) for i in range(40)))
    changes = ["fleet", "changes", "--csv", str(series), "--column", "v", "--json"]
    for k in ("1", "1000"):
        assert _json_of([*changes, "--min-effect", k]) == _json_of([*changes, "--min-noise-multiple", k])
    assert _json_of([*changes, "--min-noise-multiple", "1"])["change_points"] == [20]
    assert _json_of([*changes, "--min-noise-multiple", "1000"])["change_points"] == []
    trace = _trace(tmp_path / "t.json.gz")
    assert (_json_of(["diagnose", str(trace), "--steps", "1:1", "--json"]) ==
            _json_of(["diagnose", str(trace), "--step-window", "1:1", "--json"]))
    assert _json_of(["diagnose", str(trace), "--step-window", "1:1", "--json"])["ranks"][0]["steps"] == [1]


def test_json_puts_nothing_but_json_on_stdout(tmp_path):
    """`--json` output can be piped into a JSON parser on every verb (tables, notes and progress bars stay off
    stdout), with an HTML report written beside it where the verb has one."""
    from trainperf.store import RunRecord, StepSample, new_run_id, write_run

    store = str(tmp_path / "store")
    run_id = new_run_id()
    write_run(RunRecord(run_id=run_id, job="j", host="h", started_at=1.79e9, step_time_s=1.0,
                        samples=[StepSample(step=s, step_time_s=1.0 + s / 100) for s in range(4)]), store)
    trace = _trace(tmp_path / "t.json.gz")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(str(1.0 + 0.001 * i) for i in range(10)))
    b.write_text("\n".join(str(1.1 + 0.001 * i) for i in range(10)))
    series = tmp_path / "s.csv"
    series.write_text("v\n" + "\n".join(str(1.0 + 0.01 * (i % 3) + (0.2 if i >= 20 else 0)) for i in range(40)))
    fleet = tmp_path / "f.csv"
    fleet.write_text("period,host,step_time_s\n" + "".join(
        f"{t},node{h},{1.0 + (0.3 if t >= 3 and h == 1 else 0.0)}\n" for t in range(5) for h in range(3)))
    html = str(tmp_path / "r.html")
    for args in (["plan", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--html", html],
                 ["diagnose", str(trace), "--html", html],
                 ["diff", str(trace), str(trace), "--html", html],
                 ["gate", "--baseline", str(a), "--candidate", str(b)],
                 ["runs", "list", "--store", store],
                 ["runs", "show", run_id, "--store", store],
                 ["fleet", "changes", "--csv", str(series), "--column", "v", "--html", html],
                 ["fleet", "localize", "--csv", str(fleet), "--time-col", "period", "--measure", "step_time_s",
                  "--at", "3"]):
        r = CliRunner().invoke(app, [*args, "--json"])
        assert r.exit_code in (0, 1), (args, r.output)
        try:
            json.loads(r.stdout)
        except ValueError:
            pytest.fail(f"{' '.join(args[:2])} --json: stdout is not JSON: {r.stdout[:300]!r}")


# Spellings of a concept docs/cli.md names otherwise: a verb that shows one in help splits the vocabulary.
SYNONYMS = {"--accelerator": "--gpu", "--device-name": "--gpu", "--seq": "--seq-len", "--sequence-length": "--seq-len",
            "--output": "--out", "--out-dir": "--out", "--json-file": "--json-out", "--report": "--html",
            "--min-effect": "--min-rel-change or --min-noise-multiple", "--steps-window": "--step-window"}


# Reported to the verb's owner (issue 14), still shown in help: remove an entry once renamed.
KNOWN_SYNONYMS: set[tuple[str, str]] = set()


def test_no_verb_shows_a_synonym_of_a_vocabulary_name():
    shown = {(path, o) for path, cmd in _commands() for p in cmd.params
             if p.param_type_name == "option" and not p.hidden for o in p.opts + p.secondary_opts}
    bad = sorted(f"{path} {o}: use {SYNONYMS[o]} (docs/cli.md; keep {o} hidden with cli_options.older_name)"
                 for path, o in shown if o in SYNONYMS and (path, o) not in KNOWN_SYNONYMS)
    assert bad == [], bad


def test_roofline_takes_the_accelerator_as_gpu_like_plan_and_train(tmp_path):
    trace = str(_trace(tmp_path / "t.json.gz"))
    newer = _json_of(["roofline", trace, "--gpu", "h200", "--json"])
    assert newer["accelerator"] == "h200"
    assert _json_of(["roofline", trace, "--accelerator", "h200", "--json"]) == newer
