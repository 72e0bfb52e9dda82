"""JAX / XLA profiles into the event table: the XSpace protobuf (`<host>.xplane.pb`) that
`jax.profiler.trace` writes, or the Chrome trace JSON it writes beside it (`<host>.trace.json.gz`,
`perfetto_trace.json.gz` with create_perfetto_trace=True).

Why a reader of our own: xprof / tensorboard-plugin-profile convert an XSpace only to their tool
outputs (trace viewer JSON among them) through a compiled library, and the proto's Python classes
are not shipped; the XSpace wire format is small (tsl/profiler/protobuf/xplane.proto:
XSpace > XPlane > XLine > XEvent, names and stat names in per-plane metadata maps) and is decoded
with the protobuf wire reader of protowire.py, so no dependency is needed.

How events map onto the Kineto vocabulary (trace.events):
- a plane "/device:GPU:N" holds the device: its lines "Stream #K(...)" are streams (stream K), their
  events kernels, or memcpy / memset by name; the lines "XLA Ops" / "XLA Modules" (HLO op and module
  spans over those kernels) become GPU annotations; other device lines (Steps, counters) are dropped;
- a plane "/host:CPU" holds the host threads (lines): an event with an "hlo_op" stat off the Python
  thread is XLA executing an HLO op on the CPU device (a kernel on a stream named after its thread);
  one with "step_num" (jax.profiler.StepTraceAnnotation) becomes "ProfilerStep#<step_num>", so the
  per-step analyses run; "$file:line fn" events are Python frames; one with a "correlation_id" is a
  launch (runtime call) linked to its kernel by that id; the rest are host ops (cpu_op);
- the rank is not in the profile (a JAX process index is not recorded): it comes from the file name;
- a kernel that runs an HLO collective (its opcode from the module's HloProto, hlo.py) is
  communication whatever JAX named it ("psum_invariant.7", "ppermute.3"), its "Collective name" the
  collective, and it keeps its message size as the args PyTorch writes ("In msg nelems", "dtype",
  "Group size"), so diagnose/collectives.py computes its bus bandwidth as for NCCL kernels (and not
  an operator's roofline cost: its bound is the link, not HBM). With empty replica groups (every
  device, a number the HLO does not hold) a collective whose bus factor depends on the group size
  keeps no size. An XLA CPU thunk has no launch, hence no correlation id, which that analysis keys
  sizes by: such a collective gets one of its own, above every id of the trace (it links to no launch).
"""

from __future__ import annotations

import gzip
import json
import re
import struct
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable
from trainperf.trace.protowire import fields, int64, map_entry

_STREAM_RE = re.compile(r"^Stream #(\d+)")
_DEVICE_ANNOTATION_LINES = ("XLA Ops", "XLA Modules", "TensorFlow Ops", "Framework Ops", "TensorFlow Name Scope")
_LAUNCH_NAMES = re.compile(r"Launch|Memcpy|Memset|cuGraph|hipGraph|cudaGraph", re.I)


def _stat(b: bytes, stat_names: dict) -> tuple[str, object]:
    """(name, value) of an XStat; a ref_value is the name of another stat metadata (an interned string)."""
    mid, value = 0, None
    for f, wt, v in fields(b):
        if f == 1:
            mid = v
        elif f == 2:
            value = struct.unpack("<d", v)[0]
        elif f == 3:
            value = v
        elif f == 4:
            value = int64(v)
        elif f == 5:
            value = v.decode("utf-8", "replace")
        elif f == 7:
            value = stat_names.get(v, "")
    return stat_names.get(mid, str(mid)), value


