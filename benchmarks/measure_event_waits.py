"""How long after an op of another stream ends does a device op that waited for it start?

The replay (trainperf.diagnose.replay) links a device op to another stream's op when the op started late
(more than TOL_US after its launch + latency and after its stream's previous op) and within EVENT_WAIT_US of
that other op's end. This script measures, with that same filter, the time from the latest other-stream end
(same device) to each such op's start, over the trace folders given, and prints a histogram with the density
per µs: the event-wait latency shows as a dense head, unrelated ends as a flat floor (the chance rate).

    .venv/bin/python benchmarks/measure_event_waits.py corpus/healthy-*/traces ../shared/data/traces/hta/<folder> ...
"""

from __future__ import annotations

import sys

import numpy as np

from trainperf.diagnose import api
from trainperf.diagnose.replay import TOL_US, Graph, release_us
from trainperf.errors import TrainperfError
from trainperf.trace.nesting import thread_key

EDGES_US = [0, 5, 10, 15, 20, 30, 50, 100, np.inf]


def other_stream_gaps(g: Graph, pid: np.ndarray, stream: np.ndarray) -> list[float]:
    """For each device node the replay's filter leaves unexplained: µs from the latest end of a device op of
    another stream on the same device (after the node's launch/stream release) to the node's start."""
    dev = np.flatnonzero(~g.is_host)
    rows = g.rows[dev]
    streams, device = thread_key(pid[rows], stream[rows]), pid[rows]
    start, end = g.start[dev], g.start[dev] + g.dur[dev]
    released = release_us(g.start, g.start + g.dur, g.launch, g.lat, g.stream_prev)[dev]
    out = []
    for j in np.flatnonzero(np.isfinite(released) & (start - released > TOL_US)):
        m = (streams != streams[j]) & (device == device[j]) & (end <= start[j] + 1e-6) & (end > released[j])
        if m.any():
            out.append(float(start[j] - end[m].max()))
    return out


def main(folders: list[str]) -> None:
    gaps: list[float] = []
    analyse = api.analyse_rank

    def collect(f, job_caveats=()):
        if f.has_gpu:
            gaps.extend(other_stream_gaps(f.graph, f.table.pid, f.table.stream))
        return analyse(f, job_caveats)

    api.analyse_rank = collect  # the graphs diagnose builds, read as it builds them
    for folder in folders:
        try:
            api.diagnose(folder)
        except TrainperfError as e:
            print(f"skipped: {e}")
    counts, _ = np.histogram(np.array(gaps), EDGES_US)
    print(f"{'µs since the other stream ended':>32} {'ops':>6} {'per µs':>7}")
    for lo, hi, n in zip(EDGES_US, EDGES_US[1:], counts):
        per = f"{n / (hi - lo):7.2f}" if np.isfinite(hi) else "      -"
        print(f"{f'{lo}-{hi}':>32} {n:>6} {per}")
    print(f"{'all':>32} {len(gaps):>6}")


if __name__ == "__main__":
    main(sys.argv[1:])
