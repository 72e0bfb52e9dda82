"""host_sync's fix follows what made the blocking: a data-dependent shape, split sizes read for an all-to-all, a bare
synchronize call, or a value read (the default). Hand-built steps, the blocking worked by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose import advice  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402

A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _steps(path: Path, blocking: str, collective: str = "", operator: bool = False) -> Path:
    """Three 1600-us steps from T = 1600 s: five 200-us GEMMs launched at T+0..T+20 run back to back T+10..T+1010;
    the host blocks from T+30 until the queue drains (T+1012) in `blocking`: "nonzero" (aten::nonzero >
    cudaMemcpyAsync of its 2-us count), "repeat_interleave" (> aten::item > cudaMemcpyAsync), "tolist"
    (aten::tolist > aten::_local_scalar_dense > cudaMemcpyAsync), "copy_" (aten::copy_ > an asynchronous copy, then
    cudaStreamSynchronize), "synchronize" (cudaDeviceSynchronize in no operator) or "rate_limiter" (cudaEventSynchronize
    in FSDP1's "FullyShardedDataParallel.rate_limiter" span); then, with `collective` ("all_to_allv" or "allreduce"),
    the rank launches a 100-us collective of that name at T+1030, and three 100-us kernels from T+1040; an optimizer
    step's span at T+1060 (a training loop). operator: the kernels after the read launched inside aten::add (the
    thread's operators recorded)."""
    b = TraceBuilder(rank=0, world_size=2)
    for s in range(3):
        T = 1600.0 * s
        for i in range(5):
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", T + 5 * i, T + 10 + 200 * i, 200)
        if blocking == "synchronize":
            b.cpu("cudaDeviceSynchronize", T + 30, 985, cat="cuda_runtime")
        elif blocking == "rate_limiter":  # FSDP1's limit_all_gathers: event.synchronize() in its own span
            b.cpu("FullyShardedDataParallel.rate_limiter", T + 29, 988, cat="user_annotation")
            b.cpu("cudaEventSynchronize", T + 30, 985, cat="cuda_runtime")
        elif blocking == "copy_":  # .to("cpu"): the copy, then its stream synchronized inside aten::copy_
            b.cpu("aten::copy_", T + 30, 990)
            b.launch("Memcpy DtoH (Device -> Pinned)", T + 32, T + 1010, 2, cat="gpu_memcpy", launch_dur=4,
                     runtime="cudaMemcpyAsync")
            b.cpu("cudaStreamSynchronize", T + 37, 978, cat="cuda_runtime")
        else:
            b.cpu(f"aten::{blocking}", T + 30, 990)
            if blocking in ("tolist", "repeat_interleave"):  # the latter reads its output size with .item()
                b.cpu("aten::item" if blocking == "repeat_interleave" else "aten::_local_scalar_dense", T + 31, 987)
            b.launch("Memcpy DtoH (Device -> Pageable)", T + 32, T + 1010, 2, cat="gpu_memcpy", launch_dur=983,
                     runtime="cudaMemcpyAsync")
        if collective:
            args = {"Collective name": collective, "Process Group Name": "ep", "Group size": 2,
                    "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "BFloat16"}
            b.cpu("record_param_comms", T + 1029, 4, **args)
            b.launch(A2A if collective == "all_to_allv" else ALL_REDUCE, T + 1030, T + 1040, 100, stream=20, **args)
        for i in range(3):
            if operator:
                b.cpu("aten::add", T + 1039 + 5 * i, 3)
            b.launch("void at::native::vectorized_elementwise_kernel<4>", T + 1040 + 5 * i, T + 1150 + 100 * i, 100)
        b.cpu("Optimizer.step#AdamW.step", T + 1060, 10, cat="user_annotation")  # a training loop's step
        b.step(s, T, 1600.0)
    return b.write(path)


def _host_sync(path: Path):
    return next(f for f in diagnose(path).findings if f.kind == "host_sync")


def _share(f, name: str) -> float:
    return f.evidence["metrics"][name]["value"]


@pytest.mark.parametrize("op", ["nonzero", "repeat_interleave"])
def test_syncs_in_operators_of_data_dependent_size_are_told_to_keep_shapes_static(tmp_path, op):
    # repeat_interleave reads its output size with an aten::item nested in it: the outer operator names the cause
    f = _host_sync(_steps(tmp_path / "n.json.gz", op))
    assert _share(f, "blocking_in_data_dependent_shapes") == pytest.approx(100.0)
    assert f.recommendation == advice.SHAPE_SYNC_RECOMMENDATION.format(pct=100.0, ops=f"aten::{op}")


def test_reads_right_before_an_all_to_all_are_its_split_sizes(tmp_path):
    f = _host_sync(_steps(tmp_path / "a.json.gz", "tolist", "all_to_allv"))
    assert _share(f, "blocking_in_reads_before_all_to_all") == pytest.approx(100.0)
    assert f.recommendation == advice.SPLIT_SIZES_SYNC_RECOMMENDATION.format(pct=100.0)
    # the same read before an all-reduce is a value the host uses: the default fix (drop or defer the read)
    f = _host_sync(_steps(tmp_path / "r.json.gz", "tolist", "allreduce"))
    assert _share(f, "blocking_in_reads_before_all_to_all") == 0.0
    assert f.recommendation == advice.RECOMMENDATIONS["host_sync"]


def test_a_synchronize_call_in_no_operator_is_named(tmp_path):
    f = _host_sync(_steps(tmp_path / "s.json.gz", "synchronize", operator=True))
    assert _share(f, "blocking_in_bare_synchronize") == pytest.approx(100.0)
    assert f.recommendation == advice.BARE_SYNC_RECOMMENDATION.format(pct=100.0, calls="cudaDeviceSynchronize")
    assert _share(f, "blocking_in_data_dependent_shapes") == 0.0
    # without any operator on the thread (an nsys export without PyTorch's NVTX ranges) it cannot be told from a read
    f = _host_sync(_steps(tmp_path / "u.json.gz", "synchronize"))
    assert _share(f, "blocking_in_bare_synchronize") == 0.0 and f.recommendation == advice.RECOMMENDATIONS["host_sync"]
    # a stream synchronized inside aten::copy_ (.to("cpu")) reads for the copy: the default fix
    f = _host_sync(_steps(tmp_path / "c.json.gz", "copy_"))
    assert _share(f, "blocking_in_bare_synchronize") == 0.0
    assert f.recommendation == advice.RECOMMENDATIONS["host_sync"]


def test_fsdps_rate_limiter_is_told_as_fsdps(tmp_path):
    f = _host_sync(_steps(tmp_path / "l.json.gz", "rate_limiter", operator=True))
    assert _share(f, "blocking_in_fsdp_rate_limiter") == pytest.approx(100.0)
    assert _share(f, "blocking_in_bare_synchronize") == pytest.approx(100.0)  # it is one, in no operator
    assert f.recommendation == advice.RATE_LIMITER_SYNC_RECOMMENDATION.format(pct=100.0)
