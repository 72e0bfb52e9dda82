"""Write a Kineto trace's events as Nsight Systems' SQLite export would hold them, by the export's schema (NVIDIA's
"SQLite Export Schema Reference": StringIds, CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET / _RUNTIME, NVTX_EVENTS,
ThreadNames, TARGET_INFO_GPU / _CUDA_DEVICE, TARGET_INFO_SESSION_START_TIME), so that a reader's result can be
compared with the same trace read as Kineto JSON. What nsys does not record is left out: Python frames, the GPU
copies of annotations, flow events; operators become the NVTX ranges PyTorch's emitter writes ("aten::mm, seq = 7,
op_id = 3"), runtime calls carry nsys's API version suffix ("cudaLaunchKernel_v7000")."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
    isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
    smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, ctxId INTEGER);
CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER, uuid TEXT,
    numMultiprocessors INTEGER, computeMajor INTEGER, computeMinor INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
    launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
    gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
    blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER,
    srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER,
    dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
    globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER,
    contextId INTEGER, greenContextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
    graphId INTEGER, graphExecId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL,
    globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL,
    callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
    domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
    int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
"""
COPY_KINDS = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
MEMORY_KINDS = {"Pageable": 1, "Pinned": 2, "Device": 3, "Managed": 5}
PUSH_POP_RANGE = 59


def read_doc(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _copy_kinds(name: str) -> tuple[int, int, int]:
    """copyKind, srcKind, dstKind of a Kineto copy name, "Memcpy HtoD (Pageable -> Device)"."""
    kind = next((v for k, v in COPY_KINDS.items() if k in name), 0)
    inside = name[name.find("(") + 1:name.rfind(")")] if "(" in name else ""
    src, _, dst = inside.partition(" -> ")
    return kind, MEMORY_KINDS.get(src.strip(), 0), MEMORY_KINDS.get(dst.strip(), 0)


def write_nsys(docs: list[dict], path: Path, *, pids: list[int] | None = None, graphs: str = "node") -> Path:
    """Write the events of one or several Kineto documents (one a process: several make a report of a job's ranks)
    into one nsys-style SQLite export at path; pids: each document's process id (default: its own); graphs: "node"
    keeps the kernels of CUDA graph replays (--cuda-graph-trace=node), "graph" writes one GRAPH_TRACE row per replay
    in their place, from its first kernel's start to its last's end (nsys's default)."""
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[s], s))
        return strings[s]

    events = [(i, e) for i, d in enumerate(docs) for e in d["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    t0 = int(min(float(e["ts"]) for _, e in events) * 1000)

    def ns(us) -> int:
        return int(round(float(us) * 1000)) - t0

    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (t0,))
    for gpu in docs[0].get("deviceProperties") or []:
        db.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, smCount) VALUES (0, ?, ?, ?, ?)",
                   (gpu["id"], gpu.get("name", ""), gpu.get("totalGlobalMem", 0), gpu.get("numSms", 0)))
        db.execute("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, 0, '', ?, ?, ?)",
                   (gpu["id"], gpu["id"], gpu.get("numSms", 0), gpu.get("computeMajor", 0),
                    gpu.get("computeMinor", 0)))
    host_pid = {}
    for i, d in enumerate(docs):
        host = [e for e in d["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op")]
        host_pid[i] = pids[i] if pids else int(host[0]["pid"]) if host else 1000 + i
    threads = set()
    replays: dict[tuple, list] = {}  # (doc, correlation of a cudaGraphLaunch) -> [start, end, device, stream]
    graph_launches = {(i, (e.get("args") or {}).get("correlation")) for i, e in events
                      if e.get("name", "").startswith("cudaGraphLaunch")} if graphs == "graph" else set()
    for i, e in events:
        cat, name, args = e.get("cat", ""), e.get("name", ""), e.get("args") or {}
        start = ns(e["ts"])
        end = start + int(round(float(e["dur"]) * 1000))
        gpid = host_pid[i] << 24
        corr = args.get("correlation")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            dev, stream = int(args.get("device", e.get("pid", 0))), int(args.get("stream", e.get("tid", 0)))
            if (i, corr) in graph_launches:
                r = replays.setdefault((i, corr), [start, end, dev, stream])
                r[0], r[1] = min(r[0], start), max(r[1], end)
                continue
            if cat == "kernel":
                grid, block = args.get("grid", [1, 1, 1]), args.get("block", [1, 1, 1])
                db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
                           "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, gridY, "
                           "gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
                           "localMemoryPerThread, localMemoryTotal, gridId) "
                           "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 32, ?, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0)",
                           (start, end, dev, stream, corr, gpid, sid(name), sid(name.split("(")[0][-60:]),
                            *grid, *block))
            elif cat == "gpu_memcpy":
                db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
                           "correlationId, globalPid, bytes, copyKind, srcKind, dstKind) "
                           "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?)",
                           (start, end, dev, stream, corr, gpid, int(args.get("bytes", 0)), *_copy_kinds(name)))
            else:
                db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId, streamId, "
                           "correlationId, globalPid, value, bytes, memKind) VALUES (?, ?, ?, 1, ?, ?, ?, 0, ?, 3)",
                           (start, end, dev, stream, corr, gpid, int(args.get("bytes", 0))))
            continue
        if cat not in ("cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"):
            continue
        gtid = gpid | (int(e.get("tid", 0)) & 0xFFFFFF)
        if cat in ("cuda_runtime", "cuda_driver"):
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0, NULL)",
                       (start, end, gtid, corr, sid(f"{name}_v7000")))
        elif cat in ("cpu_op", "user_annotation"):
            # PyTorch's emitter appends ", seq = N, op_id = M" to an op that has an autograd sequence number
            seq = args.get("Sequence number", -1)
            text = f"{name}, seq = {seq}, op_id = 1" if cat == "cpu_op" and seq >= 0 else name
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)",
                       (start, end, PUSH_POP_RANGE, text, gtid))
        if gtid not in threads:
            threads.add(gtid)
            db.execute("INSERT INTO ThreadNames VALUES (?, 0, ?)", (sid(f"thread {e.get('tid')}"), gtid))
    for n, ((i, corr), (start, end, dev, stream)) in enumerate(sorted(replays.items())):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, 1, NULL, ?, ?, ?, 7, ?)",
                   (start, end, dev, stream, corr, host_pid[i] << 24, n))
    db.commit()
    db.close()
    return path
