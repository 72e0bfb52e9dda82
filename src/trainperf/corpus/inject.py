"""One function per problem kind: insert it into a base trace at a given size.

Each `inject_<kind>(ranks, size, rng)` takes the untouched traces ({rank: Kineto JSON object}),
a size (its unit in the docstring) and a seeded random generator (names and places vary with
it), and returns the modified traces and the ranks it touched. The names of the inserted spans
are the ones PyTorch, the CUDA runtime and common training code write into real traces.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

import numpy as np

from trainperf.corpus import kineto as K
from trainperf.corpus.formats import hip_runtime
from trainperf.corpus.surgery import DeviceWait, HostWork, insert_device_delays, insert_host_work
from trainperf.errors import TrainperfError

DATALOADER_NAMES = ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__")
CHECKPOINT_SPANS = ((("checkpoint", "user_annotation"),),
                    (("save_checkpoint", "user_annotation"),),
                    (("torch/distributed/checkpoint/state_dict_saver.py(146): save", "python_function"),),
                    (("torch/serialization.py(628): save", "python_function"),))
SYNC_SPANS = ((("aten::item", "cpu_op"), ("aten::_local_scalar_dense", "cpu_op"), ("cudaMemcpyAsync", "cuda_runtime")),
              (("aten::cpu", "cpu_op"), ("aten::_to_copy", "cpu_op"), ("aten::copy_", "cpu_op"),
               ("cudaMemcpyAsync", "cuda_runtime")),
              (("aten::nonzero", "cpu_op"), ("cudaMemcpyAsync", "cuda_runtime")))
MALLOC_SPANS = (("aten::empty_strided", "cpu_op"), ("cudaMalloc", "cuda_runtime"))
LAUNCH_SPANS = (("aten::add_", "cpu_op"), ("cudaLaunchKernel", "cuda_runtime"))
PAGEABLE_SPANS = (("aten::to", "cpu_op"), ("aten::_to_copy", "cpu_op"), ("aten::copy_", "cpu_op"),
                  ("cudaMemcpyAsync", "cuda_runtime"))
# host work that launches nothing, as real traces show it: metrics or logging in the loop (a Python function, or an
# annotation the user put around it), or nothing at all (Python's garbage collector, untraced Python)
HOST_WORK_SPANS = ((("train.py(212): log_metrics", "python_function"),),
                   (("compute_metrics", "user_annotation"),),
                   ())
TINY_KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, "
               "at::detail::Array<char*, 2> >(int, at::native::CUDAFunctorOnSelf_add<float>, "
               "at::detail::Array<char*, 2>)")
# a convolution library's layout conversion as a mixed-precision A100 run writes it (cuDNN), and as ROCm's MIOpen does
LAYOUT_TRANSPOSE_KERNELS = {False: "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, "
                                  "(cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, __half const*, "
                                  "__half*)",
                            True: "batched_transpose_32x32_half"}
LAYOUT_TRANSPOSES_PER_STEP = 16  # 8 convolutions' input and output conversions
ALLOC_CALLS_PER_STEP = 8
GPU_HOLDS_PER_STEP = 4        # times a step another process's work holds the GPU (its time slices)
TINY_KERNEL_US = 2.0          # a few-thousand-element add on a current GPU
SYNC_HOST_US = 12.0           # host cost of .item() besides the wait (dispatch + 4-byte copy call)
PAGEABLE_GBPS = 6.0           # host-to-device copy rate from pageable memory (staged through a pinned buffer)
MIN_OVERLAP_SHARE = 0.0    # a collective counts as overlapped when compute runs during any of it
COLLECTIVE_MARKERS = ("nccl", "rccl", "allreduce", "all_reduce", "allgather", "reducescatter", "sendrecv", "alltoall")


# Names a ROCm (HIP) trace gives the inserted calls and copies instead, as HTA's MI250 trace
# (amd_trace/, ROCm 6.2) shows them: a blocking host<->device copy is `hipMemcpyWithStream` with a
# "Memcpy HtoD (Host -> Device)" device op (ROCm's tracer does not tell pageable from pinned memory);
# other runtime calls are renamed as formats.hip_runtime renames a whole trace (hipLaunchKernel, hipMalloc).
HIP_NAMES = {"cudaMemcpyAsync": "hipMemcpyWithStream",
             "Memcpy DtoH (Device -> Pageable)": "Memcpy DtoH (Device -> Host)",
             "Memcpy HtoD (Pageable -> Device)": "Memcpy HtoD (Host -> Device)"}


class NotApplicable(TrainperfError):
    """The base has nothing this kind of problem can be injected into (the message says why)."""


@dataclass(frozen=True)
class Rank:
    """Facts of one rank's trace that the injections need."""

    main: tuple           # (pid, tid) of the thread with the ProfilerSteps
    stream: tuple         # (pid, tid) of the busiest device stream
    latency_us: float     # shortest launch-to-start latency seen
    steps: list           # kineto.Step
    launch_us: float      # median host time of a kernel launch call on the main thread
    hip: bool = False     # a ROCm trace (its runtime calls are hip*): inserted calls get HIP names


