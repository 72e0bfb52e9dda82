"""Layout search: only valid layouts, vectorised evaluation equals the one-layout estimate."""

import numpy as np
import pytest

from trainperf.errors import TrainperfError
from trainperf.plan.estimate import RECOMPUTE_NAME, check_layout, estimate
from trainperf.plan.search import evaluate_all, search
from trainperf.specs import Layout, load_model, make_cluster


def test_search_returns_valid_fitting_layouts():
    m = load_model("llama3-70b")
    c = make_cluster("h100", 256)
    res = search(m, c, 512, top=20)
    assert len(res.best) == 20 and res.n_fit <= res.n_candidates
    for e in res.best:
        lay = e.layout
        assert lay.tp * lay.pp * lay.cp * lay.dp == 256
        assert m.n_heads % lay.tp == 0 and 512 % (lay.dp * lay.mbs) == 0
        assert lay.dp * lay.mbs * lay.grad_accum == 512
        assert e.fits
        check_layout(m, c, lay, 512)  # raises on any divisibility problem
    steps = [e.step_time_s for e in res.best]
    assert steps == sorted(steps)


def test_vectorised_equals_scalar():
    # every candidate of the array evaluation must match estimate() on the same Layout
    m = load_model("llama3-8b")
    c = make_cluster("h100", 32)
    arrays, out = evaluate_all(m, c, 64)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(arrays), size=min(60, len(arrays)), replace=False)
    for i in idx:
        lay = Layout(tp=int(arrays.tp[i]), pp=int(arrays.pp[i]), dp=int(arrays.dp[i]),
                     cp=int(arrays.cp[i]), vpp=int(arrays.vpp[i]), sp=bool(arrays.sp[i]),
                     zero=int(arrays.zero[i]), recompute=RECOMPUTE_NAME[int(arrays.recompute[i])],
                     mbs=int(arrays.mbs[i]))
        assert arrays.at(int(i)).resolve(32, 64) == lay.resolve(32, 64)
        est = estimate(m, c, lay, 64)
        assert est.step_time_s == pytest.approx(out["step_time_s"][i], rel=1e-12)
        assert est.memory_bytes_per_gpu == pytest.approx(out["memory_bytes"][i], rel=1e-12)
        assert est.breakdown["dp_comm"] == pytest.approx(out["dp_comm"][i], rel=1e-12, abs=1e-15)


def test_search_covers_the_space():
    # tiny model on 8 GPUs: enumerate by hand the (tp, pp, cp) that divide 8 and the model
    m = load_model("tiny")  # 4 heads, 2 kv heads, 4 layers, seq 128
    c = make_cluster("h100", 8)
    arrays, _ = evaluate_all(m, c, 32)
    combos = {(int(t), int(p), int(cp)) for t, p, cp in zip(arrays.tp, arrays.pp, arrays.cp)}
    assert (1, 1, 1) in combos and (4, 2, 1) in combos and (2, 4, 1) in combos and (1, 1, 8) in combos
    assert all(4 % t == 0 and p <= 4 for t, p, _ in combos)
    assert set(np.unique(arrays.recompute)) == {0, 1, 2} and set(np.unique(arrays.zero)) == {0, 1, 2, 3}


def test_no_fit_reports_smallest_memory():
    with pytest.raises(TrainperfError, match=r"smallest needs [\d.]+ GiB .* GPU has 80.0 GiB"):
        search(load_model("llama3-405b"), make_cluster("h100", 8), 8)


def test_cost_objective_may_use_fewer_gpus():
    res = search(load_model("llama3-8b"), make_cluster("h100", 64), 256, objective="cost", top=3)
    assert all(n in (64, 32, 16, 8) for n in res.extra["n_gpus_used"])
    costs = [e.step_time_s * n for e, n in zip(res.best, res.extra["n_gpus_used"])]
    assert costs == sorted(costs)


def test_big_search_is_fast_enough():
    # the target is < 1 s (benchmarks/bench_plan_search.py measures it); CI machines are
    # shared, so this only guards against losing vectorisation (10x regressions)
    res = search(load_model("llama3-405b"), make_cluster("h100", 16384), 2048, top=5)
    assert res.elapsed_s < 5.0 and res.n_candidates > 1000
