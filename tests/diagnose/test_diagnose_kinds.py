"""allocator_stall, pageable_copy and GPU-side step windows on hand-built traces (answers worked by hand)."""

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402


def _allocator_trace(path: Path) -> Path:
    # ROCm names. Each 1000-us step T: hipMalloc [T, T+500); hipLaunchKernel [T+500, +4) -> k1 [T+505, T+605);
    # hipFree [T+510, T+810); hipLaunchKernel [T+810, +4) -> k2 [T+815, T+915). Two steps: span 0..1915 us.
    b = TraceBuilder()
    for s in range(2):
        T = 1000.0 * s
        b.cpu("hipMalloc", T, 500, cat="cuda_runtime")
        b.launch("Cijk_Alik_Bljk_SB_MT64x16x32", T + 500, T + 505, 100, runtime="hipLaunchKernel")
        b.cpu("hipFree", T + 510, 300, cat="cuda_runtime")
        b.launch("Cijk_Alik_Bljk_SB_MT64x16x32", T + 810, T + 815, 100, runtime="hipExtModuleLaunchKernel")
    return b.write(path)


def test_allocator_stall_by_hand(tmp_path):
    # replay with allocator calls free: host calls at 0,0,10,10 | 200,200,210,210 (the 6-us and 186-us CPU
    # gaps stay); kernels launch+5 us, back to back: 5..105, 105..205, 205..305, 305..405 -> span 405 us.
    # Gain 1915 - 405 = 1510 us. On the critical path: the four allocator calls, 2 x (500 + 300) = 1600 us.
    d = diagnose(_allocator_trace(tmp_path / "a.json.gz"))
    f = d.findings[0]
    assert f.kind == "allocator_stall" and f.severity == "high"
    assert f.gain_us == pytest.approx(1510) and f.gain_pct == pytest.approx(100 * 1510 / 1915, abs=0.01)
    assert d.ranks[0].critical_path_pct["allocator"] == pytest.approx(100 * 1600 / 1915)
    assert "expandable_segments" in f.recommendation
    assert not any(x.kind == "launch_bound" for x in d.findings)


def _pageable_trace(path: Path) -> Path:
    # each 1000-us step T: cudaMemcpyAsync [T, T+600) blocks on its copy "Pageable -> Device" of 2.56 MB [T+10, T+590)
    # (4.4 GB/s); then three launches at T+600, +605, +610 of 100-us kernels running T+610 .. T+910. Span 0..1910 us.
    b = TraceBuilder()
    for s in range(2):
        T = 1000.0 * s
        b.launch("Memcpy HtoD (Pageable -> Device)", T, T + 10, 580, cat="gpu_memcpy", launch_dur=600,
                 runtime="cudaMemcpyAsync", bytes=2_560_000)
        for i in range(3):
            b.launch("ampere_sgemm_128x64_tn", T + 600 + 5 * i, T + 610 + 100 * i, 100)
    return b.write(path)


def test_pageable_copy_by_hand(tmp_path):
    # the fix, pinned and non_blocking: each copy call costs the typical 4 us (launch latency 10 us) and its copy runs
    # on its stream at the pinned rate: no device named, 0.8 of PCIe Gen4 x16's 32 GB/s = 25.6 GB/s, 2.56 MB in
    # 100 us. host: copy 0..4, launches 4, 9, 14 | copy at 18 + 386 = 404, launches 408, 413, 418.
    # device: copy0 10..110; the kernels queue behind it on its stream: 110..210, 210..310, 310..410; copy1 414..514;
    # kernels 514..614, 614..714, 714..814 -> span 814 us, gain 1910 - 814 = 1096 us (priced before as a side-stream
    # prefetch that kept each copy's own 580 us: 916 us, the second copy ending the span at 994)
    # blocked host time: 2 x (600 - 4) = 1192 us; on the critical path 2 x 590 us
    d = diagnose(_pageable_trace(tmp_path / "p.json.gz"))
    f = d.findings[0]
    assert f.kind == "pageable_copy" and f.severity == "high"
    assert f.gain_us == pytest.approx(1096)
    m = f.evidence["metrics"]
    assert m["host_blocked"]["value"] == pytest.approx(1192) and m["blocking_copies"]["value"] == 2
    assert m["pinned_rate"]["value"] == pytest.approx(25.6) and m["copy_time_pinned"]["value"] == pytest.approx(200)
    assert m["copy_rate"]["value"] == pytest.approx(2.56e6 / 580e3, abs=1e-3)
    assert d.ranks[0].critical_path_pct["pageable_copy"] == pytest.approx(100 * 1180 / 1910)
    assert "pin_memory=True" in f.recommendation
    assert not any(x.kind == "host_sync" for x in d.findings)


