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
