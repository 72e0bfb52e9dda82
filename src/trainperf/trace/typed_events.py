"""The fast path: decode a batch of Kineto events with msgspec straight into typed structs.

Why: building a Python dict for every event (orjson, json) and then reading it in a Python loop
is most of the loading cost. `msgspec.json.Decoder(list[...])` skips, in C, every key we do not
need (grid, block, occupancy, ...), makes one small struct per complete event and an empty one for
flow/instant/counter events (tagged on "ph"), and checks the types on the way. The schema is
strict (ts/dur int, ids int, names str); a batch that does not fit it is decoded again with a
lenient one (float ns times, string pid/tid/stream as Kineto writes for its "Spans" event and ROCm
for streams), and one that fits neither (a null, an id beyond int64, an unknown phase) gets `None`
here and is re-read by the generic dict path (`chunk.chunk_from_dicts`). Every conversion repeats
the dict path's rules exactly, so both give identical columns (tests/trace/test_trace_parsers.py
checks it on random field types). Measured in docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Optional, Union

import msgspec
import numpy as np

from trainperf.trace.chunk import (CPU_DEVICE_TYPE, INT64_MAX, INT_COLUMNS, KEPT_ARGS, MEMORY_ARGS, MEMORY_EVENT,
                                   OUT_OF_MEMORY_EVENT, Chunk, add_thread_name, memory_row, to_int)

_TS_LIMIT = (1 << 63) // 1000 - 1  # |ts| or |dur| in µs whose ns still fit in int64
_EXACT_FLOAT = float(1 << 53)  # ints below this convert to float64 exactly
_INT64_MIN = -(1 << 63)


ABSENT = msgspec.Raw()  # default of a kept arg the event does not have (msgspec has no Optional[Raw])


class Args(msgspec.Struct, frozen=True, gc=False):
    """The args we keep (others are skipped unparsed); the chunk.KEPT_ARGS stay raw JSON."""

    correlation: int = -1
    stream: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    bytes: int = -1
    seq: int = msgspec.field(default=-1, name="Sequence number")
    fwd_tid: int = msgspec.field(default=-1, name="Fwd thread id")
    collective: Optional[str] = msgspec.field(default=None, name="Collective name")
    process_group: Optional[str] = msgspec.field(default=None, name="Process Group Name")
    input_dims: msgspec.Raw = msgspec.field(default=ABSENT, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=ABSENT, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=ABSENT, name="Concrete Inputs")
    input_strides: msgspec.Raw = msgspec.field(default=ABSENT, name="Input Strides")
    in_nelems: msgspec.Raw = msgspec.field(default=ABSENT, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=ABSENT, name="Out msg nelems")
    dtype: msgspec.Raw = msgspec.field(default=ABSENT, name="dtype")
    group_size: msgspec.Raw = msgspec.field(default=ABSENT, name="Group size")
    group_ranks: msgspec.Raw = msgspec.field(default=ABSENT, name="Process Group Ranks")
    src_rank: msgspec.Raw = msgspec.field(default=ABSENT, name="Src Rank")
    dst_rank: msgspec.Raw = msgspec.field(default=ABSENT, name="Dst Rank")
    in_split: msgspec.Raw = msgspec.field(default=ABSENT, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=ABSENT, name="Out split size")


NO_ARGS = Args()


class LenientArgs(Args, frozen=True, gc=False):
    """Args of the lenient schema: a stream may be a string ("0x0" in ROCm traces); other fields as Args."""

    stream: Union[int, str] = -1


NO_LENIENT_ARGS = LenientArgs()


class IntEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event with integer µs times (the common schema)."""

    cat: Optional[str] = None
    name: str = ""
    pid: int = -1
    tid: int = -1
    ts: Optional[int] = None
    dur: Optional[int] = None
    args: Args = NO_ARGS


class LenientEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event whose times may be floats (ns-resolution traces) and whose pid/tid may be
    strings (the "Spans" / "PyTorch Profiler" span Kineto writes at the end of a trace)."""

    cat: Optional[str] = None
    name: str = ""
    pid: Union[int, str] = -1
    tid: Union[int, str] = -1
    ts: Union[int, float, None] = None
    dur: Union[int, float, None] = None
    args: LenientArgs = NO_LENIENT_ARGS


_NULL = msgspec.Raw(b"null")


class MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    """The args of an allocator sample ("[memory]", chunk.MEMORY_ARGS); other instant events' args are skipped."""

    device_type: Optional[int] = msgspec.field(default=None, name="Device Type")
    device_id: Optional[int] = msgspec.field(default=None, name="Device Id")
    allocated: Optional[int] = msgspec.field(default=None, name="Total Allocated")
    reserved: Optional[int] = msgspec.field(default=None, name="Total Reserved")


