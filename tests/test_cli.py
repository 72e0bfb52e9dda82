"""The CLI entry: every verb is registered; user errors are one line and exit 2, no traceback."""

import subprocess
import sys

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
