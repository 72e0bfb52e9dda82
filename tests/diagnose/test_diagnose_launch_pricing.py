"""launch_bound priced by its concrete fix (CUDA graphs: every kernel launch costs the host nothing), not by an
assumed host speed-up. Hand-built host-bound trace, answer worked by hand:

each 3000-us step runs 2000 us of Python (one cpu_op), then 10 kernel launches 60 us apart (a 10-us
cudaLaunchKernel after 50 us of op dispatch each), then 350 us more Python; each kernel runs 20 us.
The usual dispatch before a launch is the median CPU gap between runtime calls, 50 us; so each launch
costs the host 50 + 10 = 60 us, 600 us per step. Graphed, each step's host work is 600 us shorter; the window
ends where the last analysed step ends (its host thread's, after the 350 us of Python that follow its last launch;
every kernel has ended by then): n x 600 us sooner.
"""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from host_bound import K_US, N, P, STEPS, host_bound_trace  # noqa: E402

from trainperf.corpus import kineto as K  # noqa: E402
from trainperf.corpus.inject import inject_launch_bound  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.advice import DEVICE_PACED_SMALL_KERNELS_RECOMMENDATION, INFERENCE_RECOMMENDATIONS  # noqa: E402
from trainperf.diagnose.host_bound import KERNEL_LAUNCH_CALL_RE  # noqa: E402

H200_GPU_BOUND = Path(__file__).resolve().parents[1] / "data" / "h200_faults" / "healthy-h200-gpu_bound" / "traces"


def _trace(path: Path) -> Path:
    return host_bound_trace(path / "t.json.gz")


def test_launch_bound_is_priced_by_its_launches(tmp_path):
    d = diagnose(_trace(tmp_path))
    f = next(x for x in d.findings if x.kind == "launch_bound")
    m = f.evidence["metrics"]
    n = len(f.steps)  # the steps before the last one (the window ends where the last ProfilerStep starts)
    assert n == STEPS - 1
    assert m["kernel_launches"]["value"] == N * n
    assert m["per_launch_cost"]["value"] == pytest.approx(60.0)
    assert m["launch_cost"]["value"] == pytest.approx(600.0 * n)
    # span: step 0's start to the last analysed step's end, n P -> minus 600 us per step
    assert f.gain_alone_pct == pytest.approx(100.0 * 600.0 * n / (n * P), abs=0.01)
    assert f.what_if.startswith("kernel launches cost the host nothing")


def _gpu_bound_small_kernels(path: Path, tiny: str = "elementwise_add_kernel") -> Path:
    # each 3000-us step T launches 40 kernels 5 us apart (calls of 4 us): kernel k is a 200-us GEMM when
    # k % 4 == 0, else a 2-us add (30 tiny ones, 75 % of the kernels); they queue back to back from T+5 and
    # the last ends at T+5 + 10 x 200 + 30 x 2 = T+2065; cudaDeviceSynchronize returns at T+2070; at T+2100
    # one more tiny add is launched (the GPU waits for it); Python until the next step.
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        end = T + 5.0
        for k in range(40):
            dur = 200.0 if k % 4 == 0 else 2.0
            start = max(T + 5.0 * k + 5.0, end)
            b.launch("ampere_sgemm_128x64_tn" if dur > 10 else tiny, T + 5.0 * k, start, dur)
            end = start + dur
        b.cpu("cudaDeviceSynchronize", T + 300.0, end + 5.0 - (T + 300.0), cat="cuda_runtime")
        b.cpu("python_work", end + 5.0, T + 2100.0 - end - 5.0)
        b.launch(tiny, T + 2100.0, T + 2105.0, 2.0)
        b.cpu("python_work", T + 2104.0, P - 2104.0 - 1.0)
    return b.write(path / "s.json.gz")


def test_fused_small_kernels_stop_costing_device_time(tmp_path):
    # Fused, a kernel stops paying the fixed device cost of a kernel, the 1st percentile of the trace's kernel
    # durations: 2 us (3 in 4 kernels are 2-us adds), i.e. all of an add's time. So the 30 queued adds take
    # no device time: each sync returns 60 us sooner; the last add's launch
    # also loses its call (4 us; no dispatch: the 1-us gaps between calls hold no op, so the usual dispatch
    # is 0): each step's host work is 64 us shorter, the last analysed one's too (its sync 60 us, its last add's call
    # 4 us): the span, to step 3's end (4 P), ends 4 x 64 us sooner.
    d = diagnose(_gpu_bound_small_kernels(tmp_path))
    f = next(x for x in d.findings if x.kind == "small_kernels")
    assert f.steps == [0, 1, 2, 3]
    assert f.gain_alone_pct == pytest.approx(100.0 * 4 * 64.0 / (4 * P), abs=0.01)


