"""A later pipeline stage's steps open on data from the stage before: a fix of its own host makes that data arrive no
sooner (replay.Graph.arrival_floor). Hand-built 1F1B job, its timeline worked out by the schedule."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402
from pipeline_builder import source, stage_order  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

STAGES, MICRO, FORWARD_US = 4, 8, 400.0
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ADAM = "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>"


def _schedule() -> dict:
    """(stage, phase, micro-batch) -> (start, end, input ready, stage free) in µs from the step's start: each op runs
    once its stage is free and its input has come (no transfer time); a backward takes twice a forward."""
    todo = {s: list(stage_order("1f1b", s, STAGES, MICRO)) for s in range(STAGES)}
    done, free = {}, [0.0] * STAGES
    while any(todo.values()):
        for s in range(STAGES):
            if not todo[s]:
                continue
            phase, m, _ = todo[s][0]
            src = source(phase, s, 0, STAGES, 1)
            if src is not None and (src[0], phase, m) not in done:
                continue
            ready = done[src[0], phase, m][1] if src is not None else 0.0
            start = max(free[s], ready)
            end = start + FORWARD_US * (1 if phase == "f" else 2)
            done[s, phase, m] = (start, end, ready, free[s])
            free[s] = end
            todo[s].pop(0)
    return done


def _job(out: Path, steps: int = 4) -> tuple[Path, float, float]:
    """Each stage's host launches its step ahead of its GPU (10 us a launch): a receive before each op whose input
    comes from a neighbour (it lasts until the input is ready, + 20 us), the op's GEMMs, a send after; then the
    gradient-norm all-reduce over the stages (ending 5 us after the last stage's work), the fused Adam (100 us), and
    the loss read back (aten::item: a 3-us copy that drains the queue). The device's step starts 200 us into the
    step, every step span + 500 us after the last. Returns (folder, the step's period, stage 0's GPU idle after its
    read: the job's gain without the reads)."""
    done = _schedule()
    span = max(v[1] for v in done.values()) + 20
    period = span + 500
    for s in range(STAGES):
        b = TraceBuilder(rank=s, world_size=STAGES)
        for k in range(steps):
            b.step(k, k * period, period)
            t, base = k * period + 5, k * period + 200  # the host's clock; the device's: its work 200 us later
            for phase, m, _ in stage_order("1f1b", s, STAGES, MICRO):
                start, end, ready, free = done[s, phase, m]
                if source(phase, s, 0, STAGES, 1) is not None:
                    b.cpu("nccl:recv", t, 8)
                    b.launch(SEND_RECV, t + 1, base + free, max(ready - free, 0) + 20, stream=30)
                    t += 13
                    start, end = start + 20, end + 20
                gemms = 2 if phase == "f" else 4
                for j in range(gemms):
                    b.cpu("aten::mm", t, 8)
                    b.launch(GEMM, t + 1, base + start + j * (end - start) / gemms, (end - start) / gemms)
                    t += 10
                if any(source(phase, d, 0, STAGES, 1) == (s, 0) for d in range(STAGES)):
                    b.cpu("nccl:send", t, 8)
                    b.launch(SEND_RECV, t + 1, base + end, 20, stream=31)
                    t += 10
            own_end = max(v[1] for (x, _, _), v in done.items() if x == s) + 20
            b.cpu("record_param_comms", t, 8, **{"Collective name": "allreduce", "Process Group Name": "pp"})
            b.launch(ALL_REDUCE, t + 1, base + own_end, span + 5 - own_end, stream=20,
                     **{"Collective name": "allreduce", "Process Group Name": "pp", "In msg nelems": 1})
            b.cpu("Optimizer.step#AdamW.step", t + 10, 50, cat="user_annotation")
            b.launch(ADAM, t + 12, base + span + 10, 100)
            t += 70
            b.cpu("aten::item", t, base + span + 118 - t)
            b.launch("Memcpy DtoH (Device -> Pageable)", t + 1, base + span + 112, 3, cat="gpu_memcpy",
                     runtime="cudaMemcpyAsync", launch_dur=base + span + 116 - t - 1)
        b.write(out / f"rank{s}.json.gz")
    # stage 0 opens each step on its own first forward: the idle after its read, from its end to the next step's work
    return out, period, period - (span + 115)


def test_a_later_stages_own_read_does_not_bring_its_input_sooner(tmp_path):
    # Without the reads, each stage's host would launch the next step at once; on a later stage its first receive
    # then starts early but its input still comes when the stage before sends it. A one-rank replay that let the
    # receive keep its recorded length priced the reads at 12.6 % of the step (a later stage's); the job gains what
    # the first stage, which opens its steps on its own work, gains: the idle after its read, 385 of 13,720 us (2.8 %)
    path, period, idle = _job(tmp_path)
    d = diagnose(path)
    sync = next(f for f in d.findings if f.kind == "host_sync")
    assert sync.gain_pct == pytest.approx(100 * idle / period, abs=0.3)
    # the bubble's own fix still moves every stage: halved, 3 / 11 of the step -> 3 / 22, as the schedule's law has it
    bubble = d.findings[0]
    assert bubble.kind == "pipeline_bubble" and bubble.gain_pct == pytest.approx(100 * 3 / 22, abs=0.5)
