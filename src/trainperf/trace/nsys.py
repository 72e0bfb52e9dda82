"""Nsight Systems' SQLite export (`nsys export --type sqlite -o report.sqlite report.nsys-rep`) into the event table.

Tables read (NVIDIA's export schema; columns looked up by name, since they vary across versions, and a table
the report lacks is skipped):
- `CUPTI_ACTIVITY_KIND_KERNEL`: a kernel on its device (pid = `deviceId`, tid = `streamId`), named by
  `demangledName` (else `shortName`, else `name`: ids into `StringIds`); `correlationId` links it to its launch;
- `CUPTI_ACTIVITY_KIND_GRAPH_TRACE`: a CUDA graph replay traced whole (nsys's default `--cuda-graph-trace=graph`
  records no kernel of it) as one device op named "CUDA graph <id> (whole replay)", so the device is busy while it
  runs; `--cuda-graph-trace=node` gives its kernels instead;
- `CUPTI_ACTIVITY_KIND_MEMCPY` / `_MEMSET`: copies and fills, named as Kineto names them ("Memcpy HtoD (Pageable ->
  Device)" from CUPTI's `copyKind`, `srcKind` and `dstKind` enums), bytes kept;
- `CUPTI_ACTIVITY_KIND_RUNTIME`: CUDA runtime and driver calls on their host thread (`globalTid`), the API version
  suffix nsys adds dropped ("cudaLaunchKernel_v7000" -> "cudaLaunchKernel");
- `NVTX_EVENTS` ranges (push/pop and start/end; marks skipped): PyTorch's operator ranges (`nsys profile
  --pytorch=autograd-nvtx`, or `torch.autograd.profiler.emit_nvtx()`: "aten::mm, seq = 12, op_id = 3, sizes =
  [...]", or any range named in a C++ namespace) become host ops named without their suffix, with their autograd
  sequence number; every other range (`torch.cuda.nvtx.range`, record_function, "ProfilerStep#N") a user
  annotation, so a range named ProfilerStep#N marks a step; where none is, a user's numbered iteration ranges
  ("iteration 12", "step_12": one after another on one thread) are renamed ProfilerStep#N and mark them;
- `ThreadNames`, `TARGET_INFO_GPU` / `TARGET_INFO_CUDA_DEVICE` (the devices as Kineto's deviceProperties name them)
  and `TARGET_INFO_SESSION_START_TIME` (times are ns from the session's start: the epoch is added, so that the
  ranks of one job exported apart share a clock).

A report of several processes that ran GPU work (`nsys profile torchrun --nproc-per-node 8 ...`) holds several
ranks: one table per such process, ranked by the lowest device its kernels ran on (torchrun's LOCAL_RANK; the node's
GPU id where the process saw its GPU under another index, CUDA_VISIBLE_DEVICES), else by process id; the host events
of processes without GPU work (DataLoader workers, the launcher) are left out; with one report per node, load_trace
numbers each file's ranks after the previous files'. Hand-written: no package reads the export into events (nsys's
own recipes are SQL over it). Numeric columns go through SQL into NumPy arrays a batch at a time; names are kept
once each and rows hold their indices.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainperf.errors import NotATraceError, TrainperfError
from trainperf.trace.annotate import STEP_RE
from trainperf.trace.events import EventTable

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # the report itself: a binary only nsys reads
# CUPTI's CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind, as Kineto spells them in a copy's name
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
               10: "PtoP"}
_MEMORY_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                 6: "Device Static", 7: "Managed Static"}
_API_VERSION_RE = re.compile(r"_v\d+$")
# the suffixes PyTorch's NVTX emitter (torch/csrc/profiler/stubs/cuda.cpp getNvtxStr) appends to an op's name
_NVTX_OP_SUFFIX_RE = re.compile(r", (?:seq|op_id|sizes|input_op_ids) = .*$", re.S)
_NVTX_SEQ_RE = re.compile(r", seq = (\d+)")  # the op's autograd sequence number, shared with its backward node
_NVTX_MARK = 34  # NvtxMark: an instant, no range
# an iteration's own NVTX range as users name it ("iteration 12", "step_12", "train_step 12"): a step, where no range
# is named as PyTorch's profiler names one (ProfilerStep#N)
_ITERATION_RANGE_RE = re.compile(r"^(?:iteration|iter|step|train(?:ing)?[ _]step)[\s_#:=-]*(\d+)$", re.I)


def looks_like_sqlite(head: bytes) -> bool:
    """True when a file's first bytes are an SQLite database's header."""
    return head.startswith(SQLITE_MAGIC)


_PID = "((\"{c}\" >> 24) & 16777215)"  # nsys serializes a process id in bits 24-47 of globalPid / globalTid
_TID = "(\"{c}\" & 16777215)"           # and a thread id in bits 0-23 of globalTid
_FETCH_ROWS = 200_000  # rows per fetch: the tuples SQLite hands out live only one batch at a time


class _Report:
    """One open export: its tables' columns and its string table."""

    def __init__(self, path: Path):
        self.path = path
        self.db = None
        try:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            tables = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            self.columns = {t: {r[1] for r in self.db.execute(f'PRAGMA table_info("{t}")')} for t in tables}
            self.strings = dict(self.db.execute(f"SELECT id, {self.col('StringIds', 'value', default='NULL')} "
                                                "FROM StringIds")) if "StringIds" in self.columns else {}
        except sqlite3.Error as e:
            if self.db is not None:
                self.db.close()
            raise TrainperfError(f"{path}: cannot be read as an SQLite export ({e})") from None

    def col(self, table: str, *names: str, template: str = '"{c}"', default: int | str = -1) -> str:
        """SQL for the first of the columns the table has (template applied), else default; never NULL."""
        have = [template.format(c=c) for c in names if c in self.columns.get(table, ())]
        return f"COALESCE({', '.join(have)}, {default})" if have else str(default)

    def ints(self, table: str, exprs: list[str], where: str = "") -> np.ndarray:
        """(rows, len(exprs)) int64 array of the SQL expressions over the table's rows; empty without the table."""
        if table not in self.columns:
            return np.zeros((0, len(exprs)), dtype=np.int64)
        cur = self.db.execute(f'SELECT {", ".join(exprs)} FROM "{table}" {where}')
        parts = []
        while batch := cur.fetchmany(_FETCH_ROWS):
            try:
                parts.append(np.array(batch, dtype=np.int64).reshape(len(batch), len(exprs)))
            except (ValueError, TypeError, OverflowError) as e:
                raise TrainperfError(f"{self.path}: {table} holds a value that is not an integer where the export "
                                     f"schema has one ({e})") from None
        return np.concatenate(parts) if parts else np.zeros((0, len(exprs)), dtype=np.int64)

    def rows(self, table: str, wanted: list[str]) -> list[tuple]:
        """The table's rows, the wanted columns in order (None where the table lacks one); [] without the table."""
        have = self.columns.get(table)
        if not have:
            return []
        cols = ", ".join(f'"{c}"' if c in have else "NULL" for c in wanted)
        return self.db.execute(f'SELECT {cols} FROM "{table}"').fetchall()

    def string(self, sid, fallback: str = "") -> str:
        """The string of a StringIds id, else fallback."""
        text = self.strings.get(sid)
        return text if isinstance(text, str) else fallback

    def epoch_ns(self) -> int:
        row = self.rows("TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"])
        return int(row[0][0]) if row and isinstance(row[0][0], int) else 0


