"""devices_take_turns (diagnose/devices.py): one process drives two GPUs that run one after another.

Hand-built trace (answers worked by hand): STEPS training steps of P us, a model split in two across GPU 0 and GPU 1.
Each step launches the forward's H kernels of K_US for GPU 0 (10 us apart from T+2, running back to back from T+10),
then 2H for GPU 1 (its forward and backward, launched from T+102), then GPU 0's backward (H, from T+252); a kernel
that needs the other GPU's output waits for it (an event wait, 2 us after it ends, as the copy of the activations or
gradients makes it): GPU 0 runs [T+10, T+410), GPU 1 [T+412, T+1212), GPU 0 [T+1214, T+1614). A
cudaDeviceSynchronize from T+300 returns 5 us after the last kernel, then Python runs to 1 us before the next step
(T+1625). Each GPU is busy 800 of the 1,600 us their work spans: they take turns. Side by side (every device event
1600 / 800 = 2x shorter) the chain ends at T+814, 800 us sooner, and the step with it: 800 of each 1,625-us step,
49.23 %.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose import advice  # noqa: E402
from trainperf.diagnose import findings as F  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402

P, STEPS, H, K_US = 1625.0, 4, 5, 80.0
GEMM = "ampere_bf16_s16816gemm_bf16_128x128"


def _two_gpus(folder: Path, *, side_by_side: bool = False) -> Path:
    """The trace above; side_by_side: each GPU runs a whole replica from T+10, beside the other (nn.DataParallel)."""
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        at = T + 10.0
        phases = [(0, H, T + 2.0), (1, 2 * H, T + 102.0), (0, H, T + 252.0)]
        if side_by_side:
            phases = [(0, 2 * H, T + 2.0), (1, 2 * H, T + 102.0)]
        for device, n, launch_at in phases:
            at = T + 10.0 if side_by_side else at
            for k in range(n):
                b.launch(GEMM, launch_at + 10.0 * k, at + K_US * k, K_US, device=device)
            at += n * K_US + 2.0
        end_gpu_bound_step(b, T, P, at - 2.0, sync_at=300.0)
    return write_trace(b, folder)


def _finding(d):
    return next((x for x in d.findings if x.kind == "devices_take_turns"), None)


def test_gpus_that_take_turns_are_priced_as_run_side_by_side(tmp_path):
    d = diagnose(_two_gpus(tmp_path))
    x = _finding(d)
    assert x is not None and d.findings[0] is x
    assert x.gain_alone_pct == pytest.approx(100 * 800 / P, abs=0.05)
    assert x.gain_pct == pytest.approx(100 * 800 / P, abs=0.5)  # after the closing sync's 1 % (a low stall)
    assert x.gain_is_upper_bound and x.severity == "medium"  # 49 % measured would be high; a bound rates one lower
    m = x.evidence["metrics"]
    assert m["gpus"]["value"] == 2
    assert m["busiest_gpu_busy"]["value"] == pytest.approx(3 * 2 * H * K_US)  # 3 steps analysed (the last is cut)
    assert m["devices_union_busy"]["value"] == pytest.approx(3 * 4 * H * K_US)
    assert "device_map" in x.recommendation and "tensor" in x.recommendation
    # the caveat still says the breakdown is over both GPUs, without repeating the finding
    notes = " ".join(d.ranks[0].evidence_notes)
    # each GPU 2,400 us busy from the first step's T+10 to the third's T+1614 (4,854 us): 49 %
    assert "drove 2 GPUs" in notes and "GPU 0 49%, GPU 1 49% of the window" in notes


def test_gpus_side_by_side_do_not_take_turns(tmp_path):
    d = diagnose(_two_gpus(tmp_path, side_by_side=True))
    assert _finding(d) is None
    assert "drove 2 GPUs" in " ".join(d.ranks[0].evidence_notes)


def _data_parallel(folder: Path, *, gpus: int) -> Path:
    """nn.DataParallel's step on `gpus` GPUs of one process (STEPS steps of P us): the parameters broadcast to every
    GPU ([T+10, T+210) on each), the replicas' forward and backward side by side ([T+212, T+1012)), the gradients
    reduced onto GPU 0 ([T+1014, T+1214)), the optimizer on GPU 0 ([T+1216, T+1316)); a synchronize until then. An
    ATen operator opens each step: a PyTorch process."""
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("aten::to", T + 0.5, 1.0)  # a PyTorch process
        for device in range(gpus):
            b.launch("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", T + 2.0 + device,
                     T + 10.0, 200.0, stream=20, device=device)
            for k in range(10):
                b.launch(GEMM, T + 20.0 + 10.0 * k + device, T + 212.0 + K_US * k, K_US, device=device)
            b.launch("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                     T + 130.0 + device, T + 1014.0, 200.0, stream=20, device=device)
        b.launch("multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", T + 140.0, T + 1216.0, 100.0)
        end_gpu_bound_step(b, T, P, T + 1316.0, sync_at=150.0)
    return write_trace(b, folder)


def test_data_parallel_communication_names_its_replacement(tmp_path):
    # 400 of each step's 1,306 us of device work is broadcast and reduce that nothing overlaps: exposed_comm, whose
    # fix is DistributedDataParallel when one process drives the GPUs side by side; the same collectives on one GPU
    # get the usual advice, and neither takes turns
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    two = diagnose(_data_parallel(tmp_path / "two", gpus=2))
    x = next(x for x in two.findings if x.kind == "exposed_comm")
    assert "DistributedDataParallel" in x.recommendation and "torchrun" in x.recommendation
    assert _finding(two) is None
    one = diagnose(_data_parallel(tmp_path / "one", gpus=1))
    assert "DistributedDataParallel" not in next(x for x in one.findings if x.kind == "exposed_comm").recommendation


def test_host_bound_fixes_of_one_process_driving_gpus_side_by_side_start_with_a_process_per_gpu(tmp_path):
    # two replicas side by side, each launched from a thread of its own: 40 kernels of 5 us a step each, 20 us apart
    # (the threads' Python between launches), then 0.8 ms of Python a step: the GPUs wait for tiny kernels' launches
    # (small_kernels) and for that Python (host_work); each fix starts with a host per GPU; on one GPU the same loop
    # gets the usual fixes alone
    def loop(folder: Path, gpus: int) -> Path:
        b = TraceBuilder()
        for s in range(STEPS):
            T = s * P
            b.step(s, T, P)
            b.cpu("aten::to", T + 0.5, 1.0)
            for device in range(gpus):
                for k in range(40):
                    at = T + 10.0 + 20.0 * k
                    b.cpu("aten::add", at, 8.0, tid=1 + device)
                    b.launch("vectorized_elementwise_kernel", at + 2.0, at + 7.0, 5.0, tid=1 + device, device=device)
            b.cpu("cudaDeviceSynchronize", T + 820.0, 5.0, cat="cuda_runtime")
            b.cpu("python_work", T + 826.0, P - 827.0)
        return write_trace(b, folder)

    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    two = [x for x in diagnose(loop(tmp_path / "two", 2)).findings if x.kind in F.HOST_BOUND_KINDS]
    one = [x for x in diagnose(loop(tmp_path / "one", 1)).findings if x.kind in F.HOST_BOUND_KINDS]
    assert two and all(x.recommendation.startswith(advice.ONE_HOST_FOR_SEVERAL_GPUS) for x in two)
    assert one and not any("one process per GPU" in x.recommendation for x in one)


def test_work_of_the_hosts_own_cpu_device_is_no_second_gpu(tmp_path):
    # GPU 0's work as in the first test, and as much again run on host threads as XLA runs its CPU thunks (kernels
    # recorded on the host thread that ran them, trace/xplane.py): one GPU, no turns taken, no note on several GPUs
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        for k in range(2 * H):
            b.launch(GEMM, T + 2.0 + 10.0 * k, T + 10.0 + K_US * k, K_US)
        for k in range(2 * H):
            b.events.append({"ph": "X", "cat": "kernel", "name": "fusion.1", "pid": 10, "tid": 5,
                             "ts": T + 812.0 + K_US * k, "dur": K_US, "args": {"stream": 5}})
            b.cpu("hlo_thunk", T + 812.0 + K_US * k, K_US, tid=5)
        end_gpu_bound_step(b, T, P, T + 1612.0, sync_at=300.0)
    d = diagnose(write_trace(b, tmp_path))
    assert _finding(d) is None and "drove" not in " ".join(d.ranks[0].evidence_notes)
