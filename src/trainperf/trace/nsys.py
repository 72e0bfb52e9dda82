"""Nsight Systems' SQLite export (`nsys export --type sqlite -o report.sqlite report.nsys-rep`) into the event table.

Tables read (NVIDIA's export schema; columns looked up by name, since they vary across versions, and a table
the report lacks is skipped):
- `CUPTI_ACTIVITY_KIND_KERNEL`: a kernel on its device (pid = `deviceId`, tid = `streamId`), named by
  `demangledName` (else `shortName`, else `name`: ids into `StringIds`); `correlationId` links it to its launch;
- `CUPTI_ACTIVITY_KIND_MEMCPY` / `_MEMSET`: copies and fills, named as Kineto names them ("Memcpy HtoD (Pageable ->
  Device)" from CUPTI's `copyKind`, `srcKind` and `dstKind` enums), bytes kept;
- `CUPTI_ACTIVITY_KIND_RUNTIME`: CUDA runtime and driver calls on their host thread (`globalTid`), the API version
  suffix nsys adds dropped ("cudaLaunchKernel_v7000" -> "cudaLaunchKernel");
- `NVTX_EVENTS` ranges (push/pop and start/end; marks skipped): PyTorch's operator ranges (`nsys profile
  --pytorch=autograd-nvtx`, or `torch.autograd.profiler.emit_nvtx()`: "aten::mm, seq = 12, op_id = 3, sizes =
  [...]", or any range named in a C++ namespace) become host ops named without their suffix; every other range (`torch.cuda.nvtx.range`,
  record_function, "ProfilerStep#N") a user annotation, so a range named ProfilerStep#N marks a step;
- `ThreadNames`, `TARGET_INFO_GPU` / `TARGET_INFO_CUDA_DEVICE` (the devices as Kineto's deviceProperties name them)
  and `TARGET_INFO_SESSION_START_TIME` (times are ns from the session's start: the epoch is added, so that the
  ranks of one job exported apart share a clock).

A report of several processes that ran GPU work (`nsys profile torchrun --nproc-per-node 8 ...`) holds several
ranks: one table per such process, ranked by the lowest device its kernels ran on (torchrun's LOCAL_RANK), else
by process id. Hand-written: no package reads the export into events (nsys's own recipes are SQL over it).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from trainperf.errors import NotATraceError, TrainperfError
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


def looks_like_sqlite(head: bytes) -> bool:
    """True when a file's first bytes are an SQLite database's header."""
    return head.startswith(SQLITE_MAGIC)


def _pid_tid(global_tid: int) -> tuple[int, int]:
    """(process id, thread id) of nsys's serialized globalTid (bits 24-47 the pid, 0-23 the tid)."""
    return (global_tid >> 24) & 0xFFFFFF, global_tid & 0xFFFFFF


class _Report:
    """One open export: its tables' columns and its string table."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            tables = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        except sqlite3.Error as e:
            raise TrainperfError(f"{path}: not a readable SQLite file ({e})") from None
        self.columns = {t: {r[1] for r in self.db.execute(f'PRAGMA table_info("{t}")')} for t in tables}
        self.strings = dict(self.db.execute("SELECT id, value FROM StringIds")) if "StringIds" in self.columns else {}

    def rows(self, table: str, wanted: list[str]) -> list[tuple]:
        """The table's rows, the wanted columns in order (None where the table lacks one); [] without the table."""
        have = self.columns.get(table)
        if not have:
            return []
        cols = ", ".join(f'"{c}"' if c in have else "NULL" for c in wanted)
        return self.db.execute(f'SELECT {cols} FROM "{table}"').fetchall()

    def string(self, sid, fallback: str = "") -> str:
        return self.strings.get(sid, fallback) if sid is not None else fallback

    def epoch_ns(self) -> int:
        row = self.rows("TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"])
        return int(row[0][0]) if row and isinstance(row[0][0], int) else 0


def _device_events(r: _Report, t0: int) -> list:
    """Kernels, copies and fills as build_table tuples, the process id that ran each last (None where unrecorded)."""
    events = []

    def add(cat, name, start, end, device, stream, corr, nbytes, gpid):
        if not isinstance(start, int) or not isinstance(end, int):
            return
        device, stream = int(device or 0), int(stream or 0)
        events.append((cat, name, device, stream, start + t0, max(end - start, 0), -1 if corr is None else int(corr),
                       stream, -1, -1 if nbytes is None else int(nbytes), -1, -1, gpid))

    for s, e, dev, st, corr, dem, short, name, gpid in r.rows(
            "CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end", "deviceId", "streamId", "correlationId", "demangledName",
                                           "shortName", "name", "globalPid"]):
        label = r.string(dem) or r.string(short) or r.string(name, f"kernel {dem}")
        add("kernel", label, s, e, dev, st, corr, None, _pid(gpid))
    for s, e, dev, st, corr, nbytes, kind, src, dst, gpid in r.rows(
            "CUPTI_ACTIVITY_KIND_MEMCPY", ["start", "end", "deviceId", "streamId", "correlationId", "bytes",
                                           "copyKind", "srcKind", "dstKind", "globalPid"]):
        label = (f"Memcpy {_COPY_KINDS.get(kind, 'Unknown')} ({_MEMORY_KINDS.get(src, 'Unknown')} -> "
                 f"{_MEMORY_KINDS.get(dst, 'Unknown')})")
        add("gpu_memcpy", label, s, e, dev, st, corr, nbytes, _pid(gpid))
    for s, e, dev, st, corr, nbytes, mem, gpid in r.rows(
            "CUPTI_ACTIVITY_KIND_MEMSET", ["start", "end", "deviceId", "streamId", "correlationId", "bytes",
                                           "memKind", "globalPid"]):
        add("gpu_memset", f"Memset ({_MEMORY_KINDS.get(mem, 'Device')})", s, e, dev, st, corr, nbytes, _pid(gpid))
    return events


