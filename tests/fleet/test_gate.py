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
from trainperf.fleet.gate import RunSeries, compare, hodges_lehmann_ratio, load_samples, read_sample_file
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
    # a run id: its steady per-step series (the first step is never steady, as in a run folder)
    assert load_samples("base1", store=str(store)).series[0].tolist() == [2.0, 3.0, 4.0]
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


# ---- numerics: --max-loss-delta and --numerics band on hand-built run folders ----------------

SAME = {"model": {"n_layers": 4}, "data": "abc", "seed": 0, "seq_len": 128, "samples_per_step": 2}


def _run_folder(path, loss, step_time, seed=0, eval_loss=None):
    """A run folder as `trainperf train` leaves it (the layout tests/compare writes)."""
    path.mkdir()
    t, lines = 1000.0, []
    for i, (s, l) in enumerate(zip(step_time, loss), 1):
        t += s
        rec = {"step": i, "attempt": 0, "loss": l, "step_time_s": s, "tokens": 256, "tokens_per_s": 256 / s,
               "mfu": 0.3, "mem_peak_bytes": 1e9, "grad_norm": 1.0, "t_end": t}
        if eval_loss and i in eval_loss:
            rec["eval_loss"] = eval_loss[i]
        lines.append(json.dumps(rec))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "events.jsonl").write_text(json.dumps({"kind": "attempt_start", "attempt": 0, "t": 999.0}) + "\n")
    (path / "run.json").write_text(json.dumps({"world_size": 1, "comparable": {**SAME, "seed": seed}}))
    return str(path)