def test_pytorch_pageable_copy_is_a_call_then_a_stream_sync_on_a_skewed_clock(tmp_path):
    # PyTorch's blocking copy_ from a pageable tensor: cudaMemcpyAsync [T, T+1990) then cudaStreamSynchronize
    # [T+1990, T+2010), both waiting for the copy [T+10, T+2000); the device clock reads 10 us late, so the copy call
    # "returns" 10 us (0.5 % of it) before its copy ends (as on an H200: 10-11 us on every 16-ms pageable copy). Both
    # calls are the copy's: unblocked, each costs the typical 4-us call. 3000-us steps; host: copy 0..4, sync 4..8,
    # launches 8, 13, 18 | copy 22 + 976 = 998, sync 1002, launches 1006, 1011, 1016. Device: copy0 of 12.8 MB at the
    # pinned 25.6 GB/s 10..510, kernels queued behind it 510..810; copy1 1008..1508, kernels 1508..1808 -> span
    # 1808 us, gain 5320 - 1808
    b = TraceBuilder()
    for s in range(2):
        T = 3000.0 * s
        c = b.launch("Memcpy HtoD (Pageable -> Device)", T, T + 10, 1990, cat="gpu_memcpy", launch_dur=1990,
                     runtime="cudaMemcpyAsync", bytes=12_800_000)
        b.cpu("cudaStreamSynchronize", T + 1990, 20, cat="cuda_runtime", correlation=c + 100000)
        for i in range(3):
            b.launch("ampere_sgemm_128x64_tn", T + 2010 + 5 * i, T + 2020 + 100 * i, 100)
    d = diagnose(b.write(tmp_path / "pt.json.gz"))
    f = d.findings[0]
    assert f.kind == "pageable_copy" and f.severity == "high"
    assert f.gain_us == pytest.approx(5320 - 1808)
    assert f.evidence["metrics"]["blocking_copies"]["value"] == 2  # each copy once, not its sync again
    assert not any(x.kind == "host_sync" for x in d.findings)


