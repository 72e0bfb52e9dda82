"""One batch of trace events as columns, before interning, and the generic (dict) way to build it.

A `Chunk` is what every parser (typed msgspec structs, or plain dicts from orjson/json) turns a
batch of raw events into: the eight integer columns already in their final units (ns) and the
string columns still as Python strings, so that interning and `kind` are done once, identically,
whatever parser produced the batch (`kineto.ColumnBuilder`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

try:  # orjson writes ~10x faster than json (the texts are made canonical later, either way)
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _dumps = None

INT64_MAX = (1 << 63) - 1
INT_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "correlation", "stream", "external_id", "nbytes", "seq", "fwd_tid")
# the first columns every reader has; "seq" and "fwd_tid" (an operator's autograd "Sequence number" and
# "Fwd thread id", which link a backward node to the forward op that made it) only Kineto traces carry:
# a Chunk given the first BASE_COLUMNS gets -1 for the others
BASE_COLUMNS = 8
# args the analyses read beyond the columns, kept per event as one compact JSON object (EventTable.args):
# an operator call's recorded inputs (record_shapes=True), kept when it has "Input Dims" (their strides since
# PyTorch 2.0: a view's row stride sets a GEMM operand's alignment), and a collective's message size and group,
# kept when it has "In msg nelems" (PyTorch >= 2.1), with a send's or receive's partner (its global rank: "Dst Rank",
# "Src Rank", written by torch/csrc/profiler/util.cpp saveNcclMeta since PyTorch 2.5) and an all-to-all's elements
# to and from each rank of its group ("In split size", "Out split size": lists, empty for equal splits)
SHAPE_ARGS = ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")
COMM_ARGS = ("In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Ranks", "Src Rank", "Dst Rank",
             "In split size", "Out split size")
KEPT_ARGS = SHAPE_ARGS + COMM_ARGS
# the caching allocator's samples (profile_memory=True): instant events named "[memory]", one per allocation and
# free, whose args give the device and its allocator's totals after it; kept as rows of MEMORY_COLUMNS
MEMORY_EVENT = "[memory]"
# an allocation the device's allocator could not make even after freeing its cache: torch.OutOfMemoryError was raised
# (and, where the trace goes on, caught); PyTorch records it as this instant event with profile_memory=True
OUT_OF_MEMORY_EVENT = "[OutOfMemory]"
MEMORY_ARGS = ("Device Type", "Device Id", "Total Allocated", "Total Reserved")
CPU_DEVICE_TYPE = 0  # c10::DeviceType::CPU, an allocator event's "Device Type" for host tensors; any other: a device's
MEMORY_COLUMNS = ("ts_ns", "device_type", "device_id", "allocated", "reserved")


@dataclass
class Chunk:
    """Complete ("ph": "X") events of one batch, in file order.

    ints: (n, 10) int64 array, columns INT_COLUMNS (ts/dur in ns, -1 where an id is absent), or (n, 8)
    with the first BASE_COLUMNS (the rest become -1);
    cats, names: list of str; colls, pgs: list of str or None ("Collective name", "Process Group
    Name" args); ts_float: some ts was a JSON float; skipped: entries dropped (not objects, or "X"
    without ts/dur/cat or with unusable times); thread_names: {(pid, tid): name} of "M" events; begin_end: the
    "B"/"E" events (dicts, file order), for the reader to pair into complete ones once all are read;
    args: list of bytes or None (the KEPT_ARGS of each event as a JSON object, any formatting: the
    builder makes it canonical), None for a chunk without any.
    """

    ints: np.ndarray
    cats: list
    names: list
    colls: list
    pgs: list
    ts_float: bool = False
    skipped: int = 0
    thread_names: dict = field(default_factory=dict)
    args: list | None = None
    begin_end: list = field(default_factory=list)  # "B"/"E" events as dicts, in file order (begin_end.py pairs them)
    # the allocator's samples: rows of MEMORY_COLUMNS (memory_row; an (n, 5) int64 array from the typed path)
    memory: list = field(default_factory=list)
    out_of_memory: int = 0  # OUT_OF_MEMORY_EVENT instants of an accelerator (Device Type not CPU's, 0)

    def __post_init__(self) -> None:
        n, width = self.ints.shape
        if width < len(INT_COLUMNS):  # a reader without sequence numbers (rocprof, XPlane): absent
            pad = np.full((n, len(INT_COLUMNS) - width), -1, dtype=np.int64)
            self.ints = np.hstack((self.ints, pad))

    def __len__(self) -> int:
        return len(self.cats)


def to_int(v, default: int = -1) -> int:
    """An int from an int, integral float or numeric string; default otherwise."""
    if v.__class__ is int:
        return v if -INT64_MAX <= v <= INT64_MAX else default
    try:
        f = float(v)
        if f != f or abs(f) > 9.2e18:
            return default
        return int(f)
    except (TypeError, ValueError, OverflowError):
        return default


def _id(v) -> int:
    return v if v.__class__ is int and -INT64_MAX < v < INT64_MAX else to_int(v)


def _text(v) -> str:
    return v if v.__class__ is str else str(v)


def add_thread_name(out: dict, name, pid, tid, args) -> None:
    """Record a "M" (metadata) event's thread name in out, as Chrome's thread_name convention."""
    if name == "thread_name" and args.__class__ is dict:
        out[(to_int(pid), to_int(tid))] = str(args.get("name", ""))


def memory_row(ts, args) -> tuple | None:
    """A "[memory]" event's row of MEMORY_COLUMNS (ts in ns), or None when its time or an arg is not a number."""
    if args.__class__ is not dict:
        return None
    vals = [to_int(args.get(k), None) for k in MEMORY_ARGS]
    if None in vals or ts is None or ts.__class__ is bool:
        return None
    try:
        ts_ns = ts * 1000 if ts.__class__ is int else round(float(ts) * 1000)
    except (TypeError, ValueError, OverflowError):
        return None
    return (ts_ns, *vals) if -INT64_MAX <= ts_ns <= INT64_MAX else None


