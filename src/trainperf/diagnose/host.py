"""Host side of a step: data-loader waits, host syncs, optimizer phase, checkpoint saves, torch.compile, Python's
garbage collector."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.window import Window, merge_intervals, row_events, union_us
from trainperf.trace.nesting import enclosing_span, outermost, starts_inside, thread_key
from trainperf.trace.events import CPU_OP, PYTHON, RUNTIME, USER_ANNOTATION, EventTable

# Python frames of the framework itself: a call site is the innermost frame of the user's code
_LIBRARY_FRAME_RE = re.compile(r"torch/|site-packages|dist-packages|<built-in|^built-in|nn\.Module:|<frozen|"
                               r"^\s*<module>|threading\.py")

DATALOADER_RE = re.compile(r"enumerate\(DataLoader\)|DataLoader.*__next__|_next_data|dataloader", re.I)
# CUDA and HIP runtime calls that return only when the device has caught up
SYNC_RUNTIME_RE = re.compile(r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy|MemcpyDtoH|"
                             r"MemcpyHtoD|MemcpyWithStream|ThreadSynchronize|StreamQuery|Memcpy2D|MemcpyFromSymbol)"
                             r"(_v\d+|_ptds)?$|^cuCtxSynchronize|^cuStreamSynchronize|^cuEventSynchronize")
# runtime calls that start a copy (blocking or not: the trace shows whether the call waited for it)
MEMCPY_RUNTIME_RE = re.compile(r"^(cuda|hip)Memcpy|^cuMemcpy")
# allocations and frees that reach the driver (the caching allocator avoids them); cudaFree also syncs
ALLOCATOR_RUNTIME_RE = re.compile(r"^(cuda|hip)(Malloc|Free)(Async|Host|Managed|Pitch|3D|Array)?(_v\d+)?$"
                                  r"|^(cuda|hip)(HostAlloc|HostFree|HostMalloc|HostRegister|HostUnregister)"
                                  r"|^(cu|hip)Mem(Alloc|Free|Create|Map|Unmap|Release|SetAccess|AddressReserve"
                                  r"|AddressFree|HostAlloc|HostRegister)")
# the caching allocator's own host spans (freeing cached blocks, retries after an out-of-memory)
ALLOCATOR_SPAN_RE = re.compile(r"CachingAllocator|empty_?cache|release_cached_blocks|garbage_collect"
                               r"|malloc_retries|cudaMalloc|hipMalloc", re.I)
SYNC_OP_RE = re.compile(r"^aten::(item|_local_scalar_dense|nonzero|cpu|masked_select|unique|_unique2?|unique_dim"
                        r"|unique_consecutive|repeat_interleave|tolist|is_nonzero|equal|allclose|nonzero_static"
                        r"|_assert_async)$")
OPTIMIZER_RE = re.compile(r"^Optimizer\.(step|zero_grad)|optimizer.*step|^Optimizer#", re.I)
# Activation checkpointing (recomputation) is model work, not a save: torch.utils.checkpoint's Python frames
# (with_stack traces; ~30 per checkpointed block per step, around the forward and the backward's recompute),
# the reentrant CheckpointFunction's autograd node, FSDP's checkpoint_wrapper, DeepSpeed's
# activation_checkpointing and Megatron's (tensor_parallel/random.py). On a CPU trace of 4 checkpointed Linear
# blocks with stacks they made 43 % of the step a "checkpoint_stall".
ACTIVATION_CHECKPOINT_RE = r"torch/utils/checkpoint\.py|CheckpointFunction|checkpoint_wrapper|CheckpointWrapper" \
    r"|activation_checkpoint|recompute|tensor_parallel/random\.py"
CHECKPOINT_RE = re.compile(rf"^(?!.*(?:{ACTIVATION_CHECKPOINT_RE}))"
                           r".*(?:checkpoint|torch\.save|dcp\.|save_state_dict|async_save|torch/serialization)",
                           re.I | re.S)
# torch.compile's own work on the host: Dynamo's tracing and guards, AOTAutograd, Inductor's lowering, code
# generation and autotuning. PyTorch records each phase as a "<phase> (dynamo_timed)" span while a profiler runs
# (torch/_dynamo/utils.py dynamo_timed, since 2.1); the outer names stand in case that suffix changes.
COMPILE_RE = re.compile(r"\(dynamo_timed\)$|^(entire_frame_compile|_compile\.compile_inner|compile_fx_inner"
                        r"|GraphLowering\.compile|Scheduler\.codegen)$|^CachingAutotuner")
# Python's garbage collector pausing the thread: PyTorch's Python tracer records each collection as a "Python GC"
# span (python_function) where the profile has with_stack=True and
# experimental_config=_ExperimentalConfig(record_python_gc_info=True) (PyTorch 2.9+, pytorch/pytorch#161209)
GC_RE = re.compile(r"^Python GC$")
# gc.collect() called by the program: the Python tracer names the C function it enters "<built-in function collect>",
# and the collection it runs is a "Python GC" span inside it
GC_CALL_RE = re.compile(r"^<built-in function collect>$")
# the host stalls with findings of their own, whose spans a rank's own work per step leaves out (a rank late because it
# fetched a batch, saved, compiled or collected garbage is that stall's, which its fix removes on every rank)
STALL_SPAN_RES = (DATALOADER_RE, CHECKPOINT_RE, COMPILE_RE, GC_RE)
# the compiled frame a step runs: "Torch-Compiled Region: <frame>/<compile>"; a compile id above 0 is a recompile
COMPILED_REGION_RE = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")


def span_rows(t: EventTable, w: Window, pattern: re.Pattern, kinds) -> np.ndarray:
    """Rows in the window of the given kinds whose name matches pattern (search)."""
    ids = t.ids_matching(pattern.search)
    return np.flatnonzero(w.keep & np.isin(t.name, ids) & np.isin(t.kind, kinds))


@dataclass
class HostSpans:
    """Named host spans of one kind: union time (µs), count, the longest ones (name, start µs, dur µs) and every
    span's start and end (µs)."""

    time_us: float
    count: int
    longest: list[tuple[str, float, float]]
    starts_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ends_us: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def occurrences(self) -> int:
        """Separate stretches the spans cover (nested or overlapping spans, a save's ops inside its own span, are
        one)."""
        return int(merge_intervals(self.starts_us, self.ends_us)[0].size)


