"""Errors of diagnose/roofline/diff: one line on stderr, nothing else (issue 14)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402


def _main(capsys, *args):
    from trainperf.cli import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def _run_folder(tmp_path: Path) -> Path:
    """A `trainperf train` run folder: run_record.json (a .json that is no trace) beside traces/."""
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "run_record.json").write_text('{"schema": 1}')
    b = TraceBuilder()
    b.step(0, 0, 100)
    b.write(run / "traces" / "rank0.json.gz")
    return run


@pytest.mark.parametrize("verb", ["diagnose", "roofline", "diff"])
def test_a_run_folder_is_named_as_such_with_its_traces_folder(verb, tmp_path, capsys):
    run = _run_folder(tmp_path)
    args = [verb, str(run)] + ([str(run)] if verb == "diff" else [])
    code, _, err = _main(capsys, *args)
    assert code == 2 and err.count("\n") == 1, repr(err)
    assert f"{run} is a run folder: its traces are in {run / 'traces'}/" in err, err
    assert "ph" not in err and "run_record.json" not in err


@pytest.mark.parametrize("verb", ["diagnose", "roofline", "diff"])
def test_a_run_folder_without_traces_says_how_to_record_them(verb, tmp_path, capsys):
    """A run trained without --profile-steps has run.json, metrics.jsonl and run_record.json but no traces/:
    its run.json was read as a trace ("no complete ('ph': 'X') events")."""
    run = tmp_path / "run"
    run.mkdir()
    for name, text in (("run.json", '{"model": "tiny"}'), ("metrics.jsonl", '{"step": 1}\n'),
                       ("run_record.json", '{"schema": 1}')):
        (run / name).write_text(text)
    args = [verb, str(run)] + ([str(run)] if verb == "diff" else [])
    code, _, err = _main(capsys, *args)
    assert code == 2 and err.count("\n") == 1, repr(err)
    assert f"{run} is a run folder with no traces" in err and "--profile-steps" in err, err
    assert "ph" not in err


@pytest.mark.parametrize("verb", ["diagnose", "diff"])
def test_the_error_is_the_only_output_on_stderr(verb, tmp_path, capsys):
    """The transient progress bar left a blank line on stderr before the error."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": []}')
    args = [verb, str(bad)] + ([str(bad)] if verb == "diff" else [])
    code, out, err = _main(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and err.strip(), repr(err)
