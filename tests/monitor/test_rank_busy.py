"""Per-rank busy time in the run summary: each step's own compute (phases less measured comm wait),
its median over the measured steps, and one entry per rank (one process: one entry)."""

import socket

import pytest

from trainperf.monitor.monitor import Monitor, step_busy_s


def test_step_busy_is_the_phases_less_comm_wait_by_hand():
    keys = ["backward_s", "forward_s", "optimizer_s"]
    rec = {"step_time_s": 1.0, "data_wait_s": 0.3, "forward_s": 0.1, "backward_s": 0.25, "optimizer_s": 0.05,
           "comm_wait_s": 0.15}
    assert step_busy_s(rec, keys) == pytest.approx(0.1 + 0.25 + 0.05 - 0.15)
    # no phases: the step less its data wait and comm wait
    assert step_busy_s({"step_time_s": 1.0, "data_wait_s": 0.3, "comm_wait_s": 0.2}, []) == pytest.approx(0.5)


def test_one_process_summary_has_one_rank_with_the_median_busy_time(monkeypatch):
    clock = iter(range(1000))
    # a scripted clock: each perf_counter read advances 1 s, so every block lasts a known count of reads
    monkeypatch.setattr("trainperf.monitor.monitor._perf_counter", lambda: float(next(clock)))
    mon = Monitor(None, skip_first=1, rank=0)
    comm = [0.0, 0.5, 0.25, 0.75]
    for s, c in enumerate(comm, 1):
        with mon.step(s) as st:
            with st.data():
                pass
            with st.phase("forward"):
                pass
            with st.phase("backward"):
                pass
            st.add_comm_wait(c)
    # each phase reads the clock twice, 1 s apart: forward 1 + backward 1 = 2 s, less the comm wait;
    # steps 2-4 are measured: busy 1.5, 1.75, 1.25 -> median 1.5
    assert [r.get("comm_wait_s", 0.0) for r in mon.records] == comm
    assert mon.busy_s() == pytest.approx(1.5)
    s = mon.summary()
    assert s.ranks == [{"rank": 0, "host": socket.gethostname(), "busy_s": pytest.approx(1.5),
                        "gc_pause_s": mon.gc_pauses()[0]}]
    assert mon.gc_pauses()[0] == s.gc_pause_s  # the summary's figure is this rank's
    assert mon.gather_ranks() == s.ranks and s.to_dict()["ranks"] == s.ranks