def _pid(global_pid) -> int | None:
    """The process id of nsys's serialized globalPid (its bits 24-47), None when absent."""
    return None if global_pid is None else (int(global_pid) >> 24) & 0xFFFFFF


def _host_events(r: _Report, t0: int) -> tuple[list, dict]:
    """Runtime calls and NVTX ranges as build_table tuples with (seq, fwd_tid) (their process id last), and thread
    names. The forward thread is not recorded (-1: autograd_links reads an op inside a backward node as backward)."""
    events = []
    for s, e, gtid, corr, name_id in r.rows("CUPTI_ACTIVITY_KIND_RUNTIME",
                                             ["start", "end", "globalTid", "correlationId", "nameId"]):
        if not isinstance(s, int) or not isinstance(e, int):
            continue
        name = _API_VERSION_RE.sub("", r.string(name_id, f"call {name_id}"))
        pid, tid = _pid_tid(int(gtid or 0))
        cat = "cuda_driver" if name.startswith("cu") and not name.startswith("cuda") else "cuda_runtime"
        events.append((cat, name, pid, tid, s + t0, max(e - s, 0), -1 if corr is None else int(corr), -1, -1, -1,
                       -1, -1, pid))
    for s, e, gtid, text, text_id, etype in r.rows("NVTX_EVENTS",
                                                    ["start", "end", "globalTid", "text", "textId", "eventType"]):
        if not isinstance(s, int) or not isinstance(e, int) or e <= s or etype == _NVTX_MARK:
            continue
        label = text if isinstance(text, str) else r.string(text_id)
        if not label:
            continue
        name = _NVTX_OP_SUFFIX_RE.sub("", label)
        # an operator is named in its C++ namespace (aten::, c10d::, torch::autograd::, autograd::engine::...);
        # record_function scopes (ProfilerStep#N, Optimizer.step#..., DataLoader) and user ranges are annotations
        cat = "cpu_op" if name != label or "::" in name else "user_annotation"
        pid, tid = _pid_tid(int(gtid or 0))
        seq = _NVTX_SEQ_RE.search(label)
        events.append((cat, name, pid, tid, s + t0, e - s, -1, -1, -1, -1, int(seq.group(1)) if seq else -1, -1, pid))
    threads = {}
    for name_id, gtid in r.rows("ThreadNames", ["nameId", "globalTid"]):
        if gtid is not None:
            threads[_pid_tid(int(gtid))] = r.string(name_id, f"thread {int(gtid) & 0xFFFFFF}")
    return events, threads


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


def read_nsys(path: str | Path, rank: int | None = None) -> list[EventTable]:
    """Read an Nsight Systems SQLite export into one EventTable per process that ran GPU work (module docstring),
    sorted by rank; rank: the rank of a one-process report (else taken from its devices)."""
    from trainperf.trace.producers import build_table

    path = Path(path)
    r = _Report(path)
    if not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in r.columns):
        raise NotATraceError(f"{path}: an SQLite file with no CUPTI_ACTIVITY_KIND_* table: not an Nsight Systems "
                             "export, or profiled without CUDA tracing (nsys profile --trace=cuda,nvtx)")
    try:
        t0 = r.epoch_ns()
        device = _device_events(r, t0)
        host, threads = _host_events(r, t0)
        props = _device_properties(r)
    except sqlite3.Error as e:
        raise TrainperfError(f"{path}: an Nsight Systems export that cannot be read ({e})") from None
    finally:
        r.db.close()
    # the processes that launched work: a kernel's globalPid where recorded, else its launch's process
    launcher = {e[6]: e[-1] for e in host if e[0] != "user_annotation" and e[6] >= 0}
    by_pid: dict[int, list] = {}
    for e in device:
        pid = e[-1] if e[-1] is not None else launcher.get(e[6], -1)
        by_pid.setdefault(pid, []).append(e[:-1])
    if len([p for p in by_pid if p >= 0]) <= 1:  # one process: everything is its (work of unknown process too)
        by_pid = {0: [e for v in by_pid.values() for e in v]} if by_pid else {}
    lowest = {p: min(e[2] for e in by_pid[p]) for p in by_pid if p >= 0}
    order = sorted(lowest, key=lambda p: (lowest[p], p))
    tables = []
    for i, pid in enumerate(order):
        mine = by_pid[pid] + [e[:-1] for e in host if e[-1] == pid or len(order) == 1]
        table = build_table(mine, source=str(path), producer="nsys", skipped=0,
                            thread_names={k: v for k, v in threads.items() if k[0] == pid or len(order) == 1})
        if props:
            table.metadata["deviceProperties"] = props
        if len(order) > 1:
            table.rank = lowest[pid] if len(set(lowest.values())) == len(order) else i
        elif rank is not None:
            table.rank = rank
        tables.append(table)
    if not tables:
        raise TrainperfError(f"{path}: an Nsight Systems export with no kernel, copy or fill: profile the training "
                             "steps with CUDA tracing (nsys profile --trace=cuda,nvtx)")
    return tables
