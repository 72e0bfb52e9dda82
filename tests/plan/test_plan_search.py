"""Layout search: only valid layouts, vectorised evaluation equals the one-layout estimate."""

import itertools

import numpy as np
import pytest

from trainperf.errors import TrainperfError
from trainperf.plan.estimate import RECOMPUTE_NAME, check_layout, estimate
from trainperf.plan import search as search_module
from trainperf.plan.search import MAX_MBS, MAX_VPP, enumerate_layouts, evaluate_all, search
from trainperf.plan.stacks import get_stack
from trainperf.specs import Layout, layout_problems, load_model, make_cluster, model_from_dict

MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}


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


def _brute_force_layouts(m, n, gb):
    """The search space by its stated rules, one Layout at a time (the reference for the array enumeration)."""
    out = set()
    pows = [2**i for i in range(7)]
    for tp, cp, pp in itertools.product(pows, pows, range(1, n + 1)):
        if n % (tp * cp * pp) or tp > 8:
            continue
        dp = n // (tp * cp * pp)
        for mbs, vpp, sp, zero, rc, ep in itertools.product(
                [b for b in pows if b <= MAX_MBS], range(1, MAX_VPP + 1), (False, True), range(4), range(3),
                [e for e in pows if e <= m.n_experts] if m.is_moe else [1]):
            if gb % (dp * mbs) or (vpp > 1 and pp == 1) or (sp and tp == 1) or (zero >= 2 and pp > 1):
                continue
            if (zero and dp * cp == 1) or (vpp > 1 and -(-m.n_layers // pp) % vpp) or (dp * cp) % ep:
                continue
            lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, sp=sp, zero=zero, recompute=RECOMPUTE_NAME[rc],
                         mbs=mbs, grad_accum=gb // (dp * mbs), ep=ep)
            if not layout_problems(m, lay, n):
                out.add(lay)
    return out


@pytest.mark.parametrize("model, n, gb", [("tiny", 8, 32), ("mixtral", 16, 64)])
def test_enumeration_equals_brute_force(model, n, gb):
    # reference: every combination of the fields, kept when layout_problems and the search's own rules allow it
    m = model_from_dict(MIXTRAL, "mixtral") if model == "mixtral" else load_model(model)
    arrays = enumerate_layouts(m, make_cluster("h100", n), gb)
    got = [arrays.at(i) for i in range(len(arrays))]
    assert len(set(got)) == len(got)  # no layout twice
    assert set(got) == _brute_force_layouts(m, n, gb)


@pytest.mark.parametrize("model, gpu, n, gb, precision, stack", [
    ("llama3-8b", "h100", 32, 64, "fp8", "megatron-core"),
    ("llama3-70b", "h100", 256, 512, "bf16", "pytorch-fsdp"),
    ("gpt3-175b", "a100", 1024, 1536, "bf16", "megatron-2021"),
    ("mixtral", "h100", 64, 256, "bf16", "deepspeed"),
    ("llama3-8b", "tpu-v5p", 64, 256, "bf16", "jax"),  # a runtime reserve other than a GPU's (1.25 GiB)
])
def test_pruned_search_equals_exhaustive_ranking(model, gpu, n, gb, precision, stack, monkeypatch):
    # the search prices time only for layouts that fit, block by block (997 layouts here, so block
    # edges fall anywhere); the reference prices every layout at once (estimate_arrays with its own
    # memory) and ranks the fitting ones by (step time, memory)
    monkeypatch.setattr(search_module, "CHUNK", 997)
    m = model_from_dict(MIXTRAL, "mixtral") if model == "mixtral" else load_model(model)
    c, sw = make_cluster(gpu, n), get_stack(stack)
    res = search(m, c, gb, top=10, precision=precision, sw=sw)
    arrays, out = evaluate_all(m, c, gb, precision, sw=sw)
    fit = np.flatnonzero(out["memory_bytes"] <= c.accelerator.hbm_bytes)
    order = fit[np.lexsort((out["memory_bytes"][fit], out["step_time_s"][fit]))][:10]
    assert res.n_candidates == len(arrays) and res.n_fit == fit.size > 10
    assert [e.layout for e in res.best] == [arrays.at(int(i), precision) for i in order]
    assert [e.step_time_s for e in res.best] == pytest.approx(out["step_time_s"][order], rel=1e-12)
    assert [e.memory_bytes_per_gpu for e in res.best] == pytest.approx(out["memory_bytes"][order], rel=1e-12)
    assert res.min_memory_gib == pytest.approx(out["memory_bytes"].min() / 2**30, rel=1e-12)


def test_why_not_fit_terms_sum_to_the_estimate_on_a_tpu():
    """Reference: the estimate's own memory figure. On a TPU (runtime reserve 1.25 GiB, not a GPU's 2) the
    terms `plan --layout` shows for a layout that does not fit add up to the memory it reports."""
    from trainperf.plan.api import PlanRequest, run_layout

    req = PlanRequest(model="llama3-70b", gpu="tpu-v5p", n_gpus=8, stack="jax")
    est, extra = run_layout(req, "tp=8,pp=1,dp=1,mbs=1")
    assert not est.fits
    terms = extra["memory_terms_bytes"]
    assert sum(terms.values()) == pytest.approx(est.memory_bytes_per_gpu, rel=1e-12)
    assert terms["runtime reserve (context, collective buffers, workspaces)"] < 2 * 2**30
