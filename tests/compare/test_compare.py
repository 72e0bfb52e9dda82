"""trainperf compare on runs with known truth: simulated step times (known speed-up, AR(1) noise),
simulated loss curves (known divergence step), and hand-written run folders through the CLI."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainperf.compare import compare_runs
from trainperf.errors import TrainperfError
from trainperf.compare.numerics import compare_numerics, time_to_target
from trainperf.compare.perf import compare_perf, steady_slice
from trainperf.compare.runs import RunData

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from chart_checks import assert_charts  # noqa: E402

SAME = {"model": {"n_layers": 4}, "data": "abc", "seed": 0, "seq_len": 128, "samples_per_step": 2}


def _ar1(rng, n, sigma, rho):
    e = rng.normal(0, sigma * np.sqrt(1 - rho**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, sigma)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + e[i]
    return x


def _run(step_time, loss=None, grad_norm=None, tokens=256, name="r", **comparable):
    n = len(step_time)
    st = np.asarray(step_time, dtype=float)
    return RunData(name=name, step=np.arange(1, n + 1, dtype=float), step_time_s=st,
                   loss=np.full(n, np.nan) if loss is None else np.asarray(loss, float),
                   grad_norm=np.full(n, np.nan) if grad_norm is None else np.asarray(grad_norm, float),
                   tokens_per_s=tokens / st, mfu=np.full(n, 0.4), mem_peak_bytes=np.full(n, 1e9),
                   t_end=100.0 + np.cumsum(st), t_start=100.0, comparable={**SAME, **comparable})


def test_a_3pct_change_with_1pct_noise_over_50_steps_is_detected():
    """On a machine whose runs do not differ (a between-run term of 0, as a quiet history would
    measure it; the runs' own drift still counts): tests/compare/test_between.py has the history."""
    from trainperf.compare.interval import NO_BETWEEN

    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(25):
        a = 0.1 * (1 + _ar1(rng, 50, 0.01, 0.3))
        b = 0.103 * (1 + _ar1(rng, 50, 0.01, 0.3))
        p = compare_perf([_run(a)], [_run(b)], between=NO_BETWEEN)
        hits += p.verdict == "slower"
        assert p.step_time.lo < 0.03 < p.step_time.hi or p.verdict == "slower"
    assert hits >= 24  # the truth: 3% slower


def test_warm_up_is_cut_from_the_steady_state():
    rng = np.random.default_rng(2)
    st = np.r_[0.3 * (1 + rng.normal(0, 0.05, 8)), 0.1 * (1 + rng.normal(0, 0.01, 52))]
    s = steady_slice(st)
    assert 8 <= s.start <= 10 and s.stop == 60
    st = np.r_[[2.0, 0.5], 0.1 * (1 + rng.normal(0, 0.01, 58))]  # two warm-up steps: too short for a change point
    assert steady_slice(st).start == 2


def _curve(rng, n=80, noise=0.02):
    steps = np.arange(1, n + 1)
    return 2.0 + 3.5 * np.exp(-steps / 15) + rng.normal(0, noise, n)


def test_equivalent_when_b_differs_by_rounding_only():
    rng = np.random.default_rng(3)
    loss = _curve(rng)
    gn = 1 + 0.1 * rng.random(80)
    a = _run(np.full(80, 0.1), loss, gn)
    b = _run(np.full(80, 0.1), loss + rng.normal(0, 0.002, 80), gn * (1 + rng.normal(0, 0.002, 80)), kernels=True)
    n = compare_numerics([a], [b])
    assert n.verdict == "equivalent" and n.changed == {"kernels": [None, True]}
    assert n.grad_norm_ratio == pytest.approx(1.0, abs=0.01)


def test_divergence_step_is_found():
    rng = np.random.default_rng(4)
    loss = _curve(rng)
    drift = np.where(np.arange(1, 81) >= 40, 0.05 * (np.arange(1, 81) - 39), 0.0)  # B drifts away from step 40
    n = compare_numerics([_run(np.full(80, 0.1), loss)], [_run(np.full(80, 0.1), loss + drift)])
    assert n.verdict.startswith("diverges at step")
    assert 40 <= int(n.verdict.split()[-1]) <= 46


def test_seed_band_from_repeats_and_pairing_by_seed():
    rng = np.random.default_rng(5)
    base = 2.0 + 3.5 * np.exp(-np.arange(1, 61) / 15)
    a_runs, b_runs = [], []
    for seed in range(3):
        la = base + rng.normal(0, 0.05, 60)
        a_runs.append(_run(np.full(60, 0.1), la, seed=seed, name=f"a{seed}"))
        b_runs.append(_run(np.full(60, 0.1), la + rng.normal(0, 0.01, 60), seed=seed, name=f"b{seed}"))
    n = compare_numerics(a_runs, b_runs)
    assert n.verdict == "equivalent" and "seed-to-seed" in n.band_source
    assert n.final_loss[0][1] is not None  # an interval across the 3 repeats


def test_one_b_seed_against_several_a_seeds_pairs_with_its_own_seed():
    rng = np.random.default_rng(8)
    base = 2.0 + 3.5 * np.exp(-np.arange(1, 61) / 15)
    a_runs = [_run(np.full(60, 0.1), base + rng.normal(0, 0.05, 60), seed=s, name=f"a{s}") for s in range(3)]
    b = _run(np.full(60, 0.1), a_runs[2].loss + rng.normal(0, 0.005, 60), seed=2, name="b2")
    n = compare_numerics(a_runs, [b])
    assert n.comparable and n.verdict == "equivalent" and "seed-to-seed" in n.band_source
    assert compare_numerics(a_runs[:2], [b]).verdict == "not comparable (different seed 0 vs 2)"


def test_not_comparable_names_the_reason():
    a = _run(np.full(20, 0.1), np.linspace(5, 3, 20))
    b = _run(np.full(20, 0.1), np.linspace(5, 3, 20), data="other")
    assert compare_numerics([a], [b]).verdict == "not comparable (different data)"
    c = _run(np.full(20, 0.1), np.linspace(5, 3, 20), seed=1)
    assert compare_numerics([a], [c]).verdict == "not comparable (different seed 0 vs 1)"
    d = _run(np.full(20, 0.1), np.linspace(5, 3, 20))
    d.comparable = None
    assert "no comparability record" in compare_numerics([a], [d]).verdict


def test_time_to_target_by_hand():
    loss = np.array([5.0, 4.0, 3.0, 2.5, 2.0, 1.8, 1.7, 1.6, 1.5, 1.4])
    r = _run(np.full(10, 2.0), loss)
    r.world_size = 8
    got = time_to_target(r, 2.0, use_eval=False)
    # the median of the last 5 steps first reaches <= 2.0 at step 7 (median of 3.0, 2.5, 2.0, 1.8, 1.7); 7 x 2 s
    assert got == {"step": 7, "wall_s": pytest.approx(14.0), "gpu_hours": pytest.approx(14.0 * 8 / 3600)}


def _folder(path, step_time, loss, seed=0):
    path.mkdir()
    t = 1000.0
    lines = []
    for i, (s, l) in enumerate(zip(step_time, loss), 1):
        t += s
        lines.append(json.dumps({"step": i, "attempt": 0, "loss": l, "step_time_s": s, "tokens": 256,
                                 "tokens_per_s": 256 / s, "mfu": 0.3, "mem_peak_bytes": 1e9, "grad_norm": 1.0,
                                 "t_end": t}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "events.jsonl").write_text(json.dumps({"kind": "attempt_start", "attempt": 0, "t": 999.0}) + "\n")
    (path / "run.json").write_text(json.dumps({"world_size": 1, "comparable": {**SAME, "seed": seed}}))


def test_cli_prints_the_verdict_first_and_writes_json_and_html(tmp_path):
    from trainperf.cli import app

    rng = np.random.default_rng(6)
    loss = list(_curve(rng, 40))
    _folder(tmp_path / "a", list(0.1 * (1 + rng.normal(0, 0.01, 40))), loss)
    _folder(tmp_path / "b", list(0.08 * (1 + rng.normal(0, 0.01, 40))), loss)
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json",
                                   str(tmp_path / "c.json"), "--html", str(tmp_path / "c.html")])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("B is 25.") and "faster" in first and first.endswith("numerics: equivalent")
    d = json.loads((tmp_path / "c.json").read_text())
    tt = d["numerics"]["time_to_target"]
    assert d["verdict"] == first and tt["A"]["step"] == tt["B"]["step"]  # the same loss curve
    assert tt["B"]["wall_s"] < tt["A"]["wall_s"]  # reached sooner by the faster run
    assert_charts((tmp_path / "c.html").read_text())
    assert compare_runs(str(tmp_path / "a"), str(tmp_path / "b")).headline == first
    bad = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "nope"), "--store", str(tmp_path)])
    assert isinstance(bad.exception, TrainperfError) and "nope: not a run folder" in str(bad.exception)


