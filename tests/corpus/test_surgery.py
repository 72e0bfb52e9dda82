"""Trace surgery against hand-worked timelines (µs) on small synthetic Kineto traces."""

import random

import pytest

from trainperf.corpus import kineto as K
from trainperf.corpus.build import Base, build_corpus
from trainperf.corpus.inject import (LAYOUT_TRANSPOSE_KERNELS, LAYOUT_TRANSPOSES_PER_STEP, TINY_KERNEL, NotApplicable,
                                     inject_checkpoint_stall, inject_exposed_comm, inject_gpu_held, inject_layout_transposes,
                                     inject_launch_bound, inject_pageable_copy, inject_small_kernels, inject_straggler)
from trainperf.corpus.surgery import DeviceWait, HostWork, insert_device_delays, insert_host_work

HOST, GPU = (1, 1), (0, 7)


def _x(name, cat, pid_tid, ts, dur, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid_tid[0], "tid": pid_tid[1], "ts": ts, "dur": dur, "args": {}}
    if corr is not None:
        e["args"] = {"correlation": corr, "stream": pid_tid[1]}
    return e


def three_steps():
    """3 steps of 100 µs; each launches (at +10, 5 µs) one 50 µs kernel that starts at +15."""
    ev = []
    for k in range(3):
        t = 100.0 * k
        ev += [_x(f"ProfilerStep#{k + 1}", "user_annotation", HOST, t, 100.0),
               _x("aten::mm", "cpu_op", HOST, t + 8, 12.0),
               _x("cudaLaunchKernel", "cuda_runtime", HOST, t + 10, 5.0, corr=k + 1),
               _x("gemm", "kernel", GPU, t + 15, 50.0, corr=k + 1)]
    ev.append({"ph": "f", "id": 2, "pid": 0, "tid": 7, "ts": 115.0, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return {"traceEvents": ev}


def _by_name(doc, name):
    return [e for e in doc["traceEvents"] if e.get("name") == name]


def test_dataloader_10us_before_each_of_3_steps_lengthens_by_30_and_shifts_later_events():
    doc = three_steps()
    work = [HostWork(at_us=100.0 * k + 0.5, host_us=10.0, spans=(("enumerate(DataLoader)", "user_annotation"),))
            for k in range(3)]
    out = insert_host_work(doc, work, main=HOST, stream=GPU, latency_us=5.0)
    steps = _by_name(out, "ProfilerStep#1") + _by_name(out, "ProfilerStep#2") + _by_name(out, "ProfilerStep#3")
    # hand-worked: step k starts at 110 k and lasts 110 (its own fetch inside it)
    assert [(e["ts"], e["dur"]) for e in steps] == [(0.0, 110.0), (110.0, 110.0), (220.0, 110.0)]
    assert [e["ts"] for e in _by_name(out, "cudaLaunchKernel")] == [20.0, 130.0, 240.0]
    # launch-bound kernels keep their 5 µs launch latency: they move with their launch
    assert [e["ts"] for e in _by_name(out, "gemm")] == [25.0, 135.0, 245.0]
    assert [(e["ts"], e["dur"]) for e in _by_name(out, "enumerate(DataLoader)")] == [(0.5, 10.0), (110.5, 10.0),
                                                                                     (220.5, 10.0)]
    assert [e["ts"] for e in out["traceEvents"] if e.get("ph") == "f"] == [135.0]  # flow follows its kernel
    assert K.step_time_us(doc["traceEvents"]) == 100.0
    assert K.step_time_us(out["traceEvents"]) == 110.0  # 30 µs over 3 steps


def test_gpu_slack_absorbs_host_delay_at_a_sync():
    # one step: kernel [15, 95] launched at 10; the host syncs at 60 and returns at 96 (kernel end + 1)
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 100.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, 15.0, 80.0, corr=1),
          _x("cudaStreamSynchronize", "cuda_runtime", HOST, 60.0, 36.0),
          _x("aten::add", "cpu_op", HOST, 97.0, 2.0)]
    out = insert_host_work({"traceEvents": ev}, [HostWork(at_us=50.0, host_us=10.0, spans=(("x", "cpu_op"),))],
                           main=HOST, stream=GPU, latency_us=5.0)
    sync = _by_name(out, "cudaStreamSynchronize")[0]
    assert (sync["ts"], sync["ts"] + sync["dur"]) == (70.0, 96.0)  # waits 10 µs less, returns as before
    assert _by_name(out, "aten::add")[0]["ts"] == 97.0
    assert _by_name(out, "ProfilerStep#1")[0]["dur"] == 100.0


def test_the_op_around_a_sync_returns_with_it_when_slack_absorbs_host_delay():
    # as above, with the sync inside an aten::item [58, 96) that ends at its very instant (a whole-us trace, or a read
    # the surgery planted): 10 us inserted at 50 move the item's start to 68 and the sync still returns at 96, so the
    # item ends there too (before: 96 + 10, over the aten::add the host runs at 97)
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 100.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, 15.0, 80.0, corr=1),
          _x("aten::item", "cpu_op", HOST, 58.0, 38.0),
          _x("cudaStreamSynchronize", "cuda_runtime", HOST, 60.0, 36.0),
          _x("aten::add", "cpu_op", HOST, 97.0, 2.0)]
    out = insert_host_work({"traceEvents": ev}, [HostWork(at_us=50.0, host_us=10.0, spans=(("x", "cpu_op"),))],
                           main=HOST, stream=GPU, latency_us=5.0)
    item = _by_name(out, "aten::item")[0]
    assert (item["ts"], item["ts"] + item["dur"]) == (68.0, 96.0)
    assert _by_name(out, "aten::add")[0]["ts"] == 97.0


