"""The EventTable of a profile that is not Kineto's (rocprofv3, JAX's XSpace or trace JSON, Nsight Systems): its
reader maps its events onto the Kineto vocabulary and builds the table here, the one place such events are interned,
sorted, kinded and annotated with their steps (trace.annotate)."""

from __future__ import annotations

from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable


def build_table(events: list, *, source: str, producer: str, rank: int | None = None, skipped: int = 0,
                thread_names: dict | None = None, args: list | None = None) -> EventTable:
    """An annotated EventTable from events already in the Kineto vocabulary, each a tuple
    (cat, name, pid, tid, ts_ns, dur_ns, correlation, stream, external_id, nbytes) with -1 for an absent id;
    args: per event, a JSON object (bytes) of args to keep in EventTable.args, or None."""
    import numpy as np

    # in the Chunk's column order (chunk.INT_COLUMNS): ts_ns, dur_ns, pid, tid, correlation, stream, external_id, nbytes
    ints = np.array([e[4:6] + e[2:4] + e[6:8] + e[8:10] for e in events], dtype=np.int64).reshape(-1, 8)
    return table_from_columns([e[0] for e in events], [e[1] for e in events], ints, source=source,
                              producer=producer, rank=rank, skipped=skipped, thread_names=thread_names, args=args)


def table_from_columns(cats: list, names: list, ints, *, source: str, producer: str, rank: int | None = None,
                       skipped: int = 0, thread_names: dict | None = None, args: list | None = None) -> EventTable:
    """An annotated EventTable from columns in the Kineto vocabulary: cats and names (lists of str), ints an
    (n, 8) int64 array of ts_ns, dur_ns, pid, tid, correlation, stream, external_id, nbytes (-1 for an absent
    id). The one place a non-Kineto reader turns its events into the table (interning, sorting, kinds, steps)."""
    from trainperf.trace.annotate import annotate
    from trainperf.trace.chunk import Chunk
    from trainperf.trace.kineto import ColumnBuilder

    if not len(cats):
        raise TrainperfError(f"{source}: no timed events in this {producer} profile")
    none = [None] * len(cats)
    b = ColumnBuilder()
    b.add(Chunk(ints, list(cats), list(names), none, list(none), False, skipped, dict(thread_names or {}), args))
    table = EventTable(rank=-1 if rank is None else rank, source=source, names=b.names, arg_texts=b.arg_texts,
                       metadata={"producer": producer, "profiler": {"record_shapes": False}},
                       thread_names=b.thread_names, n_skipped=skipped, **b.columns())
    annotate(table)
    return table
