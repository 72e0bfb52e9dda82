"""The replay's processing order: a topological order of the graph even where the trace's clocks disagree."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.replay import Change, processing_order  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.kineto import read_kineto  # noqa: E402


def test_a_kernel_written_before_its_launch_is_ordered_after_it():
    # nodes: 0 a launch call at 100 us, 1 its kernel written at 88 (the device clock 12 us behind), 2 a sync at 105
    # waiting for it, 3 the call after the sync at 400. Observed order puts the kernel first; it must follow its launch,
    # and the call after the sync must follow the kernel
    start = np.array([100.0, 88.0, 105.0, 400.0])
    is_host = np.array([True, False, True, True])
    chain = np.array([0, 1, 0, 0])
    launch = np.array([-1, 0, -1, -1])
    sync_wait = np.array([-1, -1, -1, 1])  # node 3's previous call (2) waited for node 1
    order = processing_order(start, is_host, chain, (launch, sync_wait)).tolist()
    assert order.index(0) < order.index(1) < order.index(3)
    assert np.lexsort((~is_host, start)).tolist()[0] == 1  # the observed order, which the replay used before


def test_a_cycle_of_disagreeing_clocks_still_gives_an_order():
    # a copy written before the kernel launched ahead of it on its stream, whose launch follows a sync on that copy:
    # no order satisfies it; the passes stop (ORDER_PASSES) and every node is ordered once
    start = np.array([10.0, 20.0, 5.0, 15.0])
    is_host = np.array([True, True, False, False])
    chain = np.array([0, 0, 1, 1])
    launch = np.array([-1, -1, 1, 0])
    sync_wait = np.array([-1, 3, -1, -1])
    assert sorted(processing_order(start, is_host, chain, (launch, sync_wait)).tolist()) == [0, 1, 2, 3]


def test_host_work_before_a_launch_the_device_clock_writes_early_is_priced(tmp_path):
    # each 2500-us step: 2000 us of host work that launches nothing, then a launch at T+2000 whose 300-us kernel is
    # written at T+1988 (12 us before its call: the device clock behind), a sync on it until T+2290, nothing until the
    # next step. Without the work each step's chain is the launch, the kernel and the sync: at least the span's 2000 us
    # shorter (80 % of the step), at most the whole 2210-us gap before the launch (88.4 %: the untraced rest goes too,
    # less the usual dispatch before a launch). Replayed in observed order the kernel kept its time and the sync with
    # it: under 1 %
    b = TraceBuilder()
    P = 2500.0
    for s in range(4):
        T = s * P
        b.step(s, T, P)
        b.cpu("compute_metrics", T + 1, 1998, cat="user_annotation")
        b.launch("volta_sgemm_128x64_nn", T + 2000, T + 1988, 300)
        b.cpu("cudaStreamSynchronize", T + 2006, 284, cat="cuda_runtime")
    t = read_kineto(b.write(tmp_path / "rank0.json.gz"))
    facts = collect_facts(t, analysis_window(t))
    g = facts.graph
    work_rows = tuple(int(r) for r in g.rows[g.is_host & (g.host_gap > 1500)])
    assert len(work_rows) == 3  # the gap before each analysed step's launch (the last step is left out)
    gain, _ = facts.gain((Change("remove_host_work", rows=work_rows),))
    assert 80.0 <= gain <= 88.4