# an .item() at 30 us: it drains the queue, copies 2 us to pageable memory, then holds the host 12 us more
BLOCKING_READ_AT_30 = HostWork(at_us=30.0, host_us=12.0, drains=True,
                               spans=(("aten::item", "cpu_op"), ("cudaMemcpyAsync", "cuda_runtime")),
                               gpu_op=("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 2.0))


def test_a_blocking_read_waits_for_the_queue_then_its_copy():
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 200.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, 15.0, 80.0, corr=1),
          _x("aten::add", "cpu_op", HOST, 40.0, 2.0)]
    out = insert_host_work({"traceEvents": ev}, [BLOCKING_READ_AT_30], main=HOST, stream=GPU, latency_us=5.0)
    item = _by_name(out, "aten::item")[0]
    copy = _by_name(out, "Memcpy DtoH (Device -> Pageable)")[0]
    # hand-worked: the copy queues behind gemm (ends 95) -> [95, 97]; the host is blocked 30..97, +12
    assert (copy["ts"], copy["dur"]) == (95.0, 2.0)
    assert (item["ts"], item["dur"]) == (30.0, 79.0)
    assert _by_name(out, "aten::add")[0]["ts"] == 40.0 + 79.0
    rt = _by_name(out, "cudaMemcpyAsync")[0]
    assert rt["args"]["correlation"] == copy["args"]["correlation"]


def test_a_slower_kernel_delays_its_stream_and_the_host_only_where_it_waited():
    # kernels k1 [15, 65] and k2 [70, 80] on one stream, launched at 10 and 12; the host syncs
    # at 30 and returns at 81 (k2's end + 1); aten::add runs at 90
    ev = [_x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 2.0, corr=1), _x("k1", "kernel", GPU, 15.0, 50.0, corr=1),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 12.0, 2.0, corr=2), _x("k2", "kernel", GPU, 70.0, 10.0, corr=2),
          _x("cudaStreamSynchronize", "cuda_runtime", HOST, 30.0, 51.0), _x("aten::add", "cpu_op", HOST, 90.0, 2.0),
          _x("aten::mul", "cpu_op", HOST, 20.0, 5.0)]
    idx = {e["name"]: i for i, e in enumerate(ev)}
    out = insert_device_delays({"traceEvents": ev}, extra={idx["k1"]: 25.0}, latency_us=5.0)
    got = {e["name"]: (e["ts"], e["dur"]) for e in out["traceEvents"]}
    assert got["k1"] == (15.0, 75.0) and got["k2"] == (90.0, 10.0)   # queued k2 starts when k1 ends
    assert got["cudaStreamSynchronize"] == (30.0, 71.0)               # returns at 101 = k2's end + 1
    assert got["aten::add"] == (110.0, 2.0) and got["aten::mul"] == (20.0, 5.0)  # only after the wait


def test_straggler_makes_the_other_rank_wait_inside_the_collective():
    def rank(r):
        return {"distributedInfo": {"rank": r}, "traceEvents": [
            _x("ProfilerStep#1", "user_annotation", HOST, 0.0, 100.0),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 5.0, 2.0, corr=1),
            _x("gemm", "kernel", GPU, 10.0, 40.0, corr=1),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 8.0, 2.0, corr=2),
            # the all-reduce waits for the gradients: it starts as gemm ends (an event wait)
            _x("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", (0, 20), 50.0, 20.0, corr=2)]}
    out, touched = inject_straggler({0: rank(0), 1: rank(1)}, 0.5, random.Random(0), slow=0)
    assert touched == [0]
    g0 = _by_name(out[0], "gemm")[0]
    n0 = _by_name(out[0], "ncclKernel_AllReduce_RING_LL_Sum_float")[0]
    n1 = _by_name(out[1], "ncclKernel_AllReduce_RING_LL_Sum_float")[0]
    assert (g0["ts"], g0["dur"]) == (10.0, 60.0)        # 40 µs * 1.5
    assert (n0["ts"], n0["dur"]) == (70.0, 20.0)        # arrives 20 µs late
    assert (n1["ts"], n1["dur"]) == (50.0, 40.0)        # waits those 20 µs inside the kernel
    assert n0["ts"] + n0["dur"] == n1["ts"] + n1["dur"]


def test_step_time_needs_profiler_steps():
    with pytest.raises(Exception, match="ProfilerStep"):
        K.step_time_us([_x("k", "kernel", GPU, 0.0, 1.0)])


def _collective_and_its_consumer():
    """All-reduce [20, 60] on stream A (0, 20), launched at 5; gemm2 [64, 94] on the compute stream
    B launched at 6, its stream idle since gemm1 [10, 30]: it started 4 µs after the all-reduce
    ended (an event wait on its result); add [95, 100] queued behind it; the host syncs at 50 and
    returns at 101 (add's end + 1)."""
    return [_x("cudaLaunchKernel", "cuda_runtime", HOST, 4.0, 1.0, corr=1),
            _x("gemm1", "kernel", GPU, 10.0, 20.0, corr=1),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 5.0, 1.0, corr=2),
            _x("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", (0, 20), 20.0, 40.0, corr=2),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 6.0, 1.0, corr=3),
            _x("gemm2", "kernel", GPU, 64.0, 30.0, corr=3),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 7.0, 1.0, corr=4), _x("add", "kernel", GPU, 95.0, 5.0, corr=4),
            _x("cudaStreamSynchronize", "cuda_runtime", HOST, 50.0, 51.0), _x("aten::mul", "cpu_op", HOST, 110.0, 2.0)]


