"""Analyses on hand-built traces whose answers are worked out by hand in the comments."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.crossrank import cross_rank  # noqa: E402
from trainperf.diagnose.gpu_time import (comm_comp_overlap, concurrent_compute_us, idle_split,  # noqa: E402
                                         temporal_breakdown)
from trainperf.diagnose.launch import launch_stats, queue_length  # noqa: E402
from trainperf.diagnose.replay import Change, build_graph, critical_path, replay  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace import load_trace, read_kineto  # noqa: E402


def _load(b: TraceBuilder, tmp_path, name="t.json.gz"):
    t = read_kineto(b.write(tmp_path / name))
    return t, analysis_window(t)


def test_breakdown_and_overlap_by_hand(tmp_path):
    # comm [0,100) on stream 20; compute [50,150) on stream 7; memcpy [200,210); window 0..210
    # busy = [0,150) + [200,210) = 160 -> idle 50; compute 100; non-compute 160-100 = 60
    # overlap: comm ∩ compute = [50,100) = 50 of 100 comm -> 50 %
    b = TraceBuilder()
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", -10, 0, 100, stream=20)
    b.launch("ampere_sgemm_128x64_tn", -5, 50, 100)
    b.launch("Memcpy DtoH (Device -> Pinned)", 0, 200, 10, cat="gpu_memcpy")
    t, w = _load(b, tmp_path)
    tb = temporal_breakdown(t, w)
    assert (tb.window_us, tb.idle_us, tb.compute_us, tb.non_compute_us) == (210, 50, 100, 60)
    ov = comm_comp_overlap(t, w)
    assert ov.comm_us == 100 and ov.overlapped_us == 50 and ov.overlap_pct == pytest.approx(50)


def test_concurrent_compute_by_hand(tmp_path):
    # stream 7: GEMMs [0,80) and [100,200); stream 8: GEMMs [50,150) and [300,320); stream 20: an all-reduce [0,400),
    # which is no computation. [0,80) shares 30 us with stream 8, [100,200) 50; [50,150) shares 30 + 50 = 80 with
    # stream 7; [300,320) nothing
    b = TraceBuilder()
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", -20, 0, 400, stream=20)
    for launch, start, dur, stream in ((-10, 0, 80, 7), (-9, 100, 100, 7), (-8, 50, 100, 8), (-7, 300, 20, 8)):
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", launch, start, dur, stream=stream)
    t, w = _load(b, tmp_path)
    gemms = w.device[t.stream[w.device] != 20]
    order = np.argsort(w.ts_us[gemms])
    assert concurrent_compute_us(t, w, gemms[order]).tolist() == [30.0, 80.0, 50.0, 0.0]


def test_idle_split_by_hand(tmp_path):
    # stream 7: k1 [0,10); k2 launched at 20 (after k1 ended at 10), starts 25 -> gap 15 is host wait;
    # k3 launched 21, starts 45 after k2 ends 35 -> gap 10 < 30 us -> kernel wait;
    # k4 launched 22, starts 135 after k3 ends 55 -> gap 80 -> other.
    b = TraceBuilder()
    b.launch("k1", -5, 0, 10)
    b.launch("k2", 20, 25, 10)
    b.launch("k3", 21, 45, 10)
    b.launch("k4", 22, 135, 10)
    t, w = _load(b, tmp_path)
    s = idle_split(t, w)
    assert (s.host_wait_us, s.kernel_wait_us, s.other_us) == (15, 10, 80)
    ls = launch_stats(t, w)
    # launch delays: 5, 5, 24, 113 -> median 14.5; all four kernels are 10 us (not < 10): none small
    assert ls.delay_median_us == pytest.approx(14.5) and ls.small_kernel_count_pct == 0
    # queue at each launch (-5, 20, 21, 22): k1 outstanding=1; at 20 k1 done -> 1; 2; 3
    assert queue_length(t, w).by_stream[7] == (pytest.approx(7 / 4), 3)


def test_window_excludes_last_profiler_step(tmp_path):
    # as HTA: host events from the last ProfilerStep on and the kernels they launched are dropped
    b = TraceBuilder()
    b.step(1, 0, 100).step(2, 100, 100)
    b.launch("k_step1", 10, 20, 50)
    b.launch("k_step2", 110, 120, 50)
    t, w = _load(b, tmp_path)
    assert temporal_breakdown(t, w).window_us == 50
    assert w.steps_excluded == [2]


def _data_and_sync_trace() -> TraceBuilder:
    # step: launches at 1000/1010/1020 of 100-us kernels back to back on stream 7 -> device busy 1005..1305;
    # cudaDeviceSynchronize at 1030 waits until 1305; then the data loader runs [1310, 2310) (host only);
    # next launches at 2310.. -> the GPU idles 1305..2315 for the data.
    b = TraceBuilder()
    for i in range(3):
        b.launch("ampere_sgemm_128x64_tn", 1000 + 10 * i, 1005 + 100 * i, 100)
    b.cpu("cudaDeviceSynchronize", 1030, 275, cat="cuda_runtime")
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1310, 1000, cat="user_annotation")
    for i in range(3):
        b.launch("ampere_sgemm_128x64_tn", 2310 + 10 * i, 2315 + 100 * i, 100)
    return b


def test_replay_reproduces_trace_and_what_if_gains_by_hand(tmp_path):
    t, w = _load(_data_and_sync_trace(), tmp_path)
    g = build_graph(t, w)
    base = replay(g)
    # baseline replay = the trace: first call 1000 .. last kernel end 2615
    assert base.makespan_us == pytest.approx(1615)
    # removing the data-loader wait removes its 1000 us gap between the sync and the next launch
    assert base.makespan_us - replay(g, Change("remove_data_wait")).makespan_us == pytest.approx(1000)
    # GEMMs 2x faster: second burst ends at 2315 + 3*50 = 2465 and the first burst ends earlier too, but
    # the sync then waits less: first burst 1005..1155, sync ends 1155, data 1000 us after the 5 us gap
    # -> next launches shift 150 us earlier -> end = 2465 - 150 = 2315 -> gain 300
    assert base.makespan_us - replay(g, Change("speedup", 0, 2.0)).makespan_us == pytest.approx(300)
    # removing the sync: the host goes on after the call's own cost (4 us, the median runtime call) at 1034;
    # the 1005 us of host work before the next launch -> launch 2039, kernel ready 2044 (5 us launch
    # latency, the 5th percentile seen), three 100-us kernels -> end 2344 instead of 2615: gain 271
    assert base.makespan_us - replay(g, Change("remove_syncs")).makespan_us == pytest.approx(271)
    cp = critical_path(g, base)
    assert sum(cp.values()) == pytest.approx(base.makespan_us)
    assert cp["dataloader"] == pytest.approx(1000) and cp["sync_wait"] > 0


def _two_rank_allreduce_job(tmp_path):
    """Write a 2-rank job with two all-reduces; return its folder.

    all-reduce #0: rank 0 arrives at 100, rank 1 at 250, both end at 300;
    all-reduce #1: rank 0 at 1000, rank 1 at 1040, both end at 1100 (times in us).
    """
    d = tmp_path / "job"
    d.mkdir()
    for rank, (a0, a1) in enumerate(((100, 1000), (250, 1040))):
        b = TraceBuilder(rank=rank, world_size=2)
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", a0 - 5, a0, 300 - a0, stream=20)
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", a1 - 5, a1, 1100 - a1, stream=20)
        b.write(d / f"rank{rank}.json.gz")
    return d


def test_straggler_by_hand(tmp_path):
    # all-reduce #0: rank 0 arrives at 100, rank 1 at 250, both end at 300 -> rank 0 waits 150, caused by rank 1;
    # all-reduce #1: rank 0 at 1000, rank 1 at 1040, both end at 1100 -> rank 0 waits 40 more
    d = _two_rank_allreduce_job(tmp_path)
    tables = load_trace(d)
    ws = {r: analysis_window(t) for r, t in tables.items()}
    xr = cross_rank(tables, ws, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0})
    assert len(xr.collectives) == 2
    assert xr.wait_by_rank_us == {0: 190, 1: 0}
    assert xr.straggler == (1, 190)


def test_critical_path_crosses_ranks_through_collective_waits(tmp_path):
    # same job as above: rank 0's step ends with all-reduce #1, where it waited 40 us for rank 1;
    # the critical path of rank 0 therefore contains 40 us of "wait_for_rank_1"
    from trainperf.diagnose.api import diagnose

    d = _two_rank_allreduce_job(tmp_path)
    res = diagnose(d)
    r0 = res.ranks[0]
    span_us = 1100 - 95  # first launch call .. last kernel end
    assert r0.critical_path_pct["wait_for_rank_1"] == pytest.approx(100 * 40 / span_us)
    assert res.cross_rank["straggler_rank"] == 1


def test_collectives_matched_within_process_groups(tmp_path):
    # 4 ranks, two data-parallel groups {0,1} (PG "1") and {2,3} (PG "2"); in PG "2" rank 3 arrives
    # 300 us late, in PG "1" both arrive together: only rank 2 waits (300 us), caused by rank 3
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(4):
        b = TraceBuilder(rank=rank, world_size=4)
        pg = "1" if rank < 2 else "2"
        arrive = 400 if rank == 3 else 100
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", arrive - 5, arrive, 500 - arrive, stream=20,
                 **{"Process Group Name": pg, "Collective name": "allreduce"})
        b.write(d / f"rank{rank}.json.gz")
    tables = load_trace(d)
    ws = {r: analysis_window(t) for r, t in tables.items()}
    xr = cross_rank(tables, ws, {}, {})
    assert sorted(c.kind for c in xr.collectives) == ["1/all_reduce", "2/all_reduce"]
    assert xr.wait_by_rank_us == {0: 0, 1: 0, 2: 300, 3: 0}
    assert xr.straggler == (3, 300)
