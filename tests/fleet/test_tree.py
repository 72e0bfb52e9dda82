"""`fleet tree`: a store of runs with faults of known size; each fault lands on its factor.

References are worked by hand from the fleet's parameters (fleet/tree_synth.py's defaults,
restated below): 8 runs (4 hosts x 2 jobs) of 8 GPUs, 1000 steps of 2.97 s compute at 40% MFU
plus 0.03 s data wait, 300 s start-up, 10 checkpoints of 6 s, 120 s evaluation. GPU-hours =
seconds x 8 / 3600 = seconds / 450. The only number not worked by hand is the planner's MFU for
the layout, which "below plan" is defined against: it is read from trainperf.plan.api.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainperf.cli import app
from trainperf.errors import TrainperfError
from trainperf.fleet.tree import build_tree, fleet_tree, parse_since, superseded
from trainperf.fleet.tree_explain import explain, explain_largest
from trainperf.fleet.tree_synth import TreeFleet
from trainperf.hardware import get_accelerator
from trainperf.plan.api import PlanRequest, run_layout
from trainperf.store import RunRecord, StepSample, write_run

H = 450.0  # seconds per GPU-hour on 8 GPUs
NO_FAULTS = dict(slow_host={}, checkpoint_stall={}, data_stall={}, restart={})


@pytest.fixture(scope="module")
def trees():
    return build_tree(TreeFleet(**NO_FAULTS).records()), build_tree(TreeFleet().records())


@pytest.fixture(scope="module")
def planned_mfu():
    fleet = TreeFleet()
    est, _ = run_layout(PlanRequest(model=fleet.model, gpu="h100", n_gpus=8, seq=8192), fleet.layout)
    return est.mfu


def gh(tree, key):
    return tree.node(key).gpu_h


def test_each_fault_lands_on_its_factor_with_its_size(trees):
    healthy, faulty = trees
    # hand-worked size of each fault in GPU-hours
    slow = 2 * 1000 * (2.97 * 0.40 / 0.30 - 2.97) / H  # 2 runs on the slow host, 0.99 s more compute a step
    expected = {"checkpoint": 600 / H, "data_wait": 200 * 3.0 / H, "restart": 180 / H, "startup": 300 / H,
                "lost_work": 50 * 3.0 / H, "below_plan": slow}
    expected["productive"] = slow
    expected["running"] = slow + expected["checkpoint"] + expected["data_wait"]
    expected["allocated"] = expected["running"] + 180 / H + 300 / H + 150 / H
    for n in healthy.root.walk():
        assert gh(faulty, n.key) - n.gpu_h == pytest.approx(expected.get(n.key, 0.0), abs=1e-9), n.key


def test_absolute_factors_by_hand(trees, planned_mfu):
    _, t = trees
    assert gh(t, "checkpoint") == pytest.approx((8 * 10 * 6 + 600) / H)
    assert gh(t, "data_wait") == pytest.approx((8 * 1000 * 0.03 + 200 * 3) / H)
    assert gh(t, "startup") == pytest.approx((8 * 300 + 300) / H)
    assert gh(t, "eval_other") == pytest.approx(8 * 120 / H)
    productive = (6 * 1000 * 2.97 + 2 * 1000 * 3.96) / H
    assert gh(t, "productive") == pytest.approx(productive)
    # every run does the same work: 1000 x 2.97 s at 40% of peak
    effective = 8 * 1000 * 2.97 * 0.40 / H
    assert gh(t, "effective") == pytest.approx(effective)
    assert gh(t, "layout_overhead") == pytest.approx(effective / planned_mfu - effective)
    assert gh(t, "below_plan") == pytest.approx(productive - effective / planned_mfu)
    assert sum(c.gpu_h for c in t.node("layout_overhead").children) == pytest.approx(gh(t, "layout_overhead"))
    assert t.effective_fraction == pytest.approx(effective / gh(t, "allocated"))
    # children add up to their parent everywhere
    for n in t.root.walk():
        if n.children:
            assert sum(c.gpu_h for c in n.children) == pytest.approx(n.gpu_h), n.key


def test_dollars_at_catalog_price_or_given_price(trees):
    _, t = trees
    price = get_accelerator("h100").usd_per_hour
    assert t.node("checkpoint").usd == pytest.approx(gh(t, "checkpoint") * price)
    t2 = build_tree(TreeFleet().records(), usd_per_gpu_hour=2.0)
    assert t2.root.usd == pytest.approx(2.0 * gh(t2, "allocated"))


def test_explain_names_where_each_fault_sits(trees):
    _, t = trees
    where = {k: explain(t, k) for k in ("below_plan", "checkpoint", "data_wait", "restart")}
    assert [s.attrs for s in where["below_plan"].segments] == [{"host": "gpu-node-3"}]
    assert where["checkpoint"].segments[0].run_ids == ["tree-02-gpu-node-1-llama-pretrain"]
    assert where["data_wait"].segments[0].run_ids == ["tree-05-gpu-node-2-llama-anneal"]
    assert where["restart"].segments[0].run_ids == ["tree-01-gpu-node-0-llama-anneal"]
    assert "gpu-node-3" in where["below_plan"].verdict
    # the largest loss (the kernels' share of the layout overhead) is a property of every run
    first, second = explain_largest(t)
    assert first.factor == t.largest_loss().key and not first.segments and "spread" in first.verdict
    assert second.factor == "below_plan"


FAULT_RUNS = {"checkpoint": ["tree-02-gpu-node-1-llama-pretrain"], "data_wait": ["tree-05-gpu-node-2-llama-anneal"],
              "restart": ["tree-01-gpu-node-0-llama-anneal"]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_faults_are_placed_under_run_to_run_noise(seed):
    # every run's MFU, data wait, checkpoint, start-up and evaluation time drawn with a 5% CV
    fleet = TreeFleet(n_steps=50, noise=0.05, seed=seed, hosts=tuple(f"gpu-node-{i}" for i in range(6)),
                      data_stall={"host": "gpu-node-2", "job": "llama-anneal", "steps": 50, "extra_s": 3.0})
    t = build_tree(fleet.records())
    assert [s.attrs for s in explain(t, "below_plan").segments] == [{"host": "gpu-node-3"}]
    for factor, runs in FAULT_RUNS.items():
        assert [s.run_ids for s in explain(t, factor).segments] == [runs], factor
    assert not explain(t, "kernels").segments and not explain(t, "communication").segments


def test_one_stalled_run_among_many_is_still_named():
    # 80 runs: the stall is ~3% of the fleet's checkpoint time, so the factor is "mostly spread",
    # yet the run holding the excess is named
    t = build_tree(TreeFleet(n_steps=20, hosts=tuple(f"gpu-node-{i}" for i in range(40))).records())
    e = explain(t, "checkpoint")
    assert [s.run_ids for s in e.segments] == [FAULT_RUNS["checkpoint"]] and "mostly spread" in e.verdict


def test_runs_without_goodput_plan_or_price(tmp_path):
    # an imported run: no goodput split, GPU not in the catalog, no MFU on one of them
    recs = [RunRecord(run_id=f"imp{i}", job="imported", gpu_model="cpu", world_size=2, kind="import",
                      samples=[StepSample(step=s, step_time_s=1.0, data_wait_s=0.25, mfu=0.3 if i else None)
                               for s in range(1, 5)]) for i in range(2)]
    t = build_tree(recs)
    # allocated = step time only: 4 s x 2 GPUs per run
    assert gh(t, "allocated") == pytest.approx(2 * 4 * 2 / 3600)
    assert gh(t, "data_wait") == pytest.approx(2 * 1.0 * 2 / 3600)
    # run 1: MFU over productive time = 0.3 x 4 / 3 = 0.4; run 0: not measured
    assert gh(t, "effective") == pytest.approx(3 * 2 * 0.4 / 3600)
    assert gh(t, "unplanned") == pytest.approx(3 * 2 * 0.6 / 3600)
    assert gh(t, "mfu_unknown") == pytest.approx(3 * 2 / 3600)
    assert t.root.usd is None and any("catalog price" in n for n in t.notes)


def test_a_later_attempt_supersedes_the_earlier_record():
    recs = TreeFleet(**NO_FAULTS).records()[:1] * 2
    first, second = (RunRecord(**{**r.__dict__}) for r in recs)
    second.run_id, second.started_at = "later", first.started_at + 10
    second.config = json.loads(json.dumps(first.config))
    second.config["summary"]["goodput"]["attempts"] = 2
    assert superseded([second, first]) == {first.run_id}
    assert [a.run_id for a in build_tree([first, second]).accounts] == ["later"]


def test_synthetic_runs_carry_the_monitors_goodput_fields():
    # the tree reads config["summary"]["goodput"] as trainperf.monitor writes it: same keys
    from trainperf.monitor.goodput import compute_goodput

    gp = TreeFleet(n_steps=3).records()[0].config["summary"]["goodput"]
    assert set(gp) == set(compute_goodput([], []).to_dict())


def test_one_run_has_nothing_to_segment():
    t = build_tree(TreeFleet(n_steps=3).records()[:1])
    assert "nothing to segment" in explain(t).verdict


def test_a_record_written_by_the_monitor():
    # the real producer: trainperf.monitor's Monitor and build_run_record, 5 steps of 2000 tokens
    # on 2 GPUs at 1e6 FLOP/token and a 1e12 FLOP/s peak. Reference: the work at peak is
    # 5 x 2000 x 1e6 / 1e12 = 0.01 GPU-seconds whatever the step times (hand formula).
    import time

    from trainperf.monitor.monitor import Monitor
    from trainperf.monitor.record import build_run_record

    mon = Monitor(None, world_size=2, peak_flops=1e12, flops_per_token=1e6, skip_first=0)
    for s in range(1, 6):
        with mon.step(s, tokens=2000) as st:
            with st.data():
                time.sleep(0.002)
            time.sleep(0.004)
    with mon.checkpoint(5):
        time.sleep(0.005)
    rec = build_run_record(mon, mon.summary(), {"host": "h", "gpu_model": "cpu"}, job="j")
    gp = rec.config["summary"]["goodput"]
    t = build_tree([rec])
    assert gh(t, "effective") == pytest.approx(0.01 / 3600)
    for key, field in (("allocated", "total_s"), ("data_wait", "data_wait_s"), ("checkpoint", "checkpoint_s"),
                       ("startup", "startup_s"), ("productive", "productive_s")):
        assert gh(t, key) == pytest.approx(gp[field] * 2 / 3600), key
    assert gh(t, "unplanned") == pytest.approx(gh(t, "productive") - gh(t, "effective"))


def test_parse_since():
    assert parse_since("7d", now=1e6) == 1e6 - 7 * 86400
    assert parse_since("1700000000", now=0) == 1.7e9
    assert parse_since("2026-01-02", now=0) == 1767312000.0
    with pytest.raises(TrainperfError, match="--since"):
        parse_since("yesterday", now=0)


def test_cli_over_a_store(tmp_path):
    small = TreeFleet(n_steps=100, data_stall={"host": "gpu-node-2", "job": "llama-anneal", "steps": 50,
                                               "extra_s": 3.0})
    for r in small.records():
        write_run(r, str(tmp_path))
    run = CliRunner().invoke
    res = run(app, ["fleet", "tree", "--store", str(tmp_path), "--json", "--explain", "--html",
                    str(tmp_path / "t.html")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["allocated_gpu_h"] == pytest.approx(gh(build_tree(small.records()), "allocated"))
    # 100 steps: the 600 s checkpoint stall outweighs the slow host's 2 x 99 s
    assert [e["factor"] for e in out["explain"]][1] == "checkpoint"
    page = (tmp_path / "t.html").read_text()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from chart_checks import assert_charts

    assert_charts(page)  # the waterfall (tests/report/test_fleet_tree_chart.py checks its numbers)
    assert "tree-02-gpu-node-1-llama-pretrain" in page
    res = run(app, ["fleet", "tree", "--store", str(tmp_path), "--host", "gpu-node-1", "--code-version", "a1b2c3",
                    "--factor", "checkpoint"])
    assert res.exit_code == 0 and "checkpoint stalls" in res.output
    assert "tree-02-gpu-node-1-llama-pretrain" in res.output
    assert fleet_tree(str(tmp_path), job="llama-anneal").root.gpu_h == pytest.approx(
        sum(a.parts["allocated"] for a in build_tree(small.records()).accounts if a.attrs["job"] == "llama-anneal"))
    with pytest.raises(TrainperfError, match="no training runs"):
        fleet_tree(str(tmp_path), version="9.9")


def test_a_fleet_where_no_run_measured_its_mfu(tmp_path):
    """A plain record (step times only) gives a tree whose effective share is 'not measured', not an error."""
    from rich.console import Console

    from trainperf.report.fleet_tree import terminal_tree, tree_report

    rec = RunRecord(run_id="plain", job="j", host="h", gpu_model="h100", world_size=8,
                    samples=[StepSample(step=s, step_time_s=2.0) for s in range(1, 4)])
    t = build_tree([rec])
    assert t.effective_gpu_h is None and t.effective_fraction is None
    assert gh(t, "mfu_unknown") == pytest.approx(3 * 2.0 * 8 / 3600)
    console = Console(record=True, width=120)
    console.print(terminal_tree(t))
    assert "not measured" in console.export_text()
    assert "not measured" in tree_report(t, tmp_path / "t.html").read_text()


def test_explain_threshold_is_a_bonferroni_t_test():
    # 4 hosts x 2 jobs, one version and config: the segments the search can name select 15
    # distinct run sets (8 runs, 4 hosts, 2 jobs, all runs; counted by hand), so the z a segment
    # needs is Student's t quantile (7 degrees of freedom) at 0.01 / 15 (reference: scipy.stats.t)
    import numpy as np
    from scipy.stats import t as student_t

    from trainperf.fleet.tree_explain import ALPHA, critical_z

    def leaves(n_hosts, n_jobs):
        pairs = [(f"h{i}", f"j{j}") for i in range(n_hosts) for j in range(n_jobs)]
        return {"job": np.array([j for _, j in pairs]), "host": np.array([h for h, _ in pairs]),
                "version": np.array(["v"] * len(pairs)), "config": np.array(["c"] * len(pairs))}

    assert ALPHA == 0.01
    assert critical_z(leaves(4, 2)) == pytest.approx(student_t.isf(0.01 / 15, 7))
    assert critical_z(leaves(4, 2), alpha=0.05) == pytest.approx(student_t.isf(0.05 / 15, 7))
    # more places to look (40 hosts: 80 + 40 + 2 + 1 run sets) need more evidence per place...
    assert critical_z(leaves(40, 2)) == pytest.approx(student_t.isf(0.01 / 123, 79))


@pytest.mark.parametrize("seed", [2, 9])
def test_noise_alone_names_no_place(seed):
    # A/A: 12 runs with 10% run-to-run noise and no fault. A loose rule (alpha 0.5, no excess
    # share) names places in noise here; the defaults name none (over 150 random fleets they
    # name one in ~2% of fault-free factors, docs/benchmarks.md)
    t = build_tree(TreeFleet(n_steps=20, noise=0.1, seed=seed, hosts=tuple(f"gpu-node-{i}" for i in range(6)),
                             **NO_FAULTS).records())
    factors = ("below_plan", "checkpoint", "data_wait", "startup", "eval_other")
    assert any(explain(t, f, min_excess_share=0.0, alpha=0.5).segments for f in factors)
    for factor in factors:
        assert not explain(t, factor).segments, factor


def test_a_slow_host_inside_multi_node_runs_is_placed_on_the_host():
    # 6 hosts, 2 jobs, each run on 2 consecutive hosts (4 ranks each); gpu-node-3 computes at 0.75x,
    # so the runs whose first host is gpu-node-2 or gpu-node-3 are slow. Only the ranks list says
    # which host it was: rank 0's host alone blames gpu-node-2 as much as gpu-node-3
    hosts = tuple(f"gpu-node-{i}" for i in range(6))
    recs = TreeFleet(nodes_per_run=2, hosts=hosts, n_steps=50, checkpoint_stall={}, data_stall={},
                     restart={}).records()
    t = build_tree(recs)
    e = explain(t, "below_plan")
    assert [s.attrs for s in e.segments] == [{"host": "gpu-node-3"}]
    assert sorted(r.split("@")[0] for r in e.segments[0].run_ids) == [
        "tree-04-gpu-node-2-llama-pretrain", "tree-05-gpu-node-2-llama-anneal",
        "tree-06-gpu-node-3-llama-pretrain", "tree-07-gpu-node-3-llama-anneal"]
    # by hand: a slow run's step computes 2.97 / 0.75 = 3.96 s on gpu-node-3 and 2.97 s on its
    # other host, so gpu-node-3 costs the job 0.99 s per step on all 8 GPUs: 50 x 0.99 / 450 GPU-h;
    # the rest of "below plan", and every other factor, splits 4/8 : 4/8; the pieces sum to the run
    a = next(x for x in t.accounts if x.run_id == "tree-06-gpu-node-3-llama-pretrain")
    straggler = 50 * 0.99 / H
    assert a.host_parts["gpu-node-3"]["below_plan"] == pytest.approx(
        (a.parts["below_plan"] - straggler) / 2 + straggler)
    for k, v in a.parts.items():
        assert sum(p[k] for p in a.host_parts.values()) == pytest.approx(v), k
    # without the ranks list (rank 0's host only) the host cannot be told apart
    for r in recs:
        del r.config["summary"]["ranks"]
    assert [s.attrs for s in explain(build_tree(recs), "below_plan").segments] != [{"host": "gpu-node-3"}]
