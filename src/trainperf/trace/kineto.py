"""Streaming reader of one Kineto (PyTorch profiler) JSON trace into an EventTable.

Why hand-written: ``json.load`` of a whole trace holds every event as a Python dict at once
(~5x the JSON size, HTA's cost). Here the file is decompressed in 1 MiB chunks, cut at event
boundaries, and each batch of events is parsed (orjson when installed, else json) and
folded into typed ``array`` columns before the next chunk is read, so peak memory stays near
one chunk of dicts plus the 8-byte columns.

A cut is only accepted when the batch ``[` + piece + `]`` parses: a boundary that falls inside a
nested object or a string cannot parse, so any formatting (pretty-printed or one line) works.
"""

from __future__ import annotations

import gzip
import re
import zlib
from array import array
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError
from trainperf.trace.events import CAT_TO_KIND, OTHER, EventTable

try:  # orjson parses ~3x faster than json; optional
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised where orjson is absent
    import json

    _loads = json.loads
    _DecodeError = (ValueError,)

CHUNK_BYTES = 1 << 20  # 1 MiB: measured best peak memory at equal CPU (docs/benchmarks/diagnose.md)
_CUT_RE = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_INT64_MAX = (1 << 63) - 1


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _read(stream, path: Path, n: int) -> bytes:
    try:
        return stream.read(n)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise TrainperfError(f"{path}: truncated or corrupt gzip file ({e or type(e).__name__})") from None


def _invalid(path: Path, err: Exception) -> TrainperfError:
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    return TrainperfError(f"{path}: invalid JSON ({msg}); is the trace complete?")


def iter_event_batches(path: Path):
    """Yield ("header", dict) once, then lists of raw event objects, then ("trailer", dict).

    Raises TrainperfError for an empty file, a corrupt gzip or invalid JSON.
    """
    stream = _open(path)
    try:
        buf = _read(stream, path, CHUNK_BYTES)
        stripped = buf.lstrip()
        if not stripped:
            # a whitespace-only first chunk of a huge file is absurd; treat as empty
            raise TrainperfError(f"{path}: empty file (no JSON); re-export the trace")
        if stripped[:1] == b"[":  # Chrome "JSON array" format: the events themselves
            buf = stripped[1:]
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
            if m is None:  # no traceEvents key at all: parse the whole (small) object
                try:
                    doc = _loads(buf)
                except _DecodeError as e:
                    raise _invalid(path, e) from None
                if not isinstance(doc, dict):
                    raise TrainperfError(f"{path}: not a Kineto trace (top-level JSON is not an object)")
                yield "header", {k: v for k, v in doc.items() if k != "traceEvents"}
                return
            head = buf[:m.start()].rstrip().rstrip(b",") + b"}"
            try:
                header = _loads(head)
            except _DecodeError:
                header = None
            if not isinstance(header, dict):  # "traceEvents" inside another value: whole-file fallback
                rest = buf + _read_all(stream, path)
                try:
                    doc = _loads(rest)
                except _DecodeError as e:
                    raise _invalid(path, e) from None
                if not isinstance(doc, dict):
                    raise TrainperfError(f"{path}: not a Kineto trace (top-level JSON is not an object)")
                yield "header", {k: v for k, v in doc.items() if k != "traceEvents"}
                ev = doc.get("traceEvents")
                yield ev if isinstance(ev, list) else []
                return
            yield "header", header
            buf = buf[m.end():]
            array_format = False
        else:
            raise TrainperfError(f"{path}: not JSON (starts with {stripped[:12]!r}); expected a Kineto trace")

        while True:
            more = _read(stream, path, CHUNK_BYTES)
            if not more:
                break
            buf += more
            batch, buf = _cut_batch(buf)
            if batch is not None:
                yield batch
        # the tail: last events, the end of the array and (object format) the trailing keys
        try:
            if array_format:
                tail = _loads(b"[" + buf)
                if not isinstance(tail, list):
                    raise ValueError("not a list")
                yield tail
            else:
                doc = _loads(b'{"traceEvents":[' + buf)
                ev = doc.get("traceEvents") if isinstance(doc, dict) else None
                yield ev if isinstance(ev, list) else []
                yield "trailer", {k: v for k, v in doc.items() if k != "traceEvents"}
        except _DecodeError as e:
            raise _invalid(path, e) from None
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
    """Split buf at the last event boundary that parses: (events list or None, remaining bytes)."""
    end = len(buf)
    for _ in range(4):
        start = max(0, end - (1 << 16))
        last = None
        for m in _CUT_RE.finditer(buf, start, end):
            last = m
        if last is None:
            if start == 0:
                return None, buf
            end = start
            continue
        try:
            batch = _loads(b"[" + buf[:last.start() + 1] + b"]")
        except _DecodeError:
            end = last.start()
            continue
        return batch, buf[last.end() - 1:]
    return None, buf


