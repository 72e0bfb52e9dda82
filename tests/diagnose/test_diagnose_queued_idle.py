"""idle_with_work_queued on hand-built traces (answers worked by hand): the GPU idles while a kernel launched long
before waits for nothing the trace shows; a host that launches late, or a single such wait, is not that."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

P = 7200.0      # step period, µs
WAIT_US = 3000.0  # kernel B waits this long after kernel A, the GPU idle, with B launched long before


def _trace(path: Path, *, steps: int = 4, waiting_steps=None, late_host: bool = False, lost: bool = False) -> Path:
    # step T: kernel A launched at T+100 runs [T+110, T+2110); kernel B launched at T+200 (or, late_host, at T+5100)
    # starts at T+2110+WAIT_US and runs 2 ms; a cudaDeviceSynchronize from T+300 returns 10 us after B ends, at
    # T+7120; the next step's first launch comes 180 us of host work later. Each waiting step's device step is
    # 7.2 ms of which WAIT_US is B's wait: removed, the step is 4.2 ms, a gain of 3000 / 7200 = 41.7 %.
    b = TraceBuilder()
    waiting = set(range(steps)) if waiting_steps is None else set(waiting_steps)
    for s in range(steps):
        T = s * P
        wait = WAIT_US if s in waiting else 0.0
        b.step(s, T, P)
        b.cpu("aten::mm", T + 90, 20)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 100, T + 110, 2000)
        if lost:  # a kernel launched between A and B whose record the trace lost (CUPTI's buffer full)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 150, T + 2110, wait)
            b.events.pop()
        b.cpu("aten::mm", T + 190, 20)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + (5100 if late_host else 200), T + 2110 + wait, 2000)
        end = T + 4110 + wait
        b.cpu("cudaDeviceSynchronize", T + (5110 if late_host else 300), end + 10 - T - (5110 if late_host else 300),
              cat="cuda_runtime")
        if wait == 0.0:  # the step's remaining time: host work before the next step
            b.cpu("aten::add", end + 20, P - (end - T) - 100)
    return b.write(path)


def _finding(d, kind: str):
    return next((f for f in d.findings if f.kind == kind), None)


def test_a_kernel_launched_long_before_that_waits_for_nothing_recorded_is_priced_by_its_wait(tmp_path):
    d = diagnose(_trace(tmp_path / "t.json.gz"))
    f = _finding(d, "idle_with_work_queued")
    assert f is not None, [x.kind for x in d.findings]
    assert f.evidence["metrics"]["idle_with_work_queued_share"]["value"] == pytest.approx(100 * WAIT_US / P, abs=1.0)
    assert f.gain_alone_pct == pytest.approx(100 * WAIT_US / P, abs=1.0)
    assert f.gain_is_upper_bound and f.severity == "medium"  # a bound >= 10 % rates medium
    assert d.findings[0].kind == "idle_with_work_queued"
    assert _finding(d, "idle_gpu") is None  # the idle it explains is not idle_gpu's


def test_a_host_that_launches_late_is_not_work_queued(tmp_path):
    d = diagnose(_trace(tmp_path / "t.json.gz", late_host=True))
    assert _finding(d, "idle_with_work_queued") is None, [x.kind for x in d.findings]


def test_one_wait_alone_is_not_enough(tmp_path):
    # 1 of the 3 analysed steps waits: 3000 us of 21.6 ms (13.9 %, over the share) but one wait, as a cut trace's
    # first kernel behind unrecorded work would show
    d = diagnose(_trace(tmp_path / "t.json.gz", waiting_steps=[1]))
    assert _finding(d, "idle_with_work_queued") is None, [x.kind for x in d.findings]


def test_a_wait_after_a_launch_whose_work_the_trace_lost_is_not_read(tmp_path):
    # the same waits, but a kernel launched between A and B has no device event: it may have run in B's wait
    d = diagnose(_trace(tmp_path / "t.json.gz", lost=True))
    assert _finding(d, "idle_with_work_queued") is None, [x.kind for x in d.findings]


def test_the_waits_removed_rank_with_the_stalls():
    # a wait removed (its cause outside the trace) ranks with the stalls, before a larger fusion bound: the trace
    # rewritten without its ProfilerSteps had ranked negative_queue's 48.7 % after an exposed_comm bound of 11.2 %
    from trainperf.diagnose import findings as F
    from trainperf.diagnose.replay import Change

    waits = F.make("idle_with_work_queued", [0], [1], {}, changes=(Change("remove_lags", rows=(1,)),))
    fused = F.make("memory_bound_unfused", [0], [1], {}, changes=(Change("fuse_kernels", rows=(2,)),))
    waits.gain_pct = waits.gain_alone_pct = 5.0
    fused.gain_pct = fused.gain_alone_pct = 12.0
    assert F.rank_key(waits)[0] == 0
    assert F.in_rank_order([fused, waits])[0] is waits