@dataclass
class _Events:
    """Events of one source as columns: ints (n, 10) in chunk.INT_COLUMNS order, each row's cat and name as an
    index into `labels` (the report's strings), and the process that ran each (-1 where unrecorded)."""

    ints: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    pid: np.ndarray


class _Labels:
    """The report's event names and categories, each stored once; rows hold their indices."""

    def __init__(self):
        self.texts: list[str] = []
        self.index: dict[str, int] = {}

    def of(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.texts)
            self.texts.append(text)
        return self.index[text]

    def named(self, ids: np.ndarray, name_of) -> np.ndarray:
        """Each row's label index: name_of applied once per distinct id."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        return np.array([self.of(name_of(int(u))) for u in uniq], dtype=np.int64)[inverse.reshape(-1)]

    def filled(self, n: int, text: str) -> np.ndarray:
        return np.full(n, self.of(text), dtype=np.int64)


# a timed row's start (+ the session's epoch) and duration in ns, and the rows that have both
_TIMES = ('"start" + {t0}', 'MAX("end" - "start", 0)')
_TIMED = 'WHERE "start" IS NOT NULL AND "end" IS NOT NULL'


def _timed(r: _Report, table: str, t0: int, head: list[str], extra: list[str]) -> np.ndarray:
    """Rows of a timed table: start (+ the epoch) and duration in ns, then the head and extra expressions."""
    return r.ints(table, [*(x.format(t0=t0) for x in _TIMES), *head, *extra], _TIMED)


def _device_events(r: _Report, t0: int, labels: _Labels) -> list[_Events]:
    """Kernels, copies and fills (pid = device, tid = stream, as Kineto writes device work)."""
    out = []
    for table, cat in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy"),
                       ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset")):
        dev, stream = r.col(table, "deviceId"), r.col(table, "streamId")
        head = [dev, stream, r.col(table, "correlationId"), stream, "-1", r.col(table, "bytes"), "-1", "-1"]
        pid = r.col(table, "globalPid", template=_PID)
        if cat == "kernel":
            a = _timed(r, table, t0, head, [pid, r.col(table, "demangledName", "shortName", "name")])
            names = labels.named(a[:, -1], lambda i: r.string(i, f"kernel {i}"))
        elif cat == "gpu_memcpy":
            kinds = [r.col(table, c, default=0) for c in ("copyKind", "srcKind", "dstKind")]  # 0: unknown
            a = _timed(r, table, t0, head, [pid, f"{kinds[0]} * 10000 + {kinds[1]} * 100 + {kinds[2]}"])
            names = labels.named(a[:, -1], lambda k: f"Memcpy {_COPY_KINDS.get(k // 10000, 'Unknown')} "
                                               f"({_MEMORY_KINDS.get(k // 100 % 100, 'Unknown')} -> "
                                               f"{_MEMORY_KINDS.get(k % 100, 'Unknown')})")
        else:
            a = _timed(r, table, t0, head, [pid, r.col(table, "memKind")])
            names = labels.named(a[:, -1], lambda k: f"Memset ({_MEMORY_KINDS.get(k, 'Device')})")
        out.append(_Events(a[:, :10], labels.filled(len(a), cat), names, a[:, 10]))
    # a CUDA graph traced whole (nsys's default --cuda-graph-trace=graph) is one row per replay and no kernel: one
    # device op spanning it (its launch's correlation id), unless its kernels were traced too (node mode)
    table = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
    stream = r.col(table, "streamId")
    a = _timed(r, table, t0, [r.col(table, "deviceId"), stream, r.col(table, "correlationId"), stream, "-1", "-1",
                              "-1", "-1"], [r.col(table, "globalPid", template=_PID), r.col(table, "graphId")])
    a = a[~np.isin(a[:, 4], out[0].ints[:, 4]) | (a[:, 4] < 0)]
    names = labels.named(a[:, -1], lambda g: f"CUDA graph {g} (whole replay)")
    out.append(_Events(a[:, :10], labels.filled(len(a), "kernel"), names, a[:, 10]))
    return out


def _host_events(r: _Report, t0: int, labels: _Labels) -> tuple[list[_Events], dict, bool]:
    """Runtime calls and NVTX ranges (with the operator's autograd sequence number; the forward thread is not
    recorded, -1: autograd_links reads an op inside a backward node as backward), thread names, and whether the
    operator ranges carry input shapes (--pytorch=autograd-shapes-nvtx: profiler overhead, as record_shapes)."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    pid, tid = r.col(table, "globalTid", template=_PID), r.col(table, "globalTid", template=_TID)
    a = _timed(r, table, t0, [pid, tid, r.col(table, "correlationId"), "-1", "-1", "-1", "-1", "-1"],
               [r.col(table, "nameId")])
    names = labels.named(a[:, -1], lambda i: _API_VERSION_RE.sub("", r.string(i, f"call {i}")))
    driver_ids = [i for i, n in enumerate(labels.texts) if n.startswith("cu") and not n.startswith("cuda")]
    cat = np.where(np.isin(names, driver_ids), labels.of("cuda_driver"), labels.of("cuda_runtime"))
    calls = _Events(a[:, :10], cat, names, a[:, 2])
    ranges, shapes = _nvtx_ranges(r, t0, labels)
    threads = {}
    for name_id, gtid in r.rows("ThreadNames", ["nameId", "globalTid"]):
        if gtid is not None:
            threads[((int(gtid) >> 24) & 0xFFFFFF, int(gtid) & 0xFFFFFF)] = r.string(name_id, f"thread {gtid}")
    return [calls, ranges], threads, shapes


