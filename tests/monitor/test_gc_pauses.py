"""Python's garbage-collector pauses per monitored step (monitor.gc_pauses), against CPython's own collection counts
(gc.get_stats), and the trainer's --gc-every schedule (torchtitan's GarbageCollection)."""

import gc

import pytest

from trainperf.monitor.gc_pauses import GcClock
from trainperf.monitor.monitor import Monitor
from trainperf.train.trainer import TrainConfig, scheduled_collection, train


@pytest.fixture
def automatic_collection_off():
    """No collection but the ones a test makes (an allocation threshold would add its own at any moment)."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def _collections_by_generation() -> list[int]:
    return [s["collections"] for s in gc.get_stats()]


def test_the_clock_counts_what_cpython_counts():
    # reference: CPython's per-generation collection counters over the same stretch, automatic collections included
    before = _collections_by_generation()
    clock = GcClock()
    for i in range(200_000):  # container objects in cycles: young-generation collections start on their own
        x = [i]
        x.append(x)
    gc.collect(1)
    gc.collect()
    seconds, collections, full = clock.take()
    after = _collections_by_generation()
    assert collections == sum(after) - sum(before) >= 3
    assert full == after[2] - before[2] >= 1
    assert seconds > 0


def test_a_step_records_the_collections_inside_it(automatic_collection_off):
    mon = Monitor(None, flops_per_token=1.0, peak_flops=1.0, skip_first=0)
    gc.collect()  # before the step: not the step's
    with mon.step(1, tokens=10):
        pass
    with mon.step(2, tokens=10):
        gc.collect(0)
        gc.collect()
    with mon.step(3, tokens=10):
        gc.collect(1)
    r1, r2, r3 = mon.records
    assert (r1["gc_collections"], r1["gc_full_collections"], r1["gc_pause_s"]) == (0, 0, 0.0)
    assert (r2["gc_collections"], r2["gc_full_collections"]) == (2, 1)
    assert (r3["gc_collections"], r3["gc_full_collections"]) == (1, 0)
    for r in (r2, r3):
        assert 0 < r["gc_pause_s"] <= r["step_time_s"]
    s = mon.summary()
    # a mean a step (the steps that collect spread over all), and the longest step's pause
    assert s.gc_pause_s == pytest.approx((r2["gc_pause_s"] + r3["gc_pause_s"]) / 3)
    assert s.gc_pause_max_s == max(r2["gc_pause_s"], r3["gc_pause_s"])
    assert s.to_dict()["gc_pause_s"] == s.gc_pause_s


def test_scheduled_collection_turns_the_collector_off_and_restores_it():
    assert gc.isenabled()
    with scheduled_collection(0):
        assert gc.isenabled()
    with scheduled_collection(5):
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # start-up's objects out of every later collection
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_trainer_collects_every_n_steps_and_no_other_time(tmp_path):
    import json

    result = train(TrainConfig(model="tiny", steps=6, out=str(tmp_path / "run"), progress=False, record=False,
                               peak_tflops=1.0, synthetic=True, gc_every=3))
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: (r["gc_collections"], r["gc_full_collections"]) for r in recs}
    assert by_step == {1: (0, 0), 2: (0, 0), 3: (1, 0), 4: (0, 0), 5: (0, 0), 6: (1, 0)}
    assert result["gc_pause_s"] > 0
    assert gc.isenabled()
    assert "Python GC pauses" in (tmp_path / "run" / "report.html").read_text()  # charted beside the step time


def test_the_gc_collect_fault_is_one_full_collection_in_each_of_its_steps(tmp_path):
    import json

    # --gc-every 100 turns automatic collection off: the fault's calls are the only collections
    train(TrainConfig(model="tiny", steps=6, out=str(tmp_path / "run"), progress=False, record=False, peak_tflops=1.0,
                      synthetic=True, gc_every=100, faults=["gc-collect=2"], fault_steps="3:6"))
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["gc_full_collections"] for r in recs} == {1: 0, 2: 0, 3: 0, 4: 1, 5: 0, 6: 1}
    assert all(r["gc_pause_s"] > 0 for r in recs if r["step"] in (4, 6))



def test_the_summary_line_gives_each_ranks_pauses():
    from rich.console import Console

    from trainperf.train.cli import print_summary

    con = Console(record=True, width=200)
    print_summary(con, {"layout": "dp=2", "run_dir": "r", "step_time_s": 0.1, "gc_pause_s": 0.002,
                        "gc_pause_max_s": 0.03, "ranks": [{"rank": 0, "gc_pause_s": 0.002},
                                                          {"rank": 1, "gc_pause_s": 0.0125}]})
    assert "2.00 ms a step (longest step 30.0 ms; ranks 2.00-12.50 ms)" in con.export_text()
