"""Derived columns of an EventTable: kernel category and profiler step (vectorized)."""

from __future__ import annotations

import re

import numpy as np

from trainperf.trace.categories import kernel_category
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, GPU_ANNOTATION, GPU_SYNC, USER_ANNOTATION, EventTable

STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")


def step_spans(t: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, start ns, end ns) of the host-side ProfilerStep#N spans, sorted by start."""
    step_of_name = {i: int(m.group(1)) for i, s in enumerate(t.names) if (m := STEP_RE.match(s))}
    if not step_of_name:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    ids = np.fromiter(step_of_name.keys(), dtype=np.int64)
    rows = np.flatnonzero(np.isin(t.name, ids) & np.isin(t.kind, (USER_ANNOTATION, CPU_OP)))
    rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
    steps = np.array([step_of_name[int(n)] for n in t.name[rows]], dtype=np.int64)
    return steps, t.ts_ns[rows], t.ts_ns[rows] + t.dur_ns[rows]


def correlated_host_row(t: EventTable) -> np.ndarray:
    """For every row, the row of the host event (launch) with the same correlation id, else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    corr = t.correlation
    host = np.flatnonzero((corr >= 0) & (t.stream < 0) & (t.kind != GPU_SYNC))
    if host.size == 0:
        return out
    order = host[np.argsort(corr[host], kind="stable")]
    keys = corr[order]
    dev = np.flatnonzero((corr >= 0) & ~((t.stream < 0) & (t.kind != GPU_SYNC)))
    pos = np.searchsorted(keys, corr[dev], side="right") - 1  # the last host event with that id, as HTA
    ok = (pos >= 0) & (keys[np.clip(pos, 0, None)] == corr[dev])
    out[dev[ok]] = order[pos[ok]]
    return out


def annotate(t: EventTable) -> None:
    """Fill t.category (per device event) and t.step (host: enclosing step; device: its launch's)."""
    device = np.isin(t.kind, DEVICE_KINDS + (GPU_SYNC, GPU_ANNOTATION))
    cat = np.full(len(t), -1, dtype=np.int8)
    if device.any():
        key = t.name[device].astype(np.int64) * 16 + t.kind[device]  # (name, kind) pairs; kinds < 16
        ukey, inv = np.unique(key, return_inverse=True)
        vals = np.array([kernel_category(t.names[int(u) // 16], int(u) % 16) for u in ukey], dtype=np.int8)
        cat[device] = vals[inv.reshape(-1)]
    t.category = cat
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