def test_the_pinned_rate_is_the_traces_own_then_the_devices_host_link_then_pcie_gen4(tmp_path):
    # the rate the fix of a pageable copy is priced at: pinned copies of >= 1 MiB in the trace (bytes over time: 8 MiB
    # in 400 us = 20.97 GB/s; a 64-KiB one is left out, its latency not its rate; on ROCm, whose names do not say,
    # those whose call returned before the copy ran), else 0.8 of the device's host link
    # (an H200's PCIe Gen5 x16, 64 GB/s: 51.2), else 0.8 of PCIe Gen4 x16's 32 GB/s
    from trainperf.diagnose.host_link import pinned_copy_rate
    from trainperf.trace.load import load_trace

    def rate(doc_of, pageable=lambda t: np.array([], dtype=np.int64)) -> float:
        b = TraceBuilder()
        b.launch("Memcpy HtoD (Pageable -> Device)", 0, 10, 580, cat="gpu_memcpy", runtime="cudaMemcpyAsync",
                 bytes=2_560_000)
        doc = doc_of(b)
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(doc))
        t = next(iter(load_trace(path).values()))
        return pinned_copy_rate(t, pageable(t)).gbps

    def with_pinned(b):
        b.launch("Memcpy HtoD (Pinned -> Device)", 600, 610, 400, cat="gpu_memcpy", bytes=8 << 20)
        b.launch("Memcpy DtoH (Device -> Pinned)", 1100, 1110, 100, cat="gpu_memcpy", bytes=64 << 10)
        return b.doc()

    assert rate(with_pinned) == pytest.approx((8 << 20) / 400e3)

    def rocm(b):
        # roctracer names neither kind: a copy whose call returned at once is pinned (4 MiB in 200 us: 20.97 GB/s), one
        # whose call returned only when it ended was staged from pageable memory (not the link's rate)
        b.launch("Memcpy HtoD (Host -> Device)", 600, 610, 200, cat="gpu_memcpy", launch_dur=5,
                 runtime="hipMemcpyAsync", bytes=4 << 20)
        b.launch("Memcpy HtoD (Host -> Device)", 900, 905, 800, cat="gpu_memcpy", launch_dur=810,
                 runtime="hipMemcpyAsync", bytes=4 << 20)
        # a synchronous call (PyTorch's blocking copy_ on ROCm) never returns before its copy: one whose clock says so
        # is not read as a pinned copy (1 MiB in 400 us would read 2.6 GB/s)
        b.launch("Memcpy HtoD (Host -> Device)", 2000, 2100, 400, cat="gpu_memcpy", launch_dur=5,
                 runtime="hipMemcpyWithStream", bytes=1 << 20)
        return b.doc()

    assert rate(rocm) == pytest.approx((4 << 20) / 200e3)
    # a copy whose call returned at once but which the host then blocked on (hipMemcpyAsync from pageable memory,
    # then a synchronize: diagnose's pageable copies) is not a pinned one; here the first copy's row, left out
    assert rate(rocm, pageable=lambda t: np.flatnonzero(t.nbytes == 4 << 20)[:1]) == pytest.approx(25.6)
    assert rate(lambda b: dict(b.doc(), deviceProperties=[{"name": "NVIDIA H200", "numSms": 132}])) == \
        pytest.approx(51.2)
    assert rate(lambda b: b.doc()) == pytest.approx(25.6)


def test_gpu_step_windows_follow_launches_not_host_spans(tmp_path):
    # host steps of 10 ms; the GPU runs 27 ms behind: step s launches at 10s+1 ms a kernel that runs at
    # 10s+28 ms for 5 ms, i.e. inside the host span of step s+2. Per step, the GPU window is [10s+28, 10s+33] ms.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_bound import gemm_steps

    b = TraceBuilder()
    gemm_steps(b, 5, 10_000.0, launch_at=1000, start_at=28_000, gemm_us=5000)
    d = diagnose(b.write(tmp_path / "g.json.gz"))
    r = d.ranks[0]
    assert r.gpu_lag_median_us == pytest.approx(28_000)
    assert r.gpu_step_time_median_us == pytest.approx(10_000)
    assert all(x["device_busy_us"] == pytest.approx(5000) for x in r.step_times)
    assert any("after its ProfilerStep ends on the host" in n for n in d.notes)


