"""Launch calls that waited for a slot in the device's full launch queue (replay.queue_waits).

A host that runs ahead of a busy GPU without a sync fills the driver's launch queue (about 1,024 launches on CUDA);
from then on each launch returns only when an earlier kernel ends. Those calls record the device's pace: a fix that
makes the device faster makes them shorter, until the host's own work is the pace. The traces are built by hand with
that queue's rule and the what-ifs worked by hand.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.replay import BLOCK_QUEUE, BLOCK_SYNC  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.hardware import get_accelerator  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

QUEUE = 1024        # launches CUDA's queue holds
OP_US = 20.0        # the host's own time per op: an aten::mm of 9 us (its launch call 5 us inside) + 11 us of Python
LAUNCH_US = 5.0     # a launch call that does not wait
RETURN_US = 3.0     # a waiting launch returns this long after the kernel it waited for ends
LATENCY_US = 5.0    # launch to kernel start on an idle stream
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "computeMajor": 8, "computeMinor": 0}


def queue_full_trace(path: Path, *, kernel_us: float, kernels: int = 300, steps: int = 12, queue: int = QUEUE,
                     blocking: bool = False, runtime: str = "cudaLaunchKernel") -> Path:
    """`steps` ProfilerSteps of `kernels` fp32 GEMMs of kernel_us each on one stream, launched from one thread with no
    sync by `runtime` calls; the queue's rule: launch n returns no sooner than RETURN_US after kernel n - queue ends.
    blocking: every launch returns after its own kernel instead (CUDA_LAUNCH_BLOCKING=1)."""
    b = TraceBuilder()
    t, free, ends = 0.0, 0.0, []
    for s in range(steps):
        step_start = t
        for _ in range(kernels):
            launch_at = t + 2.0
            start = max(launch_at + LATENCY_US, free)
            if blocking:
                call = start + kernel_us + RETURN_US - launch_at
            elif len(ends) >= queue:
                call = max(LAUNCH_US, ends[len(ends) - queue] + RETURN_US - launch_at)
            else:
                call = LAUNCH_US
            b.cpu("aten::mm", t, call + 4.0)
            b.launch("ampere_sgemm_128x64_nn", launch_at, start, kernel_us, launch_dur=call, runtime=runtime)
            free = start + kernel_us
            ends.append(free)
            t += call + 4.0 + (OP_US - 9.0)
        b.step(s, step_start, t - step_start)
    doc = b.doc()
    doc["deviceProperties"] = [A100]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _facts(path: Path):
    t = next(iter(load_trace(path).values()))
    return collect_facts(t, analysis_window(t))


def _speedup() -> float:
    a100 = get_accelerator("a100-40gb")
    return a100.bf16_tflops / a100.fp32_tflops * a100.gemm_eff  # 13.28: fp32_matmul's speed-up on an A100


def test_launches_that_waited_for_a_queue_slot_end_with_the_kernel_they_waited_for(tmp_path):
    f = _facts(queue_full_trace(tmp_path / "q.json.gz", kernel_us=500.0))
    g = f.graph
    calls = np.flatnonzero(g.kernel_launch)
    queued = calls[g.block_class[calls] == BLOCK_QUEUE]
    # the host fills the queue in its 4th step (1,024 launches ahead, gaining 480 us a launch: launch 1,067); every
    # later launch waited, for the kernel QUEUE launches before its own, and costs what a launch that does not wait
    # costs once that kernel has ended
    assert queued.size == pytest.approx(calls.size - 1067, abs=5)
    own = {int(g.launch[d]): d for d in np.flatnonzero(~g.is_host & (g.launch >= 0))}
    for i in queued[:5]:
        k = g.sync_on[i]
        assert g.start[k] + g.dur[k] + RETURN_US == pytest.approx(g.start[i] + g.dur[i])
        assert g.start[own[int(i)]] > g.start[i] + g.dur[i]  # its own kernel still queued when it returned
        assert g.sync_base[i] == pytest.approx(LAUNCH_US)
    # it is neither a host sync nor a step the host paces unseen, and the GPU's work is the critical path
    assert not (g.block_class == BLOCK_SYNC).any() and not f.paced_by_device
    assert f.critical_path.get("kernel:gemm", 0.0) > 0.95 * f.span_us


def test_a_faster_device_is_priced_through_the_queue(tmp_path):
    # 300 GEMMs of 500 us a step: a 150-ms GPU-bound step whose host (300 x 20 us = 6 ms of its own) waits in its
    # launches once the queue is full. In bf16 each GEMM takes 500 / 13.28 = 37.65 us: the device's 11.3 ms a step is
    # still the pace, so the gain is 1 - 1 / 13.28 = 92.47 %. Replayed with the launches' observed durations kept,
    # the host would still take 150 ms a step once the queue filled and the gain would be the queue's lag over the
    # window
    d = diagnose(queue_full_trace(tmp_path / "q.json.gz", kernel_us=500.0))
    x = next(x for x in d.findings if x.kind == "fp32_matmul")
    assert d.findings[0].kind == "fp32_matmul"
    assert x.gain_pct == pytest.approx(100.0 * (1.0 - 1.0 / _speedup()), abs=0.5)


def test_a_device_faster_than_the_host_leaves_the_host_as_the_pace(tmp_path):
    # 300 GEMMs of 100 us: a 30-ms step. In bf16 each takes 7.53 us, less than the host's 20 us an op: the host's
    # own 6 ms a step is the pace, gain 1 - 6 / 30 = 80 % (the device's alone would claim 1 - 1 / 13.28 = 92.5 %)
    d = diagnose(queue_full_trace(tmp_path / "q.json.gz", kernel_us=100.0))
    x = next(x for x in d.findings if x.kind == "fp32_matmul")
    assert x.gain_pct == pytest.approx(100.0 * (1.0 - OP_US / 100.0), abs=1.0)


def _profiled_from(path: Path, step: int, copy_first: bool = False) -> Path:
    """The trace as a profile started at ProfilerStep#step records it: no host event before it, and of the device
    work only what ends after it (the earlier steps' work still queued has no launch in the trace). copy_first: the
    step opens with a 1-us host-to-device copy onto a stream of its own, idle (its queue empty; its correlation id
    above the others', which leaves the earlier work's ids below every recorded launch's)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    t0 = next(e["ts"] for e in doc["traceEvents"] if e["name"] == f"ProfilerStep#{step}")
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if (e["ts"] + e["dur"] > t0 if e["pid"] == 0 else e["ts"] >= t0)]
    if copy_first:
        doc["traceEvents"] += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 10, "tid": 1, "ts": t0 + 0.5,
             "dur": 1.0, "args": {"correlation": 10**6}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 9,
             "ts": t0 + 1.0 + LATENCY_US, "dur": 1.0, "args": {"correlation": 10**6, "stream": 9, "device": 0}}]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_a_profile_that_starts_with_the_queue_full_replays_the_work_queued_before_it(tmp_path):
    # profiled from step 6 of 16: 1,024 GEMMs launched before the profile are still queued, and every launch of the
    # window waits for a slot, the first 1,024 behind that earlier work. Replayed with it (sped up as well), the
    # device stays the pace: 92.47 % as when the whole run is traced (with that work a fixed delay in front of the
    # window's, 57 %; with no call read as a wait, 38 %)
    path = _profiled_from(queue_full_trace(tmp_path / "q.json.gz", kernel_us=500.0, steps=16), 6)
    g = _facts(path).graph
    calls = np.flatnonzero(g.kernel_launch)
    assert (g.block_class[calls] == BLOCK_QUEUE).all() and int((~g.is_host & (g.launch < 0)).sum()) == QUEUE
    x = next(x for x in diagnose(path).findings if x.kind == "fp32_matmul")
    assert x.gain_pct == pytest.approx(100.0 * (1.0 - 1.0 / _speedup()), abs=0.5)
    # the same when the window opens with a copy onto an idle stream: the GEMMs' stream is the one found full
    path = _profiled_from(queue_full_trace(tmp_path / "qc.json.gz", kernel_us=500.0, steps=16), 6, copy_first=True)
    assert int((~_facts(path).graph.is_host & (_facts(path).graph.launch < 0)).sum()) == QUEUE
    # GEMMs of 100 us: the host becomes the pace. No launch of this window went unblocked, so a launch's own cost is
    # read as its time after the slot freed (RETURN_US, 3 us, against LAUNCH_US 5): 18 us an op, 1 - 18 / 100
    path = _profiled_from(queue_full_trace(tmp_path / "q100.json.gz", kernel_us=100.0, steps=16), 6)
    x = next(x for x in diagnose(path).findings if x.kind == "fp32_matmul")
    assert x.gain_pct == pytest.approx(100.0 * (1.0 - (OP_US - LAUNCH_US + RETURN_US) / 100.0), abs=0.5)