def _to_int(v, default: int = -1) -> int:
    """An int from an int, integral float or numeric string; default otherwise."""
    if v.__class__ is int:
        return v if -_INT64_MAX <= v <= _INT64_MAX else default
    try:
        f = float(v)
        if f != f or abs(f) > 9.2e18:
            return default
        return int(f)
    except (TypeError, ValueError, OverflowError):
        return default


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
    names: list[str] = []
    name_ids: dict = {}
    kind_a, cat_a, name_a, coll_a, pg_a = array("b"), array("i"), array("i"), array("i"), array("i")
    pid_a, tid_a, stream_a = array("q"), array("q"), array("q")
    ts_a, dur_a, corr_a, ext_a, bytes_a = array("q"), array("q"), array("q"), array("q"), array("q")
    header: dict = {}
    thread_names: dict = {}
    ts_float = False
    skipped = 0
    cat_kind = CAT_TO_KIND

    def intern(s) -> int:
        i = name_ids.get(s)
        if i is None:
            if s.__class__ is not str:
                s2 = str(s)
                i = name_ids.get(s2)
                if i is not None:
                    return i
                i = name_ids[s2] = len(names)
                names.append(s2)
                return i
            i = name_ids[s] = len(names)
            names.append(s)
        return i

    for batch in iter_event_batches(path):
        if batch.__class__ is tuple:
            if isinstance(batch[1], dict):
                header.update(batch[1])
            continue
        for ev in batch:
            if ev.__class__ is not dict:
                skipped += 1
                continue
            ph = ev.get("ph")
            if ph != "X":
                if ph == "M" and ev.get("name") == "thread_name":
                    a = ev.get("args")
                    if a.__class__ is dict:
                        thread_names[(_to_int(ev.get("pid")), _to_int(ev.get("tid")))] = str(a.get("name", ""))
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
                    whole = int(tsf)  # split so the ns stay exact: tsf * 1000 would round to 256 ns at epoch µs
                    tsn = whole * 1000 + round((tsf - whole) * 1000)
                if dur.__class__ is int:
                    durn = dur * 1000
                else:
                    durn = round(float(dur) * 1000)
                ts_a.append(tsn)
            except (TypeError, ValueError, OverflowError):
                skipped += 1
                continue
            try:
                dur_a.append(durn)
            except OverflowError:
                dur_a.append(0)
            a = ev.get("args")
            if a.__class__ is dict:
                c = a.get("correlation", -1)
                corr_a.append(c if c.__class__ is int and -_INT64_MAX < c < _INT64_MAX else _to_int(c))
                s = a.get("stream", -1)
                stream_a.append(s if s.__class__ is int and -_INT64_MAX < s < _INT64_MAX else _to_int(s))
                x = a.get("External id", -1)
                ext_a.append(x if x.__class__ is int and -_INT64_MAX < x < _INT64_MAX else _to_int(x))
                b = a.get("bytes")
                bytes_a.append(-1 if b is None else _to_int(b))
                cn = a.get("Collective name")
                coll_a.append(-1 if cn is None else intern(cn))
                pg = a.get("Process Group Name")
                pg_a.append(-1 if pg is None else intern(pg))
            else:
                corr_a.append(-1)
                stream_a.append(-1)
                ext_a.append(-1)
                bytes_a.append(-1)
                coll_a.append(-1)
                pg_a.append(-1)
            kind_a.append(cat_kind.get(cat, OTHER) if cat.__class__ is str else OTHER)
            cat_a.append(intern(cat))
            name_a.append(intern(ev.get("name", "")))
            p = ev.get("pid", -1)
            pid_a.append(p if p.__class__ is int and -_INT64_MAX < p < _INT64_MAX else _to_int(p))
            t = ev.get("tid", -1)
            tid_a.append(t if t.__class__ is int and -_INT64_MAX < t < _INT64_MAX else _to_int(t))

    if not len(ts_a):
        raise TrainperfError(f"{path}: no complete ('ph': 'X') events among {skipped} entries; "
                             "is this a Kineto trace (torch.profiler export_chrome_trace)?")

    def col(a, dtype):  # a view on the array's buffer; the sort below makes the only copy
        return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)

    ts_ns = col(ts_a, np.int64)
    order = np.argsort(ts_ns, kind="stable")
    cols = dict(kind=col(kind_a, np.int8), cat=col(cat_a, np.int32), name=col(name_a, np.int32),
                pid=col(pid_a, np.int64), tid=col(tid_a, np.int64), stream=col(stream_a, np.int64),
                ts_ns=ts_ns, dur_ns=col(dur_a, np.int64), correlation=col(corr_a, np.int64),
                external_id=col(ext_a, np.int64), nbytes=col(bytes_a, np.int64),
                collective=col(coll_a, np.int32), process_group=col(pg_a, np.int32))
    cols = {k: v[order] for k, v in cols.items()}
    del kind_a, cat_a, name_a, coll_a, pg_a, pid_a, tid_a, stream_a, ts_a, dur_a, corr_a, ext_a, bytes_a
    dist = header.get("distributedInfo")
    if rank is None:
        rank = -1
        if isinstance(dist, dict):
            r = _to_int(dist.get("rank"), -1)
            rank = r if r >= 0 else -1
    meta = {k: v for k, v in header.items() if k in ("schemaVersion", "distributedInfo", "deviceProperties",
                                                     "baseTimeNanoseconds", "displayTimeUnit", "traceName")}
    from trainperf.trace.annotate import annotate  # categories and steps, vectorized

    table = EventTable(rank=rank, source=str(path), names=names, metadata=meta, thread_names=thread_names,
                       ts_was_float=ts_float, n_skipped=skipped, **cols)
    annotate(table)
    return table
