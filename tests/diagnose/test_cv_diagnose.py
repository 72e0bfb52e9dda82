"""benchmarks/cv_diagnose.py: the re-run of the rules equals diagnose(), thresholds reach the rules and are
restored, and the plateau choice of the coordinate descent."""

import importlib.util
import sys
from pathlib import Path

from trainperf.diagnose import rules as R

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cv_diagnose", ROOT / "benchmarks" / "cv_diagnose.py")
cv = importlib.util.module_from_spec(_spec)
sys.modules["cv_diagnose"] = cv
_spec.loader.exec_module(cv)

CASE = ROOT / "tests" / "corpus" / "data" / "straggler-high-trace_filter-slow1"


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


def test_params_are_the_constants_the_rules_read():
    params = cv.discover_params()
    names = {p.name for p in params}
    assert "ELEMENTWISE" not in names and "OPTIMIZER" not in names  # imported kernel categories, not thresholds
    assert {"HIGH_GAIN_PCT", "MEDIUM_GAIN_PCT"} <= names
    assert all(getattr(cv._MODULES[p.module], p.name) == p.default for p in params)
    assert len(names) == len(params)  # one constant per name
    # a rule of its own module has its thresholds tuned too; a number it never reads (gemm_shapes' concurrency share,
    # read once per rank where the facts are collected) is not a threshold of any rule
    by_name = {p.name: p for p in params}
    assert by_name["LAYOUT_TRANSPOSE_MIN_PCT"].module == "layout"
    assert by_name["LAYOUT_TRANSPOSE_MIN_PCT"].kind == "layout_transposes"
    assert by_name["GRAD_SYNC_MIN_PCT"].kind == "grad_sync_per_microbatch"
    assert "CONCURRENT_MAX_SHARE" not in names
    assert not any(n.endswith("_SPEEDUP") for n in names)
    # a threshold read through a helper is its rule's (host_work_min_gap_us), and every rule reading one is named
    kinds = {p.name: p.kind.split(",") for p in cv.discover_params()}
    assert kinds["HOST_WORK_MIN_GAP_US"] == ["host_work"] and "straggler" in kinds["STRAGGLER_HOST_ALPHA"]
    assert all(k == ["*"] or set(k) <= {fn.__name__ for fn in (*R.RULES, R.idle_gpu)} for k in kinds.values())


def test_only_names_thresholds_that_exist(tmp_path, capsys):
    assert cv.main([str(tmp_path), "--only", "HOST_WORK_MIN_GAP_US,NO_SUCH_THRESHOLD", "--no-progress"]) == 2
    said = capsys.readouterr().out
    assert "no tunable threshold named NO_SUCH_THRESHOLD" in said and "HOST_WORK_MIN_GAP_US" not in said


def test_rerun_equals_diagnose_and_thresholds_reach_the_rules():
    from trainperf.diagnose.api import diagnose

    case = cv.capture(CASE)
    plain = [cv._row(f) for f in diagnose(CASE / "traces", top=10_000).to_json()["findings"]]
    assert case.expected == plain  # capturing does not change what diagnose finds
    assert any(f["kind"] == "straggler" for f in plain)
    params = cv.discover_params()
    current = {p.name: p.default for p in params}
    scorer = cv.Scorer([case], params)
    assert scorer.findings(case.result.name, current) == case.expected
    # the GPU idle the host causes is a share of the span: above 100 % the launch-bound rule cannot fire
    assert any(f["kind"] == "launch_bound" for f in case.expected)
    off = scorer.findings(case.result.name, {**current, "LAUNCH_BOUND_HOST_IDLE_MIN_PCT": 100.0})
    assert not any(f["kind"] == "launch_bound" for f in off)
    assert all(getattr(cv._MODULES[p.module], p.name) == p.default for p in params)