def _host_spans(t: EventTable, w: Window, pattern: re.Pattern, kinds) -> HostSpans:
    rows = span_rows(t, w, pattern, kinds)
    dur = w.end_us[rows] - w.ts_us[rows]
    o = np.argsort(-dur)[:5]
    return HostSpans(union_us(w, rows), int(rows.size), row_events(t, w, rows[o]), starts_us=w.ts_us[rows],
                     ends_us=w.end_us[rows])


def dataloader_spans(t: EventTable, w: Window) -> HostSpans:
    """Time the training loop spent fetching batches (DataLoader spans, µs)."""
    return _host_spans(t, w, DATALOADER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))


def host_syncs(t: EventTable, w: Window) -> HostSpans:
    """Host calls that block until the device catches up (stream/device/event synchronize, sync copies)."""
    return _host_spans(t, w, SYNC_RUNTIME_RE, (RUNTIME,))


def allocator_calls(t: EventTable, w: Window) -> HostSpans:
    """Allocator calls that reach the driver (cudaMalloc/cudaFree/hipMalloc/hipFree, ...), µs."""
    return _host_spans(t, w, ALLOCATOR_RUNTIME_RE, (RUNTIME,))


def sync_ops(t: EventTable, w: Window) -> HostSpans:
    """PyTorch ops that force a device-to-host sync (aten::item, .cpu(), nonzero, ...)."""
    return _host_spans(t, w, SYNC_OP_RE, (CPU_OP,))


def optimizer_spans(t: EventTable, w: Window) -> HostSpans:
    """Host time inside optimizer step / zero_grad spans (µs)."""
    return _host_spans(t, w, OPTIMIZER_RE, (USER_ANNOTATION, CPU_OP, PYTHON))


def compile_spans(t: EventTable, w: Window) -> HostSpans:
    """Host time inside torch.compile's compile phases (Dynamo, AOTAutograd, Inductor; µs)."""
    return _host_spans(t, w, COMPILE_RE, (USER_ANNOTATION, CPU_OP, PYTHON))


def gc_spans(t: EventTable, w: Window) -> HostSpans:
    """Host time Python's garbage collector held the threads (its "Python GC" spans, µs)."""
    return _host_spans(t, w, GC_RE, (PYTHON,))


@dataclass(frozen=True, kw_only=True)
class GcCalls:
    """The collections the program asked for (gc.collect() calls): their time (µs), the calls, where they were made."""

    time_us: float
    calls: int
    sites: list[str]