def test_a_longer_collective_carries_the_op_that_waited_for_it():
    # the all-reduce runs 25 µs longer (ends 85): gemm2 starts its 4 µs after that new end (89, was
    # 64), add queued behind it starts as it ends (119), the sync returns 1 µs after add (125) and
    # the host after it 24 µs later
    ev = _collective_and_its_consumer()
    idx = {e["name"]: i for i, e in enumerate(ev)}
    out = insert_device_delays({"traceEvents": ev}, extra={idx["ncclKernel_AllReduce_RING_LL_Sum_float"]: 25.0},
                               latency_us=5.0)
    got = {e["name"]: (e["ts"], e["dur"]) for e in out["traceEvents"]}
    assert got["ncclKernel_AllReduce_RING_LL_Sum_float"] == (20.0, 65.0)
    assert got["gemm2"] == (89.0, 30.0) and got["add"] == (119.0, 5.0) and got["gemm1"] == (10.0, 20.0)
    assert got["cudaStreamSynchronize"] == (50.0, 75.0) and got["aten::mul"] == (134.0, 2.0)


def test_a_host_delay_that_moves_a_collective_moves_the_op_that_waited_for_it():
    # 30 µs of host work at 4.5 (before the all-reduce's launch at 5, after gemm1's at 4): the
    # all-reduce is launched at 35 and starts at 40 (5 µs latency), ends 80; gemm2, launched at 36,
    # waited for it: it starts 4 µs after, at 84 (not at its old 64, before its input exists); add
    # queued behind it starts as it ends
    ev = _collective_and_its_consumer()
    work = [HostWork(at_us=4.5, host_us=30.0, spans=(("enumerate(DataLoader)", "user_annotation"),))]
    out = insert_host_work({"traceEvents": ev}, work, main=HOST, stream=GPU, latency_us=5.0)
    got = {e["name"]: (e["ts"], e["dur"]) for e in out["traceEvents"]}
    assert got["ncclKernel_AllReduce_RING_LL_Sum_float"] == (40.0, 40.0)
    assert got["gemm2"] == (84.0, 30.0) and got["add"] == (114.0, 5.0)


def test_an_op_released_by_its_own_stream_is_not_an_event_wait():
    # the same, but gemm1 runs until 62: gemm2 followed it on its stream (2 µs later), so the
    # all-reduce's end 4 µs before gemm2 is a coincidence; a longer all-reduce leaves gemm2 alone
    ev = _collective_and_its_consumer()
    ev[1]["dur"] = 52.0
    idx = {e["name"]: i for i, e in enumerate(ev)}
    out = insert_device_delays({"traceEvents": ev}, extra={idx["ncclKernel_AllReduce_RING_LL_Sum_float"]: 25.0},
                               latency_us=5.0)
    assert [e["ts"] for e in _by_name(out, "gemm2")] == [64.0]


def test_a_sync_on_a_device_op_moves_the_host_by_its_wait():
    ev = _collective_and_its_consumer()
    idx = {e["name"]: i for i, e in enumerate(ev)}
    # a sync inserted at host time 30 on the all-reduce [20, 60]: the host waits 30 µs; the original
    # sync [50, 101] starts at 80 and still returns at add's end + 1 (101): the device's slack
    # absorbs the wait, and aten::mul (110) stays
    ar = idx["ncclKernel_AllReduce_RING_LL_Sum_float"]
    out = insert_device_delays({"traceEvents": ev}, syncs=[DeviceWait(at_us=30.0, op=ar, thread=HOST)], latency_us=5.0)
    syncs = sorted((e["ts"], e["dur"]) for e in _by_name(out, "cudaStreamSynchronize"))
    assert syncs == [(30.0, 30.0), (80.0, 21.0)]
    assert _by_name(out, "aten::mul")[0]["ts"] == 110.0
    # the all-reduce 40 µs longer [20, 100]: the host waits until 100; gemm2 follows at 104, add at
    # 134 (its 1 µs gap behind gemm2 closes), so the old sync [120, ...] returns at add's end + 1 (140)
    # and aten::mul moves 39 µs
    out = insert_device_delays({"traceEvents": ev}, extra={ar: 40.0},
                               syncs=[DeviceWait(at_us=30.0, op=ar, thread=HOST)], latency_us=5.0)
    assert sorted((e["ts"], e["dur"]) for e in _by_name(out, "cudaStreamSynchronize")) == [(30.0, 70.0), (120.0, 20.0)]
    assert _by_name(out, "aten::mul")[0]["ts"] == 149.0
    with pytest.raises(ValueError, match="before"):
        insert_device_delays({"traceEvents": ev}, syncs=[DeviceWait(at_us=8.0, op=ar, thread=HOST)], latency_us=5.0)


