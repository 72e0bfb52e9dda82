"""Streaming reader of one Kineto (PyTorch profiler) JSON trace into an EventTable.

Why hand-written: ``json.load`` of a whole trace holds every event as a Python dict at once
(~5x the JSON size, HTA's cost). Here the file is decompressed in 1 MiB chunks (isal's igzip
when installed, 2-4x faster than zlib), cut at event boundaries, and each batch is decoded
straight into typed structs by msgspec (`typed_events`, the fast path) or, when msgspec is absent
or a batch does not fit its strict schema, parsed into dicts by orjson/json (`chunk`, the
generic path). Either way the batch becomes integer columns before the next chunk is read, so
peak memory stays near one chunk of events plus the 8-byte columns.

A cut is only accepted when the batch ``[` + piece + `]`` parses: a boundary that falls inside a
nested object or a string cannot parse, so any formatting (pretty-printed or one line) works.

Chrome's format as writers other than Kineto use it is read too: spans as begin/end pairs (begin_end.py), numbers
written inf/NaN (read as null), a bare array without its closing bracket; and a file cut before its end gives its
whole events before the cut, marked "truncated" in the table's metadata (the diagnosis lowers its confidence).
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import numpy as np

from trainperf.errors import NotATraceError, TrainperfError
from trainperf.trace.annotate import annotate
from trainperf.trace.begin_end import pair_begin_end
from trainperf.trace.chunk import INT_COLUMNS, MEMORY_COLUMNS, Chunk, chunk_from_dicts, compact_json, to_int
from trainperf.trace.events import CAT_TO_KIND, OTHER, EventTable

try:  # msgspec: typed decoding, several times faster than orjson + a Python loop; optional
    from trainperf.trace.typed_events import decode_chunk as _typed_decode
except ImportError:  # pragma: no cover - exercised where msgspec is absent (tests monkeypatch it)
    _typed_decode = None

try:  # isal: igzip inflates 2-4x faster than zlib; optional
    from isal import igzip as _gzip_module
    from isal.isal_zlib import error as _IsalError
except ImportError:  # pragma: no cover - exercised where isal is absent (tests monkeypatch it)
    _gzip_module = gzip
    _IsalError = zlib.error

try:  # orjson parses ~3x faster than json; optional
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised where orjson is absent
    import json

    _loads = json.loads
    _DecodeError = (ValueError,)

CHUNK_BYTES = 1 << 20  # 1 MiB: measured best peak memory at equal CPU (docs/benchmarks.md)
_CUT_RE = re.compile(rb"\}\s*,\s*\{")
_SEP_BEFORE_RE = re.compile(rb"\}\s*,\s*\Z")
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_SHAPES_KEY = b'"Input Dims"'
# a number written as no JSON number: NaN, Infinity (Python's json.dump), inf, nan (C++ streams), after a value's
# opening (":" "[" ","), before its end; inside a string only where a string holds such text, which stays a string
# an operator named with its overload, "aten::add.Tensor", as PyTorch names them where the profile has
# experimental_config=_ExperimentalConfig(capture_overload_names=True) (2.6+); by default "aten::add". One namespace,
# one operator, one overload, identifiers only: kernels' C++ names, annotations and Python frames never take that form
OVERLOADED_OP_RE = re.compile(r"^([A-Za-z_]\w*::[A-Za-z_]\w*)\.[A-Za-z_]\w*$")
_NON_FINITE_RE = re.compile(rb"([:\[,]\s*)-?(?:NaN|Infinity|inf|nan)(?=\s*[,\]}])")


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return _GzipToItsCut(path) if magic == b"\x1f\x8b" else open(path, "rb")


class _GzipToItsCut:
    """A gzip file read through _gzip_module (igzip: fast) and, when it ends before gzip's end marker (a copy or
    an export stopped early), through zlib from where that stopped to the cut: igzip's read drops what it
    inflated in the call that meets the cut, zlib's decompressobj gives every byte before it. Then EOFError."""

    def __init__(self, path: Path):
        self.path = path
        self.fast = _gzip_module.open(path, "rb")
        self.returned = 0  # bytes inflated and returned so far
        self.to_cut = None  # the pieces after them, once the fast reader met the cut

    def read(self, n: int) -> bytes:
        """Up to n bytes (a cut file's last pieces: any size); b"" at a whole file's end."""
        if self.to_cut is None:
            try:
                data = self.fast.read(n)
                self.returned += len(data)
                return data
            except EOFError:
                self.to_cut = self._inflate_to_cut()
        piece = next(self.to_cut, None)
        if piece is None:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        return piece

    def _inflate_to_cut(self):
        inflater, skip = zlib.decompressobj(wbits=31), self.returned
        with open(self.path, "rb") as f:
            while raw := f.read(CHUNK_BYTES):
                out = inflater.decompress(raw)
                if skip:
                    drop = min(skip, len(out))
                    out, skip = out[drop:], skip - drop
                if out:
                    yield out

    def close(self) -> None:
        self.fast.close()