def _nvtx_ranges(r: _Report, t0: int, labels: _Labels) -> tuple[_Events, bool]:
    """NVTX ranges: PyTorch's operator ranges as host ops named without the emitter's suffix, the rest as user
    annotations; marks (no range) and unnamed ranges left out. And whether some op range names its inputs' sizes."""
    table = "NVTX_EVENTS"
    text = '"text"' if "text" in r.columns.get(table, ()) else "NULL"
    where = f'AND "end" > "start" AND {r.col(table, "eventType")} != {_NVTX_MARK}'
    if table not in r.columns:
        none = np.zeros(0, dtype=np.int64)
        return _Events(np.zeros((0, 10), dtype=np.int64), none, none, none), False
    times = ", ".join(x.format(t0=t0) for x in _TIMES)
    cur = r.db.execute(f'SELECT {times}, {r.col(table, "globalTid", template=_PID)}, '
                       f'{r.col(table, "globalTid", template=_TID)}, {text}, {r.col(table, "textId")} FROM "{table}" '
                       f'{_TIMED} {where}')
    ints, cats, names, shapes = [], [], [], False
    op, annotation = labels.of("cpu_op"), labels.of("user_annotation")
    while batch := cur.fetchmany(_FETCH_ROWS):
        for start, dur, pid, tid, label, text_id in batch:
            label = label if isinstance(label, str) else r.string(text_id)
            if not label:
                continue
            name = _NVTX_OP_SUFFIX_RE.sub("", label)
            seq = _NVTX_SEQ_RE.search(label)
            shapes = shapes or ", sizes = " in label
            # an operator is named in its C++ namespace (aten::, c10d::, torch::autograd::, autograd::engine::...);
            # record_function scopes (ProfilerStep#N, Optimizer.step#..., DataLoader) and user ranges are annotations
            cats.append(op if name != label or "::" in name else annotation)
            names.append(labels.of(name))
            ints.append((start, dur, pid, tid, -1, -1, -1, -1, int(seq.group(1)) if seq else -1, -1))
    a = np.array(ints, dtype=np.int64).reshape(len(ints), 10)
    cat_ids, name_ids = np.array(cats, dtype=np.int64), np.array(names, dtype=np.int64)
    _iterations_as_steps(a, cat_ids == annotation, name_ids, labels)
    return _Events(a, cat_ids, name_ids, a[:, 2].copy()), shapes