def steps_then_a_cut_one(launch="cudaLaunchKernel"):
    """3 steps of 100 µs (each launches at +10 one 50 µs kernel starting at +15), then a 4th step
    the profiler's stop cut after 10 µs, with no device work."""
    ev = []
    for k in range(3):
        t = 100.0 * k
        ev += [_x(f"ProfilerStep#{k + 1}", "user_annotation", HOST, t, 100.0),
               _x(launch, "cuda_runtime", HOST, t + 10, 5.0, corr=k + 1),
               _x("gemm", "kernel", GPU, t + 15, 50.0, corr=k + 1)]
    ev.append(_x("ProfilerStep#4", "user_annotation", HOST, 300.0, 10.0))
    return {"traceEvents": ev}


def test_step_time_is_over_every_step_but_the_last():
    doc = steps_then_a_cut_one()
    assert [s.number for s in K.window_steps(doc["traceEvents"])] == [1, 2, 3]
    assert K.step_time_us(doc["traceEvents"]) == 100.0  # (300 - 0) / 3; the 10 µs step would give 77.5


def gpu_bound_steps(first_launch_us=10.0):
    """3 steps of 40 µs on the host; each launches one 100 µs kernel, queued back to back on the GPU: the first at
    first_launch_us (its kernel starts 5 µs later), the others 40 µs after the previous launch."""
    ev, gpu = [], 0.0
    for k in range(3):
        t = 40.0 * k
        lt = first_launch_us if k == 0 else t + 10.0
        start = max(lt + 5.0, gpu)
        gpu = start + 100.0
        ev += [_x(f"ProfilerStep#{k + 1}", "user_annotation", HOST, t, 40.0),
               _x("cudaLaunchKernel", "cuda_runtime", HOST, lt, 5.0, corr=k + 1),
               _x("gemm", "kernel", GPU, start, 100.0, corr=k + 1)]
    ev.append(_x("ProfilerStep#4", "user_annotation", HOST, 120.0, 10.0))
    return ev


def test_step_time_is_the_slower_sides_steady_pace_not_the_windows_makespan():
    # GPU-bound: the host's steps take 40 µs, the device's 100; the kernels run [15, 315]: 300 / 3 = 100 per step
    # (the makespan, 0 to 315, would read 105: the head before the first kernel counted as a step's cost)
    assert K.step_time_us(gpu_bound_steps()) == 100.0
    # the first launch 25 µs later (host work in front of it, absorbed by the host's lead afterwards): the kernels
    # run [40, 340], still 100 per step; the makespan would read 113.3, a 'gain' of 11.8 % for a long run's 0
    assert K.step_time_us(gpu_bound_steps(first_launch_us=35.0)) == 100.0
    # host-bound (steps_then_a_cut_one: 100-µs host steps, 50-µs kernels): the host's 300 / 3
    assert K.step_time_us(steps_then_a_cut_one()["traceEvents"]) == 100.0


def test_device_work_queued_before_the_window_is_not_the_windows_steps():
    """The GPU-bound loop with its host ahead, profiled from a later step: as the window opens the device still runs
    work queued by the steps before, whose launches the profiler did not keep (here a 10-µs kernel at [5, 15), the
    stream's last before the window's first kernel at 15). A stream runs in launch order, so it was launched before
    the window: the window's kernels run [15, 315], 100 µs per step, not (315 - 5) / 3 = 103.3."""
    ev = gpu_bound_steps()
    ev.append(_x("gemm", "kernel", GPU, 5.0, 10.0))
    assert K.step_time_us(ev) == 100.0
    # an op without a launch record that starts after the window's first kernel (its launch lost, on another
    # stream) is the window's: [15, 330] / 3
    ev.append(_x("nccl", "kernel", (GPU[0], GPU[1] + 1), 100.0, 230.0))
    assert K.step_time_us(ev) == pytest.approx(315.0 / 3)


def test_an_op_inserted_on_a_stream_queues_behind_the_work_queued_before_the_window():
    """The GPU-bound loop whose device still runs a kernel queued before the window ([1, 14), its launch not
    recorded) as the first step opens: a pageable copy inserted at the step's start (0.5 µs) goes on the same stream
    behind it and the host waits for it there. Taken for a kernel launched at its own start (1 µs, after the copy's
    call), the queued kernel would follow the copy, which would run at 0.5 + latency, before it."""
    ev = gpu_bound_steps()
    ev.append(_x("gemm", "kernel", GPU, 1.0, 13.0))
    out, _ = inject_pageable_copy({0: {"traceEvents": ev}}, 1.0, random.Random(0))
    copy = [e for e in out[0]["traceEvents"] if e["name"] == "Memcpy HtoD (Pageable -> Device)"]
    assert copy and min(e["ts"] for e in copy) >= 14.0


def test_one_off_checkpoint_gain_is_its_share_of_the_window():
    # 30 µs saved at the end of step 2 (the middle of 4): the device has drained (gemm ended at 165),
    # so the host stops 30 µs and the window grows from 300 to 330 µs: gain 30 / 330
    doc = steps_then_a_cut_one()
    out, touched = inject_checkpoint_stall({0: doc}, 30.0, random.Random(0))
    before, after = K.step_time_us(doc["traceEvents"]), K.step_time_us(out[0]["traceEvents"])
    assert (before, after) == (100.0, 110.0)
    assert 100 * (after - before) / after == pytest.approx(100 * 30 / 330)
    assert touched == [0]