@K.cached_by_identity()
def rank_facts(doc: dict) -> Rank:
    """The Rank facts of a Kineto object; a one-line error when it has no steps or no device ops."""
    ev = doc["traceEvents"]
    st = K.steps(ev)
    stream = K.main_stream(ev)
    if not st or stream is None:
        raise TrainperfError("base trace needs ProfilerStep#N spans and device ops")
    gpu_pid = next(e.get("pid") for e in ev if K.is_gpu_op(e) and e.get("tid") == stream)
    main = (st[0].pid, st[0].tid)
    launches = [float(e["dur"]) for e in ev if K.is_runtime(e) and (e.get("pid"), e.get("tid")) == main
                and str(e.get("name", "")).startswith(("cudaLaunchKernel", "hipLaunchKernel"))]
    runtime = [str(e.get("name", "")) for e in ev if K.is_runtime(e)]
    hip = sum(n.startswith("hip") for n in runtime) > sum(n.startswith(("cuda", "cu")) for n in runtime)
    return Rank(main, (gpu_pid, stream), K.min_launch_latency_us(ev), st,
                float(np.median(launches)) if launches else 5.0, hip)


def vendor_name(name: str, hip: bool) -> str:
    """The name a CUDA runtime call or copy has in a ROCm trace (HIP_NAMES, else formats.hip_runtime's renaming)
    when hip, else name unchanged."""
    if not hip:
        return name
    return HIP_NAMES.get(name) or hip_runtime(name)


def _vendor_work(w: HostWork, hip: bool) -> HostWork:
    if not hip:
        return w
    op = (vendor_name(w.gpu_op[0], hip), *w.gpu_op[1:]) if w.gpu_op else None
    return replace(w, spans=tuple((vendor_name(n, hip), c) for n, c in w.spans), gpu_op=op)


# the optimizer's spans as PyTorch names them (torch.optim's record_function around step and zero_grad) and as Meta's
# training loops annotate the phase (HTA's traces: "## optimizer ##")
OPTIMIZER_SPAN_RE = re.compile(r"^(Optimizer\.(step|zero_grad)#|## optimizer ##)")


def _launch_points(doc: dict, r: Rank, per_step: int, rng: random.Random,
                   outside_optimizer: bool = False) -> list[float]:
    """per_step host instants per step: starts of kernel launches on the main thread, evenly spread; outside the
    optimizer's spans (OPTIMIZER_SPAN_RE) where outside_optimizer."""
    ev = doc["traceEvents"]
    starts = np.sort(np.array([float(e["ts"]) for e in ev if K.is_runtime(e) and (e.get("pid"), e.get("tid")) == r.main
                               and str(e.get("name", "")).startswith(("cudaLaunchKernel", "hipLaunchKernel"))]))
    if outside_optimizer:
        for e in ev:
            if e.get("ph") == "X" and OPTIMIZER_SPAN_RE.match(str(e.get("name", ""))) and not K.is_gpu(e):
                starts = starts[(starts < float(e["ts"])) | (starts >= K.end(e))]
    out = []
    for s in r.steps:
        inside = starts[(starts > s.ts) & (starts < s.end)]
        if inside.size:
            out += [float(x) for x in _evenly(inside, per_step, rng)]
    return out


