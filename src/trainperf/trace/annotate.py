"""Derived columns of an EventTable: kernel category and profiler step (vectorized).

Communication is recognised three ways, not by one name: the kernel's name (NCCL/RCCL and other
communication libraries, trace.categories.COMM_RE); the record function around its launch on the
host or around the kernel on its stream (record_param_comms, c10d::*, nccl:*, COMM_OP_RE); and its
stream: the other kernels of a stream whose kernels are nearly all communication (a library's
helper kernels on its own communication stream) are communication too. A collective's host record
function and stream also hold real computation (the copies that flatten buckets, FP8 quantisation
before an all-to-all: HTA counts them as compute): those two rules only take kernels whose name says
nothing else (category "other"); a GPU annotation wraps the collective's kernels alone.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.trace.categories import COMM_OP_RE, kernel_category
from trainperf.trace.events import (CAT_OTHER, COMMUNICATION, CPU_OP, DEVICE_KINDS, GPU_ANNOTATION, GPU_SYNC, KERNEL,
                                    OTHER, USER_ANNOTATION, EventTable)
from trainperf.trace.nesting import enclosing_span, thread_key

__all__ = ["annotate", "clip_steps_to_session", "correlated_host_row", "step_numbers", "step_rows", "step_spans"]

COMM_STREAM_SHARE = 0.9  # a stream whose kernels are at least this share communication is a communication stream
COMM_STREAM_MIN_KERNELS = 2

STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Kineto's span of the profiling session itself (cat "Trace"): what the trace recorded lies inside it
SESSION_RE = re.compile(r"^PyTorch Profiler \(\d+\)$")


HOST_STEP_KINDS = (USER_ANNOTATION, CPU_OP)  # "user_annotation" since PyTorch 2.0, "cpu_op" before (kineto PR 709)


def step_rows(t: EventTable) -> tuple[np.ndarray, np.ndarray]:
    """The one step finder: (rows of the host ProfilerStep#N spans that define the rank's steps, sorted by start;
    rows of host ProfilerStep spans on other threads, ignored).

    PyTorch's profiler records `ProfilerStep#N` on the host thread that calls prof.step() (a user_annotation, a
    cpu_op before PyTorch 2.0). Kineto's copies on the GPU timeline (gpu_user_annotation, on a stream) are
    markers, not steps (diagnose.window says why). A span of that name on another host thread (a user's own
    record function) is not a step either: the steps are those of the stepping thread, the host thread with the
    most of them (ties: the one whose first span starts first). Every per-step figure (t.step, the analysis
    window, the replay's anchors, the CPU-only straggler's per-step waits) reads these rows."""
    ids = t.ids_matching(STEP_RE.match)
    if ids.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    host = np.flatnonzero(np.isin(t.name, ids) & np.isin(t.kind, HOST_STEP_KINDS) & (t.stream < 0))
    ignored = np.zeros(0, dtype=np.int64)
    if host.size:
        thread = thread_key(t.pid[host], t.tid[host])
        keys, counts = np.unique(thread, return_counts=True)
        first = np.array([t.ts_ns[host[thread == k]].min() for k in keys])
        best = keys[np.lexsort((first, -counts))[0]]
        ignored, host = host[thread != best], host[thread == best]
        host = host[np.argsort(t.ts_ns[host], kind="stable")]
    return host.astype(np.int64), ignored.astype(np.int64)


def step_numbers(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """N of each ProfilerStep#N row."""
    return np.array([int(STEP_RE.match(t.names[int(n)]).group(1)) for n in t.name[rows]], dtype=np.int64)


def step_spans(t: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, start ns, end ns) of the rank's steps (step_rows: the stepping thread's host
    ProfilerStep#N spans), sorted by start."""
    rows, _ = step_rows(t)
    return step_numbers(t, rows), t.ts_ns[rows], t.ts_ns[rows] + t.dur_ns[rows]


def launch_side(t: EventTable) -> np.ndarray:
    """Per row, whether it is on the launching (host) side of a correlation id: no stream, not a device-wide sync."""
    return (t.stream < 0) & (t.kind != GPU_SYNC)