def test_rocm_base_gets_hip_names():
    doc = steps_then_a_cut_one(launch="hipLaunchKernel")
    out, _ = inject_pageable_copy({0: doc}, 20.0, random.Random(0))
    names = {e["name"] for e in out[0]["traceEvents"]}
    # HTA's MI250 trace: a blocking host-to-device copy is hipMemcpyWithStream + "Memcpy HtoD (Host -> Device)"
    assert {"hipMemcpyWithStream", "Memcpy HtoD (Host -> Device)"} <= names
    assert not any(n.startswith("cuda") or "Pageable" in n for n in names)
    out, _ = inject_pageable_copy({0: steps_then_a_cut_one()}, 20.0, random.Random(0))
    assert {"cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)"} <= {e["name"] for e in out[0]["traceEvents"]}


def test_layout_transposes_are_kernels_launched_by_one_call_each_in_the_vendors_names():
    # 16 conversions of 3 us per step, each 5 us of host (the base's median launch: a 4-us launch call on the main
    # thread, as the surgery writes an inserted call, and 1 us after it) and its kernel on the main stream: 48 over the
    # 3 steps of the window
    for launch, kernel in (("cudaLaunchKernel", LAYOUT_TRANSPOSE_KERNELS[False]),
                           ("hipLaunchKernel", LAYOUT_TRANSPOSE_KERNELS[True])):
        out, touched = inject_layout_transposes({0: steps_then_a_cut_one(launch=launch)}, 3.0, random.Random(0))
        ev = out[0]["traceEvents"]
        added = _by_name(out[0], kernel)
        assert touched == [0] and len(added) == 3 * LAYOUT_TRANSPOSES_PER_STEP
        assert all(e["dur"] == 3.0 and (e["pid"], e["tid"]) == GPU for e in added)
        calls = {e["args"]["correlation"]: e for e in ev if e["name"] == launch and (e["pid"], e["tid"]) == HOST}
        assert all(calls[e["args"]["correlation"]]["dur"] == 4.0 for e in added)
        # each step's host is 16 x 5 us longer before its own launch, and the step with it
        assert K.step_time_us(ev) == pytest.approx(100.0 + LAYOUT_TRANSPOSES_PER_STEP * 5.0)


def test_a_kind_the_base_cannot_hold_is_skipped_with_its_reason(tmp_path):
    doc = steps_then_a_cut_one()
    with pytest.raises(NotApplicable, match="no collective"):
        inject_exposed_comm({0: doc}, 1.0, random.Random(0))
    path = tmp_path / "rank0.json.gz"
    K.write_events(path, doc)
    logged = []
    labels = build_corpus(tmp_path / "c", [Base("toy", (str(path),))], kinds=("exposed_comm", "straggler"),
                          severities=("high",), log=logged.append)
    assert [lab["kind"] for lab in labels] == ["healthy"]
    assert any("exposed_comm" in s and "no collective" in s for s in logged)
    assert any("straggler" in s and "at least 2 ranks" in s for s in logged)


def _gemm_allreduce_add(*, launch_ar: float, allreduce_at: float, launch_add: float) -> list[dict]:
    """One 100 µs step: gemm [10, 60] on the compute stream, a 20 µs all-reduce on its own stream at
    ``allreduce_at`` (launched at ``launch_ar``), add [70, 75] launched at ``launch_add``."""
    return [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 100.0),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, 5.0, 3.0, corr=1), _x("gemm", "kernel", GPU, 10.0, 50.0, corr=1),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, launch_ar, 3.0, corr=2),
            _x("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", (0, 20), allreduce_at, 20.0, corr=2),
            _x("cudaLaunchKernel", "cuda_runtime", HOST, launch_add, 3.0, corr=3),
            _x("add", "kernel", GPU, 70.0, 5.0, corr=3),
            _x("ProfilerStep#2", "user_annotation", HOST, 100.0, 10.0)]


def test_an_overlapped_collective_is_serialised_after_the_compute_it_overlapped():
    # step 1 [0, 100]: gemm [10, 60] on the compute stream; an all-reduce [30, 50] on its own stream
    # overlaps it. Serialised, the all-reduce starts when gemm ends (60), the host syncs on it
    # [60, 80] and everything on the host after 60 moves 20 µs: the step becomes 120 µs, gain
    # 20 / 120. add, launched at 62 + 20 = 82, starts 5 µs later (the trace's shortest launch
    # latency, gemm's: it found the device idle), after the all-reduce it waits for
    ev = _gemm_allreduce_add(launch_ar=25.0, allreduce_at=30.0, launch_add=62.0)
    out, _ = inject_exposed_comm({0: {"traceEvents": ev}}, 1.0, random.Random(0))
    got = {e["name"]: (e["ts"], e["dur"]) for e in out[0]["traceEvents"]}
    assert got["ncclKernel_AllReduce_RING_LL_Sum_float"] == (60.0, 20.0)
    assert got["add"] == (87.0, 5.0) and got["cudaStreamSynchronize"] == (60.0, 20.0)
    assert (K.step_time_us(ev), K.step_time_us(out[0]["traceEvents"])) == (100.0, 120.0)