class InstantEvent(msgspec.Struct, tag_field="ph", tag="i", gc=False):
    """An instant event: only the allocator's samples are kept (chunk.MEMORY_EVENT), by chunk.memory_row, as the
    dict path reads them (an absent or null arg: the sample is not kept)."""

    name: str = ""
    ts: Union[int, float, None] = None
    args: Optional[MemoryArgs] = None


class Metadata(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    """A metadata event (thread and process names): fields kept as raw JSON, parsed by the generic
    parser so that odd values (e.g. integers beyond 64 bits) read exactly as on the dict path."""

    name: msgspec.Raw = _NULL
    pid: msgspec.Raw = _NULL
    tid: msgspec.Raw = _NULL
    args: msgspec.Raw = _NULL


# every other phase of the Chrome trace event format: decoded to an empty struct (content skipped)
_OTHER_PHASES = tuple("ICbneSTpFstfPONDRcVv()")
_SKIPPED = tuple(msgspec.defstruct(f"Phase{i}", [], tag_field="ph", tag=p, gc=False)
                 for i, p in enumerate(_OTHER_PHASES))
# a span's begin and end ("B", "E"): their content is kept only by the generic parser, so a batch holding one is
# left to it (decode_chunk returns None), with no scan of the batch for them beforehand
_BEGIN_END = tuple(msgspec.defstruct(f"Phase{p}", [], tag_field="ph", tag=p, gc=False) for p in "BE")
_SKIPPED += _BEGIN_END
_INT_DECODER = msgspec.json.Decoder(
    list[Union[(IntEvent, Metadata, InstantEvent) + _SKIPPED]])  # type: ignore[misc]
_LENIENT_DECODER = msgspec.json.Decoder(
    list[Union[(LenientEvent, Metadata, InstantEvent) + _SKIPPED]])  # type: ignore[misc]


def decode_chunk(data: bytes, loads) -> Chunk | None:
    """A Chunk from a JSON array of events, or None when the batch does not fit the strict schema
    (including when it is not valid JSON: the caller's generic parser then says what is wrong).
    `loads` is that generic parser (orjson.loads or json.loads), used for metadata events."""
    try:
        events = _INT_DECODER.decode(data)
        cls = IntEvent
    except msgspec.DecodeError:
        try:
            events = _LENIENT_DECODER.decode(data)
            cls = LenientEvent
        except msgspec.DecodeError:
            return None
    xs = [e for e in events if e.__class__ is cls]
    thread_names: dict = {}
    memory: list = []
    out_of_memory = 0
    if len(xs) != len(events):
        if any(e.__class__ in _BEGIN_END for e in events):
            return None
        for e in [e for e in events if e.__class__ is Metadata]:
            try:
                if loads(bytes(e.name)) == "thread_name":
                    add_thread_name(thread_names, "thread_name", loads(bytes(e.pid)), loads(bytes(e.tid)),
                                    loads(bytes(e.args)))
            except ValueError:  # the generic parser rejects a value msgspec let through: it decides
                return None
        memory = _memory_rows([(e.ts, a.device_type, a.device_id, a.allocated, a.reserved) for e in events
                               if e.__class__ is InstantEvent and e.name == MEMORY_EVENT and (a := e.args) is not None])
        out_of_memory = sum(1 for e in events if e.__class__ is InstantEvent and e.name == OUT_OF_MEMORY_EVENT
                            and e.args is not None and e.args.device_type not in (None, CPU_DEVICE_TYPE)
                            and -INT64_MAX <= e.args.device_type <= INT64_MAX)  # as chunk.to_int reads it
    got = _columns(xs, cls)
    skipped = 0
    if got is None:  # maybe events without ts, dur or cat: drop them as the dict path (and HTA) does
        complete = [e for e in xs if e.cat is not None and e.ts is not None and e.dur is not None]
        if len(complete) == len(xs):
            return None
        skipped, xs = len(xs) - len(complete), complete
        got = _columns(xs, cls)
        if got is None:
            return None
    ints, cats, ts_float = got
    kept = [None if (a := e.args).input_dims is ABSENT and a.in_nelems is ABSENT else _kept_json(a) for e in xs]
    return Chunk(ints, cats, [e.name for e in xs], [e.args.collective for e in xs],
                 [e.args.process_group for e in xs], ts_float, skipped, thread_names, kept, memory=memory,
                 out_of_memory=out_of_memory)


def _memory_rows(raw: list) -> list | np.ndarray:
    """chunk.memory_row of each allocator sample (ts, device type, device id, allocated, reserved as decoded), as an
    (n, 5) int64 array where every value is an integer time or int64 (a profiler's samples: one NumPy pass, ~10x the
    Python rows' speed on df_index_resolver's 28,010), else as the dict path's rows, one by one."""
    if not raw:
        return []
    cols = [np.array(c) for c in zip(*raw)]
    if all(c.dtype == np.int64 for c in cols) and not any((c == _INT64_MIN).any() for c in cols[1:]):
        ts = cols[0]
        keep = (ts >= -(INT64_MAX // 1000)) & (ts <= INT64_MAX // 1000)  # its ns within int64, as memory_row asks
        out = np.stack([ts * 1000, *cols[1:]], axis=1)
        return out[keep]
    rows = [memory_row(r[0], dict(zip(MEMORY_ARGS, r[1:]))) for r in raw]
    return [r for r in rows if r is not None]


_KEPT_KEYS = tuple(f'"{k}":'.encode() for k in KEPT_ARGS)


def _kept_json(a) -> bytes:
    """chunk.kept_args_json of the typed path: the raw values joined into one object (text as written).
    Spelled out for an operator's shapes, the common case (twice as fast as the loop)."""
    if a.in_nelems is ABSENT and a.out_nelems is ABSENT and a.dtype is ABSENT and a.group_size is ABSENT and \
            a.group_ranks is ABSENT and a.src_rank is ABSENT and a.dst_rank is ABSENT and a.in_split is ABSENT and \
            a.out_split is ABSENT:
        s = b'{"Input Dims":' + a.input_dims
        if a.input_type is not ABSENT:
            s += b',"Input type":' + a.input_type
        if a.concrete_inputs is not ABSENT:
            s += b',"Concrete Inputs":' + a.concrete_inputs
        if a.input_strides is not ABSENT:
            s += b',"Input Strides":' + a.input_strides
        return s + b"}"
    vals = (a.input_dims, a.input_type, a.concrete_inputs, a.input_strides, a.in_nelems, a.out_nelems, a.dtype, a.group_size,
            a.group_ranks, a.src_rank, a.dst_rank, a.in_split, a.out_split)
    return b"{" + b",".join([k + v for k, v in zip(_KEPT_KEYS, vals) if v is not ABSENT]) + b"}"


def _columns(xs: list, cls) -> tuple[np.ndarray, list, bool] | None:
    """(int columns, cats, some ts was a float) of complete events, or None when a value needs the
    dict path's judgement (a missing ts/dur/cat, a time or id beyond int64, -2^63)."""
    n = len(xs)
    cats = [e.cat for e in xs]
    if None in cats:
        return None
    flat: list = []
    extend = flat.extend
    for e in xs:
        a = e.args
        extend((e.ts, e.dur, e.pid, e.tid, a.correlation, a.stream, a.external_id, a.bytes, a.seq, a.fwd_tid))
    ts_float = False
    if cls is IntEvent:
        try:
            ints = np.fromiter(flat, dtype=np.int64, count=len(flat)).reshape(n, len(INT_COLUMNS))
        except (TypeError, OverflowError):  # a missing time, or an int beyond int64
            return None
        times = ints[:, :2]
        if ((times < -_TS_LIMIT) | (times > _TS_LIMIT)).any():
            return None
        times *= 1000
    else:  # np.fromiter would truncate floats silently: the times take the vectorized float path
        got = _lenient_ints(flat, n)
        if got is None:
            return None
        ints, ts_float = got
    if n and (ints[:, 2:] == _INT64_MIN).any():  # the dict path maps -2^63 to "absent"
        return None
    return ints, cats, ts_float


def _lenient_ints(flat: list, n: int) -> tuple[np.ndarray, bool] | None:
    """(columns, some ts was a float) when ts/dur may be JSON floats and pid/tid/stream strings:
    the dict path's arithmetic, vectorized for the times (trunc, then round half to even of the
    fraction, as Python's int() and round()), and its own conversion for string ids."""
    width = len(INT_COLUMNS)
    out = np.empty((n, width), dtype=np.int64)
    try:
        for j in range(2, width):
            col = flat[j::width]
            if j in (2, 3, 5):  # pid, tid, stream: ints or strings
                col = [v if v.__class__ is int and -INT64_MAX < v < INT64_MAX else to_int(v) for v in col]
            out[:, j] = np.fromiter(col, dtype=np.int64, count=n)
    except (TypeError, OverflowError):  # an id beyond int64
        return None
    ts = np.array(flat[0::width])
    dur = np.array(flat[1::width])
    ts_float = n > 0 and ts.dtype == np.float64
    for j, v in enumerate((ts, dur)):
        if n == 0:
            break
        if v.dtype == np.int64:
            if ((v < -_TS_LIMIT) | (v > _TS_LIMIT)).any():
                return None
            out[:, j] = v * 1000
        elif v.dtype == np.float64:  # ints among them convert exactly below 2^53 (dur: 2^53 ns)
            if not np.isfinite(v).all() or (np.abs(v) >= (_EXACT_FLOAT if j == 0 else _EXACT_FLOAT / 1000)).any():
                return None
            if j == 0:
                whole = np.trunc(v)
                out[:, 0] = whole.astype(np.int64) * 1000 + np.round((v - whole) * 1000).astype(np.int64)
            else:
                out[:, 1] = np.round(v * 1000).astype(np.int64)
        else:  # None (a missing time) or an int beyond int64: the dict path decides
            return None
    return out, ts_float