def _evenly(items: np.ndarray, n: int, rng: random.Random) -> np.ndarray:
    """n of items (non-empty) evenly spread over them from a random offset (one draw of rng)."""
    pos = ((np.arange(n) + rng.random()) * items.size / n).astype(int)
    return items[np.clip(pos, 0, items.size - 1)]


def _host(ranks: dict, work_of) -> tuple[dict, list[int]]:
    """Apply insert_host_work on every rank with the work list work_of(doc, Rank) gives."""
    out = {}
    for rank, doc in ranks.items():
        r = rank_facts(doc)
        work = [_vendor_work(w, r.hip) for w in work_of(doc, r)]
        out[rank] = insert_host_work(doc, work, main=r.main, stream=r.stream, latency_us=r.latency_us)
    return out, sorted(ranks)


def inject_data_loader_stall(ranks: dict, size: float, rng: random.Random):
    """size: µs of DataLoader fetch on the host at the start of every step."""
    name = rng.choice(DATALOADER_NAMES)
    return _host(ranks, lambda doc, r: [HostWork(at_us=s.ts + 0.5, host_us=size, spans=((name, "user_annotation"),))
                                        for s in r.steps])


def inject_checkpoint_stall(ranks: dict, size: float, rng: random.Random):
    """size: µs of synchronous checkpoint save (after the device drained) at the end of a middle step
    (never the last one, which profilers and analysis windows often cut short)."""
    spans = rng.choice(CHECKPOINT_SPANS)

    def work(doc, r):
        s = r.steps[(len(r.steps) - 1) // 2]
        return [HostWork(at_us=s.end - 0.5, host_us=size, spans=spans, drains=True)]
    return _host(ranks, work)


def inject_host_sync(ranks: dict, size: float, rng: random.Random):
    """size: blocking device-to-host reads (.item(), .cpu(), nonzero) per step, spread over the launches."""
    spans = rng.choice(SYNC_SPANS)
    per_step = max(int(round(size)), 1)
    return _host(ranks, lambda doc, r: [
        HostWork(at_us=t, host_us=SYNC_HOST_US, spans=spans, drains=True,
                 gpu_op=("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 2.0), gpu_args={"bytes": 4})
        for t in _launch_points(doc, r, per_step, rng)])


def inject_allocator_stall(ranks: dict, size: float, rng: random.Random):
    """size: µs of each of ALLOC_CALLS_PER_STEP cudaMalloc calls per step (the allocator growing its
    pool on the critical path: many distinct shapes, fragmentation or the cache switched off)."""
    return _host(ranks, lambda doc, r: [HostWork(at_us=t, host_us=size, spans=MALLOC_SPANS)
                                        for t in _launch_points(doc, r, ALLOC_CALLS_PER_STEP, rng)])


def inject_pageable_copy(ranks: dict, size: float, rng: random.Random):
    """size: µs of one host-to-device copy from pageable memory at the start of every step (the host
    waits for the stream, then for the copy)."""
    gbytes = size * 1e-6 * PAGEABLE_GBPS
    return _host(ranks, lambda doc, r: [
        HostWork(at_us=s.ts + 0.5, host_us=5.0, spans=PAGEABLE_SPANS, drains=True,
                 gpu_op=("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", size),
                 gpu_args={"bytes": int(gbytes * 1e9), "memory bandwidth (GB/s)": PAGEABLE_GBPS})
        for s in r.steps])


def inject_small_kernels(ranks: dict, size: float, rng: random.Random, outside_optimizer: bool = True):
    """size: extra tiny elementwise kernels per step (each a launch on the host and ~2 µs on the device), in the
    model's work: tiny kernels inside the optimizer's step are a per-parameter optimizer's (its own kind); anywhere in
    the step where not outside_optimizer."""
    per_step = max(int(round(size)), 1)
    return _host(ranks, lambda doc, r: [
        HostWork(at_us=t, host_us=r.launch_us + 4.0, spans=LAUNCH_SPANS,
                 gpu_op=(TINY_KERNEL, "kernel", TINY_KERNEL_US),
                 gpu_args={"grid": [4, 1, 1], "block": [128, 1, 1]})
        for t in _launch_points(doc, r, per_step, rng, outside_optimizer)])


# the runtime calls that launch one kernel, as CUDA (cudaLaunchKernel, cudaLaunchKernelExC; Triton's cuLaunchKernel)
# and HIP (hipLaunchKernel, hipExtModuleLaunchKernel, hipModuleLaunchKernel) name them
KERNEL_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                       "hipModuleLaunchKernel")


# read once per untouched base: the size search asks for them on every try, and launches_per_step before it
@K.cached_by_identity()
def _launches_in_steps(doc: dict) -> list[dict]:
    """The kernel launch calls (KERNEL_LAUNCH_CALLS), of every host thread (a backward on the autograd thread launches
    too), that start inside one of the rank's steps (rank_facts)."""
    steps = rank_facts(doc).steps
    return [e for e in doc["traceEvents"] if K.is_runtime(e) and str(e.get("name", "")).startswith(KERNEL_LAUNCH_CALLS)
            and any(s.ts < float(e["ts"]) < s.end for s in steps)]


def launches_per_step(ranks: dict) -> float:
    """Kernel launch calls a step (_launches_in_steps), the largest over the ranks."""
    return max(len(_launches_in_steps(doc)) / max(len(rank_facts(doc).steps), 1) for doc in ranks.values())


def inject_launch_bound(ranks: dict, size: float, rng: random.Random):
    """size: µs added to every kernel launch call inside the steps, on every host thread (the host's launch path
    slower: a slower or contended CPU, a heavier driver call), inside the call, so the call itself is longer. Not
    into a trace whose steps launch nothing one kernel at a time (a CUDA graph replay a step)."""
    if launches_per_step(ranks) < 1:
        raise NotApplicable("the steps launch no kernel one at a time (a CUDA graph replays them)")
    return _host(ranks, lambda doc, r: [
        HostWork(at_us=float(e["ts"]) + 0.5 * float(e.get("dur", 0.0)), host_us=size, spans=())
        for e in _launches_in_steps(doc)])


def inject_layout_transposes(ranks: dict, size: float, rng: random.Random):
    """size: µs of each of LAYOUT_TRANSPOSES_PER_STEP NCHW -> NHWC conversion kernels per step, each one launch call
    on the main thread (no operator of its own: the convolution's library launches it inside the convolution's)."""
    return _host(ranks, lambda doc, r: [
        HostWork(at_us=t, host_us=r.launch_us, spans=(("cudaLaunchKernel", "cuda_runtime"),),
                 gpu_op=(LAYOUT_TRANSPOSE_KERNELS[r.hip], "kernel", size),
                 gpu_args={"grid": [1024, 1, 1], "block": [256, 1, 1]})
        for t in _launch_points(doc, r, LAYOUT_TRANSPOSES_PER_STEP, rng)])


def _is_collective(e: dict) -> bool:
    name = str(e.get("name", "")).lower()
    return K.is_gpu_op(e) and e.get("cat") in ("kernel", "Kernel") and any(m in name for m in COLLECTIVE_MARKERS)


def _collectives(doc: dict) -> list[tuple[int, dict]]:
    found = [(i, e) for i, e in enumerate(doc["traceEvents"]) if _is_collective(e)]
    return sorted(found, key=lambda x: float(x[1]["ts"]))


def inject_straggler(ranks: dict, size: float, rng: random.Random, slow: int | None = None):
    """size: how much slower the slow rank's compute kernels run (0.3 = 30 % longer each); each
    other rank waits inside the matching collective (matched by order) for as long as the slow
    rank's arrives later than it did."""
    if len(ranks) < 2:
        raise NotApplicable("a straggler needs a base with at least 2 ranks")
    slow = rng.choice(sorted(ranks)) if slow is None else slow
    doc = ranks[slow]
    r = rank_facts(doc)
    t0, t1 = r.steps[0].ts, r.steps[-1].end
    stretch = {i: size * float(e["dur"]) for i, e in enumerate(doc["traceEvents"])
               if K.is_gpu_op(e) and e.get("cat") in ("kernel", "Kernel") and not _is_collective(e)
               and t0 <= float(e["ts"]) <= t1}
    out = {slow: insert_device_delays(doc, extra=stretch, latency_us=r.latency_us)}
    late = [float(b["ts"]) - float(a["ts"]) for (_, a), (_, b) in zip(_collectives(doc), _collectives(out[slow]))]
    for rank, other in ranks.items():
        if rank == slow:
            continue
        lat = rank_facts(other).latency_us
        extra: dict[int, float] = {}
        mod = other
        for k, ((i, e), d) in enumerate(zip(_collectives(other), late)):
            now = float(_collectives(mod)[k][1]["ts"]) - float(e["ts"])  # delay it has already
            if d - now > 1.0:
                extra[i] = d - now
                mod = insert_device_delays(other, extra=extra, latency_us=lat)
        out[rank] = mod
    return out, [slow]


@dataclass(frozen=True)
class _Overlapped:
    """A collective off the compute stream that overlaps compute (event indices; µs)."""

    op: int            # the collective
    at: float          # where it would start if serialised: the end of the compute op running at its start
    dur: float
    before: int | None  # that compute op (None: it starts in a compute gap)
    next: int | None    # the first compute op starting at or after `at`, which must wait for it


@K.cached_by_identity()
def _overlapped_collectives(doc: dict) -> list[_Overlapped]:
    """Each collective off the compute stream that overlaps compute and whose own stream has nothing
    else starting before it would start if serialised."""
    r = rank_facts(doc)
    ev = doc["traceEvents"]
    comp = sorted((float(e["ts"]), K.end(e), i) for i, e in enumerate(ev)
                  if K.is_gpu_op(e) and (e.get("pid"), e.get("tid")) == r.stream and not _is_collective(e))
    cs, ce = np.array([c[0] for c in comp]), np.array([c[1] for c in comp])
    starts: dict = {}  # stream -> sorted starts of its ops
    for x in ev:
        if K.is_gpu_op(x):
            starts.setdefault((x.get("pid"), x.get("tid")), []).append(float(x["ts"]))
    starts = {k: np.sort(v) for k, v in starts.items()}
    cands = []
    for i, e in _collectives(doc):
        if (e.get("pid"), e.get("tid")) == r.stream:
            continue
        ts, te = float(e["ts"]), K.end(e)
        j = np.searchsorted(cs, ts, side="right") - 1
        running = j >= 0 and ce[j] > ts
        at = float(ce[j]) if running else ts
        overlap = float(np.clip(np.minimum(ce, te) - np.maximum(cs, ts), 0, None).sum())
        same = starts[(e.get("pid"), e.get("tid"))]
        # an op of its own stream starting before `at` would have to move too: not a candidate
        between = np.searchsorted(same, at, side="left") - np.searchsorted(same, ts, side="right")  # -1: at == ts
        if overlap > MIN_OVERLAP_SHARE * float(e["dur"]) and between <= 0:
            nxt = int(np.searchsorted(cs, at, side="left"))
            cands.append(_Overlapped(op=i, at=at, dur=float(e["dur"]), before=comp[j][2] if running else None,
                                     next=comp[nxt][2] if nxt < len(comp) else None))
    return cands


def inject_exposed_comm(ranks: dict, size: float, rng: random.Random):
    """size: share (0..1] of the collectives that overlap compute which are serialised: each starts
    when the compute op running at its start ends, the next compute op waits for it, and so does
    the host (a cudaStreamSynchronize, as after `dist.all_reduce(t); torch.cuda.synchronize()`,
    issued at the instant the collective would start).

    The sync is written on the host thread that launched the collective (its launch->kernel
    correlation): in DDP that is the autograd thread, while the main thread is inside backward()
    and cannot call it. The wait still moves every host thread: the main thread waits in
    backward() for the autograd thread, so its open ops are stretched and its later ones shifted.
    On the device only what waited moves: the compute after the collective, and what waited for
    that in turn (stream order, the original's event waits, launches that moved with the host).

    Serialising is the program's doing, so every rank serialises the same collectives (matched by order, as
    inject_straggler matches them), and a collective ends on no rank before its last rank has arrived
    (_end_together): a rank serialised later than another makes the other wait inside the collective.

    (Without the host's sync it costs nothing measurable on these bases: their GPUs idle 53-78 % of
    the step and the slack absorbs the compute's wait; gains < 0.1 %.)"""
    if not any(_overlapped_collectives(doc) for doc in ranks.values()):
        raise NotApplicable("no collective overlaps compute off the compute stream: none to serialise")
    order = {rank: {i: k for k, (i, _) in enumerate(_collectives(doc))} for rank, doc in ranks.items()}
    cands = {rank: {order[rank][c.op]: c for c in _overlapped_collectives(doc)} for rank, doc in ranks.items()}
    pool = sorted(set().union(*cands.values()))
    chosen = set(rng.sample(pool, int(np.ceil(size * len(pool))))) if pool else set()
    plans = {}
    for rank, doc in ranks.items():
        r = rank_facts(doc)
        launcher = K.launch_threads(doc["traceEvents"])
        after: dict[int, list[int]] = {}
        syncs: list[DeviceWait] = []
        for c in (cands[rank][k] for k in sorted(chosen & set(cands[rank]))):
            if syncs and c.at <= syncs[-1].at_us:
                continue
            if c.before is not None:
                after.setdefault(c.op, []).append(c.before)
            if c.next is not None:
                after.setdefault(c.next, []).append(c.op)
            syncs.append(DeviceWait(at_us=c.at, op=c.op, name=vendor_name("cudaStreamSynchronize", r.hip),
                                    thread=launcher.get(K.correlation(doc["traceEvents"][c.op]), r.main)))
        plans[rank] = {"after": after, "syncs": syncs, "latency_us": r.latency_us}
    return _end_together(ranks, plans), sorted(ranks)


def _end_together(ranks: dict, plans: dict) -> dict:
    """Each rank's trace re-timed by insert_device_delays(**plans[rank]), then, collective by collective in order,
    each rank's collective stretched (extra) until it ends as much later than it did as it now does on the rank
    where it moved most: no rank's transfer ends before the last rank's arrival lets it (each rank's times are
    compared with its own original, so clocks of other hosts need no alignment). What a stretch delays on a rank
    can make it the late one at the next collective, so each is settled before the next is looked at."""
    base = {rank: _collectives(doc) for rank, doc in ranks.items()}
    extra: dict = {rank: {} for rank in ranks}
    out = {rank: insert_device_delays(doc, **plans[rank]) for rank, doc in ranks.items()}
    now = {rank: _collectives(doc) for rank, doc in out.items()}  # read again only where a rank is re-timed
    for k in range(min(len(c) for c in base.values())):
        # each rank's clock apart (ranks of other hosts): how much later than before the collective ends on it
        moved = {rank: K.end(now[rank][k][1]) - K.end(base[rank][k][1]) for rank in ranks}
        latest = max(moved.values())
        for rank in ranks:
            short = latest - moved[rank]
            if short > 1.0:
                i = base[rank][k][0]
                extra[rank][i] = extra[rank].get(i, 0.0) + short
                out[rank] = insert_device_delays(ranks[rank], extra=extra[rank], **plans[rank])
                now[rank] = _collectives(out[rank])
    return out


# median correlation-id step between runtime calls above which a trace is sampled: diagnose's evidence uses the same
# number, restated here because the corpus must not import diagnose (it judges it)
SAMPLED_IDS_PER_CALL = 30


def _refuse_sampled(ranks: dict, what: str) -> None:
    """NotApplicable where a rank's trace is sampled (its runtime calls' correlation ids step by more than
    SAMPLED_IDS_PER_CALL, as HTA's trace_filter by 73): there `what` is as likely events the sampling dropped, so no
    reading could tell the injected problem apart."""
    for doc in ranks.values():
        ids = np.sort([c for e in doc["traceEvents"] if K.is_runtime(e) and (c := K.correlation(e)) is not None])
        per_call = float(np.median(np.diff(ids))) if ids.size > 20 else 1.0
        if per_call > SAMPLED_IDS_PER_CALL:
            raise NotApplicable(f"a sampled trace (1 runtime call in {per_call:.0f} kept): {what} cannot be told "
                                "from the events it dropped")


def inject_host_work(ranks: dict, size: float, rng: random.Random):
    """size: µs of host work that launches nothing, once per step between two of its kernel launches (the loop
    thread computing metrics, logging, or collecting garbage while the device drains its queue). Not into a sampled
    trace (_refuse_sampled): there a gap with no launch is as likely events the sampling dropped."""
    _refuse_sampled(ranks, "host work that launches nothing")
    spans = rng.choice(HOST_WORK_SPANS)
    return _host(ranks, lambda doc, r: [HostWork(at_us=t, host_us=size, spans=spans)
                                        for t in _launch_points(doc, r, 1, rng)])


def inject_gpu_held(ranks: dict, size: float, rng: random.Random):
    """size: µs by which each of GPU_HOLDS_PER_STEP kernels a step (not collectives, evenly spread over the kernels
    the step launched) starts later than its launch and its stream allow, the device idle meanwhile: the GPU held by work the
    trace does not record (another process on it, its time slices). Every rank of the base. Not into a sampled trace
    (_refuse_sampled): its dropped events leave such gaps already."""
    _refuse_sampled(ranks, "a device held by work the trace does not record")
    out = {}
    for rank, doc in ranks.items():
        r = rank_facts(doc)
        ev = doc["traceEvents"]
        kernels = np.array([i for i, e in enumerate(ev) if K.is_gpu_op(e) and e.get("cat") in ("kernel", "Kernel")
                            and not _is_collective(e)])
        # a kernel belongs to the step that launched it (a GPU-bound loop runs it steps later)
        launched = {K.correlation(e): float(e["ts"]) for e in ev if K.is_runtime(e) and K.correlation(e) is not None}
        starts = np.array([launched.get(K.correlation(ev[i]), float(ev[i]["ts"])) for i in kernels])
        hold: dict[int, float] = {}
        for s in r.steps:
            inside = kernels[(starts >= s.ts) & (starts < s.end)]
            if inside.size:
                hold.update({int(k): size for k in _evenly(inside, GPU_HOLDS_PER_STEP, rng)})
        out[rank] = insert_device_delays(doc, hold=hold, latency_us=r.latency_us)
    return out, sorted(ranks)


INJECTORS = {
    "data_loader_stall": inject_data_loader_stall,
    "checkpoint_stall": inject_checkpoint_stall,
    "host_sync": inject_host_sync,
    "allocator_stall": inject_allocator_stall,
    "pageable_copy": inject_pageable_copy,
    "small_kernels": inject_small_kernels,
    "layout_transposes": inject_layout_transposes,
    "straggler": inject_straggler,
    "exposed_comm": inject_exposed_comm,
    "host_work": inject_host_work,
    "idle_with_work_queued": inject_gpu_held,
    "launch_bound": inject_launch_bound,
}