def _rocm_ddp(path: Path, lag_us: float = 27_000.0,
              comm: str = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", comm_args: dict | None = None,
              device: dict | None = None) -> Path:
    # ROCm DDP, 32 ms per step on the GPU: 10 backward GEMMs of 1 ms (stream 0), an RCCL all-reduce of 20 ms
    # (stream 1) right after them, 2 optimizer kernels of 1 ms (stream 0) waiting for it. Every kernel is
    # launched 27 ms before it starts: the GPU trails the host's ProfilerStep windows by 27 ms. comm_args: the
    # all-reduce kernel's args (message sizes); device: the trace's deviceProperties entry
    b = TraceBuilder()
    for s in range(5):
        G = 32_000.0 * s + lag_us
        b.step(s, 32_000.0 * s, 32_000)
        t = G
        for i in range(10):
            b.launch("Cijk_Alik_Bljk_SB_MT128x128x32", t - lag_us, t, 1000, stream=0, runtime="hipLaunchKernel")
            t += 1000
        b.launch(comm, t - lag_us - 500, t, 20_000, stream=1, runtime="hipExtModuleLaunchKernel", **(comm_args or {}))
        t += 20_000
        for i in range(2):
            b.launch("void at::native::multi_tensor_apply_kernel<SGD>", t - lag_us, t, 1000, stream=0,
                     runtime="hipLaunchKernel")
            t += 1000
    if device is None:
        return b.write(path)
    doc = b.doc()
    doc["deviceProperties"] = [device]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_exposed_comm_priced_when_the_gpu_trails_the_host(tmp_path):
    # 4 steps analysed: span 0 .. 27 + 128 = 155 ms; exposed all-reduce 80 of 128 ms of GPU time (62.5 %).
    # The launch latency is measured on launches onto an idle stream (none here: 5 us default), not the
    # 27-ms queue. Overlapped, the GEMMs and optimizer kernels stop waiting for the all-reduces and each
    # step's kernels start as soon as launched (host timing is kept): the last optimizer kernel is launched
    # at 127 ms and ends at 128.005 ms -> gain 155 - 128.005 = 26.995 ms over the 4 steps. The host kept 27 ms
    # ahead of a busy GPU at its pace, so its own step is unseen: the gain is a share of the device's 32-ms step
    # (diagnose/period.py), 26.995 / 4 / 32 = 21.09 % (the 155-ms window would read 17.4 %). Only device work (the optimizer
    # kernels, which consume the reduced gradients) waits for the all-reduces, no host sync: hiding them needs them
    # issued earlier (bucketing, overlapping the 10-ms backward at most), so the 27 ms are an upper bound, rated
    # one level below high; it still ranks first (a stall)
    d = diagnose(_rocm_ddp(tmp_path / "ddp.json.gz"))
    f = d.findings[0]
    assert f.kind == "exposed_comm" and f.severity == "medium" and f.gain_is_upper_bound
    assert f.gain_us == pytest.approx(155_000 - 128_005)
    assert f.gain_pct == pytest.approx(100 * 26_995 / 4 / 32_000, abs=0.01)
    assert d.ranks[0].comm_us == pytest.approx(80_000) and d.ranks[0].exposed_comm_us == pytest.approx(80_000)
    assert not any(x.kind == "launch_bound" for x in d.findings)


def test_exposed_send_recv_is_an_upper_bound(tmp_path):
    # the same trace with the 20-ms transfers point-to-point (a pipeline stage's send/recv): the replayed gain is
    # the same 26.995 ms (17.4 % of 155 ms, high if measured), but a receiver usually needs what it receives, so
    # overlap may not hide it: an upper bound, rated one level lower (medium)
    d = diagnose(_rocm_ddp(tmp_path / "pp.json.gz", comm="ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"))
    f = next(x for x in d.findings if x.kind == "exposed_comm")
    assert f.gain_us == pytest.approx(155_000 - 128_005)
    assert f.gain_is_upper_bound and f.severity == "medium"
    assert f.evidence["metrics"]["point_to_point_share"]["value"] == pytest.approx(100.0)
    # and the fix is the pipeline schedule's, not the collectives' bucketing (the all-reduce trace above keeps it)
    assert "pipeline" in f.recommendation and "bucket" not in f.recommendation
    assert "bucket" in next(x for x in diagnose(_rocm_ddp(tmp_path / "ddp.json.gz")).findings
                            if x.kind == "exposed_comm").recommendation


MI300X = {"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4, "numSms": 304,
          "totalGlobalMem": 205_822_885_888}