def correlated_host_row(t: EventTable) -> np.ndarray:
    """For every row, the row of the host event (launch) with the same correlation id, else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    corr = t.correlation
    host_side = launch_side(t)
    host = np.flatnonzero((corr >= 0) & host_side)
    if host.size == 0:
        return out
    order = host[np.argsort(corr[host], kind="stable")]
    keys = corr[order]
    dev = np.flatnonzero((corr >= 0) & ~host_side)
    pos = np.searchsorted(keys, corr[dev], side="right") - 1  # the last host event with that id, as HTA
    ok = (pos >= 0) & (keys[np.clip(pos, 0, None)] == corr[dev])
    out[dev[ok]] = order[pos[ok]]
    return out


def clip_steps_to_session(t: EventTable) -> dict[int, int]:
    """Cut each step (step_rows) that ends after the end of the profiling session it started in (Kineto's "PyTorch
    Profiler (N)" span) at that end, in t.dur_ns; returns {step number: ns cut}, also kept in
    t.metadata["steps_cut_at_session_end"] when not empty.

    Why: the profiler records nothing after its session ends, yet a step's span can end there much later (the
    step's record function closed after the profile was stopped: HTA's triton_example records a ProfilerStep of
    13.3 s in a 355-ms session holding one 1.8-us kernel). Read as it is, that step is 100 % idle GPU and sets every
    share of step time; what the trace holds is the part inside the session."""
    sessions = np.flatnonzero(np.isin(t.name, t.ids_matching(SESSION_RE.match)) & (t.kind == OTHER))
    rows, _ = step_rows(t)
    if not sessions.size or not rows.size:
        return {}
    start, end = t.ts_ns[sessions], t.ts_ns[sessions] + t.dur_ns[sessions]
    cut = {}
    for r, n in zip(rows, step_numbers(t, rows)):
        inside = (start <= t.ts_ns[r]) & (t.ts_ns[r] < end)
        if not inside.any():
            continue
        over = int(t.ts_ns[r] + t.dur_ns[r] - end[inside].max())
        if over > 0:
            t.dur_ns[r] -= over
            cut[int(n)] = over
    if cut:
        t.metadata["steps_cut_at_session_end"] = cut
    return cut


def annotate(t: EventTable) -> None:
    """Fill t.category (per device event) and t.step (host: enclosing step; device: its launch's), the steps cut at
    the profiling session's end first (clip_steps_to_session)."""
    clip_steps_to_session(t)
    device = np.isin(t.kind, DEVICE_KINDS + (GPU_SYNC, GPU_ANNOTATION))
    cat = np.full(len(t), -1, dtype=np.int8)
    if device.any():
        key = t.name[device].astype(np.int64) * 16 + t.kind[device]  # (name, kind) pairs; kinds < 16
        ukey, inv = np.unique(key, return_inverse=True)
        vals = np.array([kernel_category(t.names[int(u) // 16], int(u) % 16) for u in ukey], dtype=np.int8)
        cat[device] = vals[inv.reshape(-1)]
    t.category = cat
    if device.any():
        _communication_by_context(t)
    steps, starts, ends = step_spans(t)
    step = np.full(len(t), -1, dtype=np.int32)
    if steps.size:
        host = ~device
        idx = np.searchsorted(starts, t.ts_ns[host], side="right") - 1
        ok = idx >= 0
        ok[ok] &= t.ts_ns[host][ok] < ends[idx[ok]]
        hs = np.full(int(host.sum()), -1, dtype=np.int32)
        hs[ok] = steps[idx[ok]]
        step[host] = hs
        link = correlated_host_row(t)
        dev_rows = np.flatnonzero(device & (link >= 0))
        step[dev_rows] = step[link[dev_rows]]
    t.step = step


def _communication_by_context(t: EventTable) -> None:
    """Mark as communication the kernels launched inside a collective's record function, run inside a
    collective's GPU annotation, or run on a communication stream (module docstring); a kernel whose
    collective is unnamed takes the collective named by its record function."""
    kern = np.flatnonzero((t.kind == KERNEL) & (t.stream >= 0))
    if kern.size == 0:
        return
    op_ids = t.ids_matching(COMM_OP_RE.search)
    comm = t.category[kern] == COMMUNICATION
    unknown = t.category[kern] == CAT_OTHER  # names that say nothing about what the kernel does
    if op_ids.size:
        host_ops = np.flatnonzero(np.isin(t.name, op_ids) & np.isin(t.kind, (CPU_OP, USER_ANNOTATION)))
        link = correlated_host_row(t)[kern]
        launched = link >= 0
        if host_ops.size and launched.any():
            key = thread_key(t.pid, t.tid)
            lrows = link[launched]
            hit = enclosing_span(key[host_ops], t.ts_ns[host_ops], t.ts_ns[host_ops] + t.dur_ns[host_ops], key[lrows],
                          t.ts_ns[lrows])
            got = (hit >= 0) & unknown[launched]
            idx = np.flatnonzero(launched)[got]
            comm[idx] = True
            span_coll = t.collective[host_ops[hit[got]]]
            span_name = t.name[host_ops[hit[got]]]
            rows = kern[idx]
            unnamed = t.collective[rows] < 0
            t.collective[rows[unnamed]] = np.where(span_coll[unnamed] >= 0, span_coll[unnamed], span_name[unnamed])
        gpu_ops = np.flatnonzero(np.isin(t.name, op_ids) & (t.kind == GPU_ANNOTATION))
        if gpu_ops.size:
            key = thread_key(t.pid, t.tid)  # device events: tid is the stream
            hit = enclosing_span(key[gpu_ops], t.ts_ns[gpu_ops], t.ts_ns[gpu_ops] + t.dur_ns[gpu_ops], key[kern],
                          t.ts_ns[kern])
            comm |= hit >= 0
    stream_key = thread_key(t.pid[kern], t.stream[kern])
    for k in np.unique(stream_key[comm]):
        on = stream_key == k
        n_comm = int((comm & on).sum())
        if n_comm >= COMM_STREAM_MIN_KERNELS and n_comm >= COMM_STREAM_SHARE * int(on.sum()):
            comm |= on & unknown
    t.category[kern[comm]] = COMMUNICATION
