"""Format variants of a Kineto trace: the same run as another profiler set-up, PyTorch version or vendor would
have written it, for measuring whether diagnose's findings depend on the format rather than the physics.

Third-party traces differ from ours in ways that carry no performance information: ROCm names its runtime calls
hip* and does not say whether a host buffer was pinned, older PyTorch writes other categories, exporters drop the
flow events or the operator ids, each host of a job has its own clock. Each variant below rewrites one such thing and
leaves the timing untouched, so a diagnosis that changes under it reads the format, not the run; but for
TIMING_VARIANTS, which write a GPU's clock behind its host's.

Like the rest of trainperf.corpus, independent of trainperf.trace and trainperf.diagnose (plain Kineto field
names): it feeds the measurement of diagnose and must not share its reading of the format. Times are µs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from trainperf.corpus.kineto import GPU_CATS, STEP_RE

# CUDA runtime/driver calls whose HIP name is not the plain cuda -> hip prefix swap (HIP API reference)
HIP_NAMES = {
    "cudaLaunchKernelExC": "hipExtLaunchKernel",
    "cuLaunchKernel": "hipModuleLaunchKernel",
    "cuLaunchKernelEx": "hipModuleLaunchKernel",
    "cudaHostAlloc": "hipHostMalloc",
    "cudaMallocHost": "hipHostMalloc",
    "cudaFreeHost": "hipHostFree",
    "cudaMemcpy": "hipMemcpyWithStream",  # ROCm's synchronous copy as PyTorch issues it (HTA's MI250 trace)
}
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
# "Memcpy HtoD (Pageable -> Device)": ROCm's Kineto names the direction, not the host memory's kind
_MEMORY_KIND = re.compile(r"\((?:Pageable|Pinned|Host)\s*->\s*Device\)|\(Device\s*->\s*(?:Pageable|Pinned|Host)\)")
# PyTorch 1.8-1.9 (the first Kineto releases) wrote these categories; python_function events did not exist
OLD_CATEGORIES = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "cuda_driver": "Runtime", "kernel": "Kernel",
                  "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}
OPERATOR_ID_ARGS = ("External id", "Sequence number", "Fwd thread id", "Record function id", "Ev Idx")
FLOW_PHASES = frozenset({"s", "t", "f"})
CLOCK_SKEW_US = 37_000.0  # per rank: hosts of one job whose clocks disagree by tens of ms (NTP, no PTP)
# the device's clock behind the host's, as CUPTI's conversion of GPU time stamps leaves it: HTA's V100
# df_index_resolver writes kernels up to 12 us before the calls that launched them
DEVICE_CLOCK_BEHIND_US = 20.0


def _events(doc: dict) -> list[dict]:
    return doc["traceEvents"]


def _with_events(doc: dict, events: list[dict]) -> dict:
    return {**doc, "traceEvents": events}


def hip_runtime(name: str) -> str:
    """The HIP name of a CUDA runtime/driver call (cudaLaunchKernel -> hipLaunchKernel); other names unchanged."""
    if name in HIP_NAMES:
        return HIP_NAMES[name]
    if name.startswith("cuda"):
        return "hip" + name[4:]
    if name.startswith("cu") and name[2:3].isupper():
        return "hip" + name[2:]
    return name


def rocm(doc: dict, rank: int) -> dict:
    """The trace as ROCm's Kineto writes it: hip* runtime calls, copies named by direction only (Host -> Device,
    so a pageable copy is told from a pinned one only by its blocking host call), RCCL's collective kernels
    keep NCCL's names (as RCCL does). A cudaMemcpyAsync of a pageable copy is PyTorch's blocking copy_, which on ROCm
    is one synchronous hipMemcpyWithStream (c10's memcpy_and_sync; HTA's MI250 trace reads so)."""
    pageable = {e.get("args", {}).get("correlation") for e in _events(doc)
                if e.get("cat") in ("gpu_memcpy", "Memcpy") and "Pageable" in str(e.get("name"))} - {None}
    out = []
    for e in _events(doc):
        cat, name = e.get("cat"), e.get("name")
        if isinstance(name, str) and cat in RUNTIME_CATS:
            blocking = name == "cudaMemcpyAsync" and (e.get("args") or {}).get("correlation") in pageable
            e = {**e, "name": "hipMemcpyWithStream" if blocking else hip_runtime(name)}
        elif isinstance(name, str) and cat in ("gpu_memcpy", "Memcpy"):
            e = {**e, "name": _MEMORY_KIND.sub(lambda m: "(Host -> Device)" if m.group(0).endswith("Device)")
                                               else "(Device -> Host)", name)}
        out.append(e)
    return _with_events(doc, out)


def no_flows(doc: dict, rank: int) -> dict:
    """Without flow events (launch -> kernel arrows, forward -> backward links): exporters and trimmed traces
    that keep the correlation ids in args only."""
    return _with_events(doc, [e for e in _events(doc) if e.get("ph") not in FLOW_PHASES])


def no_operator_ids(doc: dict, rank: int) -> dict:
    """Without the operator ids in args (External id, Sequence number, ...): the CPU op <-> runtime call link
    that some exporters drop; the launch <-> kernel correlation stays."""
    out = []
    for e in _events(doc):
        args = e.get("args")
        if isinstance(args, dict) and any(k in args for k in OPERATOR_ID_ARGS):
            e = {**e, "args": {k: v for k, v in args.items() if k not in OPERATOR_ID_ARGS}}
        out.append(e)
    return _with_events(doc, out)


def no_distributed_info(doc: dict, rank: int) -> dict:
    """Without distributedInfo (a job profiled without torch.distributed's metadata): the rank comes from the file
    name only."""
    return {k: v for k, v in doc.items() if k != "distributedInfo"}


def clock_skew(doc: dict, rank: int) -> dict:
    """Rank r's clock ahead by r x CLOCK_SKEW_US (each host of a job on its own clock): every time stamp of the
    file shifted, so the ranks' windows no longer line up in absolute time."""
    shift = rank * CLOCK_SKEW_US
    if not shift:
        return doc
    out = []
    for e in _events(doc):
        if isinstance(e.get("ts"), (int, float)):
            e = {**e, "ts": e["ts"] + shift}
        out.append(e)
    extra = {"baseTimeNanoseconds": doc["baseTimeNanoseconds"] + int(shift * 1e3)} \
        if isinstance(doc.get("baseTimeNanoseconds"), int) else {}
    return {**_with_events(doc, out), **extra}


def device_clock_behind(doc: dict, rank: int) -> dict:
    """Every device event (and the flow arrow's end on it) DEVICE_CLOCK_BEHIND_US earlier: a GPU clock behind the
    host's by that much, so a kernel that started within that time of its launch call is written before it."""
    out = []
    for e in _events(doc):
        on_device = e.get("cat") in GPU_CATS or (e.get("ph") == "f" and e.get("cat") == "ac2g")
        if on_device and isinstance(e.get("ts"), (int, float)):
            e = {**e, "ts": e["ts"] - DEVICE_CLOCK_BEHIND_US}
        out.append(e)
    return _with_events(doc, out)


def no_python_stack(doc: dict, rank: int) -> dict:
    """Profiled without with_stack: no python_function events."""
    return _with_events(doc, [e for e in _events(doc) if e.get("cat") != "python_function"])


def old_pytorch(doc: dict, rank: int) -> dict:
    """As the first Kineto releases (PyTorch 1.8-1.9) wrote it: Operator/Runtime/Kernel/Memcpy/Memset categories,
    no python_function events."""
    out = []
    for e in _events(doc):
        cat = e.get("cat")
        if cat == "python_function":
            continue
        if cat in OLD_CATEGORIES:
            e = {**e, "cat": OLD_CATEGORIES[cat]}
        out.append(e)
    return _with_events(doc, out)


def no_profiler_steps(doc: dict, rank: int) -> dict:
    """Profiled without a schedule (`with profile(): ...` around the loop, no prof.step()): no ProfilerStep#N
    spans, on the host or the device; the steps must be found from the work itself."""
    return _with_events(doc, [e for e in _events(doc) if not STEP_RE.match(str(e.get("name", "")))])


HOST_SPAN_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "Operator"})