def test_kernel_e2e_result_gets_compares_verdict():
    from trainperf.bench.e2e import E2EResult

    rng = np.random.default_rng(7)
    eager = _curve(rng, 60)
    res = E2EResult(eager=eager, eager_rounding_variant=eager + rng.normal(0, 1e-4, 60),
                    kernels=eager + np.where(np.arange(60) >= 30, 0.5, 0.0), step_s={}, applied={})
    assert res.verdict("eager-div") == "equivalent"
    assert res.verdict("kernels") == "diverges at step 31"  # index 30 = step 31, the first shifted step


def test_reference_run_sets_the_band():
    """--reference: the band is 4 x |reference - A|; B as far from A as the reference is stays inside,
    B ten times as far diverges."""
    rng = np.random.default_rng(8)
    loss = _curve(rng, 60)
    ref_gap = 0.01 * (1 + rng.random(60))
    a = _run(np.full(60, 0.1), loss, name="a")
    ref = _run(np.full(60, 0.1), loss + ref_gap, name="fp64", precision="fp64")
    near = compare_numerics([a], [_run(np.full(60, 0.1), loss - ref_gap)], reference=ref)
    assert near.verdict == "equivalent" and "reference" in near.band_source
    far = compare_numerics([a], [_run(np.full(60, 0.1), loss + 10 * ref_gap)], reference=ref)
    assert far.verdict.startswith("diverges at step")