def _all_reduce_args(nelems: int) -> dict:
    return {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float",
            "Group size": 8, "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}


def test_exposed_collectives_slower_than_the_link_name_the_transport(tmp_path):
    # each step's all-reduce of 2^28 floats (1 GiB) over 8 ranks of one MI300X node (Infinity Fabric 448 GB/s one
    # way, catalog) takes 20 ms. NCCL's bus bytes: 1 GiB x 2 x 7/8 = 1,879,048,192 B; at the link's rate
    # 1,879,048,192 / 448e3 = 4,194.3 us, + 10 us fixed cost = 4,204.3 us: 21.0 % of the 20 ms. Bus bandwidth
    # 1,879,048,192 B / 20 ms = 93.95 GB/s. Below a third of the link's rate: the transport is named, before the
    # overlap's fix; one rank's trace, so the caution that a late partner reads the same
    d = diagnose(_rocm_ddp(tmp_path / "slow.json.gz", comm_args=_all_reduce_args(1 << 28), device=MI300X))
    f = next(x for x in d.findings if x.kind == "exposed_comm")
    m = f.evidence["metrics"]
    assert m["transfer_time_at_link_rate"]["value"] == pytest.approx(100 * 4204.3 / 20_000, abs=0.01)
    assert m["collective_bus_bandwidth"]["value"] == pytest.approx(93.952, abs=1e-3)
    assert m["scale-up_link"]["value"] == 448
    assert f.recommendation.startswith("The collectives move their data at 21 % of the scale-up link's rate")
    assert "NCCL_PROTO" in f.recommendation and "this rank's trace alone" in f.recommendation
    assert "bucket" in f.recommendation  # the overlap's fix still follows
    assert m["bytes_over_nccl_ll_protocol"]["value"] == 0 and "LL protocol" not in f.recommendation  # RCCL's name
    # the same collectives named as NCCL's LL protocol names them: the protocol is named too
    d = diagnose(_rocm_ddp(tmp_path / "ll.json.gz", comm="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
                           comm_args=_all_reduce_args(1 << 28), device=MI300X))
    f = next(x for x in d.findings if x.kind == "exposed_comm")
    assert "100 % of the bytes went over NCCL's LL protocol" in f.recommendation
    # 4 GiB in the same 20 ms: 16,787.2 us at the link's rate, 83.9 %: the transfer is fine, only unhidden
    d = diagnose(_rocm_ddp(tmp_path / "fast.json.gz", comm_args=_all_reduce_args(1 << 30), device=MI300X))
    f = next(x for x in d.findings if x.kind == "exposed_comm")
    assert f.evidence["metrics"]["transfer_time_at_link_rate"]["value"] == pytest.approx(83.936, abs=0.01)
    assert f.recommendation.startswith("Overlap communication")
    # without message sizes (PyTorch < 2.1) or a catalog device: no rate, no claim
    for path in (_rocm_ddp(tmp_path / "nosize.json.gz", device=MI300X),
                 _rocm_ddp(tmp_path / "nodev.json.gz", comm_args=_all_reduce_args(1 << 28))):
        f = next(x for x in diagnose(path).findings if x.kind == "exposed_comm")
        assert "transfer_time_at_link_rate" not in f.evidence["metrics"]
        assert f.recommendation.startswith("Overlap communication")


def _saving(path: Path, P: float, S: float, saving_steps, n_steps: int) -> Path:
    # host-bound steps of P us (10 ops of 900 us at T + 1000 i, each launching a 50-us kernel); in the saving steps a
    # synchronous checkpoint of S us at the step's end (the step lasts P + S)
    b = TraceBuilder()
    T = 0.0
    for s in range(n_steps):
        save = S if s in saving_steps else 0.0
        b.step(s, T, P + save)
        for i in range(10):
            b.cpu("aten::mm", T + 1000 * i, 900)
            b.launch("ampere_sgemm_128x64_tn", T + 1000 * i + 10, T + 1000 * i + 20, 50)
        if save:
            b.cpu("dcp.save", T + P, S, cat="user_annotation")
        T += P + save
    return b.write(path)


def _checkpoint_finding(path: Path):
    return next(x for x in diagnose(path).findings if x.kind == "checkpoint_stall")


def test_one_off_checkpoint_priced_over_the_window(tmp_path):
    # host-bound steps of P = 10 ms; one synchronous checkpoint of S = 5 ms at the end of step 1 only: step 1 lasts
    # P + S, step 2 starts at 2P + S. The window (HTA's: the last step's length may be cut by the profiler's stop, so
    # it is left out) holds steps 0-1: replayed saving S of a 2P + S window: S / (2P + S) = 20 %, the share the
    # corpus truth counts.
    P, S = 10_000.0, 5_000.0
    f = _checkpoint_finding(_saving(tmp_path / "ck.json.gz", P, S, {1}, 3))
    assert f.gain_us == pytest.approx(S, abs=1)
    assert f.gain_pct == pytest.approx(100 * S / (2 * P + S), abs=0.05)
    # saved in 1 of the 2 steps: how often the run saves the trace cannot tell, so for the run the 20 % is an upper
    # bound (rate_unknown), rated one level lower than high; priced as measured for the window (the gain above)
    assert f.rate_unknown and f.gain_is_upper_bound and f.severity == "medium"
    assert f.evidence["metrics"]["steps_saving"]["value"] == 1 and "seen in 1 of 2 steps" in f.what_if


def test_a_save_in_every_step_is_a_measured_cost(tmp_path):
    # the same host-bound steps (P = 10 ms) with a 2-ms save at the end of every step: each analysed step pays it,
    # 2 / 12 = 16.7 % of the window, measured, high
    P, S = 10_000.0, 2_000.0
    f = _checkpoint_finding(_saving(tmp_path / "ck.json.gz", P, S, {0, 1, 2}, 3))
    assert not f.rate_unknown and not f.gain_is_upper_bound and f.severity == "high"
    assert f.gain_pct == pytest.approx(100 * S / (P + S), abs=0.05)


def test_a_save_seen_once_in_a_window_without_steps_has_no_rate(tmp_path):
    # the same host-bound iterations without ProfilerSteps (an unscheduled profile): nothing says how many iterations
    # the window holds, so one save (a dcp.save span with a torch.save inside it: one stretch) is an upper bound for
    # the run; saves in 3 separate stretches give the window's rate, measured
    def unstepped(path, saving):
        b = TraceBuilder()
        T = 0.0
        for s in range(3):
            for i in range(10):
                b.cpu("aten::mm", T + 1000 * i, 900)
                b.launch("ampere_sgemm_128x64_tn", T + 1000 * i + 10, T + 1000 * i + 20, 50)
            T += 10_000.0
            if s in saving:
                b.cpu("dcp.save", T, 3000, cat="user_annotation")
                b.cpu("torch.save", T + 100, 2800, cat="user_annotation")
                T += 3000
        return b.write(path)

    once = _checkpoint_finding(unstepped(tmp_path / "once.json.gz", {1}))
    assert once.rate_unknown and once.gain_is_upper_bound and "seen once, in a window without steps" in once.what_if
    every = _checkpoint_finding(unstepped(tmp_path / "every.json.gz", {0, 1, 2}))
    assert not every.rate_unknown and not every.gain_is_upper_bound


def test_checkpoint_after_the_last_launch_of_a_step_counts(tmp_path):
    # 3 steps of 2000 us: 5 launches at T+0..T+40 (100-us kernels T+10..T+510), then a synchronous checkpoint
    # [T+600, T+1800). Steps 0 and 1 are analysed: the replay runs from step 0's start to step 1's end (4000 us,
    # 200 us after its checkpoint). Without the checkpoints step 1 launches at 800 and its host chain closes at
    # 844 + (1956 - 1200) = 1600 (its kernels end at 1310): gain 4000 - 1600 = 2400 us = both checkpoints.
    b = TraceBuilder()
    for s in range(3):
        T = 2000.0 * s
        b.step(s, T, 2000)
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", T + 10 * i, T + 10 + 100 * i, 100)
        b.cpu("dcp.save", T + 600, 1200, cat="user_annotation")
    d = diagnose(b.write(tmp_path / "ck.json.gz"))
    f = d.findings[0]
    assert f.kind == "checkpoint_stall" and f.gain_us == pytest.approx(2400)
    assert f.gain_pct == pytest.approx(100 * 2400 / 4000, abs=0.01)


def test_host_sync_waiting_for_a_collective_is_exposed_communication(tmp_path):
    # GEMM A [10, 110) on stream 7; all-reduce [110, 410) on stream 20 right after it; the host waits for the
    # all-reduce in cudaStreamSynchronize [20, 412) (dist.all_reduce(t); torch.cuda.synchronize()); GEMM B,
    # launched at 420, runs [430, 530). Span 0..530.
    # Overlapped, the sync waits only for A (ends 110, +2 us as observed): B is launched at 120 and runs
    # [130, 230) (launch latency 10 us, seen on B); the all-reduce still ends at 410 -> gain 120 us.
    # The sync is the collective's exposure, not a host_sync to remove.
    b = TraceBuilder()
    b.launch("ampere_sgemm_128x64_tn", 0, 10, 100)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 110, 300, stream=20)
    b.cpu("cudaStreamSynchronize", 20, 392, cat="cuda_runtime")
    b.launch("ampere_sgemm_128x64_tn", 420, 430, 100)
    d = diagnose(b.write(tmp_path / "cw.json.gz"))
    f = next(x for x in d.findings if x.kind == "exposed_comm")
    assert f.gain_us == pytest.approx(120)
    assert f.evidence["metrics"]["host_syncs_waiting_for_collectives"]["value"] == 1
    assert not f.gain_is_upper_bound  # the host's wait is one the trace shows
    assert not any(x.kind == "host_sync" for x in d.findings)
    # on the critical path: the host blocked from the all-reduce's start (110) to the sync's return (412)
    assert d.ranks[0].critical_path_pct["comm_wait"] == pytest.approx(100 * 302 / 530)