HIP_QUEUE = 16_384  # AQL packets of a HIP stream's hardware queue (ROCclr's ROC_AQL_QUEUE_SIZE default)


def test_a_hip_launch_waits_for_a_slot_only_behind_hips_deeper_queue(tmp_path):
    # the same GPU-bound loop launched by hipLaunchKernel: with launches blocking 1,024 entries deep, HIP's 16,384-
    # packet queue was not full, so they did not wait for a slot (their time stays theirs); with the queue's rule at
    # 16,384 (2,000 GEMMs of 500 us a step, 10 steps: the host, 480 us a launch ahead, fills it at launch ~17,070), the
    # later launches waited, each for the kernel 16,384 launches before its own
    shallow = _facts(queue_full_trace(tmp_path / "s.json.gz", kernel_us=500.0, runtime="hipLaunchKernel")).graph
    assert not (shallow.block_class == BLOCK_QUEUE).any()
    g = _facts(queue_full_trace(tmp_path / "d.json.gz", kernel_us=500.0, kernels=2_000, steps=10, queue=HIP_QUEUE,
                                runtime="hipLaunchKernel")).graph
    calls = np.flatnonzero(g.kernel_launch)
    queued = calls[g.block_class[calls] == BLOCK_QUEUE]
    assert queued.size == pytest.approx(calls.size - 17_070, abs=40)
    k = g.sync_on[queued[0]]
    assert g.start[k] + g.dur[k] + RETURN_US == pytest.approx(g.start[queued[0]] + g.dur[queued[0]])