def _iterations_as_steps(ints: np.ndarray, is_annotation: np.ndarray, name_ids: np.ndarray, labels: _Labels) -> None:
    """Rename a user's iteration ranges ("iteration 12") ProfilerStep#12 in place, so that they are the steps, when
    no range is already named so: on the thread with the most of them, at least two, one after another (not nested
    or overlapping: a range per iteration)."""
    texts = labels.texts
    annotations = np.unique(name_ids[is_annotation]).tolist()
    if any(STEP_RE.match(texts[i]) for i in annotations):
        return
    numbered = {i: m for i in annotations if (m := _ITERATION_RANGE_RE.match(texts[i]))}
    rows = np.flatnonzero(is_annotation & np.isin(name_ids, list(numbered)))
    if rows.size < 2:
        return
    thread = ints[rows, 2] * (1 << 24) + ints[rows, 3]
    keys, counts = np.unique(thread, return_counts=True)
    rows = rows[thread == keys[np.argmax(counts)]]
    rows = rows[np.argsort(ints[rows, 0], kind="stable")]
    if rows.size < 2 or (ints[rows[1:], 0] < ints[rows[:-1], 0] + ints[rows[:-1], 1]).any():
        return
    for r in rows:
        name_ids[r] = labels.of(f"ProfilerStep#{int(numbered[int(name_ids[r])].group(1))}")


def _device_properties(r: _Report) -> list[dict]:
    """The GPUs as Kineto's deviceProperties name them (id: the CUDA device index; name, numSms, totalGlobalMem,
    computeMajor/Minor where the export records them)."""
    gpus = {}
    for gid, name, sms, mem, major, minor in r.rows("TARGET_INFO_GPU", ["id", "name", "smCount", "totalMemory",
                                                                      "computeMajor", "computeMinor"]):
        gpus[gid] = {"name": str(name or ""), "numSms": sms, "totalGlobalMem": mem, "computeMajor": major,
                     "computeMinor": minor}
    cuda = r.rows("TARGET_INFO_CUDA_DEVICE", ["gpuId", "cudaId", "numMultiprocessors", "computeMajor", "computeMinor"])
    by_index = {}
    for gid, cid, sms, major, minor in cuda:
        if cid is None:
            continue
        p = dict(gpus.get(gid, {"name": ""}))
        for k, v in (("numSms", sms), ("computeMajor", major), ("computeMinor", minor)):
            p[k] = p.get(k) or v
        by_index.setdefault(int(cid), p)
    if not by_index:
        by_index = {int(g): p for g, p in gpus.items() if g is not None}
    out = []
    for i, p in sorted(by_index.items()):
        props = {"id": i, "name": p.get("name", "")}
        props.update({k: int(v) for k, v in p.items() if k != "name" and isinstance(v, int) and v > 0})
        out.append(props)
    return out


