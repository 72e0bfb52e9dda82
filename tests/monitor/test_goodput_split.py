"""Goodput and badput split against hand-worked timelines."""

import pytest

from trainperf.monitor.goodput import compute_goodput


def _step(attempt, step, t_end, step_time=1.0, data_wait=0.0):
    return {"attempt": attempt, "step": step, "t_end": t_end, "step_time_s": step_time, "data_wait_s": data_wait}


def test_single_attempt_hand_worked():
    # Timeline (s): process starts at 100, first step starts at 110 (start-up 10 s);
    # steps 1..4 of 1 s each with 0.25 s data wait, back to back, ending at 114;
    # a 0.5 s checkpoint after step 4; the job ends at 115.
    steps = [_step(0, i, 110 + i, 1.0, 0.25) for i in range(1, 5)]
    events = [{"kind": "attempt_start", "attempt": 0, "t": 100.0},
              {"kind": "checkpoint", "attempt": 0, "t": 114.5, "blocking_s": 0.5}]
    g = compute_goodput(steps, events, end_time=115.0)
    assert g.total_s == pytest.approx(15.0)
    assert g.productive_s == pytest.approx(4 * 0.75)
    assert g.startup_s == pytest.approx(10.0)
    assert g.data_wait_s == pytest.approx(1.0)
    assert g.checkpoint_s == pytest.approx(0.5)
    assert g.restart_s == 0 and g.lost_work_s == 0
    assert g.other_s == pytest.approx(15 - 3 - 10 - 1 - 0.5)
    assert g.goodput == pytest.approx(3.0 / 15.0)


def test_crash_and_resume_hand_worked():
    # Attempt 0: starts at 0, steps 1..6 (1 s each) run 2..8, checkpoint at step 4 (0.2 s,
    # logged at 6.2), crash after step 6. Attempt 1: process starts at 20 (restart = 20 - 8
    # = 12 s), resumes from step 4, first step (5) starts at 23 (start-up 3 s), steps 5..8
    # end at 24..27. Steps 5 and 6 of attempt 0 were thrown away: lost work 2 s.
    steps = [_step(0, i, 2 + i) for i in range(1, 7)] + [_step(1, i, 19 + i) for i in range(5, 9)]
    events = [{"kind": "attempt_start", "attempt": 0, "t": 0.0},
              {"kind": "checkpoint", "attempt": 0, "t": 6.2, "blocking_s": 0.2},
              {"kind": "attempt_start", "attempt": 1, "t": 20.0}]
    g = compute_goodput(steps, events)
    assert g.attempts == 2
    assert g.total_s == pytest.approx(27.0)
    assert g.productive_s == pytest.approx(8.0)  # steps 1-4 of attempt 0, 5-8 of attempt 1
    assert g.lost_work_s == pytest.approx(2.0)
    assert g.restart_s == pytest.approx(12.0)
    assert g.startup_s == pytest.approx(2.0 + 3.0)
    assert g.checkpoint_s == pytest.approx(0.2)
    parts = g.productive_s + g.startup_s + g.data_wait_s + g.checkpoint_s + g.restart_s + g.lost_work_s + g.other_s
    assert parts == pytest.approx(g.total_s)


def test_empty_job():
    assert compute_goodput([], []).goodput == 0.0