def _plane_rows(b: bytes):
    """Rows (process, pid, thread, tid, ts_ns, dur_ns, name, args) of one XPlane."""
    name, pid, lines, ev_meta_raw, stat_names = "", 0, [], [], {}
    for f, _, v in fields(b):
        if f == 1:
            pid = int64(v)
        elif f == 2:
            name = v.decode("utf-8", "replace")
        elif f == 3:
            lines.append(v)
        elif f == 4:
            ev_meta_raw.append(v)
        elif f == 5:
            k, raw = map_entry(v)
            stat_names[k] = next((s.decode("utf-8", "replace") for ff, _, s in fields(raw) if ff == 2), "")
    ev_meta = {}
    for raw in ev_meta_raw:
        k, m = map_entry(raw)
        mname = display = ""
        mstats = {}
        for f, _, v in fields(m):
            if f == 2:
                mname = v.decode("utf-8", "replace")
            elif f == 4:
                display = v.decode("utf-8", "replace")
            elif f == 5:
                sn, sv = _stat(v, stat_names)
                mstats[sn] = sv
        ev_meta[k] = (display or mname, mstats)
    for lb in lines:
        tid, lname, display, t0_ns, events = 0, "", "", 0, []
        for f, _, v in fields(lb):
            if f == 1:
                tid = int64(v)
            elif f == 2:
                lname = v.decode("utf-8", "replace")
            elif f == 11:
                display = v.decode("utf-8", "replace")
            elif f == 3:
                t0_ns = int64(v)
            elif f == 4:
                events.append(v)
        thread = display or lname
        for eb in events:
            mid, off_ps, dur_ps, stats, aggregated = 0, 0, 0, [], False
            for f, _, v in fields(eb):
                if f == 1:
                    mid = v
                elif f == 2:
                    off_ps = int64(v)
                elif f == 3:
                    dur_ps = int64(v)
                elif f == 4:
                    stats.append(v)
                elif f == 5:
                    aggregated = True
            if aggregated:  # counts of occurrences, no time: not a trace event
                continue
            ename, margs = ev_meta.get(mid, (str(mid), {}))
            args = dict(margs)
            for s in stats:
                sn, sv = _stat(s, stat_names)
                args[sn] = sv
            ts_ps = t0_ns * 1000 + off_ps
            yield name, pid, thread, tid, ts_ps // 1000, dur_ps // 1000, ename, args


def xspace_rows(data: bytes):
    """Rows (process, pid, thread, tid, ts_ns, dur_ns, name, args) of every event of an XSpace."""
    for f, _, v in fields(data):
        if f == 1:
            yield from _plane_rows(v)


# --- the trace JSON written beside it ---------------------------------------------------------

def trace_json_rows(doc: dict):
    """Rows of the Chrome trace JSON that jax.profiler writes (µs floats with ns decimals, no "cat")."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return
    processes, threads = {}, {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and isinstance(e.get("args"), dict):
            if e.get("name") == "process_name":
                processes[e.get("pid")] = str(e["args"].get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(e["args"].get("name", ""))
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        try:
            ts_ns = round(float(e["ts"]) * 1000)
            dur_ns = round(float(e.get("dur", 0)) * 1000)
        except (TypeError, ValueError):
            continue
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        yield (processes.get(pid, ""), pid, threads.get((pid, tid), ""), tid, ts_ns, dur_ns, str(e.get("name", "")),
               args)


def looks_like_jax_trace(head: bytes) -> bool:
    """True when the start of a JSON trace is jax.profiler's: processes named "/host:..." or "/device:..."."""
    return b'"traceEvents"' in head and (b'"name":"/host:' in head.replace(b" ", b"")
                                         or b'"name":"/device:' in head.replace(b" ", b""))


# --- rows into the event table ----------------------------------------------------------------

def _classify(process: str, thread: str, name: str, args: dict) -> tuple[str, int, str] | None:
    """(Kineto cat, stream, name) of a row, or None to drop it (module docstring)."""
    if process.startswith("/device:"):
        m = _STREAM_RE.match(thread)
        if m:
            low = name.lower()
            cat = "gpu_memcpy" if "memcpy" in low or "memcpy_details" in args else \
                "gpu_memset" if "memset" in low else "kernel"
            return cat, int(m.group(1)), name
        if thread in _DEVICE_ANNOTATION_LINES:
            return "gpu_user_annotation", -1, name
        return None
    if "step_num" in args:
        return "user_annotation", -1, f"ProfilerStep#{int(float(args['step_num']))}"
    if "hlo_op" in args and thread != "python":
        return "kernel", -2, name  # -2: the stream is this thread (filled in by the caller)
    if name.startswith("$"):
        return "python_function", -1, name
    if "correlation_id" in args and _LAUNCH_NAMES.search(name):
        return "cuda_runtime", -1, name
    return "cpu_op", -1, name


def _int_arg(args: dict, key: str) -> int:
    v = args.get(key)
    try:
        return int(v) if v is not None else -1
    except (TypeError, ValueError):
        return -1