def test_long_launches_without_a_queue_behind_them_are_not_queue_waits(tmp_path):
    # kernels of 2 us behind 20-us ops: the GPU idles between them and no launch ever finds the queue full
    f = _facts(queue_full_trace(tmp_path / "idle.json.gz", kernel_us=2.0))
    assert not (f.graph.block_class == BLOCK_QUEUE).any()
    # launches made synchronous wait for their own kernel: a host sync (CUDA_LAUNCH_BLOCKING), not a queue slot
    g = _facts(queue_full_trace(tmp_path / "sync.json.gz", kernel_us=500.0, blocking=True)).graph
    launches = np.flatnonzero(g.kernel_launch)
    assert (g.block_class[launches] == BLOCK_SYNC).all()


def test_a_graph_launch_is_one_entry_of_the_queue(tmp_path):
    # each 6-ms step replays a CUDA graph of 2,000 kernels of 10 us (20 ms) with one cudaGraphLaunch of 300 us, made
    # while earlier replays still run: it returns right after one of their kernels ends, its own kernels queued
    # behind them, with over 1,000 kernels ahead of it but only a few launches: the queue is far from full. Ten 5-us
    # launches of small kernels on another stream show what a call that does not wait costs
    b = TraceBuilder()
    free = 0.0
    for s in range(5):
        t = 6_000.0 * s
        b.step(s, t, 6_000.0)
        k = max(t + 10.0 + LATENCY_US, free)
        b.graph_launch(t + 10.0, [("void at::native::vectorized_elementwise_kernel<4>", k + 10.0 * i, 10.0)
                                  for i in range(2_000)], launch_dur=300.0)
        free = k + 10.0 * 2_000
        for j in range(10):
            at = t + 400.0 + 100.0 * j
            b.launch("void at::native::reduce_kernel<128>", at, at + LATENCY_US, 2.0, stream=8, launch_dur=LAUNCH_US)
    g = _facts(b.write(tmp_path / "graphs.json.gz")).graph
    launches = np.flatnonzero(g.is_host & (g.dur == 300.0))
    assert launches.size >= 3 and not (g.block_class == BLOCK_QUEUE).any()


