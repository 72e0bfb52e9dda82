"""Host syncs: blocking time per call site, priced by the GPU idle they cause (replay), worked by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.advice import INFERENCE_RECOMMENDATIONS, RECOMMENDATIONS  # noqa: E402


def _item_trace(path: Path) -> Path:
    # each 1400-us step T: five 200-us kernels launched at T+0..T+20 run back to back T+10..T+1010;
    # aten::item [T+30, T+1025) > aten::_local_scalar_dense > cudaMemcpyAsync [T+32, T+1020) waits for its
    # "Device -> Pageable" copy [T+1010, T+1012), i.e. for the queue to drain; then three 100-us kernels
    # launched at T+1030.. run T+1040..T+1340. Two steps: span 0 .. 2740 us.
    b = TraceBuilder()
    for s in range(2):
        _gemms_then_read(b, 1400.0 * s, gemm_us=200, copy_at=1010, item_us=995, scalar_us=993, call_us=988,
                         next_at=1030)
    return b.write(path)


def _gemms_then_read(b: TraceBuilder, T: float, *, gemm_us: float, copy_at: float, item_us: float,
                     scalar_us: float, call_us: float, next_at: float, copy_event: bool = True) -> None:
    """One step from T (µs): five gemm_us GEMMs launched at T+0..T+20 run back to back from T+10; aten::item
    [T+30, +item_us) > aten::_local_scalar_dense [T+31, +scalar_us) > cudaMemcpyAsync [T+32, +call_us) whose
    2-us "Device -> Pageable" copy runs from T+copy_at (copy_event False: the call alone, its copy not in the
    trace); then three 100-us kernels launched at T+next_at.. run from T+next_at+10, back to back."""
    for i in range(5):
        b.launch("ampere_sgemm_128x64_tn", T + 5 * i, T + 10 + gemm_us * i, gemm_us)
    b.cpu("aten::item", T + 30, item_us)
    b.cpu("aten::_local_scalar_dense", T + 31, scalar_us)
    if not copy_event:
        b.cpu("cudaMemcpyAsync", T + 32, call_us, cat="cuda_runtime")
    else:
        b.launch("Memcpy DtoH (Device -> Pageable)", T + 32, T + copy_at, 2, cat="gpu_memcpy", launch_dur=call_us,
                 runtime="cudaMemcpyAsync")
    for i in range(3):
        b.launch("vectorized_elementwise_kernel", T + next_at + 5 * i, T + next_at + 10 + 100 * i, 100)


def test_item_sync_priced_by_the_idle_it_causes(tmp_path):
    # without the sync the call returns after the typical 4 us, the host runs ahead and the kernels run back
    # to back: step 0 ends at 1312 (the copy at 1010..1012, then 3 x 100), step 1 follows at once and ends at
    # 1312 + 1000 + 2 + 300 = 2614; the trace ends at 2740 -> gain 126 us = the GPU idle the syncs caused
    # (28 us after each drain plus the 70 us the host's late launches of step 1 left idle).
    d = diagnose(_item_trace(tmp_path / "i.json.gz"))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.gain_us == pytest.approx(126) and f.gain_pct == pytest.approx(100 * 126 / 2740, abs=0.01)
    m = f.evidence["metrics"]
    assert m["sync_calls"]["value"] == 2
    assert m["sync_blocking_time"]["value"] == pytest.approx(2 * (988 - 4))
    assert m["aten::item calls"]["value"] == 2 and m["aten::item cpu_time"]["value"] == pytest.approx(2 * 995)
    # the device idles from each sync's end (T+1020) to the next kernel (T+1040)
    assert m["gpu_idle_after_syncs"]["value"] == pytest.approx(40)
    (site,) = f.evidence["call_sites"]
    assert site["site"] == "aten::item > aten::_local_scalar_dense" and site["count"] == 2
    assert site["gain_us"] == pytest.approx(126)
    # 72 % of the step blocked, but only 4.6 % to gain: the gain, not the count, sets the severity
    assert f.severity == "medium"
    assert not any(x.kind == "pageable_copy" for x in d.findings)


def test_a_blocking_copy_whose_copy_the_trace_lacks_is_still_a_sync(tmp_path):
    # _item_trace with the copies' device events dropped (a CUPTI buffer overflow): each cudaMemcpyAsync [T+32,
    # T+1020) returns 10 us after the last GEMM ends (T+1010), as a synchronize call would. Read as host time, it
    # held both steps to its length: no host_sync, nothing to gain. As a sync: without it the kernels run back to
    # back, step 0 ends at 1310 (no 2-us copy now), step 1 at 1310 + 1000 + 300 = 2610, the trace at 2740: 130 us
    b = TraceBuilder()
    for s in range(2):
        _gemms_then_read(b, 1400.0 * s, gemm_us=200, copy_at=1010, item_us=995, scalar_us=993, call_us=988,
                         next_at=1030, copy_event=False)
    f = next(x for x in diagnose(b.write(tmp_path / "n.json.gz")).findings if x.kind == "host_sync")
    assert f.gain_us == pytest.approx(130) and f.evidence["metrics"]["sync_calls"]["value"] == 2


def test_call_site_from_python_stack(tmp_path):
    # with_stack=True: user frame train.py(42) encloses the aten::item; a torch frame inside it is skipped
    b = TraceBuilder()
    for s in range(2):
        T = 1400.0 * s
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", T + 5 * i, T + 10 + 200 * i, 200)
        b.cpu("train.py(42): train_step", T + 28, 1000, cat="python_function")
        b.cpu("torch/_tensor.py(1050): __format__", T + 29, 998, cat="python_function")
        b.cpu("aten::item", T + 30, 995)
        b.launch("Memcpy DtoH (Device -> Pageable)", T + 32, T + 1010, 2, cat="gpu_memcpy", launch_dur=988,
                 runtime="cudaMemcpyAsync")
        b.launch("vectorized_elementwise_kernel", T + 1030, T + 1040, 100)
    d = diagnose(b.write(tmp_path / "s.json.gz"))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert [c["site"] for c in f.evidence["call_sites"]] == ["train.py(42): train_step > aten::item"]


def test_async_device_to_device_copy_is_not_a_sync(tmp_path):
    # cudaMemcpyAsync [0, 30) whose 1-us DtoD copy [20, 21) ends inside the call: asynchronous, never a sync;
    # the same for a DtoH copy whose call returned 40 us after it (> COPY_RETURN_US): it did not wait for it
    from trainperf.diagnose.replay import build_graph
    from trainperf.diagnose.window import analysis_window
    from trainperf.trace import read_kineto

    b = TraceBuilder()
    for i in range(5):
        b.launch("ampere_sgemm_128x64_tn", -50 + i, -40 + 5 * i, 4)
    b.launch("Memcpy DtoD (Device -> Device)", 0, 20, 1, cat="gpu_memcpy", launch_dur=30, runtime="cudaMemcpyAsync")
    b.launch("Memcpy DtoH (Device -> Pinned)", 100, 110, 1, cat="gpu_memcpy", launch_dur=51, runtime="cudaMemcpyAsync")
    t = read_kineto(b.write(tmp_path / "d.json.gz"))
    g = build_graph(t, analysis_window(t))
    assert not g.is_sync.any()


def _host_bound_item_trace(path: Path) -> Path:
    # host-bound: each 1000-us step T launches one 50-us kernel at T (call 4 us, kernel T+5..T+55), runs Python
    # until T+400, then aten::item [T+400, T+460) > aten::_local_scalar_dense > cudaMemcpyAsync [T+420, T+440)
    # waiting for its 2-us "Device -> Pageable" copy [T+430, T+432); then Python until the next step. 3 steps.
    b = TraceBuilder()
    for s in range(3):
        T = 1000.0 * s
        b.launch("ampere_sgemm_128x64_tn", T, T + 5, 50)
        b.cpu("python_work", T + 5, 395)
        b.cpu("aten::item", T + 400, 60)
        b.cpu("aten::_local_scalar_dense", T + 401, 58)
        b.launch("Memcpy DtoH (Device -> Pageable)", T + 420, T + 430, 2, cat="gpu_memcpy", launch_dur=20,
                 runtime="cudaMemcpyAsync")
        b.cpu("python_work", T + 461, 538)
    return b.write(path)


def test_removing_a_sync_removes_the_read_that_made_it(tmp_path):
    # The fix (log the value every N steps) drops the whole .item(): its 20 us before the copy call, the call
    # (20 us) and its 20 us after. Each later step starts 60 us sooner: step 2's call starts at 2420 - 120 - 20
    # = 2280 and returns at once; its copy runs 2290..2292 (launch latency 5 + the 5 us lag the trace shows);
    # the trace ended at 2440 -> 148 us. The ops' CPU time around the calls: 20 + 20 per step, but the last
    # item's tail has no next call in the window: 5 x 20 us, plus the calls' own typical cost x 3: the median of
    # the calls that cannot wait (the 4-us launches; replay._typical_call_us), not of all calls (12 us).
    d = diagnose(_host_bound_item_trace(tmp_path / "h.json.gz"))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.fix_order == 1 and f.gain_us == pytest.approx(148)
    assert f.evidence["metrics"]["reading_ops_cpu_time"]["value"] == pytest.approx(5 * 20 + 3 * 4)


def _idle_gpu_reads(path: Path, *, launches: int = 3, launch_every: float = 10.0, launch_us: float = 4.0,
                    reads: int = 10, read_at: float = 200.0, read_every: float = 30.0, item_us: float | None = None,
                    runtime: str = "cudaMemcpyAsync", launch_runtime: str = "cudaLaunchKernel",
                    copy: str = "Memcpy DtoH (Device -> Pageable)") -> Path:
    """An idle GPU, 1000-us steps (3): Python until T+100; `launches` launches `launch_every` us apart from T+100
    (calls of launch_us, 5-us kernels 5 us after each call starts); then `reads` blocking reads `read_every` us apart
    from T+read_at: a 24-us copy call (`runtime`) whose 2-us `copy` runs 10 us after the call starts, the call
    returning 12 us after the copy ends (the round trip of a .item() with nothing queued), inside an aten::item of
    item_us that starts 3 us before the call where item_us is given; Python until the next step."""
    b = TraceBuilder()
    for s in range(3):
        T = 1000.0 * s
        b.step(s, T, 1000.0)
        b.cpu("python_work", T, 100.0)
        for k in range(launches):
            b.launch("vectorized_elementwise_kernel", T + 100 + launch_every * k, T + 105 + launch_every * k, 5,
                     launch_dur=launch_us, runtime=launch_runtime)
        for j in range(reads):
            at = T + read_at + read_every * j
            if item_us is not None:
                b.cpu("aten::item", at, item_us)
                at += 3.0
            b.launch(copy, at, at + 10, 2, cat="gpu_memcpy", launch_dur=24, runtime=runtime)
        b.cpu("python_work", T + read_at + read_every * reads, 1000.0 - read_at - read_every * reads - 1.0)
    return b.write(path)


def test_reads_are_syncs_even_when_they_are_most_of_the_calls(tmp_path):
    # A call that cannot wait (a launch) costs 4 us: each read blocked 20 us (replay._typical_call_us; the
    # median of all calls, 24 us, is the reads' own duration and made none of them look blocked). The window
    # (steps 0 and 1) ends with step 1, at 2000 us. Removed, each read returns after 4 us: 20 x 20 us sooner, and
    # the Python after the last one with them: 400 us sooner.
    d = diagnose(_idle_gpu_reads(tmp_path / "r.json.gz"))  # the reads outnumber the launches
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.evidence["metrics"]["sync_calls"]["value"] == 20
    assert f.evidence["metrics"]["sync_blocking_time"]["value"] == pytest.approx(20 * 20)
    assert f.gain_us == pytest.approx(400) and f.gain_pct == pytest.approx(100 * 400 / 2000, abs=0.01)


def test_a_long_read_returning_a_little_late_still_blocked(tmp_path):
    # each 150-ms step T: five 28-ms kernels launched at T+0..T+20 run back to back T+10..T+140010; aten::item
    # [T+30, T+140050) > cudaMemcpyAsync [T+32, T+140040) whose 2-us "Device -> Pageable" copy runs
    # [T+140015, T+140017): the call returns 23 us after its copy (HTA's negative_queue reads do), well within 1 %
    # of its 140-ms wait: a blocking read (before: > 20 us after the copy, so not one, and no host_sync finding)
    b = TraceBuilder()
    for s in range(3):
        T = 150_000.0 * s
        b.step(s, T, 150_000)
        _gemms_then_read(b, T, gemm_us=28_000, copy_at=140_015, item_us=140_020, scalar_us=140_015,
                         call_us=140_008, next_at=140_060)
    d = diagnose(b.write(tmp_path / "late.json.gz"))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.evidence["metrics"]["sync_calls"]["value"] == len(f.steps) == 2


@pytest.mark.parametrize("training", [True, False])
def test_a_host_waiting_for_its_input_copy_is_told_to_copy_asynchronously(tmp_path, training):
    # each 6000-us step: tensor.to(device) with non_blocking=False from pinned memory: aten::copy_ [T+10, +2040)
    # holds a 4-us cudaMemcpyAsync (its 2000-us "Pinned -> Device" copy [T+30, +2000)) and a cudaStreamSynchronize
    # [T+20, T+2035) that returns 5 us after it; then 10 GEMMs of 350 us launched from T+2100, and a device sync
    # (training: inside an Optimizer.step span). The host's blocking on the copies (5 x 2011 us) is 38 % of it, the
    # device syncs' the rest: the fix names an asynchronous copy ahead of time first (>= HOST_TO_DEVICE_SYNC_SHARE),
    # then the reads' fix, a forward-only loop's when the loop has no backward or optimizer step
    b = TraceBuilder()
    P = 6000.0
    for s in range(6):
        T = s * P
        b.step(s, T, P)
        b.cpu("aten::copy_", T + 10, 2040)
        b.launch("Memcpy HtoD (Pinned -> Device)", T + 12, T + 30, 2000, cat="gpu_memcpy", runtime="cudaMemcpyAsync",
                 bytes=64 << 20)
        b.cpu("cudaStreamSynchronize", T + 20, 2015, cat="cuda_runtime")
        for k in range(10):
            b.cpu("aten::mm", T + 2100 + 20 * k, 15)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 2105 + 20 * k, T + 2120 + 350 * k, 350)
        if training:
            b.cpu("Optimizer.step#AdamW.step", T + 2305, 3500 + 2120 - 2305 + 10, cat="user_annotation")
        b.cpu("cudaDeviceSynchronize", T + 2310, 3500 + 2120 - 2310 + 5, cat="cuda_runtime")
    f = next(x for x in diagnose(b.write(tmp_path / "h2d.json.gz")).findings if x.kind == "host_sync")
    share = f.evidence["metrics"]["waiting_for_host_to_device_copies"]["value"]
    blocked = f.evidence["metrics"]["sync_blocking_time"]["value"]
    assert share == pytest.approx(100.0 * 5 * (2015 - 4) / blocked, abs=1.0)
    assert f.recommendation.startswith("38 % of the host's blocking is on its own host-to-device copies")
    assert "non_blocking=True" in f.recommendation and "side stream" in f.recommendation
    rest = RECOMMENDATIONS["host_sync"] if training else INFERENCE_RECOMMENDATIONS["host_sync"]
    assert f.recommendation.endswith(" " + rest)


@pytest.mark.parametrize("runtime,launch_runtime,copy,syncs", [
    ("hipMemcpyWithStream", "hipLaunchKernel", "Memcpy DtoH (Device -> Host)", True),  # ROCm's blocking copy_
    ("cudaMemcpyAsync", "cudaLaunchKernel", "Memcpy DtoH (Device -> Pageable)", True),  # CUDA returns once copied
    ("cudaMemcpyAsync", "cudaLaunchKernel", "Memcpy DtoH (Device -> Pinned)", False)])  # may end inside its call
def test_a_synchronous_read_is_a_sync_even_when_nothing_is_queued(tmp_path, runtime, launch_runtime, copy, syncs):
    # A synchronous copy call (ROCm's hipMemcpyWithStream: c10's memcpy_and_sync) or a copy into pageable memory
    # returns only once its copy is done: a sync whatever its length (before: only when longer than the usual call,
    # 60 us here, so none). Blocking nothing, its cost to this host-bound step is the read: aten::item's 30 us, the
    # call in it, 2 a step; the window (steps 0 and 1) is 2000 us: 4 x 30 = 120 us, 6 %, what removing them gains.
    # five launches 70 us apart whose calls take 60 us (a slow host: the usual call is 60 us); two .item() reads of
    # 30 us from T+500, 50 us apart, each around its 24-us copy call: they block for nothing (nothing is queued) and
    # are shorter than the usual call
    d = diagnose(_idle_gpu_reads(tmp_path / "r.json.gz", launches=5, launch_every=70.0, launch_us=60.0, reads=2,
                                 read_at=500.0, read_every=50.0, item_us=30.0, runtime=runtime,
                                 launch_runtime=launch_runtime, copy=copy))
    f = next((x for x in d.findings if x.kind == "host_sync"), None)
    if not syncs:
        assert f is None
        return
    m = f.evidence["metrics"]
    assert m["sync_calls"]["value"] == 4 and m["sync_blocking_time"]["value"] == 0.0
    assert m["reading_ops_cpu_time"]["value"] == pytest.approx(120.0)
    assert f.gain_us == pytest.approx(120.0) and f.gain_pct == pytest.approx(6.0, abs=0.01)
