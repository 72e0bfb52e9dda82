"""rocprofv3 JSON (`rocprofv3 --kernel-trace --hip-trace --memory-copy-trace --marker-trace
--output-format json`, `<pid>_results.json`) into the event table.

The document is `{"rocprofiler-sdk-tool": [ {per profiled process} ]}` (one object instead of the
list in early versions). Each process holds `metadata` (pid), `agents` (CPU and GPU agents, `id.handle`,
`type` 1 CPU / 2 GPU), `kernel_symbols` (kernel id -> names), `strings.buffer_records` (per record kind
id, its name and its operation names) and `buffer_records`: lists per kind with `start_timestamp` /
`end_timestamp` (ns), `correlation_id.internal`, `thread_id`, `kind`, `operation`. Field names follow
rocprofiler-sdk's own output tests (tests/rocprofv3/tracing/validate.py).

How records map onto the Kineto vocabulary (trace.events):
- `kernel_dispatch` (`kernel_dispatches` in early versions): a kernel on its GPU (pid = the GPU's index
  among GPU agents) and queue (stream = the HIP stream id when recorded, else the queue handle), named by
  its kernel symbol; correlation = the internal correlation id, shared with the HIP call that launched it;
- `memory_copy`: a memcpy ("Memcpy HtoD/DtoH/DtoD/HtoH (rocprofv3)") on the GPU end of the copy, bytes kept;
- `hip_api` / `hsa_api`: runtime calls on their host thread (the launches: hipLaunchKernel, hipMemcpyAsync...);
- `marker_api` (roctx ranges, named by their message when the document lists it): user annotations,
  so a range named "ProfilerStep#N" marks a step;
- `rccl_api`: host ops named after the RCCL call.
Other kinds (allocations, scratch memory, counters, PC samples) are skipped and counted.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable

TOOL_KEY = "rocprofiler-sdk-tool"
_COPY_NAMES = {"HOST_TO_DEVICE": "HtoD", "DEVICE_TO_HOST": "DtoH", "DEVICE_TO_DEVICE": "DtoD",
               "HOST_TO_HOST": "HtoH"}
_HOST_KINDS = {"hip_api": "cuda_runtime", "hsa_api": "cuda_driver", "marker_api": "user_annotation",
               "rccl_api": "cpu_op"}


def looks_like_rocprof(head: bytes) -> bool:
    """True when the start of a JSON file is a rocprofv3 results document."""
    return head.lstrip()[:1] == b"{" and b'"' + TOOL_KEY.encode() + b'"' in head[:4096]


def _corr(rec: dict) -> int:
    c = rec.get("correlation_id")
    v = c.get("internal", -1) if isinstance(c, dict) else c
    return int(v) if isinstance(v, (int, float)) else -1


def _handle(v) -> int:
    v = v.get("handle", -1) if isinstance(v, dict) else v
    return int(v) if isinstance(v, (int, float)) else -1


def _times(rec: dict) -> tuple[int, int] | None:
    s, e = rec.get("start_timestamp"), rec.get("end_timestamp")
    if not isinstance(s, (int, float)) or not isinstance(e, (int, float)):
        return None
    return int(s), max(int(e) - int(s), 0)


class _Names:
    """Operation and kind names of one process (strings.buffer_records), kernel names, GPU indices."""

    def __init__(self, proc: dict):
        strings = proc.get("strings") if isinstance(proc.get("strings"), dict) else {}
        self.kinds: dict[int, tuple[str, list]] = {}
        for i, k in enumerate(strings.get("buffer_records") or []):
            if isinstance(k, dict):
                self.kinds[int(k.get("kind_id", i)) if isinstance(k.get("kind_id"), int) else i] = (
                    str(k.get("kind", "")), list(k.get("operations") or []))
        self.markers = {}
        for m in strings.get("marker_api") or []:
            if isinstance(m, dict) and "key" in m:
                self.markers[m["key"]] = str(m.get("value", ""))
        syms = proc.get("kernel_symbols") or []
        items = syms.items() if isinstance(syms, dict) else enumerate(syms)
        self.kernels: dict[int, str] = {}
        for i, s in items:
            if isinstance(s, dict):
                kid = s.get("kernel_id", i)
                self.kernels[int(kid)] = str(s.get("formatted_kernel_name") or s.get("demangled_kernel_name")
                                             or s.get("truncated_kernel_name") or s.get("kernel_name") or kid)
        gpus = [a for a in proc.get("agents") or [] if isinstance(a, dict) and a.get("type") == 2]
        gpus.sort(key=lambda a: (a.get("logical_node_id", 0), _handle(a.get("id"))))
        self.gpus = gpus
        self.gpu_index = {_handle(a.get("id")): i for i, a in enumerate(gpus)}
        self.agent_type = {_handle(a.get("id")): a.get("type") for a in proc.get("agents") or [] if isinstance(a, dict)}

    def device_properties(self) -> list[dict]:
        """The GPU agents in index order as Kineto's deviceProperties name a device: name (the product name, else
        the gfx target), numSms (the CU count), totalGlobalMem (the local memory's bytes, where recorded and not 0)."""
        out = []
        for a in self.gpus:
            props = {"id": len(out), "name": str(a.get("product_name") or a.get("name") or "")}
            if isinstance(a.get("cu_count"), int) and a["cu_count"] > 0:
                props["numSms"] = a["cu_count"]
            if isinstance(a.get("local_mem_size"), int) and a["local_mem_size"] > 0:
                props["totalGlobalMem"] = a["local_mem_size"]
            out.append(props)
        return out

    def operation(self, rec: dict) -> str:
        kind, ops = self.kinds.get(rec.get("kind"), ("", []))
        op = rec.get("operation")
        return str(ops[op]) if isinstance(op, int) and 0 <= op < len(ops) else f"{kind or 'operation'} {op}"

    def gpu(self, agent) -> int:
        return self.gpu_index.get(_handle(agent), _handle(agent))


def process_events(proc: dict) -> tuple[list, dict, int, list]:
    """(events in build_table's tuple form, thread names, records skipped, its GPUs as deviceProperties) of one
    profiled process."""
    names = _Names(proc)
    meta = proc.get("metadata") if isinstance(proc.get("metadata"), dict) else {}
    pid = int(meta.get("pid", 0)) if isinstance(meta.get("pid"), (int, float)) else 0
    records = proc.get("buffer_records") if isinstance(proc.get("buffer_records"), dict) else {}
    events, threads, skipped = [], {}, 0
    for key, recs in records.items():
        if not isinstance(recs, list):
            continue
        if key not in ("kernel_dispatch", "kernel_dispatches", "memory_copy") and key not in _HOST_KINDS:
            skipped += len(recs)
            continue
        for rec in recs:
            t = _times(rec) if isinstance(rec, dict) else None
            if t is None:
                skipped += 1
                continue
            ts, dur = t
            corr = _corr(rec)
            if key in ("kernel_dispatch", "kernel_dispatches"):
                info = rec.get("dispatch_info") if isinstance(rec.get("dispatch_info"), dict) else {}
                kid = info.get("kernel_id", -1)
                stream = _handle(rec.get("stream_id"))
                stream = stream if stream > 0 else _handle(info.get("queue_id"))
                gpu = names.gpu(info.get("agent_id"))
                events.append(("kernel", names.kernels.get(kid, f"kernel {kid}"), gpu, stream, ts, dur, corr,
                               max(stream, 0), -1, -1))
                threads[(gpu, stream)] = f"GPU {gpu} queue {stream}"
            elif key == "memory_copy":
                op = names.operation(rec).replace("MEMORY_COPY_", "")
                src, dst = rec.get("src_agent_id"), rec.get("dst_agent_id")
                gpu = names.gpu(dst if names.agent_type.get(_handle(dst)) == 2 else src)
                stream = _handle(rec.get("stream_id"))
                stream = stream if stream > 0 else 0
                nbytes = rec.get("bytes", -1)
                events.append(("gpu_memcpy", f"Memcpy {_COPY_NAMES.get(op, op)} (rocprofv3)", gpu, stream, ts, dur,
                               corr, stream, -1, int(nbytes) if isinstance(nbytes, (int, float)) else -1))
            else:
                tid = int(rec.get("thread_id", 0)) if isinstance(rec.get("thread_id"), (int, float)) else 0
                name = names.operation(rec)
                if key == "marker_api":
                    name = names.markers.get(corr, name)
                events.append((_HOST_KINDS[key], name, pid, tid, ts, dur, corr, -1, -1, -1))
                threads.setdefault((pid, tid), f"thread {tid}")
    return events, threads, skipped, names.device_properties()


def read_rocprof(path: str | Path, rank: int | None = None) -> EventTable:
    """Read a rocprofv3 JSON results file into an EventTable (module docstring); every profiled process
    of the file goes into the one table (one file per rank)."""
    from trainperf.trace.foreign_table import build_table

    path = Path(path)
    try:
        import gzip

        raw = path.read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError) as e:
        raise TrainperfError(f"{path}: not a readable rocprofv3 JSON file ({str(e).splitlines()[0]})") from None
    procs = doc.get(TOOL_KEY) if isinstance(doc, dict) else None
    if isinstance(procs, dict):
        procs = [procs]
    if not isinstance(procs, list):
        raise TrainperfError(f"{path}: no '{TOOL_KEY}' list; is this rocprofv3 --output-format json output?")
    events, threads, skipped, devices = [], {}, 0, []
    for proc in procs:
        if isinstance(proc, dict):
            e, t, s, d = process_events(proc)
            events += e
            threads.update(t)
            skipped += s
            devices = devices or d
    table = build_table(events, source=str(path), producer="rocprofv3", rank=rank, skipped=skipped,
                        thread_names=threads)
    if devices:
        table.metadata["deviceProperties"] = devices
    return table
