"""Monitor.step's aside(): work inside a step that is not the step's is timed apart and left out."""

import time

import pytest

from trainperf.monitor import Monitor


def test_aside_time_is_recorded_and_left_out_of_the_step():
    mon = Monitor(None, flops_per_token=1.0, peak_flops=1.0)
    with mon.step(1, tokens=10) as st:
        time.sleep(0.01)
        with st.aside("eval"):
            time.sleep(0.05)
    rec = mon.records[-1]
    assert rec["eval_s"] == pytest.approx(0.05, abs=0.03)
    assert 0.01 <= rec["step_time_s"] < 0.05  # the 50 ms aside is not in the step
    assert rec["tokens_per_s"] == pytest.approx(10 / rec["step_time_s"])
