"""Which host span holds a moment: the nesting of spans (operators, Python calls, module forwards,
autograd nodes) on each thread. One definition for every analysis that asks "inside what was this
launched / called?":

- A span holds the moments start <= t < end (half-open). An event that starts exactly when a span
  ends is after it: Kineto rounds to the µs, so back-to-back operators share that µs. A zero-length
  span holds nothing.
- Spans of one key (a thread: pid and tid) are ordered by start, then longest first, then table
  order: at equal starts the longer span encloses the shorter; of two identical intervals the later
  row is inside the earlier.
- The innermost span holding t is the last span in that order that holds it (the latest-starting;
  at equal starts the shortest).
- Nesting (`parent`): a span's parent is the innermost earlier span that holds its start and does
  not end before it does. A span that outlasts an open span (a clock artefact: host calls nest
  exactly) is not nested in it, but in the span around both.

The innermost query climbs the parent chain from the last span that started at or before t, one tree
level per vectorized pass, and is exact for any set of intervals, nested or not: the span it looks
for is always on that chain (tests/trace/test_nesting.py checks it against a brute-force scan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.trace.events import EventTable

# pid * this + tid: one int64 per thread, as the analyses have always keyed threads; two threads collide only
# when their tids differ by a multiple of it across pids (one rank's trace holds one or two pids)
THREAD_KEY_FACTOR = 1_000_003


@dataclass(frozen=True, slots=True)
class Nesting:
    """Spans in nesting order (by key, start, longest first, table order) with each one's parent."""

    order: np.ndarray   # position of each span in the arrays given to `nest`, in nesting order
    key: np.ndarray     # key, start and end (ns) of each span, in nesting order
    start: np.ndarray
    end: np.ndarray
    parent: np.ndarray  # nesting-order index of the enclosing span, -1 for a root

    def __len__(self) -> int:
        return int(self.order.size)

    def original(self, pos: np.ndarray) -> np.ndarray:
        """The input positions of nesting-order indices (-1 stays -1)."""
        pos = np.asarray(pos, dtype=np.int64)
        if not self.order.size:
            return np.full(pos.shape, -1, dtype=np.int64)
        return np.where(pos >= 0, self.order[np.maximum(pos, 0)], -1)


def thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One int64 per (pid, tid) thread: the key spans and queries are matched on."""
    return np.asarray(pid, dtype=np.int64) * THREAD_KEY_FACTOR + np.asarray(tid, dtype=np.int64)


def nest(key: np.ndarray, start: np.ndarray, end: np.ndarray) -> Nesting:
    """The spans (key, start ns, end ns) in nesting order with their parents (module docstring)."""
    key, start, end = (np.asarray(a, dtype=np.int64) for a in (key, start, end))
    order = np.lexsort((start - end, start, key))  # lexsort is stable: equal intervals keep table order
    k, s, e = key[order], start[order], end[order]
    parent = np.full(order.size, -1, dtype=np.int64)
    # A stack walk, hand-written: each span is pushed and popped once, and no NumPy primitive builds a
    # parent tree from intervals. Python lists: ~4x faster per step than indexing NumPy scalars.
    sl, el = s.tolist(), e.tolist()
    par = parent.tolist()
    bounds = np.flatnonzero(np.diff(k)) + 1
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(sl)]):  # one thread at a time
        stack: list[int] = []
        ends: list[int] = []  # ends of the spans on the stack
        for i in range(lo, hi):
            si, ei = sl[i], el[i]
            # close the spans that ended, and those this one outlasts (not nested in them: a clock artefact)
            while ends and (ends[-1] <= si or ei > ends[-1]):
                stack.pop()
                ends.pop()
            if stack:
                par[i] = stack[-1]
            stack.append(i)
            ends.append(ei)
    return Nesting(order=order, key=k, start=s, end=e, parent=np.array(par, dtype=np.int64))


def innermost(n: Nesting, key: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each query (key, ts ns): the nesting-order index of the innermost span with that key holding
    ts, else -1 (module docstring). O(depth) per query."""
    key, ts = np.asarray(key, dtype=np.int64), np.asarray(ts, dtype=np.int64)
    out = np.full(key.size, -1, dtype=np.int64)
    if len(n) == 0 or key.size == 0:
        return out
    for k in np.unique(key):
        lo, hi = np.searchsorted(n.key, k, side="left"), np.searchsorted(n.key, k, side="right")
        if lo == hi:
            continue
        q = np.flatnonzero(key == k)
        t = ts[q]
        pos = lo + np.searchsorted(n.start[lo:hi], t, side="right") - 1  # the last span started at or before t
        pos[pos < lo] = -1
        ended = (pos >= 0) & (n.end[np.maximum(pos, 0)] <= t)
        while ended.any():  # climb one tree level per pass
            pos[ended] = n.parent[pos[ended]]
            ended = (pos >= 0) & (n.end[np.maximum(pos, 0)] <= t)
        out[q] = pos
    return out


def row_spans(t: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thread key, start ns, end ns) of the table rows: the spans `nest` and `enclosing_span` take."""
    return thread_key(t.pid[rows], t.tid[rows]), t.ts_ns[rows], t.ts_ns[rows] + t.dur_ns[rows]


def starts_inside(t: EventTable, spans: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows` (bool): whether it starts inside one of the spans `spans` (table rows) of its thread."""
    if not spans.size or not rows.size:
        return np.zeros(rows.size, dtype=bool)
    return enclosing_span(*row_spans(t, spans), thread_key(t.pid[rows], t.tid[rows]), t.ts_ns[rows]) >= 0


def enclosing_span(spans_key: np.ndarray, spans_start: np.ndarray, spans_end: np.ndarray, key: np.ndarray,
                   ts: np.ndarray) -> np.ndarray:
    """For each query (key, ts ns): the index into the given spans of the innermost span with that key
    holding ts (start <= ts < end), else -1. Builds the nesting each call: reuse `nest` + `innermost`
    when querying one set of spans several times."""
    n = nest(spans_key, spans_start, spans_end)
    return n.original(innermost(n, key, ts))


def outermost(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Return the rows among ``rows`` that no other of them on the same thread encloses (each span's time
    once), in (thread, start, longest first) order."""
    key = thread_key(t.pid[rows], t.tid[rows])
    order = np.lexsort((-t.dur_ns[rows], t.ts_ns[rows], key))
    rows, key = rows[order], key[order]
    top = np.ones(rows.size, dtype=bool)
    for k in np.unique(key):
        sel = np.flatnonzero(key == k)
        ts = t.ts_ns[rows[sel]]
        run_end = np.maximum.accumulate(ts + t.dur_ns[rows[sel]])
        top[sel[1:]] = ts[1:] >= run_end[:-1]  # starts after every earlier span ended
    return rows[top]
