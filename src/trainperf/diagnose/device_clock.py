"""A device clock behind the host's, read from the launches and undone before any analysis.

Kineto converts the GPU's time stamps to the host's clock (CUPTI's, or ROCm's, conversion); where that conversion is
off, every device event is written some µs early, and a kernel that started right after its launch call began reads
as starting before it. Nothing a trace shows can start before the call that launched it, so the latency of a rank's launch
calls to their first device event, at its 1st percentile (the fast starts on an idle stream; a percentile, not the minimum, so
that one mismatched correlation id cannot move the whole device) is a floor: below zero, the device clock is behind,
by that much plus the floor's usual value (USUAL_FLOOR_US), and the rank's device events are moved that much later
before the window, the syncs and the replay read them.
A sync returns after the work it waited for and a blocking copy within 20 µs of its copy's end (replay.py): with the
device written 20 µs early, the corpus's blocking syncs and pageable copies read as not blocking (16 of its 233
cases changed their top finding; benchmarks/format_robustness.py --variants device_clock_behind).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import DEVICE_KINDS, EventTable

MIN_LAUNCHES = 5        # launch calls needed to read the clock from (fewer: no correction); none can start early
FLOOR_PERCENTILE = 1.0  # the latency percentile taken as the floor (%)
# The floor's usual value on a clock that agrees (µs): the 1st-percentile launch-to-start latency of the real traces
# at hand, HTA's A100/V100/MI250 ranks and the H200 loops, is 3-10 µs, median 7 (docs/benchmarks.md). A floor
# below zero says the clock is behind, by at least minus it; by minus it plus this, most likely
USUAL_FLOOR_US = 7.0


def device_clock_behind_us(t: EventTable) -> float:
    """How far the rank's device clock reads behind its host's (µs, >= 0): USUAL_FLOOR_US minus the 1st-percentile
    launch-to-start latency of its launch calls (to each one's first device event) where that is negative, else 0 (and
    0 with under MIN_LAUNCHES of them)."""
    link = correlated_host_row(t)
    dev = np.flatnonzero((link >= 0) & np.isin(t.kind, DEVICE_KINDS))
    # each launch's first device event: a CUDA graph's later kernels start long after its one launch call
    calls = np.unique(link[dev])
    if calls.size < MIN_LAUNCHES:
        return 0.0
    first_ns = np.full(len(t), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_ns, link[dev], t.ts_ns[dev])
    floor_ns = float(np.percentile(first_ns[calls] - t.ts_ns[calls], FLOOR_PERCENTILE))
    return USUAL_FLOOR_US - floor_ns / 1e3 if floor_ns < 0 else 0.0


def with_device_clock_aligned(t: EventTable) -> tuple[EventTable, str]:
    """The rank's table with its device events moved later by device_clock_behind_us (rows sorted by start again),
    and a note saying so ("" and the table itself when the clock needs no correction)."""
    behind_us = device_clock_behind_us(t)
    if behind_us <= 0:
        return t, ""
    on_device = np.isin(t.kind, DEVICE_KINDS) | (t.stream >= 0)
    ts = t.ts_ns + np.where(on_device, int(round(behind_us * 1e3)), 0)
    moved = replace(t, ts_ns=ts)
    note = (f"rank {t.rank}: the device clock reads {behind_us:.1f} µs behind the host's (launched work written as "
            "starting before the calls that launched it): the device events are moved that much later")
    return moved.take(np.argsort(ts, kind="stable")), note


def with_device_clocks_aligned(tables: dict[int, EventTable]) -> tuple[dict[int, EventTable], list[str]]:
    """Every rank's table through with_device_clock_aligned, and the notes of those corrected."""
    out, notes = {}, []
    for r, t in tables.items():
        out[r], note = with_device_clock_aligned(t)
        notes += [note] if note else []
    return out, notes