class _CutGzip(TrainperfError):
    """A gzip stream that ends before its end marker: the file was cut (a copy or an export stopped early)."""


def _read(stream, path: Path, n: int) -> bytes:
    try:
        return stream.read(n)
    except EOFError as e:
        raise _CutGzip(f"{path}: truncated or corrupt gzip file ({e or type(e).__name__})") from None
    except (gzip.BadGzipFile, zlib.error, _IsalError, OSError) as e:
        raise TrainperfError(f"{path}: truncated or corrupt gzip file ({e or type(e).__name__})") from None


def _invalid(path: Path, err: Exception) -> TrainperfError:
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    return TrainperfError(f"{path}: invalid JSON ({msg}); is the trace complete?")


def _loads_lenient(data: bytes):
    """data parsed as JSON, where a number is written as NaN, Infinity, inf or nan (Python's json.dump writes the
    first two; Kineto wrote `"memory bandwidth (GB/s)": inf` for a copy of zero duration, pytorch/kineto#105)
    read as null, as no JSON parser of the field takes the lowercase ones; raises one of _DecodeError otherwise."""
    try:
        return _loads(data)
    except _DecodeError:
        if not _NON_FINITE_RE.search(data):
            raise
    return _loads(_finite(data))


def _finite(data: bytes) -> bytes:
    """data with every number written as no JSON number (_NON_FINITE_RE) written null."""
    return _NON_FINITE_RE.sub(rb"\1null", data)


def _ends_inside(text: bytes) -> bool:
    """Whether a trace's text (from its start, or from its events array's as b'{"traceEvents":[' + the rest), not
    valid JSON, is valid up to its end: the file was cut inside a value, not damaged or written wrong before it.
    Python's json module, for the position of its error."""
    import json

    doc = _finite(text).decode("utf-8", errors="replace").rstrip()
    try:
        json.loads(doc)
    except json.JSONDecodeError as e:  # a string open at the end is reported where it starts
        return e.msg.startswith("Unterminated string") or e.pos >= len(doc)
    return False


def _decode_events(data: bytes) -> Chunk:
    """The events of a JSON array as a Chunk; raises one of _DecodeError when data is not valid JSON. A batch with
    begin/end ("B"/"E") events is read by the generic parser (the typed one leaves it), which keeps them for
    begin_end.pair_begin_end."""
    if _typed_decode is not None:
        chunk = _typed_decode(data, _loads)
        if chunk is not None:
            return chunk
    events = _loads_lenient(data)
    return chunk_from_dicts(events if isinstance(events, list) else [])


def _decode_tail(tail: bytes) -> tuple[Chunk, dict]:
    """The last events and the keys after the array, from b'{"traceEvents":[' + the rest of the file."""
    if _typed_decode is not None:
        import msgspec  # present: the typed path imported it

        try:
            parts = msgspec.json.decode(tail, type=dict[str, msgspec.Raw])
        except msgspec.DecodeError:
            parts = None
        if parts is not None:
            try:
                chunk = _decode_events(bytes(parts.pop("traceEvents")))
                return chunk, {k: _loads_lenient(bytes(v)) for k, v in parts.items()}
            except _DecodeError:
                pass  # the generic parser below says what is wrong
    return _split_doc(_loads_lenient(tail))


def _split_doc(doc: dict) -> tuple[Chunk, dict]:
    """A whole parsed trace object: its events as a Chunk, and its other keys."""
    ev = doc.get("traceEvents")
    return chunk_from_dicts(ev if isinstance(ev, list) else []), {k: v for k, v in doc.items() if k != "traceEvents"}


