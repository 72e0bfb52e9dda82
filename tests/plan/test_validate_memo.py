"""The validation's memoised fit predictions are the planner's own estimates (benchmarks/validate_planner.py).

The leave-one-source-out headline is fitted through ``predicted_value``, which skips the
memory model and reuses a row's prediction when only constants the row does not use change.
Reference: ``estimate`` itself (``predict``) on every dev row, and a perturbation of each
constant the memo key leaves out, which must not move that row's estimate.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _value(case, est):
    return est.step_time_s if case.kind == "step_time_s" else est.tokens_per_s_per_gpu


def test_memoised_prediction_is_the_estimate(validate):
    cases, _ = validate.load_cases([ROOT / "benchmarks" / "data" / "planner_dev_runs.csv"])
    assert len(cases) > 40
    params = validate.shipped_params()
    for c in cases:
        assert validate.predicted_value(c, params) == pytest.approx(_value(c, validate.predict(c, params)), rel=1e-12)


def test_constants_left_out_of_the_memo_key_do_not_move_the_row(validate):
    cases, _ = validate.load_cases([ROOT / "benchmarks" / "data" / "planner_dev_runs.csv"])
    params = validate.shipped_params()
    for c in cases:
        base = _value(c, validate.predict(c, params))
        for k in validate.unused_constants(c):
            grid = validate.CONSTANTS[k][0]
            other = grid[0] if params[k] != grid[0] else grid[-1]
            assert _value(c, validate.predict(c, dict(params, **{k: other}))) == pytest.approx(base, rel=1e-12), (c.model.name, k)


def test_held_out_generation_gets_the_other_generations_efficiency_per_sustained_clock(validate):
    # A fold without any GB200 row: the Blackwell constant is the mean of the fitted NVIDIA
    # generations' GEMM efficiency per sustained clock (same vendor first), and the row's GEMM
    # rate is that times GB200's own clock fraction (hand formula: (1200 / (400/312 x 2500))^(1/3)).
    cases, _ = validate.load_cases([ROOT / "benchmarks" / "data" / "planner_dev_runs.csv"])
    train = [c for c in cases if c.generation != "blackwell"]
    gb200 = next(c for c in cases if c.cluster.accelerator.name == "gb200")
    params = dict(validate.PRIORS, **{"gemm_eff:ampere": 0.80, "gemm_eff:hopper": 0.76, "gemm_eff:tpu": 0.98})
    nvidia = {c.generation for c in train if c.cluster.accelerator.vendor == "nvidia"}
    prior = validate.generation_prior("blackwell", "nvidia", params, train)
    assert prior == pytest.approx(sum(params[f"gemm_eff:{g}"] for g in nvidia) / len(nvidia), abs=0.005)
    eff, _ = validate._inputs(gb200, dict(params, **{"gemm_eff:blackwell": prior}))
    assert eff.gemm_eff_max == pytest.approx(prior * (1200 / (400 / 312 * 2500)) ** (1 / 3))
    # a vendor no training row has: every fitted generation's mean
    tpu_free = [c for c in cases if c.generation != "tpu"]
    gens = {c.generation for c in tpu_free}
    assert validate.generation_prior("tpu", "google", params, tpu_free) == pytest.approx(
        sum(params[f"gemm_eff:{g}"] for g in gens) / len(gens), abs=0.0051)


def test_every_dev_row_loads_with_its_stated_stack(validate):
    # the dev file states each source's stack with its switches (e.g. FlagPerf's Megatron-Core runs:
    # FA2, no opt-in overlap flags); every string must parse and every row become a case
    path = ROOT / "benchmarks" / "data" / "planner_dev_runs.csv"
    cases, skipped = validate.load_cases([path])
    assert skipped == []
    by_model = {c.model.name: c.stack for c in cases}
    fp = by_model["Llama 3 70B (FlagPerf, Megatron-Core, H100 8x8)"]
    assert (fp.attention, fp.tp_overlap, fp.dp_overlap) == ("fa2", 0.0, False)
    assert by_model["Paxml GPT 126M (JAX-Toolbox)"].attention == "math"
    assert by_model["Llama 2 7B (FlagPerf, DeepSpeed ZeRO-3)"].name.startswith("deepspeed-hf")