def test_the_summary_gives_the_hosts_wait_for_queue_slots(tmp_path):
    # each launch that waited took 500 us (a GEMM's) less the 5 us a launch costs: the rank's host_queue_wait_pct is
    # that time over the window, beside no host sync
    path = queue_full_trace(tmp_path / "q.json.gz", kernel_us=500.0)
    f = _facts(path)
    g = f.graph
    queued = g.block_class == BLOCK_QUEUE
    assert f.queue_wait_us == pytest.approx(float((g.dur[queued] - LAUNCH_US).sum()))
    r = diagnose(path).ranks[0]
    assert r.host_queue_wait_pct == pytest.approx(100.0 * f.queue_wait_us / f.span_us, abs=0.01)
    assert r.host_queue_wait_pct > 50.0 and r.host_sync_pct == 0.0


def test_a_window_of_waiting_calls_prices_a_call_by_its_time_after_the_slot_freed():
    # every call of the window may have waited (synchronize, copies, launches that waited for a slot): their own
    # durations are waits, so what a call costs is the queue's reading (the time after the slot freed), not their
    # median; with no queue wait seen, the median of all calls as before
    from trainperf.diagnose.replay import _typical_call_us
    dur = np.array([0.0, 480.0, 490.0, 500.0])
    waits = np.array([False, True, True, True])
    assert _typical_call_us(dur, 1, 4, waits, fallback_us=3.0) == 3.0
    assert _typical_call_us(dur, 1, 4, waits) == 490.0
    assert _typical_call_us(dur, 1, 4, np.array([False, False, True, True]), fallback_us=3.0) == 480.0


def test_a_host_that_waited_for_queue_slots_is_told_the_gpu_sets_the_pace(tmp_path):
    # the long launches are the GPU's pace, not host overhead: the rank says so; a host that never waited does not
    waited = diagnose(queue_full_trace(tmp_path / "q.json.gz", kernel_us=500.0))
    assert any("full launch queue" in n for n in waited.ranks[0].evidence_notes)
    idle = diagnose(queue_full_trace(tmp_path / "idle.json.gz", kernel_us=2.0))
    assert not any("full launch queue" in n for n in idle.ranks[0].evidence_notes)


def test_a_call_waited_only_for_work_running_when_it_returned(tmp_path):
    # a synchronize returns 2 us after a 500-us kernel ends; a 1.5-us kernel launched before it on another stream
    # starts 0.5 us after that return and ends within the 5 us Kineto's clocks leave: the sync waited for the long
    # kernel, not for work that had not started (the replay reads the end of what it waited for when its thread
    # goes on: the later kernel's end was then still the trace's, and a faster device could not move the host)
    b = TraceBuilder()
    b.step(0, 0.0, 1_000.0)
    b.step(1, 1_000.0, 1_000.0)
    b.launch("ampere_sgemm_128x64_nn", 10.0, 20.0, 500.0, stream=7)
    b.launch("void at::native::reduce_kernel<128>", 15.0, 522.5, 1.5, stream=8)
    b.cpu("cudaStreamSynchronize", 30.0, 492.0, cat="cuda_runtime")
    b.launch("ampere_sgemm_128x64_nn", 1_010.0, 1_020.0, 500.0, stream=7)
    b.cpu("cudaStreamSynchronize", 1_030.0, 492.0, cat="cuda_runtime")
    g = _facts(b.write(tmp_path / "s.json.gz")).graph
    first_sync = int(np.flatnonzero(g.is_host & (g.dur == 492.0))[0])
    waited = int(g.sync_on[first_sync])
    assert waited >= 0 and g.dur[waited] == 500.0


def test_a_queue_wait_is_on_work_that_ran_when_the_call_returned():
    # queue_waits on hand-made arrays: host calls 0 (the waiting launch, 0-100 us) and 1 (a launch that did not wait,
    # 200-205 us); device nodes 2 (launched by an earlier call, ran -50..98: its end freed the slot), 3 (started at 101,
    # after the return, ended at 102: within Kineto's 5-us tolerance but not what the call waited for), 4 and 5 (the
    # two calls' own work, still queued behind a full queue)
    from trainperf.diagnose.replay import NOT_BLOCKING, queue_waits
    start = np.array([0.0, 200.0, -50.0, 101.0, 500.0, 600.0])
    end = np.array([100.0, 205.0, 98.0, 102.0, 510.0, 610.0])
    launch = np.array([-1, -1, -1, -1, 0, 1])
    full = np.array([True, True, False, False, False, False])
    waited, unblocked = queue_waits(start, end, launch, full, 2, np.full(6, NOT_BLOCKING), np.zeros(6, bool))
    assert list(waited[:2]) == [2, -1] and unblocked == 5.0