def iter_event_chunks(path: Path):
    """Yield ("header", dict) once, then Chunks of events in file order, then ("trailer", dict);
    ("profiler", {"record_shapes": True}) once when the events carry input shapes.

    Raises TrainperfError for an empty file, a corrupt gzip or invalid JSON.
    """
    stream = _open(path)
    try:
        buf = _read(stream, path, CHUNK_BYTES)
        # a UTF-8 byte-order mark, as some Windows editors and PowerShell's redirection write it: JSON allows none,
        # Python's json.load of such text (utf-8-sig) and Chrome's trace viewer read past it
        buf = buf.removeprefix(b"\xef\xbb\xbf")
        stripped = buf.lstrip()
        if not stripped:
            # a whitespace-only first chunk of a huge file is absurd; treat as empty
            raise TrainperfError(f"{path}: empty file (no JSON); re-export the trace")
        if stripped[:1] == b"[":  # Chrome "JSON array" format: the events themselves
            buf = stripped[1:]
            first = buf.lstrip()[:1]
            if first and first not in b"{]":
                # an array of arrays or numbers holds no event: torch.profiler's export_memory_timeline writes such
                # files (raw: [time, action, bytes, category] entries), often beside the traces of the same run
                raise NotATraceError(f"{path}: a JSON array of {'arrays' if first == b'[' else 'values'}, not of "
                                     "events: not a trace (a memory timeline, as export_memory_timeline writes one?)")
            yield "header", {}
            array_format = True
        elif stripped[:1] == b"{":
            m = _EVENTS_KEY_RE.search(buf)
            while m is None:
                more = _read(stream, path, CHUNK_BYTES)
                if not more:
                    break
                buf += more
                m = _EVENTS_KEY_RE.search(buf)
            header = None
            if m is not None:
                try:
                    header = _loads_lenient(buf[:m.start()].rstrip().rstrip(b",") + b"}")
                except _DecodeError:
                    pass
            if not isinstance(header, dict):  # no traceEvents array, or one inside another value: parse it all
                try:
                    doc = _loads_lenient(buf + _read_all(stream, path))  # m is None: buf holds the whole file
                except _DecodeError as e:
                    raise _invalid(path, e) from None
                if not isinstance(doc, dict):
                    raise TrainperfError(f"{path}: not a Kineto trace (top-level JSON is not an object)")
                chunk, header = _split_doc(doc)
                yield "header", header
                yield chunk
                return
            yield "header", header
            buf = buf[m.end():]
            array_format = False
        else:
            raise TrainperfError(f"{path}: not JSON (starts with {stripped[:12]!r}); expected a Kineto trace")

        shapes = _SHAPES_KEY in buf  # record_shapes=True writes "Input Dims" on every op: profiler overhead
        if shapes:
            yield "profiler", {"record_shapes": True}
        cut_gzip, any_events = None, False
        while True:
            try:
                more = _read(stream, path, CHUNK_BYTES)
            except _CutGzip as e:  # the events inflated so far stand; the tail below finds where they stop
                more, cut_gzip = b"", e
            if not more:
                break
            if not shapes and _SHAPES_KEY in more:
                shapes = True
                yield "profiler", {"record_shapes": True}
            buf += more
            chunk, buf = _cut_batch(buf)
            if chunk is not None:
                any_events = True
                yield chunk
        # the tail: last events, the end of the array and (object format) the trailing keys
        opening = b"[" if array_format else b'{"traceEvents":['
        try:
            if array_format:
                # Chrome's array format may leave out its closing "]" (a writer that streams its events)
                tail = buf.rstrip()
                yield _decode_events(b"[" + (tail if tail.endswith(b"]") else tail.rstrip(b",") + b"]"))
            else:
                chunk, trailer = _decode_tail(opening + buf)
                yield chunk
                yield "trailer", trailer
        except _DecodeError as e:
            # a file that ends inside its events or the keys after them (an export or a copy stopped early): the
            # complete events before the cut are the trace, marked as cut, when they parse; text that is not JSON
            # before its end (damage, or a file written wrong) still makes it invalid, and so does a cut before any
            # whole event
            chunk, _ = _cut_batch(buf)
            if not _ends_inside(opening + buf) or (chunk is None and not any_events):
                raise (cut_gzip or _invalid(path, e)) from None
            if chunk is not None:
                yield chunk
            yield "cut", {}
    finally:
        stream.close()


def _read_all(stream, path: Path) -> bytes:
    parts = []
    while True:
        more = _read(stream, path, CHUNK_BYTES)
        if not more:
            return b"".join(parts)
        parts.append(more)


def _cut_batch(buf: bytes):
    """Split buf at the last event boundary that parses: (Chunk or None, remaining bytes)."""
    end = len(buf)
    for _ in range(4):
        cut = _last_boundary(buf, end)
        if cut is None:
            return None, buf
        close, open_ = cut
        try:
            chunk = _decode_events(b"".join((b"[", memoryview(buf)[:close + 1], b"]")))
        except _DecodeError:
            end = close
            continue
        return chunk, buf[open_:]
    return None, buf