def test_a_collective_that_starts_in_a_compute_gap_is_serialised_where_it_starts():
    # all-reduce [62, 82] starts after gemm [10, 60] ended and overlaps add [70, 75]: the host syncs
    # on it from 62 to 82, add (the next compute) waits for it and for its launch, moved from 63 to
    # 83, + 5.2 µs (5th percentile of the launch latencies 5, 7, 7): 88.2; the step is 120 µs
    ev = _gemm_allreduce_add(launch_ar=55.0, allreduce_at=62.0, launch_add=63.0)
    out, _ = inject_exposed_comm({0: {"traceEvents": ev}}, 1.0, random.Random(0))
    got = {e["name"]: (e["ts"], e["dur"]) for e in out[0]["traceEvents"]}
    assert got["ncclKernel_AllReduce_RING_LL_Sum_float"] == (62.0, 20.0) and got["add"] == (88.2, 5.0)
    assert K.step_time_us(out[0]["traceEvents"]) == 120.0


def test_the_sync_of_a_serialised_collective_lands_on_the_thread_that_launched_it():
    # as above, but the autograd thread (1, 2) launches the all-reduce [30, 50] inside its backward
    # node [20, 65] while the main thread (1, 1) only holds the step. Serialised at 60, the 20 µs sync
    # [60, 80] is that thread's (the main thread is inside backward() and cannot sync): the node
    # spanning 60 is stretched to [20, 85] and holds it; the main thread gets no sync.
    autograd = (1, 2)
    ev = _gemm_allreduce_add(launch_ar=25.0, allreduce_at=30.0, launch_add=62.0)
    for e in ev:
        if e.get("args", {}).get("correlation") == 2 and e["cat"] == "cuda_runtime":
            e["pid"], e["tid"] = autograd
    ev.append(_x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", autograd, 20.0, 45.0))
    out, _ = inject_exposed_comm({0: {"traceEvents": ev}}, 1.0, random.Random(0))
    (sync,) = _by_name(out[0], "cudaStreamSynchronize")
    assert ((sync["pid"], sync["tid"]), sync["ts"], sync["dur"]) == (autograd, 60.0, 20.0)
    (node,) = _by_name(out[0], "autograd::engine::evaluate_function: MmBackward0")
    assert (node["ts"], node["dur"]) == (20.0, 65.0)
    assert K.step_time_us(out[0]["traceEvents"]) == 120.0


def test_ranks_serialise_the_same_collective_and_it_ends_together_on_them():
    # rank 0: the all-reduce [30, 50] overlaps gemm [10, 60]: serialised, it runs [60, 80], 30 us later than it
    # ended; rank 1 (its own clock): the all-reduce [62, 82] starts in a compute gap, serialised where it starts,
    # ending as before. Rank 1 cannot finish the transfer before rank 0 arrives: its all-reduce ends 30 us later
    # too, [62, 112]; its sync [62, 112] holds the host 50 us from 62, so add's launch moves 63 -> 113, + 5.2 us
    # (the launch latency as in the test above): 118.2; its step 150 us against rank 0's 120
    r0 = _gemm_allreduce_add(launch_ar=25.0, allreduce_at=30.0, launch_add=62.0)
    r1 = _gemm_allreduce_add(launch_ar=55.0, allreduce_at=62.0, launch_add=63.0)
    out, touched = inject_exposed_comm({0: {"traceEvents": r0}, 1: {"traceEvents": r1}}, 1.0, random.Random(0))
    got = [{e["name"]: (e["ts"], e["dur"]) for e in out[r]["traceEvents"]} for r in (0, 1)]
    ar = "ncclKernel_AllReduce_RING_LL_Sum_float"
    assert got[0][ar] == (60.0, 20.0) and got[0]["add"] == (87.0, 5.0)
    assert got[1][ar] == (62.0, 50.0) and got[1]["cudaStreamSynchronize"] == (62.0, 50.0)
    assert got[1]["add"] == pytest.approx((118.2, 5.0))
    assert [K.step_time_us(out[r]["traceEvents"]) for r in (0, 1)] == [120.0, 150.0] and touched == [0, 1]


def test_a_held_gpu_starts_kernels_later_than_launch_and_stream_allow_the_device_idle():
    # the GPU-bound steps' kernels (launched at 10, 50, 90; back to back from 15) each held 20 us (one kernel a step:
    # every hold of a step falls on it): 15 + 20 = 35 .. 135; then max(55, 135) + 20 = 155 .. 255; 275 .. 375
    doc = {"traceEvents": gpu_bound_steps()}
    out, touched = inject_gpu_held({0: doc}, 20.0, random.Random(0))
    kernels = sorted((e for e in out[0]["traceEvents"] if e["name"] == "gemm"), key=lambda e: e["ts"])
    assert touched == [0] and [e["dur"] for e in kernels] == [100.0] * 3
    assert [e["ts"] for e in kernels] == [35.0, 155.0, 275.0]
    launches = sorted(e["ts"] for e in out[0]["traceEvents"] if e["name"] == "cudaLaunchKernel")
    assert launches == [10.0, 50.0, 90.0]  # the host does not wait for the device: its launches stay


def test_a_launch_a_float_step_before_inserted_work_moves_with_its_kernel():
    # on an epoch clock (~4.2e12 µs, float64's step there ~0.0005 µs) a launch written a step before the instant work
    # is inserted at is at that instant: the host moves it by the work's 100 µs, and its kernel must move with it
    # (timed before the work, the kernel stayed where it was: 95 µs before its own launch)
    t0 = 4.2e12
    launch = t0 + 10.0 - 0.0005
    doc = {"traceEvents": [_x("ProfilerStep#1", "user_annotation", HOST, t0, 100.0),
                           _x("cudaLaunchKernel", "cuda_runtime", HOST, launch, 5.0, corr=1),
                           _x("gemm", "kernel", GPU, launch + 5.0, 50.0, corr=1)]}
    out = insert_host_work(doc, [HostWork(at_us=t0 + 10.0, host_us=100.0, spans=(("log", "user_annotation"),))],
                           main=HOST, stream=GPU, latency_us=5.0)
    (new_launch,) = _by_name(out, "cudaLaunchKernel")
    (kernel,) = _by_name(out, "gemm")
    assert new_launch["ts"] == pytest.approx(launch + 100.0, abs=0.01)
    assert kernel["ts"] == pytest.approx(launch + 105.0, abs=0.01)


def test_work_inserted_where_a_blocking_copy_returns_runs_after_it_and_the_next_kernel_moves_with_its_launch():
    # a pageable copy call [10, 40] blocked on its copy [20, 38]; 100 us of host work inserted at 40, where it returns;
    # then a launch at 45 of a kernel at 55. Hand-worked: the call returns at 40 as before, the launch moves to 145 and
    # its kernel to 150 (the device's 5-us latency after it; timed as inside the call, the work stretched the call to
    # 112, and the kernel, timed with the smaller shift that left, was written at 122, 23 us before its launch)
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 200.0),
          _x("cudaMemcpyAsync", "cuda_runtime", HOST, 10.0, 30.0, corr=1),
          _x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", GPU, 20.0, 18.0, corr=1),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 45.0, 5.0, corr=2),
          _x("gemm", "kernel", GPU, 55.0, 50.0, corr=2)]
    out = insert_host_work({"traceEvents": ev}, [HostWork(at_us=40.0, host_us=100.0, spans=(("log", "cpu_op"),))],
                           main=HOST, stream=GPU, latency_us=5.0)
    (call,) = _by_name(out, "cudaMemcpyAsync")
    assert (call["ts"], call["ts"] + call["dur"]) == (10.0, 40.0)
    assert _by_name(out, "cudaLaunchKernel")[0]["ts"] == 145.0
    assert _by_name(out, "gemm")[0]["ts"] == 150.0


