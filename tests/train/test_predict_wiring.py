"""Predicted (trainperf plan) vs measured: the same estimate the planner gives for the layout."""

import pytest

from trainperf.monitor.goodput import Goodput
from trainperf.monitor.monitor import MonitorSummary
from trainperf.specs import load_model, make_cluster, parse_layout
from trainperf.train.predict import predict_step


def _summary(step_time_s, mem):
    return MonitorSummary(steps=10, step_time_s=step_time_s, tokens_per_s=1.0, mfu=0.4, hfu=0.4,
                          mem_peak_bytes=mem, data_wait_s=0.0, final_loss=1.0,
                          goodput=Goodput(1, 1, 0, 0, 0, 0, 0, 0, 1))


def test_prediction_is_the_planners_estimate():
    estimate = pytest.importorskip("trainperf.plan.estimate").estimate
    spec = load_model("llama3-1b", seq_len=8192)
    layout = parse_layout("mbs=2,recompute=none,zero=0,precision=bf16").resolve(1)
    from trainperf.plan.stacks import get_stack

    # the planner's own answer for this trainer's software stack (trainperf plan --stack pytorch-fsdp)
    ref = estimate(spec, make_cluster("h200", 1), layout, sw=get_stack("pytorch-fsdp"))
    got = predict_step(spec, layout, 1, "h200", _summary(0.5, 60e9))
    assert got["predicted"]["step_time_s"] != pytest.approx(
        estimate(spec, make_cluster("h200", 1), layout).step_time_s)  # not the default (megatron-core) stack
    assert got["predicted"]["step_time_s"] == pytest.approx(ref.step_time_s)
    assert got["predicted"]["mem_peak_bytes"] == pytest.approx(ref.memory_bytes_per_gpu)
    assert got["measured_over_predicted"]["step_time_s"] == pytest.approx(0.5 / ref.step_time_s)


def test_no_accelerator_no_prediction():
    got = predict_step(load_model("tiny"), parse_layout("").resolve(1), 1, None, _summary(0.1, 1e6))
    assert "predicted" not in got and "note" in got and got["measured"]["step_time_s"] == 0.1