def accelerator_event(args) -> bool:
    """Whether an allocator event's args name an accelerator: a "Device Type" that is a number other than the CPU's."""
    return args.__class__ is dict and to_int(args.get("Device Type"), CPU_DEVICE_TYPE) != CPU_DEVICE_TYPE


def kept_args_json(a: dict) -> bytes | None:
    """The KEPT_ARGS of one event's args as a JSON object, UTF-8 (None when it has neither "Input Dims"
    nor "In msg nelems")."""
    if "Input Dims" not in a and "In msg nelems" not in a:
        return None
    return compact_json({k: a[k] for k in KEPT_ARGS if k in a}).encode()


def compact_json(value) -> str:
    """value as compact JSON text (orjson when installed: ~10x faster than json)."""
    if _dumps is not None:
        try:
            return _dumps(value).decode()
        except TypeError:  # an integer beyond 64 bits: the stdlib writes it
            pass
    return json.dumps(value, separators=(",", ":"))


def chunk_from_dicts(events: list) -> Chunk:
    """The generic path: a Chunk from events parsed into dicts (any JSON value is tolerated).

    Events without ts, dur or cat are dropped as HTA does; float (ns-resolution) times are split
    into whole µs and fraction so the ns stay exact (tsf * 1000 would round to 256 ns at epoch µs).
    """
    flat: list = []
    cats, names, colls, pgs, kept = [], [], [], [], []
    thread_names: dict = {}
    begin_end: list = []
    memory: list = []
    out_of_memory = 0
    ts_float = False
    skipped = 0
    for ev in events:
        if ev.__class__ is not dict:
            skipped += 1
            continue
        ph = ev.get("ph")
        if ph != "X":
            if ph == "M":
                add_thread_name(thread_names, ev.get("name"), ev.get("pid"), ev.get("tid"), ev.get("args"))
            elif ph == "B" or ph == "E":
                begin_end.append(ev)
            elif ph == "i" and ev.get("name") == MEMORY_EVENT:
                row = memory_row(ev.get("ts"), ev.get("args"))
                if row is not None:
                    memory.append(row)
            elif ph == "i" and ev.get("name") == OUT_OF_MEMORY_EVENT:
                out_of_memory += accelerator_event(ev.get("args"))
            continue
        ts = ev.get("ts")
        dur = ev.get("dur")
        cat = ev.get("cat")
        if ts is None or dur is None or cat is None:  # as HTA: events without dur or cat are dropped
            skipped += 1
            continue
        try:
            if ts.__class__ is int:
                tsn = ts * 1000
            else:
                ts_float = True  # HTA rounds float (ns-resolution) traces: ceil start, floor end
                tsf = float(ts)
                whole = int(tsf)
                tsn = whole * 1000 + round((tsf - whole) * 1000)
            durn = dur * 1000 if dur.__class__ is int else round(float(dur) * 1000)
        except (TypeError, ValueError, OverflowError):
            skipped += 1
            continue
        if not -INT64_MAX - 1 <= tsn <= INT64_MAX:
            skipped += 1
            continue
        if not -INT64_MAX - 1 <= durn <= INT64_MAX:
            durn = 0
        a = ev.get("args")
        if a.__class__ is dict:
            b = a.get("bytes")
            flat.extend((tsn, durn, _id(ev.get("pid", -1)), _id(ev.get("tid", -1)), _id(a.get("correlation", -1)),
                         _id(a.get("stream", -1)), _id(a.get("External id", -1)), -1 if b is None else to_int(b),
                         _id(a.get("Sequence number", -1)), _id(a.get("Fwd thread id", -1))))
            cn = a.get("Collective name")
            pg = a.get("Process Group Name")
            colls.append(None if cn is None else _text(cn))
            pgs.append(None if pg is None else _text(pg))
            kept.append(kept_args_json(a))
        else:
            flat.extend((tsn, durn, _id(ev.get("pid", -1)), _id(ev.get("tid", -1)), -1, -1, -1, -1, -1, -1))
            colls.append(None)
            pgs.append(None)
            kept.append(None)
        cats.append(_text(cat))
        names.append(_text(ev.get("name", "")))
    ints = np.array(flat, dtype=np.int64).reshape(-1, len(INT_COLUMNS))
    return Chunk(ints, cats, names, colls, pgs, ts_float, skipped, thread_names, kept, begin_end, memory,
                 out_of_memory)