def test_a_long_call_that_enqueues_nothing_does_not_wait_for_the_kernel_it_ends_with():
    # kernel A [15, 215] launched at 10; a 195-us cudaMalloc on the host [20, 215] (no correlation id: it enqueues
    # nothing) that ends as A does; kernel B launched at 220. A made 100 us longer: B runs after it on its stream
    # (315), but the malloc, which waits for no slot in the launch queue, keeps its length and B's launch stays at 220
    # (read as waiting for A, the malloc was stretched to 295 us and the launch moved to 320)
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 400.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, 15.0, 200.0, corr=1),
          _x("cudaMalloc", "cuda_runtime", HOST, 20.0, 195.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 220.0, 5.0, corr=2),
          _x("add", "kernel", GPU, 225.0, 50.0, corr=2)]
    a = next(i for i, e in enumerate(ev) if e["name"] == "gemm")
    out = insert_device_delays({"traceEvents": ev}, extra={a: 100.0}, latency_us=5.0)
    (malloc,) = _by_name(out, "cudaMalloc")
    assert (malloc["ts"], malloc["dur"]) == (20.0, 195.0)
    assert [e["ts"] for e in _by_name(out, "cudaLaunchKernel")] == [10.0, 220.0]
    assert _by_name(out, "add")[0]["ts"] == 315.0


def _launches_behind(n_ahead: int) -> list[dict]:
    """n_ahead kernels of 10 us launched in the first ~100 us and run back to back from 600 (kernel j [600 + 10 j,
    610 + 10 j)); then a 150-us launch call [460, 610) that returns as the first kernel ends, its kernel last."""
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 700.0)]
    for j in range(n_ahead):
        ev += [_x("cudaLaunchKernel", "cuda_runtime", HOST, 1.0 + 0.2 * j, 0.1, corr=j + 1),
               _x("k", "kernel", GPU, 600.0 + 10 * j, 10.0, corr=j + 1)]
    return ev + [_x("cudaLaunchKernel", "cuda_runtime", HOST, 460.0, 150.0, corr=n_ahead + 1),
                 _x("last", "kernel", GPU, 600.0 + 10 * n_ahead, 10.0, corr=n_ahead + 1)]


@pytest.mark.parametrize("n_ahead, call_end", [(520, 710.0), (100, 610.0)])
def test_a_long_launch_waits_for_a_slot_only_when_its_queue_is_full(n_ahead, call_end):
    # the first kernel made 100 us longer: with 520 launches ahead (half of CUDA's 1,024-entry queue or more) the call
    # waited for a slot and returns as that kernel now ends (710); with 100 ahead its 150 us were the host's own work
    # and stay (it ended with a kernel by chance). The last kernel runs behind all of them either way
    ev = _launches_behind(n_ahead)
    first = next(i for i, e in enumerate(ev) if e["name"] == "k")
    out = insert_device_delays({"traceEvents": ev}, extra={first: 100.0}, latency_us=5.0)
    call = _by_name(out, "cudaLaunchKernel")[-1]
    assert (call["ts"], call["ts"] + call["dur"]) == (460.0, call_end)
    assert _by_name(out, "last")[0]["ts"] == 700.0 + 10 * n_ahead


