"""Collectives across ranks: skew apart from transfer and NCCL bus bandwidth, worked out by hand."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.collectives import bus_factor, collective_stats, collectives_for_trace, comm_args  # noqa: E402
from trainperf.hardware import get_accelerator  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"


def test_bus_factors_follow_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather / reducescatter / alltoall (n-1)/n, bcast 1
    assert bus_factor("all_reduce", 8) == 1.75 and bus_factor("all_gather", 8) == 0.875
    assert bus_factor("reduce_scatter", 4) == 0.75 and bus_factor("all_to_all", 2) == 0.5
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("send_recv", 2) == 1.0


def _rank(rank: int, clock: float, colls: list[tuple[float, float, int]]) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=2)
    for start, dur, nelems in colls:
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", clock + start - 5, clock + start, dur, stream=20,
                 **{"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                    "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"})
    return b


def test_skew_transfer_and_bus_bandwidth_by_hand(tmp_path):
    # rank 1's clock runs 1000 µs ahead. Collective 0: rank 0 arrives at 100, rank 1 at 150, both end
    # at 350 -> skew 50 (rank 0 waits 50), transfer 200 µs for 16 Mi floats = 67,108,864 B:
    # algbw 67108864 B / 200 µs = 335.54 GB/s, busbw x 2(2-1)/2 = 335.54 GB/s. Collective 1: both at
    # 500, end 600: skew 0, transfer 100 µs for 8 Mi floats: 335.54 GB/s. H100 SXM, ranks 0-1 in one
    # node: NVLink 450 GB/s one way -> 74.57 %.
    (tmp_path / "run").mkdir()
    for r, clock, colls in ((0, 0.0, [(100, 250, 1 << 24), (500, 100, 1 << 23)]),
                            (1, 1000.0, [(150, 200, 1 << 24), (500, 100, 1 << 23)])):
        _rank(r, clock, colls).write(tmp_path / "run" / f"rank{r}.json.gz")
    tables = {r: read_kineto(tmp_path / "run" / f"rank{r}.json.gz") for r in (0, 1)}
    sizes = {r: comm_args(t) for r, t in tables.items()}
    (g,) = collective_stats(tables, get_accelerator("h100-sxm"), sizes)
    assert collective_stats(tables, get_accelerator("h100-sxm")) == [g]  # sizes read from the tables by default
    assert (g.group, g.kind, g.count, g.ranks) == ("0/all_reduce", "all_reduce", 2, [0, 1])
    assert g.skew_us == pytest.approx(50) and g.transfer_us == pytest.approx(300)
    assert g.wait_by_rank_us == {0: pytest.approx(50), 1: pytest.approx(0)}
    assert g.busbw_gbps_median == pytest.approx(335.544, abs=1e-3)
    assert (g.link, g.link_gbps) == ("scale-up", 450.0) and g.busbw_pct_of_link == pytest.approx(74.565, abs=1e-3)
    assert json.dumps(g.to_json())


def test_one_rank_transfer_is_the_whole_kernel(tmp_path):
    # nothing to match: transfer = kernel time (an upper bound), bandwidth a lower bound
    t = read_kineto(_rank(0, 0.0, [(100, 250, 1 << 24)]).write(tmp_path / "r.json.gz"))
    (g,) = collective_stats({0: t}, None, {0: comm_args(t.source)})  # a path is read first
    assert g.skew_us == 0 and g.transfer_us == 250
    assert g.busbw_gbps_median == pytest.approx((1 << 26) / 250e3) and g.link_gbps is None


def test_real_trace_message_sizes():
    # rank 0 of 2, A100, NCCL: every all-reduce kernel carries In/Out msg nelems and dtype
    f = HTA / "nccl_parser_config" / "nccl_data.json.gz"
    if not f.exists():
        pytest.skip(f"{f} absent (../shared/data not mounted)")
    stats = {g.kind: g for g in collectives_for_trace(f, accelerator="a100-40gb")}
    ar = stats["all_reduce"]
    assert ar.count == 15 and ar.bytes_median > 0 and 0 < ar.busbw_gbps_median < ar.link_gbps
    assert ar.link == "scale-up"


@pytest.mark.parametrize("kind,n,size_b,time_us,algbw,busbw", [
    # nccl-tests' own output, rows copied by hand: all_reduce_perf over 16 H100s (2 nodes x 8;
    # github.com/lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result) and sendrecv_perf over
    # 8 A100s (github.com/li-plus/playground, cuda/nccl.md)
    ("all_reduce", 16, 8589934592, 47535, 180.71, 338.82),
    ("all_reduce", 16, 134217728, 1652.2, 81.24, 152.32),
    ("all_reduce", 16, 33554432, 1059.9, 31.66, 59.36),
    ("send_recv", 2, 134217728, 1211.2, 110.81, 110.81),
])
def test_bandwidths_reproduce_nccl_tests_output(kind, n, size_b, time_us, algbw, busbw):
    # nccl-tests: algbw = size / time; busbw = algbw x factor (PERFORMANCE.md); printed to 0.01 GB/s from a
    # time printed rounded (to 1 µs above 10 ms): within 1e-4 relative (the factors differ by >= 6%)
    from trainperf.diagnose.collectives import Collective

    c = Collective(group=kind, kind=kind, seq=0, arrival_us={0: 0.0}, end_us={0: float(time_us)}, nbytes=size_b,
                   group_size=n)
    assert c.algbw_gbps == pytest.approx(algbw, rel=1e-4) and c.busbw_gbps == pytest.approx(busbw, rel=1e-4)


def test_message_size_is_nccl_tests_size_column(tmp_path):
    # nccl-tests' "size" of all_gather / reduce_scatter is the whole gathered (scattered) buffer, n x the
    # per-rank count: the larger of "In msg nelems" and "Out msg nelems" (PyTorch's per-rank counts)
    b = TraceBuilder(rank=0, world_size=4)
    for i, (name, n_in, n_out) in enumerate((("ncclDevKernel_AllGather_RING_LL", 1000, 4000),
                                             ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 4000, 1000))):
        b.launch(name, 10 + 100 * i, 20 + 100 * i, 50, stream=20, **{
            "In msg nelems": n_in, "Out msg nelems": n_out, "dtype": "BFloat16", "Group size": 4,
            "Process Group Ranks": "[0, 1, 2, 3]"})
    t = read_kineto(b.write(tmp_path / "r.json.gz"))
    sizes = comm_args(t)
    assert sorted(a.nbytes for a in sizes.values()) == [8000, 8000]
    assert {a.group_ranks for a in sizes.values()} == {(0, 1, 2, 3)}


def _sendrecv_under(ops_by_kernel: list[tuple[str, ...]]) -> TraceBuilder:
    """One ncclKernel_SendRecv per entry, its launch inside the given host ops (outermost first, each 20 µs
    wider than the next), 100 µs apart: the way NCCL runs all-to-all (and, in some versions, other collectives)."""
    b = TraceBuilder(rank=0, world_size=2)
    for i, ops in enumerate(ops_by_kernel):
        t0 = 100.0 + 100.0 * i
        for depth, op in enumerate(ops):
            b.cpu(op, t0 + 2 * depth, 60.0 - 4 * depth)
        b.launch("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", t0 + 20.0, t0 + 30.0, 10.0, stream=20)
    return b


def test_the_collective_of_a_sendrecv_kernel_is_the_op_that_launched_it(tmp_path):
    """NCCL's all-to-all runs as ncclKernel_SendRecv kernels (HTA's negative_queue trace: 65 of its 80 SendRecv
    kernels are launched inside c10d::alltoall_base_, _reduce_scatter_base_, allreduce_ or _allgather_base_).
    The collective is the innermost enclosing collective op that names one (record_param_comms without args
    names none); a SendRecv launched inside c10d::send, or inside no collective op, stays point-to-point.
    Before, every one was "send_recv" by its kernel name."""
    from trainperf.diagnose.crossrank import launch_collectives
    from trainperf.trace.events import COMMUNICATION, KERNEL

    b = _sendrecv_under([("nccl:all_to_all", "c10d::alltoall_base_", "record_param_comms"),
                         ("c10d::_reduce_scatter_base_", "record_param_comms"),
                         ("ReduceScatterBase_WaitBackward", "nccl:_all_gather_base", "c10d::_allgather_base_"),
                         ("c10d::send", "record_param_comms"),
                         ()])
    # batch_isend_irecv's kernel, launched as its coalesced group ends, named by the group, not by a collective
    b.cpu("nccl:coalesced", 640.0, 60.0)
    b.launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 660.0, 670.0, 10.0, stream=20,
             **{"Collective name": "coalesced"})
    t = read_kineto(b.write(tmp_path / "r.json.gz"))
    rows = np.flatnonzero((t.category == COMMUNICATION) & (t.kind == KERNEL))
    rows = rows[np.argsort(t.ts_ns[rows])]
    assert launch_collectives(t, rows) == ["all_to_all", "reduce_scatter", "all_gather", "send_recv", "send_recv",
                                           "send_recv"]


def test_negative_queue_collectives_are_not_point_to_point():
    f = HTA / "negative_queue_length_values_check"
    if not f.exists():
        pytest.skip(f"{f} absent (../shared/data not mounted)")
    from trainperf.diagnose.crossrank import collective_rows
    from trainperf.diagnose.window import analysis_window
    from trainperf.trace.load import load_trace

    (t,) = load_trace(f).values()
    groups = {k: len(v) for k, v in collective_rows(t, analysis_window(t)).items()}
    # by the launching ops: counted from the raw JSON (kernels launched before the last ProfilerStep starts, the
    # innermost enclosing c10d::/nccl: op of the launch on its thread): 36 / 8 / 8 / 8, all SendRecv kernels
    assert groups == {"all_to_all": 36, "reduce_scatter": 8, "all_reduce": 8, "all_gather": 8}


def test_consensus_offset_and_end_agreement_by_hand():
    from trainperf.diagnose.crossrank import consensus_offset, ends_agree

    # 4 pairs agree on +150 µs (within 100 µs or 5 % of the shorter kernel); 3 pairs of other process groups'
    # collectives, matched by order, end 13.9-134 ms apart: the offset is the 4's median, not the 7's (62.8 ms)
    diffs = np.array([62789.0, 87882.0, 100.0, 134153.0, 200.0, -13869.0, 150.0, 160.0])
    durs = np.array([30669.0, 41375.0, 8370.0, 17614.0, 42496.0, 12119.0, 13838.0, 62163.0])
    assert consensus_offset(diffs, durs) == pytest.approx(155.0)
    assert consensus_offset(np.array([5.0, 7.0, 9.0]), np.array([1e3, 1e3, 1e3])) == pytest.approx(7.0)
    assert consensus_offset(np.array([0.0, 1e6, 3e6]), np.array([10.0, 10.0, 10.0])) == pytest.approx(1e6)  # none agree
    assert ends_agree({0: 1000.0, 1: 1099.0}, {0: 500.0, 1: 800.0})        # 99 <= 100 µs
    assert not ends_agree({0: 1000.0, 1: 1101.0}, {0: 500.0, 1: 800.0})
    assert ends_agree({0: 0.0, 1: 2400.0}, {0: 50e3, 1: 60e3})              # 2.4 ms <= 5 % of 50 ms


def test_trace_filter_matches_only_collectives_that_end_together():
    """HTA trace_filter (ranks 0 and 1 of 128, no process-group names): its SendRecv kernels are all-to-all,
    all-reduce and all-gather of several process groups; of the 5 pairs matched by order in the analysed step, 2
    end within 0.4 ms of each other once aligned (the rest 13.9-134 ms apart, by the raw JSON): only those are
    one collective, and the clock offset is theirs (0.14 ms), not the median of all (62.8 ms before)."""
    from trainperf.diagnose.api import diagnose

    f = HTA / "trace_filter"
    if not f.exists():
        pytest.skip(f"{f} absent (../shared/data not mounted)")
    d = diagnose(f)
    assert d.cross_rank["n_collectives_matched"] == 2
    assert abs(d.cross_rank["clock_offset_us"][1]) < 400
    assert any("do not end together" in n for n in d.notes)


def test_transfer_rate_against_the_link_by_hand(tmp_path):
    # one rank's trace, H100 SXM, 2 ranks of one node (NVLink 450 GB/s one way): three all-reduces of 16 Mi floats
    # (67,108,864 B; bus factor 2(2-1)/2 = 1) taking 1000, 600 and 2000 us. Waiting only adds time: each counts as
    # the fastest, 600 us. At the link's rate one takes 67,108,864 / 450e3 = 149.13 us + 10 us fixed = 159.13 us:
    # 159.13 / 600 = 26.5 % of the time taken; bus bandwidth 3 x 67,108,864 B / 1,800 us = 111.85 GB/s
    from trainperf.diagnose.collectives import transfer_rate
    from trainperf.diagnose.crossrank import group_collective_rows
    from trainperf.trace.events import COMMUNICATION, KERNEL

    t = read_kineto(_rank(0, 0.0, [(100, 1000, 1 << 24), (2000, 600, 1 << 24), (3000, 2000, 1 << 24)])
                    .write(tmp_path / "r.json.gz"))
    rows = np.flatnonzero((t.category == COMMUNICATION) & (t.kind == KERNEL))
    groups = group_collective_rows(t, rows)
    h100 = get_accelerator("h100-sxm")
    rate = transfer_rate(t, groups, None, h100)
    assert (rate.sized_count, rate.link, rate.link_gbps, rate.partners_seen) == (3, "scale-up", 450.0, False)
    assert rate.link_share == pytest.approx((10 + (1 << 26) / 450e3) / 600)
    assert rate.busbw_gbps == pytest.approx(3 * (1 << 26) / 1800e3)
    assert rate.ll_share == 1.0  # "..._RING_LL": NCCL's low-latency protocol moved every byte
    # the other rank's trace matched: the 1000-us one waited 500 us for it -> 500 us of transfer, now the fastest
    rate = transfer_rate(t, groups, {int(rows[0]): 500.0}, h100)
    assert rate.partners_seen and rate.link_share == pytest.approx((10 + (1 << 26) / 450e3) / 500)
    assert rate.busbw_gbps == pytest.approx(3 * (1 << 26) / 1500e3)
    # no catalog device: no rate
    assert transfer_rate(t, groups, None, None) is None


def test_collectives_of_a_handful_of_values_do_not_rate_the_link(tmp_path):
    # the three 16-Mi-float all-reduces above, and two of one float (a barrier, a loss average) each taking 3000 us,
    # nearly all of it waiting for the other rank: their 4 bytes say nothing of the link's rate, so the rate is the
    # large ones' alone (26.5 % of the time taken), not one dragged down by 6 ms that moved 8 bytes
    from trainperf.diagnose.collectives import transfer_rate
    from trainperf.diagnose.crossrank import group_collective_rows
    from trainperf.trace.events import COMMUNICATION, KERNEL

    t = read_kineto(_rank(0, 0.0, [(100, 1000, 1 << 24), (2000, 600, 1 << 24), (3000, 2000, 1 << 24),
                                   (6000, 3000, 1), (10000, 3000, 1)]).write(tmp_path / "r.json.gz"))
    rows = np.flatnonzero((t.category == COMMUNICATION) & (t.kind == KERNEL))
    rate = transfer_rate(t, group_collective_rows(t, rows), None, get_accelerator("h100-sxm"))
    assert rate.sized_count == 3
    assert rate.link_share == pytest.approx((10 + (1 << 26) / 450e3) / 600)