def _last_boundary(buf: bytes, end: int) -> tuple[int, int] | None:
    """(index of the '}', index of the '{') of the last '}' ws ',' ws '{' that ends before end.

    Looks back from each '{' (a few per event) instead of running the regex over the whole
    chunk, which cost ~0.4 ms per MiB; the regex scan remains for unusually long whitespace.
    """
    pos = end
    for _ in range(64):
        j = buf.rfind(b"{", 0, pos)
        if j <= 0:
            return None
        m = _SEP_BEFORE_RE.search(buf, max(0, j - 64), j)
        if m is not None:
            return m.start(), j
        pos = j
    while end > 0:  # fallback: scan back 64 KiB at a time
        start = max(0, end - (1 << 16))
        last = None
        for m in _CUT_RE.finditer(buf, start, end):
            last = m
        if last is not None:
            return last.start(), last.end() - 1
        end = start
    return None


class ColumnBuilder:
    """Accumulates Chunks: interns their strings (in one order, whatever parser made the chunk)."""

    def __init__(self):
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in INT_COLUMNS + _STRING_COLUMNS + ("args",)}
        self.arg_texts: list = []  # kept args (chunk.KEPT_ARGS): JSON bytes, canonical str after columns()
        self.arg_ids: dict[bytes, int] = {}
        self.thread_names: dict = {}
        self.ts_float = False
        self.skipped = 0
        self.rows = 0
        self.begin_end: list = []  # "B"/"E" events of every chunk, in file order (pair_begin_end pairs them)
        self.memory: list = []  # each chunk's allocator samples (chunk.MEMORY_COLUMNS rows, or an array of them)
        self.out_of_memory = 0  # the accelerators' failed allocations (chunk.OUT_OF_MEMORY_EVENT)

    def intern(self, values: list, table: str = "names") -> np.ndarray:
        """int32 ids of the strings in values (None -> -1), adding new strings to self.names (or, with
        table="args", to self.arg_texts)."""
        n = len(values)
        if values.count(None) == n:
            return np.full(n, -1, dtype=np.int32)
        name_ids, names = (self.name_ids, self.names) if table == "names" else (self.arg_ids, self.arg_texts)
        ids = list(map(name_ids.get, values))
        if None in ids:
            for i, j in enumerate(ids):
                if j is None:
                    s = values[i]
                    if s is None:
                        ids[i] = -1
                        continue
                    j = name_ids.get(s)
                    if j is None:
                        j = name_ids[s] = len(names)
                        names.append(s)
                    ids[i] = j
        return np.fromiter(ids, dtype=np.int32, count=n)

    def add(self, chunk: Chunk) -> None:
        """Append one chunk's rows."""
        self.ts_float |= chunk.ts_float
        self.skipped += chunk.skipped
        self.thread_names.update(chunk.thread_names)
        self.begin_end += chunk.begin_end
        self.memory.append(chunk.memory)
        self.out_of_memory += chunk.out_of_memory
        if not len(chunk):
            return
        self.rows += len(chunk)
        for j, c in enumerate(INT_COLUMNS):
            self.parts[c].append(chunk.ints[:, j].copy())  # contiguous, and frees the chunk's 2-D block
        self.parts["cat"].append(self.intern(chunk.cats))
        self.parts["name"].append(self.intern(chunk.names))
        self.parts["collective"].append(self.intern(chunk.colls))
        self.parts["process_group"].append(self.intern(chunk.pgs))
        self.parts["args"].append(self.intern(chunk.args, "args") if chunk.args is not None
                                  else np.full(len(chunk), -1, dtype=np.int32))

    def _without_overloads(self) -> None:
        """Name each operator without its overload (OVERLOADED_OP_RE: "aten::add.Tensor" -> "aten::add"), as a
        default profile names it: every rule and price looks operators up by that name."""
        base = {i: m.group(1) for i, s in enumerate(self.names) if (m := OVERLOADED_OP_RE.match(s))}
        if not base:
            return
        to = np.arange(len(self.names) + 1, dtype=np.int32)
        to[-1] = -1
        for i, name in base.items():
            to[i] = self.intern([name])[0]
        self.parts["name"] = [to[ids] for ids in self.parts["name"]]

    def columns(self) -> dict[str, np.ndarray]:
        """The EventTable columns, sorted by start time (stable: file order among equal starts); operators named
        without their overload (_without_overloads)."""
        self._without_overloads()
        ts = np.concatenate(self.parts.pop("ts_ns"))
        order = np.argsort(ts, kind="stable")
        cols = {"ts_ns": ts[order]}
        del ts
        # ids in sorted-string order: the same table whatever the chunk size or parser
        by_text = sorted(range(len(self.names)), key=self.names.__getitem__)
        new_id = np.empty(len(by_text) + 1, dtype=np.int32)
        new_id[np.array(by_text, dtype=np.int64)] = np.arange(len(by_text), dtype=np.int32)
        new_id[-1] = -1  # id -1 (absent) stays -1
        self.names[:] = [self.names[i] for i in by_text]
        args_id = self._canonical_args()
        for c in list(self.parts):
            col = np.concatenate(self.parts.pop(c))[order]
            cols[c] = new_id[col] if c in _STRING_COLUMNS else args_id[col] if c == "args" else col
        kind_of = np.array([CAT_TO_KIND.get(s, OTHER) for s in self.names] or [OTHER], dtype=np.int8)
        cols["kind"] = kind_of[cols["cat"]]
        return cols

    def memory_samples(self) -> np.ndarray | None:
        """The allocator's samples as an (n, 5) int64 array of chunk.MEMORY_COLUMNS sorted by time (stable), or
        None when the trace has none (profiled without profile_memory=True)."""
        parts = [np.asarray(m, dtype=np.int64).reshape(-1, len(MEMORY_COLUMNS)) for m in self.memory if len(m)]
        if not parts:
            return None
        rows = np.concatenate(parts)
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def _canonical_args(self) -> np.ndarray:
        """Make self.arg_texts canonical (compact JSON, sorted, unique: the same texts whatever parser or
        chunking read them); returns old id -> new id, with -1 kept at index -1."""
        # parsed by the generic path's parser, so that both paths read a value alike (orjson reads an
        # integer beyond 64 bits as a float); once per distinct text
        canon = [compact_json(_loads(s)) for s in self.arg_texts]
        texts = sorted(set(canon))
        pos = {s: i for i, s in enumerate(texts)}
        self.arg_texts[:] = texts
        return np.array([pos[s] for s in canon] + [-1], dtype=np.int32)


