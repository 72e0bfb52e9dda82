"""Software stacks (--stack): byte counts priced at HBM bandwidth, kernels, overlap, CLI and API."""

import json

import pytest
from typer.testing import CliRunner

from trainperf.cli import app
from trainperf.errors import TrainperfError
from trainperf.plan import compute
from trainperf.plan.estimate import check_layout, estimate
from trainperf.plan.stacks import DEFAULT_STACK, STACKS, get_stack
from trainperf.specs import Layout, layout_problems, load_model, make_cluster

runner = CliRunner()


def test_issue_stacks_exist_and_default_is_megatron_core():
    for name in ("megatron-core", "megatron-2021", "deepspeed", "pytorch-fsdp", "pytorch-fsdp-compile", "jax"):
        assert get_stack(name).name == name
    assert DEFAULT_STACK == "megatron-core" and get_stack(None).name == "megatron-core"
    with pytest.raises(TrainperfError, match="unknown stack 'nemo3' \\(known: megatron-core, megatron-2021"):
        get_stack("nemo3")


def test_elementwise_bytes_are_the_operator_counts():
    # hand count (plan/stacks.py): per token, fused = (2 norms x 4 B + residuals 12 B) h + 6 B f + 4 B (q+kv);
    # eager = (2 x 36 + 12) h + 10 B f + 20 B (q+kv). llama3-8b: h 4096, f 14336, q 4096, kv 1024.
    m = load_model("llama3-8b")
    h, f, qkv = 4096, 14336, 4096 + 1024
    fused = compute.layer_elementwise_fwd_s(m, 1.0, 1, False, 1.0, sw=get_stack("megatron-core"))
    eager = compute.layer_elementwise_fwd_s(m, 1.0, 1, False, 1.0, sw=get_stack("pytorch-fsdp"))
    assert float(fused) == pytest.approx(20 * h + 6 * f + 4 * qkv)
    assert float(eager) == pytest.approx(84 * h + 10 * f + 20 * qkv)
    assert float(compute.layer_elementwise_fwd_s(m, 1.0, 1, False, 1.0, sw=get_stack("pytorch-fsdp-compile"))) \
        == pytest.approx(float(fused))


def test_eager_pytorch_is_slower_than_compiled_and_megatron():
    m = load_model("llama3-8b")
    c = make_cluster("h100", 8)
    lay = Layout(zero=3, mbs=1)
    t = {s: estimate(m, c, lay, 32, sw=get_stack(s)) for s in STACKS}
    assert t["pytorch-fsdp"].step_time_s > t["pytorch-fsdp-compile"].step_time_s > t["megatron-core"].step_time_s
    assert t["pytorch-fsdp"].breakdown["host_overhead"] > t["jax"].breakdown["host_overhead"]
    assert all(e.stack == s for s, e in t.items())
    # no flash attention: the score matrix is in HBM, both slower and larger
    old = estimate(m, c, lay, 32, sw=get_stack("megatron-2021"))
    assert old.memory_bytes_per_gpu > t["megatron-core"].memory_bytes_per_gpu


def test_fa2_runs_at_the_catalog_fa2_rate_on_hopper_only():
    m = load_model("llama3-8b")
    lay = Layout(zero=3)
    # A100: FA2 is the best kernel, so the compiled PyTorch stack's attention equals Megatron-Core's
    a_best = estimate(m, make_cluster("a100", 8), lay, 32, sw=get_stack("megatron-core"))
    a_fa2 = estimate(m, make_cluster("a100", 8), lay, 32, sw=get_stack("jax"))
    assert a_best.breakdown["compute"] == pytest.approx(a_fa2.breakdown["compute"])


def test_layout_problems_one_rule_set():
    m = load_model("llama3-8b")  # 32 heads, 8 kv heads, ffn 14336, 32 layers
    assert layout_problems(m, Layout(tp=16), 64) == []  # planner: tp > kv heads replicates them
    assert any("kv heads" in p for p in layout_problems(m, Layout(tp=16), 64, for_trainer=True))
    probs = layout_problems(m, Layout(tp=3, pp=64), 192)
    assert any("tp=3" in p for p in probs) and any("pp*vpp" in p for p in probs)
    assert any("pp=2 is not run" in p for p in layout_problems(m, Layout(pp=2), 8, for_trainer=True))
    with pytest.raises(TrainperfError, match="tp=3 does not divide .*; .*exceeds"):
        check_layout(m, make_cluster("h100", 192), Layout(tp=3, pp=64), None)


def test_cli_stack_flag_json_and_unknown():
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "32", "--layout",
                            "zero=3", "--stack", "pytorch-fsdp", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["stack"] == "pytorch-fsdp" and d["breakdown"]["host_overhead"] > 0
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "32", "--top", "2",
                            "--json"])
    assert json.loads(r.output)["stack"] == "megatron-core"
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--stack", "nope"])
    # main() prints a TrainperfError as one line (tests/plan/test_plan_cli.py checks that path)
    assert isinstance(r.exception, TrainperfError) and "unknown stack 'nope'" in str(r.exception)


def test_plan_help_lists_every_stack():
    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.replace("│", " ").split())
    for name in STACKS:
        assert name in text, name
