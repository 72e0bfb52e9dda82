"""`make demo` (scripts/demo.sh) as a newcomer runs it (issue 14)."""

import re
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"


def _commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith('"$TP"')]


def test_training_numbers_are_measured_after_a_thrown_away_warm_up_run():
    cmds = _commands(DEMO.read_text())
    trains = [c for c in cmds if c.startswith('"$TP" train')]
    measured = next(i for i, c in enumerate(trains) if '--out "$OUT/train"' in c)
    assert measured >= 1, "the first training run in a fresh process is warm-up, not a measurement"
    warm = trains[0]
    # thrown away: neither its folder nor its run record lands in the demo's output or store
    assert "$OUT" not in warm and re.search(r"--store \S+", warm), warm


def test_demo_uses_the_current_option_names():
    """The older names still work (hidden), but the demo shows the vocabulary of docs/cli.md."""
    text = DEMO.read_text()
    for older in ("--seq ", "--min-effect", "--steps A:B"):
        assert older not in text, older
    assert not re.search(r'"\$TP" (diagnose|diff|compare|evaluate) .*--json "', text)


README = DEMO.parents[1] / "README.md"


def _readme_commands(verb: str) -> list[list[str]]:
    """The README's `trainperf VERB ...` examples (continuation lines joined, comments cut), as argv."""
    import shlex

    text = README.read_text().replace("\\\n", " ").replace("$EX/", "src/trainperf/fleet/examples/")
    return [shlex.split(ln.split("  #")[0])[1:] for ln in text.splitlines() if ln.startswith(f"trainperf {verb} ")]


def test_readme_plan_examples_run_on_a_fresh_clone(capsys, monkeypatch):
    """The README's mixture-of-experts example named a mixtral-config.json the clone did not have."""
    import pytest

    from trainperf.cli import main

    monkeypatch.chdir(README.parent)  # the examples' paths are relative to the clone
    cmds = _readme_commands("plan")
    assert len(cmds) >= 4, cmds
    for argv in cmds:
        with pytest.raises(SystemExit) as e:
            main([*argv, "--top", "1"] if "--layout" not in argv and "--compare-hardware" not in argv else argv)
        err = capsys.readouterr().err
        assert e.value.code == 0, (argv, err)


def test_readme_fleet_and_gate_examples_run_on_a_fresh_clone(capsys, monkeypatch, tmp_path):
    """They named step_times.csv, incident.csv, main.txt and pr.txt, which a clone does not have."""
    import pytest

    from trainperf.cli import main

    monkeypatch.chdir(README.parent)
    monkeypatch.setenv("TRAINPERF_STORE", str(tmp_path / "store"))
    cmds = [c for c in _readme_commands("fleet") + _readme_commands("gate") if "--csv" in c or "--baseline" in c]
    assert len(cmds) == 3, cmds
    for argv in cmds:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == (1 if argv[0] == "gate" else 0), (argv, err)  # the example gate finds its regression


def test_demo_filtered_fleet_tree_lines_show_whole_sentences(tmp_path):
    """The demo cut `fleet tree --factor ...` to its last line, which at 80 columns is the tail of a wrapped
    sentence ("GPU-hours vs 1.9% typical; ..."). Each such line of demo.sh, run as written on the demo's store
    of 8 runs at 80 columns, must print the whole `explain:` sentence."""
    import os
    import subprocess
    import sys

    from trainperf.fleet.tree_synth import TreeFleet
    from trainperf.store import write_run

    for r in TreeFleet().records():
        write_run(r, str(tmp_path / "tree_store"))
    lines = [c for c in _commands(DEMO.read_text()) if "--factor" in c]
    assert len(lines) >= 2, lines
    env = {**os.environ, "COLUMNS": "80", "TP": f"{sys.executable} -m trainperf.cli", "OUT": str(tmp_path)}
    for line in lines:
        shown = subprocess.run(["bash", "-c", line.replace('"$TP"', "$TP")], env=env, capture_output=True,
                               text=True, check=True).stdout
        assert shown.startswith("explain: "), (line, shown)
        assert shown.rstrip().endswith("of the deviation across runs)"), (line, shown)
        assert " sits in " in shown and "GPU-h" in shown, (line, shown)