def begin_end(doc: dict, rank: int) -> dict:
    """As a tracer that writes spans as begin/end pairs writes them: each host thread's spans ("ph": "X" of
    HOST_SPAN_CATS) as "B" at its start and "E" at its end, in time order, the inner span's end first. A span
    that starts inside another and ends after it cannot be written so (an "E" ends the latest open "B") and stays
    complete, as such a writer would have to leave it."""
    spans: dict[tuple, list[dict]] = {}
    out = []
    for e in _events(doc):
        if e.get("ph") == "X" and e.get("cat") in HOST_SPAN_CATS:
            spans.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        else:
            out.append(e)
    for thread in spans.values():
        open_spans: list[dict] = []

        def close_until(t: float) -> None:
            while open_spans and _end(open_spans[-1]) <= t:
                done = open_spans.pop()
                out.append({"ph": "E", "pid": done.get("pid"), "tid": done.get("tid"), "ts": _end(done)})

        for e in sorted(thread, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            close_until(float(e["ts"]))
            if open_spans and _end(e) > _end(open_spans[-1]):
                out.append(e)  # overlaps the open span without nesting in it: stays complete
                continue
            out.append({k: v for k, v in e.items() if k not in ("ph", "dur")} | {"ph": "B"})
            open_spans.append(e)
        close_until(float("inf"))
    return _with_events(doc, out)


def _end(e: dict) -> float:
    return float(e["ts"]) + float(e["dur"])


def non_finite_numbers(doc: dict, rank: int) -> dict:
    """As Kineto wrote copies of zero duration (pytorch/kineto#105): a "memory bandwidth (GB/s)" arg of each copy
    whose value is not a finite number (infinity; Python's json writes it Infinity)."""
    return _with_events(doc, [{**e, "args": {**e["args"], "memory bandwidth (GB/s)": float("inf")}}
                              if e.get("cat") in ("gpu_memcpy", "Memcpy") and isinstance(e.get("args"), dict) else e
                              for e in _events(doc)])


VARIANTS: dict[str, Callable[[dict, int], dict]] = {
    "rocm": rocm, "no_flows": no_flows, "no_operator_ids": no_operator_ids,
    "no_distributed_info": no_distributed_info, "clock_skew": clock_skew, "no_python_stack": no_python_stack,
    "old_pytorch": old_pytorch, "no_profiler_steps": no_profiler_steps, "begin_end": begin_end,
    "non_finite_numbers": non_finite_numbers, "device_clock_behind": device_clock_behind,
}
# variants that move the device against the host (the rest leave the timing untouched): a trace whose work starts
# DEVICE_CLOCK_BEHIND_US after its calls reads, rewritten, as a clock that agrees (no launch starts early), so only
# the corpus-wide measure (benchmarks/format_robustness.py) holds them to the untouched diagnosis, not each trace
TIMING_VARIANTS = ("device_clock_behind",)
