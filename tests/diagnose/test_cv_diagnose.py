"""benchmarks/cv_diagnose.py: the re-run of the rules equals diagnose(), thresholds reach the rules and are
restored, and the plateau choice of the coordinate descent."""

import importlib.util
import sys
from pathlib import Path

from trainperf.diagnose import findings as F
from trainperf.diagnose import rules as R

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cv_diagnose", ROOT / "benchmarks" / "cv_diagnose.py")
cv = importlib.util.module_from_spec(_spec)
sys.modules["cv_diagnose"] = cv
_spec.loader.exec_module(cv)

CASE = ROOT / "tests" / "corpus" / "data" / "healthy-trace_filter"


def test_choose_keeps_the_middle_of_the_widest_optimal_run():
    grid = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert cv.choose(grid, [0, 1, 1, 1, 0, 1], current=6.0) == 3.0  # widest run 2..4, its middle
    assert cv.choose(grid, [1, 1, 0, 0, 1, 1], current=6.0) == 5.0  # tie of widths: the run holding the current value
    assert cv.choose(grid, [1, 1, 0, 0, 1, 1], current=3.0) == 1.0  # neither holds it: the first
    assert cv.choose(grid, [2, 2, 2, 2, 2, 2], current=4.0) == 4.0  # no effect: keep the current value


def test_grid_stays_in_range_and_holds_the_current_value():
    assert cv._grid("X_SHARE", 0.5) == [0.125, 0.1768, 0.25, 0.3536, 0.5, 0.7071, 0.95]
    assert max(cv._grid("X_PCT", 50.0)) == 100.0 and 50.0 in cv._grid("X_PCT", 50.0)
    assert cv._grid("X_RATIO", 1.05)[0] == 1.0125 and cv._grid("X_RATIO", 1.05)[-1] == 1.2


def test_params_are_the_constants_rules_py_assigns():
    names = {p.name for p in cv.discover_params()}
    assert "ELEMENTWISE" not in names and "OPTIMIZER" not in names  # imported kernel categories, not thresholds
    assert {"HIGH_GAIN_PCT", "MEDIUM_GAIN_PCT"} <= names
    assert all(hasattr(R, n) or hasattr(F, n) for n in names)
    assert not any(n.endswith("_SPEEDUP") for n in names)


def test_rerun_equals_diagnose_and_thresholds_reach_the_rules():
    case = cv.capture(CASE)
    params = cv.discover_params()
    current = {p.name: p.default for p in params}
    scorer = cv.Scorer([case], params)
    assert case.expected and scorer.findings(case.result.name, current) == case.expected
    # GPU idle is a share of the window: above 100 % the launch-bound rule cannot fire
    assert any(f["kind"] == "launch_bound" for f in case.expected)
    off = scorer.findings(case.result.name, {**current, "LAUNCH_BOUND_IDLE_PCT": 100.0})
    assert not any(f["kind"] == "launch_bound" for f in off)
    assert all(getattr(R, p.name, None) == p.default or getattr(F, p.name, None) == p.default for p in params)