def _device_bound_small_kernels(path: Path, gemm_us: float, gap_us: float = 0.0) -> Path:
    # the host runs ahead: each 2500-us host step launches 40 kernels 5 us apart (calls of 4 us), then Python; kernel
    # k is a GEMM of gemm_us when k % 4 == 0, else a 2-us add (30 of 40); the device runs them back to back from 5 us
    # on, gap_us apart, 10 gemm_us + 60 + 40 gap_us a step, more than the host's 2500: the GPU never waits for the host
    b = TraceBuilder()
    device_end = 5.0 - gap_us
    for s in range(6):
        T = s * 2500.0
        b.step(s, T, 2500.0)
        for k in range(40):
            dur = gemm_us if k % 4 == 0 else 2.0
            start = max(T + 5.0 * k + 5.0, device_end + gap_us)
            b.launch("ampere_sgemm_128x64_tn" if dur > 10 else "elementwise_add_kernel", T + 5.0 * k, start, dur)
            device_end = start + dur
        b.cpu("python_work", T + 200.0, 2500.0 - 201.0)
    return b.write(path / "d.json.gz")


@pytest.mark.parametrize("gemm_us,gap_us,gain_pct",
                         [(294.0, 0.0, 2.0), (294.0, 1.0, 100 * 90 / 3040), (2940.0, 0.0, None)])
def test_small_kernels_on_a_device_that_sets_the_pace_cost_their_fixed_device_time(tmp_path, gemm_us, gap_us,
                                                                                   gain_pct):
    # no launch makes the GPU wait, yet each tiny add costs the device its fixed cost (the 1st percentile of the
    # kernel durations, 2 us: all of it) and the gap the device leaves before each kernel queued behind another (the
    # median lag of those, gap_us): 30 x (2 + gap_us) us of each device step, fused away. With 294-us GEMMs and no
    # gap a device step is 3000 us: 2.0 % of each of the 5 analysed steps (the device still sets the pace, 2940 us
    # against the host's 2500); with a 1-us gap 90 of 3040 us, 2.96 %; with 2940-us GEMMs 60 of 29460 us, 0.2 %,
    # under SMALL_KERNEL_DEVICE_MIN_PCT: no finding
    d = diagnose(_device_bound_small_kernels(tmp_path, gemm_us, gap_us))
    f = next((x for x in d.findings if x.kind == "small_kernels"), None)
    if gain_pct is None:
        assert f is None
        return
    assert f.evidence["metrics"]["gpu_idle_before_them"]["value"] == 0.0
    assert f.recommendation == DEVICE_PACED_SMALL_KERNELS_RECOMMENDATION  # fusion, not a CUDA graph
    assert f.evidence["metrics"]["their_fixed_device_cost"]["value"] == pytest.approx(5 * 30 * (2.0 + gap_us))
    assert f.gain_alone_pct == pytest.approx(gain_pct, abs=0.01)


def test_short_collectives_are_not_small_kernels(tmp_path):
    # the same trace with every 2-us kernel a collective: foreach ops or torch.compile cannot fuse a
    # collective into its neighbours (its fix is fewer, larger buckets), so nothing is a small kernel
    d = diagnose(_gpu_bound_small_kernels(tmp_path, tiny="ncclDevKernel_AllReduce_Sum_f32_RING_LL"))
    assert "small_kernels" not in {x.kind for x in d.findings}


def _outlier_launch_trace(path: Path, steps: int = 4, call_us: float = 10.0, outlier_us: float = 1000.0,
                          step_us: float = 4000.0) -> Path:
    # host-bound, 4000-us steps: 2000 us of Python, then 10 launches 60 us apart as in _trace (50 us of op
    # dispatch, a 10-us call, a 20-us kernel 5 us after the call starts), except the 10th call: it takes
    # 1000 us (a launch that loads its kernel's code on first use, as one hipLaunchKernel in HTA's MI250
    # trace) and its kernel starts 5 us after the call returns; then Python until the next step. call_us,
    # outlier_us and step_us change the calls' durations (launches then 50 + call_us apart) and the step's
    b = TraceBuilder()
    for s in range(steps):
        T = s * step_us
        b.step(s, T, step_us)
        b.cpu("python_work", T, 2000.0)
        for k in range(N):
            at = T + 2000.0 + (50.0 + call_us) * k
            call = outlier_us if k == N - 1 else call_us
            b.cpu("aten::add", at, 50.0 + call)
            b.launch("elementwise_add_kernel", at + 50.0, at + 5.0 + (50.0 + call if k == N - 1 else 50.0), K_US,
                     launch_dur=call)
        after = T + 2000.0 + (50.0 + call_us) * (N - 1) + 50.0 + outlier_us + 10.0
        b.cpu("python_work", after, T + step_us - after - 1.0)
    return b.write(path / "o.json.gz")


