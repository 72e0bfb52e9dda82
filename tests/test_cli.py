"""The CLI entry: every verb is registered; user errors are one line and exit 2, no traceback."""

import subprocess
import sys

import pytest

from trainperf.cli import app


def _run(*args):
    return subprocess.run([sys.executable, "-m", "trainperf.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_every_verb_is_registered():
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert {"plan", "calibrate", "diagnose", "train", "bench", "runs", "fleet", "gate"} <= names


def test_user_error_is_one_line_exit_2():
    r = _run("plan", "--model", "no-such-model", "--gpu", "h100", "--gpus", "8")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown model" in lines[0] and "llama3-8b" in lines[0]
    assert "Traceback" not in r.stderr


def test_unusable_output_path_is_one_line_exit_2(unusable_outputs):
    """plan --html into a directory or under a regular file: one line, exit 2, no traceback."""
    for target in unusable_outputs("plan.html"):
        r = _run("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--top", "1",
                 "--html", str(target))
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert str(target if target.is_dir() else target.parent) in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_train_out_under_a_file_fails_before_training(tmp_path):
    """train --out below a regular file: one line naming it, exit 2, nothing trained."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    r = _run("train", "--model", "tiny", "--steps", "2", "--out", str(a_file / "run"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and str(a_file) in lines[0], r.stderr
    assert a_file.read_text() == ""


@pytest.mark.parametrize("args,option", [
    (("plan", "--usd-per-hour", "-1"), "--usd-per-hour"),
    (("plan", "--seq", "0"), "--seq"),
    (("plan", "--global-batch", "0"), "--global-batch"),
    (("plan", "--gpus-per-node", "0"), "--gpus-per-node"),
    (("diagnose", "x", "--top", "-1"), "--top"),
    (("fleet", "changes", "--csv", "x.csv", "--alpha", "2"), "--alpha"),
    (("fleet", "localize", "--csv", "x.csv", "--history", "-2"), "--history"),
    (("train", "--lr", "-1"), "--lr"),
    (("train", "--peak-tflops", "-3"), "--peak-tflops"),
    (("plan", "--no-such-option"), "--no-such-option"),
])
def test_out_of_range_and_unknown_options_are_one_line_exit_2(args, option):
    """Values outside an option's range are refused before any work: one line naming the option."""
    r = _run(*args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and option in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def _main(capsys, *args):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    from trainperf.cli import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_version_prints_the_package_version(capsys):
    import trainperf

    code, out, err = _main(capsys, "--version")
    assert code == 0 and out.strip() == f"trainperf {trainperf.__version__}", (out, err)


@pytest.mark.parametrize("args,option", [
    (("plan", "--usd-per-hour", "inf"), "--usd-per-hour"),
    (("plan", "--usd-per-hour", "1e400"), "--usd-per-hour"),  # parses as float infinity
    (("train", "--peak-tflops", "inf"), "--peak-tflops"),
    (("plan", "--gpus", str(2**64)), "--gpus"),  # beyond int64: would overflow numpy / torch later
])
def test_non_finite_and_beyond_int64_numbers_are_refused(args, option, capsys):
    code, _, err = _main(capsys, *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and option in lines[0], err


def test_help_shows_value_types_but_no_bool_for_flags(capsys):
    """Flags take no value, so help shows none; numbers show their type and range."""
    code, out, _ = _main(capsys, "plan", "--help")
    assert code == 0
    rows = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("│ --")}
    assert "<bool>" not in out
    assert "<int> [x>=1]" in rows["--gpus"] and "<float> [x>=0.0]" in rows["--usd-per-hour"]
    assert "<str>" in rows["--model"] and "<path>" in rows["--html"]


@pytest.mark.parametrize("model", ["[/]", "[bold]x", "a\nb", "a\x1cb\x85c"])
def test_error_line_shows_the_input_as_typed_on_one_line(model, capsys):
    """Brackets are not rich markup (a '[/]' crashed the printer) and control characters are escaped."""
    code, _, err = _main(capsys, "plan", "--model", model)
    assert code == 2 and "Traceback" not in err, err
    assert len(err.rstrip("\n").split("\n")) == 1, err
    assert repr(model)[1:-1].replace("\\\\", "\\") in err


def test_diagnose_on_a_run_folder_points_to_its_traces(tmp_path, capsys):
    """Issue 14: `diagnose RUN_FOLDER` said 'no .json trace files'; the traces are in RUN_FOLDER/traces."""
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    code, _, err = _main(capsys, "diagnose", str(run))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and f"{run} is a run folder: its traces are in {run / 'traces'}/" in lines[0], err