def _physical_gpus(r: _Report) -> dict[tuple[int, int], int]:
    """{(process id, CUDA device index in that process): the node's GPU id}: a process given one GPU through
    CUDA_VISIBLE_DEVICES sees it as device 0 (TARGET_INFO_CUDA_DEVICE)."""
    out = {}
    for pid, cid, gid in r.rows("TARGET_INFO_CUDA_DEVICE", ["pid", "cudaId", "gpuId"]):
        if isinstance(pid, int) and isinstance(cid, int) and isinstance(gid, int):
            out[((pid >> 24) & 0xFFFFFF if pid >= 1 << 24 else pid, cid)] = gid
    return out


def read_nsys(path: str | Path, rank: int | None = None) -> list[EventTable]:
    """Read an Nsight Systems SQLite export into one EventTable per process that ran GPU work (module docstring),
    sorted by rank; rank: the rank of a one-process report (else taken from its devices)."""
    from trainperf.trace.foreign_table import table_from_columns

    path = Path(path)
    r = _Report(path)
    if any(t.startswith("rocpd_") for t in r.columns):
        r.db.close()
        raise TrainperfError(f"{path}: a rocpd database (rocprofv3's SQLite output), not read directly: convert it "
                             f"with `rocpd convert --output-format csv -i {path.name}` and pass the folder it writes")
    if not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in r.columns):
        r.db.close()
        raise NotATraceError(f"{path}: an SQLite file with no CUPTI_ACTIVITY_KIND_* table: not an Nsight Systems "
                             "export, or profiled without CUDA tracing (nsys profile --trace=cuda,nvtx)")
    labels = _Labels()
    try:
        t0 = r.epoch_ns()
        device = _device_events(r, t0, labels)
        host, threads, shapes = _host_events(r, t0, labels)
        props = _device_properties(r)
        physical = _physical_gpus(r)
    except sqlite3.Error as e:
        raise TrainperfError(f"{path}: an Nsight Systems export that cannot be read ({e})") from None
    finally:
        r.db.close()
    dev = _concat(device)
    if not len(dev.pid):
        raise TrainperfError(f"{path}: an Nsight Systems export with no kernel, copy or fill: profile the training "
                             "steps with CUDA tracing (nsys profile --trace=cuda,nvtx)")
    calls, everything_host = host[0], _concat(host)
    # device work without its process recorded belongs to the process of the call that launched it
    unknown = dev.pid < 0
    if unknown.any() and len(calls.pid):
        order = np.argsort(calls.ints[:, 4], kind="stable")
        corr = calls.ints[order, 4]
        at = np.clip(np.searchsorted(corr, dev.ints[unknown, 4]), 0, len(corr) - 1)
        found = corr[at] == dev.ints[unknown, 4]
        dev.pid[np.flatnonzero(unknown)[found]] = calls.pid[order[at[found]]]
    pids = np.unique(dev.pid[dev.pid >= 0])
    single = pids.size <= 1  # one process: everything is its own (work of an unknown process too)
    groups = [0] if single else pids.tolist()
    lowest = {p: physical.get((p, d), d) for p in groups
              for d in [int(dev.ints[dev.pid == p, 2].min())]} if not single else {0: 0}
    order = sorted(groups, key=lambda p: (lowest[p], p))
    texts = labels.texts
    tables = []
    for i, p in enumerate(order):
        # one GPU process: its device work whatever process it was recorded under, and its host events only (a
        # DataLoader worker's or the launcher's are other processes'); none known: every host event
        host_pid = int(pids[0]) if single and pids.size else None if single else p
        host = everything_host if host_pid is None else _rows_of(everything_host, host_pid)
        mine = _concat([dev if single else _rows_of(dev, p), host])
        table = table_from_columns([texts[c] for c in mine.cat.tolist()], [texts[c] for c in mine.name.tolist()],
                                   mine.ints, source=str(path), producer="nsys",
                                   thread_names={k: v for k, v in threads.items() if host_pid in (None, k[0])})
        if props:
            table.metadata["deviceProperties"] = props
        table.metadata["profiler"] = {"record_shapes": shapes}
        if not single:
            table.rank = lowest[p] if len(set(lowest.values())) == len(order) else i
        elif rank is not None:
            table.rank = rank
        tables.append(table)
    return tables


def _concat(parts: list[_Events]) -> _Events:
    """One _Events of several sources' rows."""
    return _Events(np.concatenate([p.ints for p in parts]), np.concatenate([p.cat for p in parts]),
                   np.concatenate([p.name for p in parts]), np.concatenate([p.pid for p in parts]))


def _rows_of(e: _Events, pid: int) -> _Events:
    """The rows of one process."""
    m = e.pid == pid
    return _Events(e.ints[m], e.cat[m], e.name[m], e.pid[m])
