"""A pipeline job written as Kineto traces, one per stage (rank), for the tests and benchmarks/slow_ranks_jobs.py and
pipeline_bubble.py.

In GPipe every stage runs the forwards of a step's micro-batches in order, then their backwards (2x the forward) in
reverse; in 1F1B it warms up with some forwards, then alternates a forward and a backward (stage_order). A
stage's forward of m starts when it is free and m's activations have arrived (the previous stage's forward of m
ended + 50 us); a backward when its gradient has (the next stage's backward ended + 50 us). Each transfer is a
SendRecv kernel on the sender (stream 21, 50 us from its compute's end) and on the receiver (stream 20, from when it
is free until the data arrives, at least 10 us). Each rank's host launches its step's work at the step's start
and then waits in a device sync that returns 100 us after its own GPU's last op; its next step starts 50 us later
(the stages keep their own step boundaries: a stage that finishes early waits for the next step's data in a recv).
"""

from __future__ import annotations

import random
from pathlib import Path

from kineto_builder import TraceBuilder

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
TRANSFER_US = 50.0
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ALL_REDUCE_US = 300.0


def stage_order(schedule: str, stage: int, stages: int, micro: int, chunks: int = 1) -> list[tuple[str, int, int]]:
    """The (phase, micro-batch, model chunk) order a stage runs its step in: GPipe's every forward, then every backward
    in reverse; 1F1B's (PipeDream-Flush, Megatron's default) stages - 1 - stage forwards to warm up, then one forward
    and one backward in turn, then the backwards left; "interleaved" (Megatron's interleaved 1F1B, `chunks` model
    chunks per stage: forward_backward_pipelining_with_interleaving's warm-up of 2 (stages - stage - 1) +
    (chunks - 1) stages chunk-forwards, micro-batches taken in groups of `stages` per chunk); "forward"
    (generation): the forwards alone."""
    if schedule == "forward":  # generation or serving: forwards only
        return [("f", m, 0) for m in range(micro)]
    if schedule == "gpipe":
        return [("f", m, 0) for m in range(micro)] + [("b", m, 0) for m in reversed(range(micro))]
    if schedule == "interleaved":
        total = micro * chunks

        def unit(k: int, phase: str) -> tuple[str, int, int]:
            c = (k % (stages * chunks)) // stages  # Megatron's get_model_chunk_id
            return phase, (k // (stages * chunks)) * stages + k % stages, c if phase == "f" else chunks - 1 - c
        warm = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
        order = [unit(k, "f") for k in range(warm)]
        for k in range(total - warm):
            order += [unit(warm + k, "f"), unit(k, "b")]
        return order + [unit(k, "b") for k in range(total - warm, total)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    warm = min(stages - 1 - stage, micro)
    order = [("f", m, 0) for m in range(warm)]
    for i in range(micro - warm):
        order += [("f", warm + i, 0), ("b", i, 0)]
    return order + [("b", m, 0) for m in range(micro - warm, micro)]


def source(phase: str, stage: int, chunk: int, stages: int, chunks: int) -> tuple[int, int] | None:
    """The (stage, chunk) whose output a stage's chunk needs for its forward (activations) or backward (gradients),
    None where the input is the stage's own (the first layer's data, the loss): with model chunks, the first stage's
    chunk c takes the last stage's chunk c - 1 (and gives its gradient back)."""
    if phase == "f":
        return (stage - 1, chunk) if stage > 0 else (stages - 1, chunk - 1) if chunk > 0 else None
    return (stage + 1, chunk) if stage < stages - 1 else (0, chunk + 1) if chunk < chunks - 1 else None


def pipeline_job(out: Path, forward_us: list, micro: int, *, steps: int = 5, noise_us: float = 0.0,
              rng: random.Random | None = None, replicas: int = 1, schedule_names: bool = False,
              schedule: str = "gpipe", all_reduce_us: float = ALL_REDUCE_US, aten_ops: bool = False,
              receive_syncs: bool = False, tp_all_reduce_us: float = 0.0, transfer_us: float = TRANSFER_US,
              receive_floor_us: float = 10.0, transfer_args: dict | None = None, chunks: int = 1,
              norm_all_reduce_us: float = 0.0, partners: str = "") -> Path:
    """Write rank<k>.json.gz for each rank k into out; return out. forward_us[s]: stage s's forward of a micro-batch
    (us), or a list of one per step; every compute kernel +-noise_us, uniform. replicas: data-parallel copies of the
    pipeline (rank d * stages + s is stage s of copy d, each copy's send/recv its own); with more than one, each stage's
    copies all-reduce their gradients at the end of the step (all_reduce_us after the last copy's backward).
    schedule_names: each compute launch inside a "PP:<stage><F|B><micro-batch>" annotation, as
    torch.distributed.pipelining's multi-stage schedules record them. schedule: "gpipe", "1f1b", "interleaved" (`chunks`
    model chunks per stage, each 1 / chunks of the stage's compute; micro a multiple of the stages) or "forward"
    (stage_order; in "forward", generation, the first stage starts a step once the last stage's output of the step
    before has come back to it: a send/recv from the last stage to the first). aten_ops: each compute launch inside an
    "aten::mm" operator (a loop PyTorch's profiler records operators of). receive_syncs: the host synchronizes the
    device after each receive it launches, as Megatron-LM's batched send/recv does (batch_p2p_sync, on by default), so
    it launches what follows only once the data has arrived (and each kernel starts >= 5 us after its launch).
    tp_all_reduce_us: each forward and backward ends with a tensor-parallel all-reduce of this long (stream 23,
    "Collective name" allreduce in process group "tp") that the stage's next work waits for. transfer_us: each
    activation's or gradient's transfer. A receive starts when its stage is free (PyTorch's send/recv run on NCCL's
    stream, which waits for the compute stream's work queued before the call) and lasts until its data has arrived,
    at least receive_floor_us (10 us: its data already in flight when it starts; transfer_us where the data moves
    only while it runs, as NCCL's kernels move it). Before 2026-12-07 a receive whose data had arrived early started
    then, before its stage was free, with no dependency a trace could show: a replay kept that start as a fixed delay
    and priced a slow 1F1B stage at 7.4 % where the schedule gives 22.4 %;
    transfer_args: the send/recv kernels' args (message sizes, group: PyTorch >= 2.1's record_param_comms).
    norm_all_reduce_us: each copy's stages all-reduce together at the end of the step, this long after the last of
    them arrives (Megatron's gradient-norm all-reduce over the model-parallel group before the optimizer).
    partners: "args", each send/recv kernel names its call and partner as PyTorch >= 2.5 writes them ("Collective
    name" send or recv, "Dst Rank" / "Src Rank", "Process Group Ranks": its pipeline copy's ranks in stage order, and
    a message size), over transfer_args; "spans", as PyTorch 2.1-2.4 does: each launch inside ProcessGroupNCCL's
    "nccl:send 0->1" / "nccl:recv 1<-0" span (ranks within the copy's group), the kernel's args a message size and
    "Group size" alone."""
    rng = rng or random.Random(0)
    p2p_args = transfer_args or {}

    def call_args(call: str, rank: int, first: int, partner: int) -> dict:
        """The args of a send's or recv's kernel that `rank` launches next: transfer_args, and with partners its call,
        partner and group (with "spans", the span around the launch is written here)."""
        if not partners:
            return p2p_args
        size = {"Collective name": call, "In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "BFloat16"}
        if partners == "spans":  # the next launch call is 2 us after host[rank]
            arrow = "->" if call == "send" else "<-"
            b[rank].cpu(f"nccl:{call} {rank - first}{arrow}{partner - first}", host[rank] + 1.0, 2.0,
                        cat="user_annotation")
            return {**size, "Group size": stages, **p2p_args}
        return {**size, "Process Group Ranks": str(list(range(first, first + stages))),
                ("Dst Rank" if call == "send" else "Src Rank"): partner, **p2p_args}

    stages = len(forward_us)
    ranks = stages * replicas
    b = [TraceBuilder(rank=k, world_size=ranks) for k in range(ranks)]
    T = [0.0] * ranks  # each rank's step start
    for step in range(steps):
        free, n = [t + 200.0 for t in T], [0] * ranks
        host = [t + 10.0 for t in T]  # each rank's host clock: its next launch is 2 us after the last
        done: dict = {}

        def launch(k, name, start, dur, stream=7, **args) -> float:
            n[k] += 1
            host[k] += 2.0
            if receive_syncs and start < host[k] + 5.0:  # a kernel starts after its launch; a receive still ends
                end = max(start + dur, host[k] + 15.0) if stream == 20 else host[k] + 5.0 + dur  # when its data is in
                start = host[k] + 5.0
                dur = end - start
            b[k].launch(name, host[k], start, dur, stream=stream, **args)
            return start + dur

        for d in range(replicas):
            at = d * stages  # this copy's first rank
            # the kernels' noise, drawn in one order whatever the schedule (forwards by micro-batch then stage, the
            # backwards in reverse; a stage's chunks innermost), so that a schedule's jobs differ by their order alone
            noise = {(phase, m, s, c): rng.uniform(-noise_us, noise_us)
                     for phase, order in (("f", range(micro)), ("b", reversed(range(micro))))
                     for m in order for s in (range(stages) if phase == "f" else reversed(range(stages)))
                     for c in range(chunks)}
            todo = {s: stage_order(schedule, s, stages, micro, chunks) for s in range(stages)}
            while any(todo.values()):
                ran = False
                for s in range(stages):  # each stage runs its next op once its input has arrived
                    if not todo[s]:
                        continue
                    phase, m, c = todo[s][0]
                    src = source(phase, s, c, stages, chunks)
                    if src is not None and (phase, at + src[0], m, src[1]) not in done:
                        continue
                    todo[s].pop(0)
                    ran = True
                    start = free[at + s]
                    if src is not None:
                        arrive = done[phase, at + src[0], m, src[1]] + transfer_us
                        got = launch(at + s, SEND_RECV, free[at + s],
                                     max(arrive - free[at + s], receive_floor_us), stream=20,
                                     **call_args("recv", at + s, at, at + src[0]))
                        start = max(start, arrive)
                        if receive_syncs:  # the host waits for the receive before it launches anything else
                            b[at + s].cpu("cudaDeviceSynchronize", host[at + s] + 1.0, got + 5.0 - host[at + s] - 1.0,
                                          cat="cuda_runtime")
                            host[at + s] = got + 5.0
                    fwd = (forward_us[s][step] if isinstance(forward_us[s], list) else forward_us[s]) / chunks
                    dur = (1.0 if phase == "f" else 2.0) * fwd + noise[phase, m, s, c]
                    if schedule_names:  # the virtual stage's index: chunk c of stage s is stage c x stages + s
                        b[at + s].cpu(f"PP:{c * stages + s}{phase.upper()}{m}", host[at + s] + 2.0 - 0.5, 1.0,
                                      cat="user_annotation")
                    if aten_ops:
                        b[at + s].cpu("aten::mm", host[at + s] + 2.0 - 0.25, 0.5)
                    done[phase, at + s, m, c] = free[at + s] = launch(at + s, GEMM, start, dur)
                    if tp_all_reduce_us:  # the layer's output reduced across the stage's tensor-parallel ranks
                        done[phase, at + s, m, c] = free[at + s] = launch(
                            at + s, ALL_REDUCE, free[at + s], tp_all_reduce_us, stream=23,
                            **{"Collective name": "allreduce", "Process Group Name": "tp"})
                    takers = [d for d in range(stages) for e in range(chunks)
                              if source(phase, d, e, stages, chunks) == (s, c)]
                    if takers:  # its output leaves for the stage that takes it
                        launch(at + s, SEND_RECV, done[phase, at + s, m, c], transfer_us, stream=21,
                               **call_args("send", at + s, at, at + takers[0]))
                if not ran:
                    raise ValueError(f"the {schedule} schedule deadlocks with {stages} stages, {micro} micro-batches")
            if schedule == "forward" and stages > 1:  # the last stage's output (the next token) returns to the first
                last = at + stages - 1
                launch(last, SEND_RECV, done["f", last, micro - 1, 0], transfer_us, stream=21,
                       **call_args("send", last, at, at))
                arrive = done["f", last, micro - 1, 0] + transfer_us
                launch(at, SEND_RECV, free[at], max(arrive - free[at], receive_floor_us), stream=20,
                       **call_args("recv", at, at, last))
                free[at] = max(free[at], arrive)
        for s in range(stages) if replicas > 1 else ():  # each stage's copies reduce their gradients together
            copies = [d * stages + s for d in range(replicas)]
            last = max(free[k] for k in copies)
            for k in copies:
                launch(k, ALL_REDUCE, free[k], last + all_reduce_us - free[k], stream=22,
                       **{"Collective name": "allreduce", "Process Group Name": f"dp{s}"})
                free[k] = last + all_reduce_us
        for d in range(replicas if norm_all_reduce_us else 0):  # each copy's stages reduce the gradients' norm
            members = range(d * stages, (d + 1) * stages)
            last = max(free[k] for k in members)
            for k in members:
                launch(k, ALL_REDUCE, free[k], last + norm_all_reduce_us - free[k], stream=22,
                       **{"Collective name": "allreduce", "Process Group Name": f"mp{d}"})
                free[k] = last + norm_all_reduce_us
        for k in range(ranks):
            sync_at = host[k] + 5.0
            end = max(free[k], done.get(("f", k, micro - 1, 0), 0.0)) + 100
            b[k].cpu("cudaDeviceSynchronize", sync_at, end - sync_at, cat="cuda_runtime")
            b[k].step(step, T[k], end + 50 - T[k])
            T[k] = end + 50
    out.mkdir(parents=True, exist_ok=True)
    for k in range(ranks):
        b[k].write(out / f"rank{k}.json.gz")
    return out