def test_straggler_priced_on_the_slow_rank(tmp_path):
    # rank 1's GEMM takes 1000 us where rank 0's takes 500: rank 0 waits 500 us in the all-reduce that ends at
    # 1100 on both. On rank 1, computation 1000/500 = 2x faster: GEMM [10, 510), all-reduce (90 us of its
    # own) [510, 600) -> span 1100 -> 600: gain 500 us = 45.45 %; on rank 0 the wait removed gives the same.
    d = tmp_path / "job"
    d.mkdir()
    for rank, gemm in ((0, 500), (1, 1000)):
        b = TraceBuilder(rank=rank, world_size=2)
        b.launch("ampere_sgemm_128x64_tn", 0, 10, gemm)
        b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 10 + gemm, 1090 - gemm, stream=20)
        b.write(d / f"rank{rank}.json.gz")
    res = diagnose(d)
    f = next(x for x in res.findings if x.kind == "straggler")
    assert f.ranks == [1] and f.gain_us == pytest.approx(500) and f.gain_pct == pytest.approx(100 * 500 / 1100, abs=0.01)
    assert f.evidence["metrics"]["compute_vs_other_ranks"]["value"] == pytest.approx(2.0)
    # its computation beyond the other rank's, 1000 - 500 us, is evidence beside the wait it caused
    assert f.evidence["metrics"]["extra_compute"]["value"] == pytest.approx(500)
    assert f.evidence["metrics"]["caused_wait"]["value"] == pytest.approx(500)