def test_a_threshold_of_a_rule_in_its_own_module_reaches_it():
    """The H200 fp32 loop's fp32_matmul (diagnose/precision.py) goes when its threshold is above any share, and the
    module's constant is restored after."""
    case = cv.capture(ROOT / "tests" / "data" / "h200_faults" / "fp32_matmul-high-h200")
    params = cv.discover_params()
    current = {p.name: p.default for p in params}
    scorer = cv.Scorer([case], params)
    assert any(f["kind"] == "fp32_matmul" for f in scorer.findings(case.result.name, current))
    off = scorer.findings(case.result.name, {**current, "FP32_MATMUL_MIN_PCT": 100.0})
    assert not any(f["kind"] == "fp32_matmul" for f in off)
    assert cv._MODULES["precision"].FP32_MATMUL_MIN_PCT == current["FP32_MATMUL_MIN_PCT"]


class _ThresholdScorer(cv.Scorer):
    """A stand-in for the rules: a case's finding fires when its evidence (facts[0], %) exceeds X_MIN_PCT."""

    def _rerun(self, c, values):
        if c.facts[0] <= values["X_MIN_PCT"]:
            return []
        return [{"kind": "data_loader_stall", "severity": "high", "ranks": [0], "gain_pct": c.facts[0]}]


def test_nested_cv_moves_a_threshold_that_misses_everything_between_healthy_and_sick_evidence():
    from trainperf.corpus.evaluate import CaseResult

    def case(name, kind, base, evidence):
        r = CaseResult(name=name, kind=kind, ranks=[0], true_gain_pct=20.0 if kind != "healthy" else 0.0,
                       severity="high", base=base)
        return cv.Case(result=r, facts=[evidence])

    cases = [x for b in ("a", "b", "c") for x in (case(f"h-{b}", "healthy", b, 0.5),
                                                  case(f"s-{b}", "data_loader_stall", b, 3.0))]
    p = cv.Param(module="rules", name="X_MIN_PCT", default=4.0, grid=cv._grid("X_MIN_PCT", 4.0), kind="*")
    scorer = _ThresholdScorer(cases, [p])
    nested = cv.NestedCV(scorer, [p], sweeps=2, margins=(0.0, 0.1, float("inf")))
    everything = frozenset("abc")
    # every value in (0.5, 3.0) separates them: 1, 1.41, 2, 2.83 on the grid; the middle of that run
    assert nested.fit(everything, 0.0)["X_MIN_PCT"] == 1.4142
    margin, scores = nested.choose_margin(everything)
    assert scores[float("inf")] < scores[0.0] and margin == 0.1  # ties: the larger margin
    held = nested.lobo(everything, margin)  # each base diagnosed with the value tuned on the other two
    assert [r.findings != [] for r in held] == [False, True] * 3


def test_per_base_scores_split_by_base_by_hand():
    """Two bases, hand-made findings: each base's top-1, P/R and healthy false findings counted by hand."""
    from trainperf.corpus.evaluate import CaseResult

    def case(name, kind, base, found):
        return CaseResult(name=name, kind=kind, ranks=[0], true_gain_pct=10.0, severity="high", base=base,
                          findings=[{"kind": k, "severity": s, "ranks": [0], "gain_pct": g} for k, s, g in found])

    a = [case("a1", "host_sync", "A", [("host_sync", "high", 12.0)]),
         case("a2", "host_sync", "A", [("launch_bound", "medium", 5.0), ("host_sync", "low", 2.0)]),
         case("ah", "healthy", "A", [("small_kernels", "medium", 4.0)])]
    b = [case("b1", "straggler", "B", [("straggler", "high", 9.0)])]
    sa, sb = cv.per_base_scores(a), cv.per_base_scores(b)
    assert sa["n"] == 3 and sa["top1_accuracy"] == 0.5                    # a1 right, a2 launch_bound first
    assert sa["kinds"] == {"host_sync": [1.0, 1.0, 2]}
    assert sa["healthy_false_findings"] == {"high": 0, "medium": 1, "low": 0}
    assert sa["whatif_median_abs_error_pct"] == 5.0 and sa["whatif_max_abs_error_pct"] == 8.0  # |12-10|, |2-10|
    assert sb["top1_accuracy"] == 1.0 and sb["kinds"] == {"straggler": [1.0, 1.0, 1]}