def test_store_run_ids_are_read_with_their_comparability_and_evaluations(tmp_path):
    from trainperf.compare.runs import load_run
    from trainperf.store import write_run
    from trainperf.store.record import RunRecord, StepSample

    def record(run_id, scale):
        samples = [StepSample(step=i, step_time_s=0.1 * scale, tokens_per_s=256 / (0.1 * scale), loss=5.0 - 0.1 * i)
                   for i in range(1, 21)]
        return RunRecord(run_id=run_id, job="j", started_at=1000.0, world_size=2, samples=samples,
                         config={"comparable": SAME, "eval": [[10, 4.2], [20, 3.4]]})

    store = str(tmp_path / "store")
    write_run(record("r-a", 1.0), store)
    write_run(record("r-b", 0.5), store)
    a = load_run("r-a", store)
    assert a.comparable == SAME and a.eval_loss.tolist() == [4.2, 3.4] and a.world_size == 2
    assert a.t_end[-1] == pytest.approx(1000.0 + 20 * 0.1)  # step ends rebuilt from the step times
    c = compare_runs("r-a", "r-b", store=store)
    assert c.perf.throughput.change == pytest.approx(1.0) and c.numerics.verdict == "equivalent"
    tt = c.numerics.time_to_target
    assert tt["A"]["step"] == tt["B"]["step"] == 20 and tt["B"]["gpu_hours"] == pytest.approx(1.0 * 2 / 3600)