def _growth_trace(path: Path, malloc_steps) -> Path:
    # 4 steps of 1000 us: in the steps listed, cudaMalloc [T, T+400) before the step's launches; each step launches
    # five 50-us kernels at T+400 + 100 i (host-bound)
    b = TraceBuilder()
    for s in range(4):
        T = 1000.0 * s
        b.step(s, T, 1000)
        if s in malloc_steps:
            b.cpu("cudaMalloc", T, 400, cat="cuda_runtime")
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", T + 400 + 100 * i, T + 410 + 100 * i, 50)
    return b.write(path)


def test_allocator_growth_on_first_use_is_not_a_stall(tmp_path):
    # every analysed step (0-2) pays 400 us of cudaMalloc: a recurring stall. Only step 0 paying it is the caching
    # allocator growing its pool on first use: later steps reuse the blocks, and no setting removes the first
    # allocation (audit P2)
    every = diagnose(_growth_trace(tmp_path / "every.json.gz", range(4)))
    assert any(x.kind == "allocator_stall" for x in every.findings)
    first = diagnose(_growth_trace(tmp_path / "first.json.gz", (0,)))
    assert first.ranks[0].steps == every.ranks[0].steps == [0, 1, 2]
    assert not any(x.kind == "allocator_stall" for x in first.findings)