# launch.launch_call_cutoff_us: a call over 50 us (HTA's runtime_cutoff) and over 10x the trace's usual launch call is a
# wait a CUDA graph keeps (code loaded on first use), not launch overhead. Each step's launches cost 10 x 50 us of
# dispatch and the calls under the cutoff; graphed, every step's host work is that much shorter, and the window (3
# steps, to the last analysed step's end, after its Python; its kernels end before) ends 3 x that sooner.
# - 10-us calls and one of 1000 us: 10 x 50 + 9 x 10 = 590 us a step (1590 when the outlier was removed as overhead)
# - every call 100 us (a contended or slower CPU) and one of 2000 us: the usual call is 100 us, so the 9 100-us calls
#   are overhead (an absolute 50-us cutoff read them all as outliers: 500 us a step) and the 2000-us one is not:
#   10 x 50 + 9 x 100 = 1400 us a step. A median call of 100 us is past host_bound.SLOW_LAUNCH_CALL_US (40): the
#   host's launch path is slow itself, and the fix priced is each call at the top of a call's usual range (20 us),
#   9 x 80 = 720 us a step (the outlier, a wait, keeps its time)
@pytest.mark.parametrize("call_us, outlier_us, step_us, per_step_us, gain_per_step_us, what_if", [
    (10.0, 1000.0, 4000.0, 590.0, 590.0, "kernel launches cost the host nothing"),
    (100.0, 2000.0, 6000.0, 1400.0, 720.0, "every kernel launch call takes at most 20 us")])
def test_an_outlier_launch_call_is_not_launch_overhead(tmp_path, call_us, outlier_us, step_us, per_step_us,
                                                       gain_per_step_us, what_if):
    d = diagnose(_outlier_launch_trace(tmp_path, call_us=call_us, outlier_us=outlier_us, step_us=step_us))
    f = next(x for x in d.findings if x.kind == "launch_bound")
    n = len(f.steps)
    assert n == 3
    assert f.evidence["metrics"]["launch_cost"]["value"] == pytest.approx(per_step_us * n)
    assert f.evidence["metrics"]["launch_call_median"]["value"] == pytest.approx(call_us)
    assert f.gain_alone_pct == pytest.approx(100.0 * gain_per_step_us * n / (n * step_us), abs=0.01)
    assert f.what_if.startswith(what_if)
    slow = call_us >= 40.0
    assert f.gain_is_upper_bound is not slow  # the usual call is measured against its range, a graph is a bound
    assert f.recommendation.startswith("Each kernel launch call takes 100 us") is slow


def test_a_host_slowed_past_a_gpu_bound_loops_pace_is_launch_bound_though_the_queue_hid_it(tmp_path):
    # The H200's GPU-bound loop (its host ~28 ms ahead: 13 ms of earlier steps' work queued as the window opens) with
    # every launch call 125 us longer (the corpus's surgery): its host now sets the pace (8.4 % slower a step), but the
    # queue keeps the GPU busy through the profiled steps, off the host, so only the host step's excess over the
    # device's (RankFacts.host_excess_us) shows the launches' cost. The truth is the surgery's: the steady step's
    # growth.
    base = K.read_events(H200_GPU_BOUND / "rank0.json.gz")
    out, _ = inject_launch_bound({0: base}, 125.0, random.Random(0))
    before, after = K.step_time_us(base["traceEvents"]), K.step_time_us(out[0]["traceEvents"])
    truth = 100.0 * (after - before) / after
    assert truth > 5.0
    (tmp_path / "traces").mkdir()
    K.write_events(tmp_path / "traces" / "rank0.json.gz", out[0])
    top = diagnose(tmp_path / "traces").findings[0]
    assert top.kind == "launch_bound"
    assert top.gain_pct == pytest.approx(truth, abs=2.0)
    assert "host_step_over_device_step" in top.evidence["metrics"]


