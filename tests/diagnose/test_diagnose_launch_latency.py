"""The typical launch latency the replay chains each kernel to its launch by (replay.launch_latency_us), worked by
hand: the 5th percentile of the delays of launches onto an idle stream, given enough of them to be typical."""

import numpy as np
import pytest

from trainperf.diagnose.replay import DEFAULT_LAUNCH_LATENCY_US, LAUNCH_LATENCY_MIN_SAMPLES, launch_latency_us


def _events(idle_delays_us, queued_delays_us):
    """Device events in order on one stream: a first event (no predecessor), then one launched onto the idle stream
    per idle delay (its predecessor ended before its launch), then one per queued delay (launched while its
    predecessor ran). Returns launch_latency_us's arguments."""
    obs, launch_start, end, prev = [np.nan], [np.nan], [0.0], [-1]
    t = 1000.0
    for d in idle_delays_us:
        obs.append(d), launch_start.append(t), end.append(t + d + 10.0), prev.append(len(prev) - 1)
        t += d + 1000.0  # the stream idle again before the next launch
    for d in queued_delays_us:
        obs.append(d), launch_start.append(end[-1] - 5.0), end.append(end[-1] + 10.0), prev.append(len(prev) - 1)
    obs = np.array(obs)
    has_launch = ~np.isnan(obs)
    return obs, has_launch, np.array(prev), np.array(launch_start), np.array(end)


def test_enough_launches_onto_an_idle_stream_give_their_5th_percentile():
    delays = [10.0, 12.0, 14.0, 2851.0]
    assert len(delays) >= LAUNCH_LATENCY_MIN_SAMPLES
    assert launch_latency_us(*_events(delays, [40.0])) == pytest.approx(np.percentile(delays, 5))  # 10.3 us


def test_one_delayed_launch_onto_an_idle_stream_is_not_the_typical_latency():
    # HTA's MI250 step: its one launch onto an idle stream started 2,851 us after its call (the device's first-use
    # set-up); the other launches were queued (their delays measure the queue): the shortest delay of any launch,
    # at most the 5-us default, stands in for it
    assert launch_latency_us(*_events([2851.0], [3132.0, 2776.0])) == DEFAULT_LAUNCH_LATENCY_US
    assert launch_latency_us(*_events([2851.0, 2900.0], [3.0])) == 3.0