def _loss_curve(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return 2.0 + 3.5 * np.exp(-np.arange(1, n + 1) / 15) + rng.normal(0, 0.02, n)


def _step_times(n=60):
    return list(0.1 * (1 + np.random.default_rng(9).normal(0, 0.01, n)))


def test_max_loss_delta_names_the_step_and_passes_identical_losses(tmp_path):
    from trainperf.compare.runs import load_run
    from trainperf.fleet.gate import loss_delta_gate

    loss, st = _loss_curve(), _step_times()
    shifted = loss.copy()
    shifted[9] += 0.5  # step 10 (steps count from 1): by construction the only step off by more than 0.1
    a = _run_folder(tmp_path / "a", list(loss), st)
    b = _run_folder(tmp_path / "b", list(shifted), st)
    g = loss_delta_gate(load_run(a), load_run(b), 0.1)
    assert g.status == "fail" and g.step == 10 and g.exit_code == 1
    assert g.detail["loss"]["worst_delta"] == pytest.approx(0.5) and g.detail["loss"]["n_steps"] == 60
    assert loss_delta_gate(load_run(a), load_run(b), 0.6).status == "pass"  # 0.5 < 0.6
    same = loss_delta_gate(load_run(a), load_run(a), 0.0)
    assert same.status == "pass" and same.exit_code == 0 and same.detail["loss"]["worst_delta"] == 0.0
    # the held-out loss is gated too: training losses equal, eval loss off by 0.3 at step 40
    c = _run_folder(tmp_path / "c", list(loss), st, eval_loss={20: 3.0, 40: 2.5})
    d = _run_folder(tmp_path / "d", list(loss), st, eval_loss={20: 3.0, 40: 2.8})
    g = loss_delta_gate(load_run(c), load_run(d), 0.1)
    assert g.status == "fail" and g.step == 40 and g.verdict.startswith("eval loss")
    # a candidate whose loss stops being finite fails there
    nan = loss.copy()
    nan[30:] = np.nan
    g = loss_delta_gate(load_run(a), load_run(_run_folder(tmp_path / "e", list(nan), st)), 10.0)
    assert g.status == "fail" and g.step == 31


def test_gate_cli_numerics_exit_codes_and_json(tmp_path):
    loss, st = _loss_curve(), _step_times()
    shifted = loss.copy()
    shifted[9] += 0.5
    a = _run_folder(tmp_path / "a", list(loss), st)
    b = _run_folder(tmp_path / "b", list(shifted), st)
    r = _cli("gate", "--baseline", a, "--candidate", b, "--max-loss-delta", "0.1")
    assert r.returncode == 1, r.stdout + r.stderr
    speed, num = r.stdout.strip().splitlines()  # the speed verdict, then one numerics line
    # one run a side and no history: the default between-run term (0.75% a run) leaves +-2.1%, so the
    # speed cannot be called "no change" at 2%: inconclusive (exit 0), the numerics decide the code
    assert speed.startswith("inconclusive") and "step 10" in num and num.startswith("numerics (max-loss-delta)")
    r = _cli("gate", "--baseline", a, "--candidate", a, "--max-loss-delta", "0.1", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["verdict"] == "inconclusive" and out["numerics"]["status"] == "pass"
    assert "between-run sd of 0.75% a run from the stated default" in out["test"]
    # a different seed is not the same training: exit 2, one line with the reason
    c = _run_folder(tmp_path / "c", list(loss), st, seed=1)
    r = _cli("gate", "--baseline", a, "--candidate", c, "--max-loss-delta", "0.1")
    num = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 2 and num == "numerics (max-loss-delta): not comparable (different seed 0 vs 1)"
    # numbers files carry no loss curve: a one-line usage error
    base = str(EXAMPLES / "baseline_step_times.txt")
    r = _cli("gate", "--baseline", base, "--candidate", base, "--max-loss-delta", "0.1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "numerics need a run" in r.stderr
    r = _cli("gate", "--baseline", a, "--candidate", a, "--numerics", "seeds")
    assert r.returncode == 2 and "--numerics 'seeds': unknown" in r.stderr
    r = _cli("gate", "--baseline", a, "--candidate", a, "--max-loss-delta", "-1")
    assert r.returncode == 2


def _seed_folders(tmp_path, prefix, n_seeds, change=None, n=80):
    """Runs of seeds 0..n_seeds-1 (loss noise differs by seed); ``change`` is added to every loss."""
    out = []
    for seed in range(n_seeds):
        loss = _loss_curve(n, seed=seed) + (0.0 if change is None else change)
        out.append(_run_folder(tmp_path / f"{prefix}{seed}", list(loss), _step_times(n), seed=seed))
    return ",".join(out)


def test_gate_cli_numerics_band_follows_compare_numerics_with_seed_repeats(tmp_path):
    from trainperf.compare.numerics import compare_numerics
    from trainperf.compare.runs import load_side

    steps = np.arange(1, 81)
    drift = np.where(steps >= 40, 0.05 * (steps - 39), 0.0)  # B drifts away from step 40 (as tests/compare)
    a, b = _seed_folders(tmp_path, "a", 3), _seed_folders(tmp_path, "b", 3, drift)
    ref = compare_numerics(load_side(a), load_side(b))  # the reference: compare's own verdict, seed band
    assert ref.verdict.startswith("diverges at step") and "seed-to-seed" in ref.band_source
    r = _cli("gate", "--baseline", a, "--candidate", b, "--numerics", "band", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["numerics"]["verdict"] == ref.verdict, r.stderr
    assert 40 <= out["numerics"]["step"] <= 46
    r = _cli("gate", "--baseline", a, "--candidate", a, "--numerics", "band")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("numerics (band): equivalent")
    one = a.split(",")[0]  # one baseline seed: no seed band, inconclusive (exit 0), the stand-in's verdict as a hint
    r = _cli("gate", "--baseline", one, "--candidate", b.split(",")[0], "--numerics", "band", "--json")
    out = json.loads(r.stdout)["numerics"]
    assert r.returncode == 0 and out["status"] == "inconclusive" and "diverges at step" in out["reason"]
    c = _run_folder(tmp_path / "c", list(_loss_curve(80)), _step_times(80), seed=1)
    r = _cli("gate", "--baseline", one, "--candidate", c, "--numerics", "band")
    assert r.returncode == 2 and r.stdout.strip().splitlines()[-1] == "numerics (band): not comparable (different seed 0 vs 1)"


def test_seed_band_of_the_end_point_by_hand_and_a_shifted_end_fails(tmp_path):
    from trainperf.compare.numerics import seed_band
    from trainperf.compare.runs import load_side
    from trainperf.fleet.gate import band_gate

    # end points 2.0, 2.1, 2.2: mean 2.1, sd 0.1; one new run, 99%: t(2, 0.995) = 9.9248,
    # half-width 9.9248 * 0.1 * sqrt(1/3 + 1) = 1.14602
    assert seed_band([2.0, 2.1, 2.2], 1, 0.99) == pytest.approx((2.1 - 1.14602, 2.1 + 1.14602), abs=1e-4)
    a = load_side(_seed_folders(tmp_path, "a", 4))
    steps = np.arange(1, 81)
    late = np.where(steps >= 75, 0.3, 0.0)  # the last 6 steps jump: too short for the per-step band's persistence?
    g = band_gate(a, load_side(_seed_folders(tmp_path, "b", 4, late)))
    assert g.status == "fail" and g.detail["end_band"]["what"] == "final training loss"
    assert not g.detail["end_band"]["lo"] <= np.mean(g.detail["end_band"]["candidate"]) <= g.detail["end_band"]["hi"]
    same = band_gate(a, load_side(_seed_folders(tmp_path, "c", 4, np.full(80, 1e-4))))
    assert same.status == "pass" and "seed band" in same.reason


def test_store_run_ids_drop_the_warm_up_as_run_folders_do(tmp_path):
    """One function (steady_samples) for both: the same steps give the same steady samples."""
    rng = np.random.default_rng(11)
    st = list(np.r_[[2.0, 0.9, 0.5, 0.4, 0.35], 0.1 * (1 + rng.normal(0, 0.01, 45))])
    folder = _run_folder(tmp_path / "run", list(_loss_curve(50)), st)
    write_run(RunRecord(run_id="r1", job="j", samples=[StepSample(i + 1, s, tokens_per_s=256 / s)
                                                       for i, s in enumerate(st)]), str(tmp_path / "store"))
    from_folder = load_samples(folder, "step_time").series[0]
    from_store = load_samples("r1", "step_time", store=str(tmp_path / "store")).series[0]
    assert from_store.tolist() == from_folder.tolist()
    assert from_store.max() < 0.2 and len(from_store) >= 40  # the five slow warm-up steps are out


def test_gate_on_runs_uses_compares_interval_not_a_rank_test_over_steps():
    """Reference: compare.interval.shift (the interval `compare` reports) on the same series."""
    from trainperf.compare.interval import shift
    from trainperf.fleet.gate import RunSeries

    rng = np.random.default_rng(12)

    def ar1(n, phi=0.6):
        x = np.zeros(n)
        for i in range(1, n):
            x[i] = phi * x[i - 1] + rng.normal(0, 0.01 * np.sqrt(1 - phi**2))
        return 0.1 * (1 + x)

    # 10% slower: with one run a side the default between-run term (0.75% a run) leaves a 2% change
    # short of the gate's p < 0.005, a 10% one well past it
    a, b = ar1(200), 1.10 * ar1(200)
    r = compare(RunSeries(names=["a"], series=[a]), RunSeries(names=["b"], series=[b]))
    ref = shift([a], [b])
    assert r.effect == pytest.approx(np.expm1(ref.estimate)) and r.p_value == pytest.approx(ref.p_value)
    assert r.effect_ci == pytest.approx((np.expm1(ref.lo), np.expm1(ref.hi)))
    assert r.verdict == "regression" and "autocorrelation-robust" in r.test
    short = compare(RunSeries(names=["a"], series=[a[:6]]), RunSeries(names=["b"], series=[b[:6]]))
    assert short.verdict == "inconclusive" and "too few steady steps" in short.reason


def test_gate_prints_each_metric_with_its_unit(tmp_path, capsys):
    from trainperf.cli import main
    from trainperf.fleet.gate import format_values

    # hand-worked: 0.0123 s = 12.3 ms; MFU 0.412 of peak = 41.2%; 2**31 bytes = 2 GiB
    assert format_values("step_time", [0.0123, 0.01251]) == ["12.3 ms", "12.51 ms"]
    assert format_values("step_time", [0.9986, 1.028]) == ["0.9986 s", "1.028 s"]  # one unit for both
    assert format_values("mfu", [0.412, 0.3995]) == ["41.2%", "40%"]
    assert format_values("mfu", [41.2, 39.95]) == ["41.2%", "40%"]  # MFU above 1 was given in percent
    assert format_values("tokens_per_s", [12345.6, 512.25]) == ["12,346 tokens/s", "512.2 tokens/s"]
    assert format_values("mem_peak_bytes", [2**31]) == ["2 GiB"]
    assert format_values("loss", [2.5]) == ["2.5"]
    base, cand = str(EXAMPLES / "baseline_step_times.txt"), str(EXAMPLES / "candidate_step_times.txt")
    with pytest.raises(SystemExit):
        main(["gate", "--baseline", base, "--candidate", cand])
    assert "step_time 0.9986 s -> 1.028 s" in capsys.readouterr().out
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(f"{0.40 + i * 1e-4}\n" for i in range(12)))
    b.write_text("".join(f"{0.38 + i * 1e-4}\n" for i in range(12)))
    with pytest.raises(SystemExit):
        main(["gate", "--baseline", str(a), "--candidate", str(b), "--metric", "mfu"])
    assert "mfu 40.1% -> 38.1%" in capsys.readouterr().out


def test_gate_with_repeats_on_different_hosts_takes_compares_hosts_term(tmp_path):
    """Repeats measure their spread on their own hosts, not a difference of hosts: three runs a side, B 10%
    slower, is a regression when both sides ran on one host, but with A on host X and B on host Y and a store
    that knows nothing of how hosts differ, the gate (like `compare`) cannot tell the change from the hosts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
    from test_between import _run

    from trainperf.compare import compare_runs

    rng = np.random.default_rng(3)

    def side(level, host, name):
        runs = [_run(level * (1 + 0.01 * rng.standard_normal(60)), name=f"{name}{i}", host=host) for i in range(3)]
        return runs, RunSeries(names=[r.name for r in runs], series=[r.step_time_s for r in runs], runs=runs,
                               store=str(tmp_path / "store"))

    a_runs, a = side(0.100, "X", "a")
    _, b_same = side(0.110, "X", "b")
    b_runs, b_other = side(0.110, "Y", "c")
    assert compare(a, b_same).verdict == "regression"
    assert compare(a, b_other).verdict == "inconclusive"
    assert compare_runs(a_runs, b_runs, store=str(tmp_path / "store")).perf.verdict == "inconclusive"
