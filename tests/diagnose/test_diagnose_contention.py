"""comm_contention on hand-built H100 traces (answers worked by hand): the same GEMM on the same shapes, slower while an
all-reduce runs beside it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import end_gpu_bound_step, queued_ops, recorded_shapes, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

BF16 = "c10::BFloat16"
P, STEPS = 4200.0, 5
MM_US = 228.0
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _trace(folder: Path, slow: float = 1.25, shapes: bool = True, wider_beside: bool = False,
           backward: bool = False, exposed_us: float = 0.0,
           collective: tuple = ("c10d::allreduce_", ALL_REDUCE), comm_device: int = 0) -> Path:
    # each 4200-us step: 8 aten::mm [4096, 4096] x [4096, 4096] launched 10 us apart from T, their kernels back to
    # back from T+10; the 5th to 7th run `slow` x 228 us, an all-reduce beside them (stream 20, launched at T+915 on
    # the backward's thread inside c10d::allreduce_) from the 5th's start to the 7th's end; the others 228 us alone.
    # wider_beside: the three beside it multiply [4096, 8192] instead (other work, nothing to compare them with).
    # backward: the 5th to 8th are a backward's, launched inside an autograd node, each `slow` x 228 us whether beside
    # the all-reduce or not (the 8th, alone): the backward's own pace, not the collective's. exposed_us: another
    # all-reduce that long on the computation's stream after it, before the sync: exposed, the next step's
    # computation queued behind it. collective: the (host op, kernel) of the collective beside the GEMMs;
    # comm_device: the GPU it runs on (one process driving two)
    square = recorded_shapes([[4096, 4096], [4096, 4096]], BF16, shapes)
    wide = recorded_shapes([[4096, 8192], [8192, 4096]], BF16, shapes)
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        last = 7 if backward else 6
        ops = [("aten::mm", wide if wider_beside and 4 <= i <= 6 else square, GEMM,
                MM_US * slow if 4 <= i <= last else MM_US) for i in range(8)]
        if backward:
            b.cpu("autograd::engine::evaluate_function: MmBackward0", T + 39.0, 40.0, **{"Sequence number": s})
        end = queued_ops(b, T, ops, T + 10.0)
        start = T + 10.0 + 4 * MM_US
        b.cpu(collective[0], T + 910.0, 20.0, tid=2)
        b.launch(collective[1], T + 915.0, start, 3 * MM_US * slow, stream=20, tid=2, device=comm_device)
        if exposed_us:
            b.cpu("c10d::allreduce_", end - 10.0, 8.0, tid=2)
            b.launch(ALL_REDUCE, end - 8.0, end, exposed_us, tid=2)
            end += exposed_us
        end_gpu_bound_step(b, T, P, end, sync_at=100.0)
    return write_trace(b, folder)


def _find(d):
    return next((f for f in d.findings if f.kind == "comm_contention"), None)


def test_a_gemm_slower_beside_an_all_reduce_is_priced_at_its_time_alone(tmp_path):
    # 3 GEMMs a step at 285 us beside the all-reduce, 5 alone at 228: 1.25x, 3 x 57 = 171 us a step. At 228 the
    # step's device work ends 171 us sooner (the all-reduce, still 855 us from T+922, ends at T+1777, inside the 8th
    # GEMM, now T+1606 - T+1834): the sync and the Python after it follow, 171 / 4200 = 4.07 %
    f = _find(diagnose(_trace(tmp_path)))
    assert f is not None
    m = f.evidence["metrics"]
    assert m["slowdown_beside_communication"]["value"] == pytest.approx(1.25, abs=1e-3)
    steps = len(f.steps)
    assert m["contention_extra_time"]["value"] == pytest.approx(3 * 57.0 * steps, rel=1e-3)
    assert m["of_which_compared"]["value"] == pytest.approx(100.0)
    assert f.gain_alone_pct == pytest.approx(100.0 * 171.0 / P, abs=0.05)
    # an upper bound (fewer SMs for the collective make it longer): a 3-10 % bound rates low
    assert f.gain_is_upper_bound and f.severity == "low"
    assert f.evidence["events"][0]["name"].startswith("aten::mm | [4096, 4096] x [4096, 4096] bf16")
    assert "1.25x beside communication" in f.evidence["events"][0]["name"]
    assert "NCCL_MAX_CTAS" in f.recommendation
    # all of the slowed time beside an all-reduce: the fix says which collective
    assert m["beside_all_reduce"]["value"] == pytest.approx(100.0)
    assert f.recommendation.startswith("Most of it runs beside all-reduces")


@pytest.mark.parametrize("kw", [{"slow": 1.0},             # as fast beside it: no contention
                                {"shapes": False},         # no recorded shapes: the same kernel may be other work
                                {"wider_beside": True},    # other shapes beside it: nothing alone to compare with
                                {"backward": True},        # the backward as slow alone: its pace, compared in its pass
                                {"comm_device": 1}])       # the collective on another GPU: no SM shared
def test_no_contention_without_the_same_work_slower_beside_communication(tmp_path, kw):
    assert _find(diagnose(_trace(tmp_path, **kw))) is None


def test_exposed_communication_says_hiding_it_slows_the_computation_measured_slower_beside_it(tmp_path):
    # an 800-us all-reduce after the computation, exposed (19 % of the step): hidden behind computation that runs
    # 1.25x slower beside a collective, it would gain about 800 / 1.25 = 640 us, not 800
    def exposed(d):
        return next(f for f in d.findings if f.kind == "exposed_comm")

    (tmp_path / "slow").mkdir()
    (tmp_path / "as_fast").mkdir()
    x = exposed(diagnose(_trace(tmp_path / "slow", exposed_us=800.0)))
    assert x.evidence["metrics"]["computation_slowdown_beside_communication"]["value"] == pytest.approx(1.25, abs=1e-3)
    assert "1.25x slower than alone" in x.recommendation and "about 1/1.25 of their exposed time" in x.recommendation
    y = exposed(diagnose(_trace(tmp_path / "as_fast", slow=1.0, exposed_us=800.0)))
    assert "computation_slowdown_beside_communication" not in y.evidence["metrics"]
    assert "slower than alone" not in y.recommendation


def test_the_fix_names_the_collective_beside_the_slowed_computation(tmp_path):
    # the same GEMMs beside an all-to-all (NCCL runs it as send/recv kernels, inside c10d::alltoall_base_): expert
    # parallelism's, whose SM knob is DeepEP's
    f = _find(diagnose(_trace(tmp_path, collective=("c10d::alltoall_base_", "ncclDevKernel_SendRecv"))))
    assert f.evidence["metrics"]["beside_all_to_all"]["value"] == pytest.approx(100.0)
    assert f.recommendation.startswith("Most of it runs beside all-to-all")