def test_a_slow_launch_with_a_free_slot_keeps_its_time_after_a_planted_drain():
    # kernel gemm [15, 215]; a 150-us launch [65, 215) that ends as gemm does, its add queued behind it. A read at 30
    # drains the queue (gemm ends 215, its copy [215, 217]) and holds the host 12 us more: 229, every later host
    # event 199 us later. The launch had one kernel ahead: its 150 us are the host's and stay, [264, 414), and the
    # aten::mul after it comes at 419 (read as a wait for gemm's slot, it returned at once: 264 + 2, mul at 271)
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, 0.0, 300.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, 15.0, 200.0, corr=1),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, 65.0, 150.0, corr=2),
          _x("add", "kernel", GPU, 215.0, 50.0, corr=2),
          _x("aten::mul", "cpu_op", HOST, 220.0, 5.0)]
    out = insert_host_work({"traceEvents": ev}, [BLOCKING_READ_AT_30], main=HOST, stream=GPU, latency_us=5.0)
    launch = _by_name(out, "cudaLaunchKernel")[1]
    assert (launch["ts"], launch["dur"]) == (264.0, 150.0)
    assert _by_name(out, "add")[0]["ts"] == 269.0
    assert _by_name(out, "aten::mul")[0]["ts"] == 419.0
    assert _by_name(out, "ProfilerStep#1")[0]["dur"] == 499.0


def test_a_launch_a_float_step_before_a_delayed_sync_returns_moves_with_its_kernel():
    # epoch clock: kernel A [15, 95] launched at 10, a sync [20, 96] returning with it, kernel B launched a float step
    # (0.0005 us) before the sync returns, at 96, and started at 101. A made 100 us longer: the sync returns at 196, B's
    # launch (at that instant) moves to 196 and B to 201, 5 us after it (timed as before the return, B started at 195,
    # when A ended: before its own launch)
    t0 = 4.2e12
    launch_b = t0 + 96.0 - 0.0005
    ev = [_x("ProfilerStep#1", "user_annotation", HOST, t0, 200.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, t0 + 10.0, 5.0, corr=1),
          _x("gemm", "kernel", GPU, t0 + 15.0, 80.0, corr=1),
          _x("cudaStreamSynchronize", "cuda_runtime", HOST, t0 + 20.0, 76.0),
          _x("cudaLaunchKernel", "cuda_runtime", HOST, launch_b, 3.0, corr=2),
          _x("add", "kernel", GPU, t0 + 101.0, 20.0, corr=2)]
    a = next(i for i, e in enumerate(ev) if e["name"] == "gemm")
    out = insert_device_delays({"traceEvents": ev}, extra={a: 100.0}, latency_us=5.0)
    assert _by_name(out, "cudaLaunchKernel")[1]["ts"] == pytest.approx(launch_b + 100.0, abs=0.01)
    assert _by_name(out, "add")[0]["ts"] == pytest.approx(t0 + 201.0, abs=0.01)


def test_slower_launches_lengthen_every_launch_call_and_shift_what_follows():
    # each step's one launch (5 us at +10) takes 20 us more, inside the call: step k's call starts 20 k us later and
    # lasts 25 us, its kernel (launched at the call's start, +5 us) starts 20 k us later too, and every step lasts
    # 120 us: the window's steady step (its first two steps) 100 -> 120 us
    out, touched = inject_launch_bound({0: three_steps()}, 20.0, random.Random(0))
    calls, kernels = _by_name(out[0], "cudaLaunchKernel"), _by_name(out[0], "gemm")
    assert touched == [0]
    assert [(c["ts"], c["dur"]) for c in calls] == [(10.0, 25.0), (130.0, 25.0), (250.0, 25.0)]
    assert [k["ts"] for k in kernels] == [15.0, 135.0, 255.0]
    assert [e["dur"] for e in _by_name(out[0], "ProfilerStep#1") + _by_name(out[0], "ProfilerStep#2")] == [120.0, 120.0]
    assert K.step_time_us(out[0]["traceEvents"]) == pytest.approx(120.0)


def test_slower_launches_need_kernels_launched_one_at_a_time():
    doc = three_steps()
    for e in doc["traceEvents"]:
        if e["name"] == "cudaLaunchKernel":
            e["name"] = "cudaGraphLaunch"
    with pytest.raises(NotApplicable, match="CUDA graph"):
        inject_launch_bound({0: doc}, 20.0, random.Random(0))


def test_small_kernels_go_into_the_models_work_not_the_optimizers_step():
    # tiny kernels launched inside the optimizer's step are a per-parameter optimizer's (their own kind): with step 2's
    # one launch inside an Optimizer.step span, one tiny kernel a step lands in steps 1 and 3 only
    doc = three_steps()
    doc["traceEvents"].append(_x("Optimizer.step#SGD.step", "user_annotation", HOST, 105.0, 15.0))
    out, _ = inject_small_kernels({0: doc}, 1.0, random.Random(0))
    assert len(_by_name(out[0], TINY_KERNEL)) == 2
    out, _ = inject_small_kernels({0: three_steps()}, 1.0, random.Random(0))
    assert len(_by_name(out[0], TINY_KERNEL)) == 3