def _tiny_kernels_slow_or_usual_calls(path: Path, call_us: float) -> Path:
    # host-bound: each step runs 20 ops of 50 us of dispatch, each ending in a launch call of call_us whose 2-us add
    # starts 5 us into the call (the GPU idles between them), then 20 us of Python: 20 (50 + call_us) + 20 us a step
    step_us = 20 * (50.0 + call_us) + 20.0
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * step_us
        b.step(s, T, step_us)
        for k in range(20):
            at = T + (50.0 + call_us) * k
            b.cpu("aten::add", at, 50.0 + call_us)
            b.launch("elementwise_add_kernel", at + 50.0, at + 55.0, 2.0, launch_dur=call_us)
        b.cpu("python_work", T + step_us - 20.0, 19.0)
    return b.write(path / "t.json.gz")


@pytest.mark.parametrize("call_us", [100.0, 10.0])
def test_a_slow_launch_path_is_named_before_the_tiny_kernels_it_slows(tmp_path, call_us):
    # every kernel is a tiny add, so fusing them (small_kernels) and graphing every launch (launch_bound) remove the
    # same launches. With 100-us calls the host's launch path is slow itself (host_bound.SLOW_LAUNCH_CALL_US): its fix,
    # each call at the top of a call's usual range (20 us), is measured, 20 x 80 us of each 3020-us step, 52.98 %,
    # and ranks first; the tiny kernels get what fusing them adds after it. With usual 10-us calls the tiny kernels
    # are the cause: their fusion is priced first and ranks first (a graph of every launch adds nothing after it)
    d = diagnose(_tiny_kernels_slow_or_usual_calls(tmp_path, call_us))
    kinds = [x.kind for x in d.findings]
    if call_us == 100.0:
        top = d.findings[0]
        assert top.kind == "launch_bound" and top.fix_order == 1
        assert top.gain_alone_pct == pytest.approx(100.0 * 20 * 80.0 / 3020.0, abs=0.01)
        assert "small_kernels" in kinds[1:]
    else:
        assert kinds[0] == "small_kernels"


@pytest.mark.parametrize("name, per_kernel", [
    ("cudaLaunchKernel", True), ("cuLaunchKernelEx", True), ("cudaLaunchKernelExC_v11060", True),
    ("hipLaunchKernel", True), ("hipExtModuleLaunchKernel", True), ("cudaLaunchCooperativeKernel", True),
    ("cudaGraphLaunch", False), ("hipGraphLaunch", False), ("cudaMemcpyAsync", False), ("mtiaLaunchKernel", False)])
def test_the_slow_launch_check_reads_cuda_and_hip_per_kernel_launches_only(name, per_kernel):
    # a graph's launch starts a whole graph (400 us on the H200 loop), another device's runtime has its own costs
    assert bool(KERNEL_LAUNCH_CALL_RE.match(name)) is per_kernel


def _with(path: Path, extra) -> Path:
    """host_bound_trace with the events `extra(step start)` returns added to each step."""
    import gzip
    import json

    host_bound_trace(path)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    b = TraceBuilder()
    b._corr = 10_000  # ids apart from the trace's own
    for s in range(STEPS):
        extra(b, s * P)
    doc["traceEvents"] += b.events
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.mark.parametrize("extra, says", [
    # torch.compile's region around the launches, no graph: compiled in the default mode
    (lambda b, T: b.cpu("Torch-Compiled Region: 0/0", T + 1990.0, 620.0, cat="user_annotation"),
     "compiled in the default mode"),
    # a CUDA graph replaying 4 kernels in the Python before the launches: part of the step is graphed already
    (lambda b, T: b.graph_launch(T + 100.0, [("graphed_kernel", T + 120.0 + 10 * i, 5.0) for i in range(4)]),
     "already replays as CUDA graphs (4 kernels a step)"),
])
def test_launch_bound_names_what_the_step_already_does(tmp_path, extra, says):
    d = diagnose(_with(tmp_path / "t.json.gz", extra))
    f = next(x for x in d.findings if x.kind == "launch_bound")
    assert says in f.recommendation and "gpu_busy_per_step" in f.recommendation
    # without either, the kind's own fix (this loop has no backward: the forward-only loop's)
    plain = next(x for x in diagnose(_trace(tmp_path)).findings if x.kind == "launch_bound")
    assert plain.recommendation == INFERENCE_RECOMMENDATIONS["launch_bound"]