_STRING_COLUMNS = ("cat", "name", "collective", "process_group")


def read_kineto(path: str | Path, rank: int | None = None) -> EventTable:
    """Read one Kineto trace (.json or .json.gz, current or 2021 schema) into an EventTable.

    `rank` overrides the rank; otherwise it comes from distributedInfo (or -1 when absent, for
    the caller to resolve from the file name). Raises TrainperfError on unreadable input.
    """
    path = Path(path)
    if not path.is_file():
        raise TrainperfError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise TrainperfError(f"{path}: empty file (0 bytes); re-export the trace")
    header: dict = {}
    profiler: dict = {}
    builder = ColumnBuilder()
    cut = False
    for item in iter_event_chunks(path):
        if item.__class__ is tuple:
            cut |= item[0] == "cut"
            if isinstance(item[1], dict):
                (profiler if item[0] == "profiler" else header).update(item[1])
            continue
        builder.add(item)
    if builder.begin_end:  # spans written as begin/end pairs: complete events once all are read
        spans, unpaired = pair_begin_end(builder.begin_end)
        builder.begin_end = []
        builder.add(chunk_from_dicts(spans))
        builder.skipped += unpaired
    if not builder.rows:
        # no entry at all: some other JSON (labels, a config), not a trace; entries but none complete: a trace
        # without the events an analysis needs
        error = NotATraceError if not builder.skipped else TrainperfError
        raise error(f"{path}: no complete ('ph': 'X') or begin/end ('B'/'E') events among {builder.skipped} entries; "
                    "is this a Kineto trace (torch.profiler export_chrome_trace)?")
    cols = builder.columns()
    if cut:
        header["truncated"] = {"events_read": builder.rows}
    dist = header.get("distributedInfo")
    if rank is None:
        rank = -1
        if isinstance(dist, dict):
            r = to_int(dist.get("rank"), -1)
            rank = r if r >= 0 else -1
    meta = {k: v for k, v in header.items() if k in ("schemaVersion", "distributedInfo", "deviceProperties",
                                                     "baseTimeNanoseconds", "displayTimeUnit", "traceName",
                                                     "truncated")}
    meta["profiler"] = {"record_shapes": bool(profiler.get("record_shapes"))}
    if builder.out_of_memory:
        meta["out_of_memory_events"] = builder.out_of_memory
    table = EventTable(rank=rank, source=str(path), names=builder.names, arg_texts=builder.arg_texts, metadata=meta,
                       thread_names=builder.thread_names, ts_was_float=builder.ts_float,
                       n_skipped=builder.skipped, memory=builder.memory_samples(), **cols)
    annotate(table)
    return table
