"""Communication recognised by name, by the record function around the launch, by GPU annotation and by stream."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.trace import read_kineto  # noqa: E402
from trainperf.trace.categories import collective_type  # noqa: E402
from trainperf.trace.events import COMMUNICATION, GEMM  # noqa: E402


def _cat(t, name):
    return {int(t.category[i]) for i in range(len(t)) if t.name_of(i) == name and t.stream[i] >= 0}


def test_comm_by_library_prefix_context_and_stream(tmp_path):
    b = TraceBuilder()
    # DeepEP's expert-parallel kernels (name prefix) on their own stream 30, with one unnamed helper kernel
    # there: 9 of its 10 kernels are communication (>= COMM_STREAM_SHARE), so the helper is too
    for i in range(3):
        b.launch("void dpsk::ep::dispatch<8, 768>(int*)", 0, 10 + 60 * i, 5, stream=30)
        b.launch("void deep_ep::intranode::combine<8>(float*)", 5, 20 + 60 * i, 5, stream=30)
        b.launch("void dpsk::ep::combine<8>(float*)", 8, 30 + 60 * i, 5, stream=30)
    b.launch("helper_layout_kernel", 9, 200, 5, stream=30)
    # a custom kernel launched inside record_param_comms (its collective named in the args) on stream 7
    b.cpu("record_param_comms", 300, 20, **{"Collective name": "all_to_allv"})
    b.launch("my_exchange_kernel", 305, 310, 40)
    # a GEMM on stream 7 outside any collective stays a GEMM
    b.launch("ampere_sgemm_128x64_tn", 400, 410, 40)
    # a kernel under a "nccl:all_reduce" GPU annotation on stream 9
    b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "pid": 0, "tid": 9,
                     "ts": 500, "dur": 60, "args": {}})
    b.launch("custom_reduce_kernel_v2", 490, 505, 50, stream=9)
    b.launch("ampere_sgemm_128x64_tn", 491, 600, 50, stream=9)
    t = read_kineto(b.write(tmp_path / "c.json.gz"))
    for name in ("void dpsk::ep::dispatch<8, 768>(int*)", "void deep_ep::intranode::combine<8>(float*)",
                 "helper_layout_kernel", "my_exchange_kernel", "custom_reduce_kernel_v2"):
        assert _cat(t, name) == {COMMUNICATION}, name
    assert _cat(t, "ampere_sgemm_128x64_tn") == {GEMM}
    row = next(i for i in range(len(t)) if t.name_of(i) == "my_exchange_kernel" and t.stream[i] >= 0)
    assert collective_type(t.names[int(t.collective[row])]) == "all_to_all"


def test_deepep_comm_time_counted(tmp_path):
    # DeepEP dispatch [10, 60) on stream 30 while a GEMM runs [0, 100) on stream 7: comm 50 us, fully hidden
    from trainperf.diagnose.api import diagnose

    b = TraceBuilder()
    b.launch("ampere_sgemm_128x64_tn", -5, 0, 100)
    b.launch("void deep_ep::internode::dispatch<8>(int*)", 0, 10, 50, stream=30)
    r = diagnose(b.write(tmp_path / "d.json.gz")).ranks[0]
    assert r.comm_us == pytest.approx(50) and r.overlap_pct == pytest.approx(100)


@pytest.mark.parametrize("name, kind", [
    ("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", "all_to_all"),   # DeepEP: tokens to experts
    ("void dpsk::ep::internode::combine<8>(float*)", "all_to_all"),              # and back
    ("void deep_ep::layout::get_dispatch_layout(int64_t*)", "all_to_all"),       # its helpers
    ("moe_all2all_kernel", "all_to_all"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(RankData*, RankSignals, int)", "all_reduce"),
])
def test_expert_parallel_kernels_are_an_all_to_all(name, kind):
    assert collective_type(name) == kind
