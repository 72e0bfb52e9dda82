"""CI gate: verdicts against scipy's Mann-Whitney U and hand-worked effect sizes; CLI exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from trainperf.errors import TrainperfError
from trainperf.fleet.gate import compare, hodges_lehmann_ratio, load_samples, read_sample_file
from trainperf.store import RunRecord, StepSample, write_run

EXAMPLES = Path(__file__).resolve().parents[2] / "src/trainperf/fleet/examples"


def test_regression_improvement_and_no_change():
    rng = np.random.default_rng(0)
    a = 1.0 + 0.01 * rng.standard_normal(10)
    slow = 1.05 * (1.0 + 0.01 * rng.standard_normal(10))
    r = compare(a, slow)
    assert r.verdict == "regression" and r.exit_code == 1
    assert r.p_value == pytest.approx(mannwhitneyu(slow, a, alternative="two-sided").pvalue)  # reference: scipy
    assert r.effect_ci[0] < 0.05 < r.effect_ci[1]
    assert compare(slow, a).verdict == "improvement"
    # for a throughput metric, larger is better: the same numbers are an improvement
    assert compare(a, slow, metric="tokens_per_s").verdict == "improvement"
    same = 1.0 + 0.01 * rng.standard_normal(30)
    assert compare(1.0 + 0.01 * rng.standard_normal(30), same).verdict == "no change"
    # significant but below the threshold: not a regression
    tiny = compare(1.0 + 0.001 * rng.standard_normal(30), 1.01 + 0.001 * rng.standard_normal(30))
    assert tiny.verdict == "no change" and tiny.p_value < 0.005


def test_inconclusive_with_too_few_samples():
    # 3 vs 3: the smallest two-sided Mann-Whitney p-value is 2/C(6,3) = 0.1 > alpha
    r = compare([1.0, 1.01, 0.99], [1.2, 1.21, 1.19])
    assert r.verdict == "inconclusive" and r.exit_code == 0


def test_hodges_lehmann_ratio_matches_hand_computation():
    a, b = np.array([1.0, 2.0, 4.0]), np.array([2.0, 4.0, 8.0])
    eff, lo, hi = hodges_lehmann_ratio(a, b)
    # median of the 9 pairwise log ratios log(b_j / a_i) is log 2 -> +100%
    assert eff == pytest.approx(1.0)
    assert lo <= eff <= hi


def test_heavy_tails_and_outliers_do_not_flip_the_verdict():
    rng = np.random.default_rng(1)
    a = 1.0 + 0.01 * rng.standard_normal(20)
    b = 1.0 + 0.01 * rng.standard_normal(20)
    b[3] = 5.0  # one stalled step
    assert compare(a, b).verdict == "no change"


def test_sample_files_folders_and_runs(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("# comment\n1.0\n\n1.1  # inline\n0.9,\n")
    assert read_sample_file(f).tolist() == [1.0, 1.1, 0.9]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.txt").write_text("1\n2\n")
    (tmp_path / "dir" / "y.txt").write_text("3\n")
    assert sorted(load_samples(str(tmp_path / "dir")).tolist()) == [1, 2, 3]
    store = tmp_path / "store"
    write_run(RunRecord(run_id="base1", job="j", samples=[StepSample(i, 1.0 + i) for i in range(4)]), str(store))
    assert load_samples("base1", store=str(store)).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert load_samples(str(store)).tolist() == [2.5]  # a store folder: one value (the median) per run
    bad = tmp_path / "bad.txt"
    bad.write_text("1.0\nfast\n")
    with pytest.raises(TrainperfError, match=r"bad.txt:2: not a number"):
        read_sample_file(bad)
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    with pytest.raises(TrainperfError, match="empty"):
        read_sample_file(tmp_path / "empty.txt")
    with pytest.raises(TrainperfError, match="not a file, folder or run id"):
        load_samples("nope", store=str(store))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainperf.cli", *args], capture_output=True, text=True, timeout=120)


def test_gate_cli_exit_codes(tmp_path):
    base, cand = str(EXAMPLES / "baseline_step_times.txt"), str(EXAMPLES / "candidate_step_times.txt")
    r = _cli("gate", "--baseline", base, "--candidate", cand, "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "regression" and out["effect"] > 0.02
    r = _cli("gate", "--baseline", base, "--candidate", base, "--min-effect", "2%")
    assert r.returncode == 0 and "no change" in r.stdout
    r = _cli("gate", "--baseline", base, "--candidate", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = _cli("gate", "--baseline", base)
    assert r.returncode == 2


def test_interval_wider_than_min_effect_is_inconclusive_not_no_change():
    # hand-built: a +1% shift with 1% noise, 12 vs 12 samples. The test cannot reach alpha, and
    # the 95% interval of the Hodges-Lehmann ratio (checked below) reaches past +2%: a change of
    # the minimum effect is not ruled out, so the verdict is "inconclusive", not "no change".
    rng = np.random.default_rng(3)
    a = 1.0 + 0.01 * rng.standard_normal(12)
    b = 1.01 * (1.0 + 0.01 * rng.standard_normal(12))
    eff, lo, hi = hodges_lehmann_ratio(a, b)
    assert hi > 0.02 or lo < -0.02
    r = compare(a, b, min_effect=0.02)
    assert r.verdict == "inconclusive" and "allows" in r.reason and r.exit_code == 0
    # the interval inside ±min_effect: "no change"
    assert compare(a, b, min_effect=0.10).verdict == "no change"