def gc_calls(t: EventTable, w: Window) -> GcCalls:
    """The window's gc.collect() calls (GC_CALL_RE) and the time of the collections inside them (µs, "Python GC"
    spans starting in a call); their call sites (call_sites), most frequent first."""
    calls = span_rows(t, w, GC_CALL_RE, (PYTHON,))
    collections = span_rows(t, w, GC_RE, (PYTHON,)) if calls.size else calls
    inside = starts_inside(t, calls, collections)
    if not inside.any():
        return GcCalls(time_us=0.0, calls=int(calls.size), sites=[])
    sites = []
    for site, caller in zip(call_sites(t, calls), _caller_frames(t, calls)):
        if GC_CALL_RE.match(site):  # no frame of the user's code around the call: the library's that made it
            site = caller or site
        elif caller and caller not in site:
            site = f"{site} > {caller}"
        sites.append(site)
    by_count = sorted(set(sites), key=lambda s: (-sites.count(s), s))
    return GcCalls(time_us=union_us(w, collections[inside]), calls=int(calls.size), sites=by_count)


def _caller_frames(t: EventTable, rows: np.ndarray) -> list[str]:
    """The Python frame each row was made from, library code's included (a library's cleanup that calls gc.collect()
    for the user, e.g. Accelerate's release_memory): the innermost Python span around the row's start, the rows
    themselves left out; "" where there is none. call_sites names the user's own frame only."""
    key = thread_key(t.pid, t.tid)
    py = np.setdiff1d(np.flatnonzero(t.kind == PYTHON), rows)
    if not py.size:
        return [""] * rows.size
    hit = enclosing_span(key[py], t.ts_ns[py], t.ts_ns[py] + t.dur_ns[py], key[rows], t.ts_ns[rows])
    return [t.names[int(t.name[py[h]])] if h >= 0 else "" for h in hit]


def compiled_frames(t: EventTable, w: Window) -> tuple[int, int]:
    """(distinct compiled frames, recompiles) the window's steps ran: from the "Torch-Compiled Region: F/C"
    spans, the number of frames F and of compile ids C above 0 (each a new compile of a frame whose guards
    failed)."""
    rows = span_rows(t, w, COMPILED_REGION_RE, (USER_ANNOTATION, CPU_OP, PYTHON))
    ids = {tuple(int(x) for x in COMPILED_REGION_RE.match(t.names[int(t.name[r])]).groups()) for r in rows}
    return len({f for f, _ in ids}), sum(c > 0 for _, c in ids)


def checkpoint_spans(t: EventTable, w: Window) -> HostSpans:
    """Host time inside checkpoint-saving spans (µs)."""
    return _host_spans(t, w, CHECKPOINT_RE, (USER_ANNOTATION, CPU_OP, PYTHON))


def call_sites(t: EventTable, rows: np.ndarray) -> list[str]:
    """Where each host row (a runtime call) was made: the innermost Python frame of user code when the
    trace has Python stacks (with_stack=True), then the outermost and innermost ATen op around it
    ("train.py(88): step > aten::item > aten::_local_scalar_dense"), else the call's own name."""
    key = thread_key(t.pid, t.tid)
    ts = t.ts_ns[rows]
    parts: list[list[str]] = [[] for _ in range(rows.size)]
    py = np.flatnonzero(t.kind == PYTHON)
    if py.size:
        user = np.isin(t.name[py], t.ids_matching(lambda s: not _LIBRARY_FRAME_RE.search(s)))
        py = py[user]
    ops = np.flatnonzero(t.kind == CPU_OP)
    for spans in (py, outermost(t, ops) if ops.size else ops, ops):
        if not spans.size:
            continue
        hit = enclosing_span(key[spans], t.ts_ns[spans], t.ts_ns[spans] + t.dur_ns[spans], key[rows], ts)
        for j in np.flatnonzero(hit >= 0):
            name = t.names[int(t.name[spans[hit[j]]])]
            if name not in parts[j]:
                parts[j].append(name)
    return [" > ".join(p) if p else t.names[int(t.name[r])] for p, r in zip(parts, rows)]


def sync_op_counts(t: EventTable, w: Window) -> dict[str, tuple[int, float]]:
    """Ops that force a device-to-host sync, by name: (count, CPU time µs) of the outermost ones."""
    rows = span_rows(t, w, SYNC_OP_RE, (CPU_OP,))
    if not rows.size:
        return {}
    rows = outermost(t, rows)
    out: dict[str, tuple[int, float]] = {}
    for r in rows:
        n = t.names[int(t.name[r])]
        c, d = out.get(n, (0, 0.0))
        out[n] = (c + 1, d + float(w.end_us[r] - w.ts_us[r]))
    return out
