"""grad_sync_per_microbatch (diagnose/grad_sync.py): gradients synchronised after every micro-batch of gradient
accumulation. Real 2-rank gloo DDP profiles (tests/data/grad_sync, torch 2.13 CPU) with and without no_sync, and a
hand-built GPU trace priced by hand."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.grad_sync import accumulating_passes
from trainperf.diagnose.window import analysis_window
from trainperf.trace import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import backward_node, end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "grad_sync"


def _finding(d):
    return next((x for x in d.findings if x.kind == "grad_sync_per_microbatch"), None)


def test_ddp_without_no_sync_is_found_in_real_profiles():
    # 3 micro-batches a step, 2 analysed steps: 6 backward passes, the first 2 of each step accumulate into the next
    # and all-reduce anyway (DDP calls c10d::allreduce_ twice a pass here: 8 early calls); under no_sync the same
    # passes make no call, only the last pass of each step reduces
    for case in ("every_microbatch", "no_sync"):
        for t in load_trace(DATA / case).values():
            early, n = accumulating_passes(t, analysis_window(t).keep)
            assert (len(early), n) == (4, 6)
    x = _finding(diagnose(DATA / "every_microbatch"))
    assert x is not None and x.evidence["metrics"]["early_collective_calls"]["value"] == 8
    assert _finding(diagnose(DATA / "no_sync")) is None


GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclDevComm*, unsigned long, ncclWork*)"
P, STEPS, MICRO = 15300.0, 4, 3
FSDP_P = 16900.0
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CHUNK_CAT = "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<float, float>(CatArrInputTensorMetadata)"


def _accumulating_trace(folder: Path, fsdp: bool = False) -> Path:
    """STEPS steps of MICRO micro-batches: a forward linear (GEMM 1000 us, thread 1), its backward node (thread 2:
    a GEMM of 1000 us, then a 3000-us all-reduce on stream 84 that starts 2 us after it), the next micro-batch's
    forward GEMM starting 2 us after the all-reduce (the step waits for each one); then the optimizer step.
    fsdp: FSDP2's reduce instead, inside an FSDP::post_backward_reduce span of the node: a 500-us copy-in kernel
    (torch._chunk_cat) on stream 84, then a 3000-us reduce-scatter there; steps FSDP_P long."""
    b = TraceBuilder()
    step = FSDP_P if fsdp else P
    for s in range(STEPS):
        T = s * step
        b.step(s, T, step)
        at = T + 50.0
        for m in range(MICRO):
            t0 = T + 60.0 * m
            b.cpu("aten::linear", t0, 8.0, **{"Sequence number": 100 * s + 10 * m, "Fwd thread id": 0})
            b.launch(GEMM, t0 + 2.0, at, 1000.0)
            at = backward_node(b, "AddmmBackward0", t0 + 20.0, 100 * s + 10 * m, [(GEMM, 1000.0)], at + 1000.0)
            if fsdp:
                b.cpu("FSDP::post_backward_reduce", t0 + 26.0, 8.0, cat="user_annotation", tid=2)
                b.launch(CHUNK_CAT, t0 + 27.0, at + 2.0, 500.0, stream=84, tid=2, launch_dur=1.5)
                at += 500.0
            b.launch(RS if fsdp else NCCL, t0 + 30.0, at + 2.0, 3000.0, stream=84, tid=2)
            at += 2.0 + 3000.0 + 2.0
        b.cpu("Optimizer.step#SGD.step", T + 200.0, 20.0, cat="user_annotation")
        end_gpu_bound_step(b, T, step, at, sync_at=250.0)
    return write_trace(b, folder)


def test_early_all_reduces_priced_as_not_run(tmp_path):
    # per step 3 x (1000 + 1000 + 2 + 3000 + 2) = 15,012 us of device time; the first two all-reduces, 3000 us each,
    # are waste: 6000 us per step, measured (ranked with the stalls), high
    d = diagnose(_accumulating_trace(tmp_path))
    x = _finding(d)
    assert x is not None and d.findings[0] is x and not x.gain_is_upper_bound and x.severity == "high"
    n = STEPS - 1
    m = x.evidence["metrics"]
    assert m["backward_passes"]["value"] == MICRO * n and m["accumulating_passes"]["value"] == 2 * n
    assert m["early_collective_time"]["value"] == pytest.approx(6000.0 * n)
    assert x.gain_us / n == pytest.approx(6000.0, rel=0.01)


def test_early_fsdp_reduce_priced_with_its_copies(tmp_path):
    # FSDP2: per micro-batch the reduce path runs a 500-us copy-in and a 3000-us reduce-scatter; a pass without
    # synchronisation (set_requires_gradient_sync(False)) runs neither: 2 x 3500 = 7000 us per step of waste, the
    # copy-in as much as the collective (the collective alone would price 6000)
    x = _finding(diagnose(_accumulating_trace(tmp_path, fsdp=True)))
    assert x is not None and not x.gain_is_upper_bound
    n = STEPS - 1
    m = x.evidence["metrics"]
    assert m["early_collective_time"]["value"] == pytest.approx(6000.0 * n)
    assert m["early_sync_path_ops"]["value"] == 2 * n
    assert m["early_sync_path_op_time"]["value"] == pytest.approx(1000.0 * n)
    assert x.gain_us / n == pytest.approx(7000.0, rel=0.01)