def table_from_rows(rows, source: str, producer: str, rank: int | None = None, costs: dict | None = None
                    ) -> EventTable:
    """An annotated EventTable from (process, pid, thread, tid, ts_ns, dur_ns, name, args) rows. costs:
    {(module, instruction): hlo.HloCost}; a kernel with those `hlo_module` / `hlo_op` stats keeps its
    cost in EventTable.args (hlo_flops, hlo_bytes, hlo_precision, hlo_shapes) for the roofline."""
    from trainperf.trace.chunk import compact_json
    from trainperf.trace.foreign_table import build_table

    events, thread_names, skipped, kept, comm = [], {}, 0, [], []
    costs = costs or {}
    for process, pid, thread, tid, ts_ns, dur_ns, name, args in rows:
        c = _classify(process, thread, name, args)
        if c is None:
            skipped += 1
            continue
        cat, stream, name = c
        pid_i, tid_i = _to_int(pid), _to_int(tid)
        if stream == -2:  # XLA on the CPU device: the thread is the stream
            stream = tid_i
        thread_names[(pid_i, tid_i)] = thread
        events.append((cat, name, pid_i, tid_i, int(ts_ns), max(int(dur_ns), 0), _int_arg(args, "correlation_id"),
                       stream, _int_arg(args, "group_id"), _int_arg(args, "bytes")))
        cost = costs.get((str(args.get("hlo_module", "")), str(args.get("hlo_op", name)))) if cat == "kernel" else None
        if cost is not None and cost.collective is not None:  # its size, not an operator's roofline cost
            c = cost.collective
            # busbw = algbw x a factor of the group size n for these kinds: with n unknown, no size rather
            # than a bandwidth off by up to 2x
            size = c.kineto_args() if c.group_size or c.kind in ("send_recv", "broadcast") else {}
            kept.append(compact_json({**size, _KIND_ARG: c.kind, "hlo_shapes": cost.shapes}).encode())
            comm.append(len(events) - 1)
        else:
            kept.append(None if cost is None else compact_json(
                {"hlo_flops": cost.flops, "hlo_bytes": cost.bytes, "hlo_precision": cost.precision,
                 "hlo_shapes": cost.shapes}).encode())
    next_id = max((e[6] for e in events), default=-1) + 1
    for i in comm:  # a correlation id for each collective without one (module docstring)
        if events[i][6] < 0:
            events[i] = events[i][:6] + (next_id,) + events[i][7:]
            next_id += 1
    table = build_table(events, source=source, producer=producer, rank=rank, skipped=skipped,
                        thread_names=thread_names, args=kept if costs else None)
    if comm:
        _mark_collectives(table)
    return table


_KIND_ARG = "hlo_collective"


def _mark_collectives(t: EventTable) -> None:
    """Kernels whose kept args name an HLO collective: category communication, "Collective name" the kind."""
    import numpy as np

    from trainperf.trace.events import COMMUNICATION

    kinds = {i: a[_KIND_ARG] for i, a in enumerate(t.kept_args()) if _KIND_ARG in a}
    for arg_id, kind in kinds.items():
        rows = np.flatnonzero(t.args == arg_id)
        if kind not in t.names:
            t.names.append(kind)
        t.category[rows] = COMMUNICATION
        t.collective[rows] = t.names.index(kind)


def _to_int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TrainperfError(f"{path}: cannot read ({e})") from None


def read_xplane(path: str | Path, rank: int | None = None) -> EventTable:
    """Read a JAX/XLA XSpace protobuf (<host>.xplane.pb) into an EventTable (module docstring)."""
    path = Path(path)
    data = _read_bytes(path)
    from trainperf.trace.hlo import xspace_costs

    try:
        rows = list(xspace_rows(data))
    except (IndexError, ValueError, struct.error):
        raise TrainperfError(f"{path}: not a readable XSpace protobuf (truncated or another format)") from None
    try:  # the HLO modules only add costs for the roofline: one that does not decode leaves them out
        costs = xspace_costs(data)
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        costs = {}
    return table_from_rows(rows, str(path), "jax-xplane", rank, costs)


def read_jax_trace_json(path: str | Path, rank: int | None = None) -> EventTable:
    """Read the trace JSON jax.profiler writes (<host>.trace.json.gz, perfetto_trace.json.gz)."""
    path = Path(path)
    try:
        doc = json.loads(_read_bytes(path))
    except ValueError as e:
        raise TrainperfError(f"{path}: invalid JSON ({str(e).splitlines()[0]})") from None
    return table_from_rows(trace_json_rows(doc), str(path), "jax-trace-json", rank)