def test_context_init_free_and_pool_growth_without_steps_are_not_a_stall(tmp_path):
    # no ProfilerStep: a 5-ms cudaFree before any allocation (cudaFree(0): a library forcing its context up), then
    # three first allocations of 250 us with no free (HTA's cuda_event_sync_multi_stream: one per new stream) among
    # GEMMs: nothing shows a recurring allocator cost. With a free after each allocation (the cache off) it is one.
    def trace(path, frees):
        b = TraceBuilder()
        b.cpu("cudaFree", 0, 5000, cat="cuda_runtime")
        for i in range(3):
            T = 5000.0 + 1000 * i
            b.cpu("cudaMalloc", T, 250, cat="cuda_runtime")
            b.launch("ampere_sgemm_128x64_tn", T + 260, T + 270, 300)
            if frees:
                b.cpu("cudaFree", T + 600, 250, cat="cuda_runtime")
        return b.write(path)

    assert not any(x.kind == "allocator_stall" for x in diagnose(trace(tmp_path / "g.json.gz", False)).findings)
    off = next(x for x in diagnose(trace(tmp_path / "o.json.gz", True)).findings if x.kind == "allocator_stall")
    assert off.evidence["metrics"]["allocator_calls"]["value"] == 6  # the 5-ms cudaFree(0) is not one of them


@pytest.mark.parametrize("malloc_iterations, stall, n", [(range(4), True, 4), ((0,), False, 4), ((0,), True, 1)])
def test_without_steps_mallocs_recur_by_the_optimizer_iterations(tmp_path, malloc_iterations, stall, n):
    # no ProfilerStep (profiled without prof.step()), but torch.optim's Optimizer.step annotation ends each of 4
    # iterations: a 400-us cudaMalloc with no free in every iteration recurs (in 4 of the 5 parts the annotations
    # cut the window into); in the first iteration only it is the pool growing. A trace of one iteration shows
    # neither: its calls count, as one step's do
    b = TraceBuilder()
    for s in range(n):
        T = 1000.0 * s
        if s in malloc_iterations:
            b.cpu("cudaMalloc", T, 400, cat="cuda_runtime")
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", T + 400 + 100 * i, T + 410 + 100 * i, 50)
        b.cpu("Optimizer.step#AdamW.step", T + 950, 40, cat="user_annotation")
    found = {x.kind for x in diagnose(b.write(tmp_path / "t.json.gz")).findings}
    assert ("allocator_stall" in found) == stall


def test_a_one_off_initialisation_call_is_not_allocator_time(tmp_path):
    # the cache off (a 250-us cudaMalloc and cudaFree around each of 4 GEMMs, no steps) and, after them, one
    # 60-ms cudaFree (a library's initialisation, HTA's PARAM alexnet: 6 s): 240 x the 250-us median of its
    # kind, so it is left out; the 8 others are the allocator's cost: 2000 us
    b = TraceBuilder()
    for i in range(4):
        T = 1000.0 * i
        b.cpu("cudaMalloc", T, 250, cat="cuda_runtime")
        b.launch("ampere_sgemm_128x64_tn", T + 260, T + 270, 300)
        b.cpu("cudaFree", T + 600, 250, cat="cuda_runtime")
    b.cpu("cudaFree", 4000, 60_000, cat="cuda_runtime")
    b.launch("ampere_sgemm_128x64_tn", 64_010, 64_020, 300)
    f = next(x for x in diagnose(b.write(tmp_path / "init.json.gz")).findings if x.kind == "allocator_stall")
    m = f.evidence["metrics"]
    assert m["allocator_calls"]["value"] == 8 and m["allocator_time"]["value"] == pytest.approx(2000)


def test_saves_in_several_steps_give_their_rate(tmp_path):
    # host-bound steps of P = 10 ms; a 2-ms save in steps 1 and 3 of the 4 analysed (0-3): every other step, a rate
    # the window measures: 2 x 2 / (4 x 10 + 2 x 2) = 9.1 %, measured (medium)
    P, S = 10_000.0, 2_000.0
    f = _checkpoint_finding(_saving(tmp_path / "ck.json.gz", P, S, {1, 3}, 5))
    assert f.evidence["metrics"]["steps_saving"]["value"] == 2
    assert not f.rate_unknown and not f.gain_is_upper_bound and f.severity == "medium"
    assert f.gain_pct == pytest.approx(100 * 2 * S / (4 * P + 2 * S), abs=0.05)
