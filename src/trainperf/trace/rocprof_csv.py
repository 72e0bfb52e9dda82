"""rocprofv3 CSV output (`rocprofv3 --kernel-trace --hip-trace --memory-copy-trace --marker-trace
--output-format csv`; CSV was the default format before rocpd) into the event table, the same
vocabulary as the JSON reader (trace/rocprof.py).

One profiled process writes one file per kind, named `<prefix>_<kind>.csv` (prefix: the pid, or
what `-o` names): `kernel_trace`, `hip_api_trace`, `hsa_api_trace`, `memory_copy_trace`,
`marker_api_trace`, `rccl_api_trace`. Columns, from rocprofiler-sdk's CSV writer
(source/lib/output/generateCSV.cpp) and its documented examples (source/docs/data/*.csv):
- kernel_trace: Kind, Agent_Id, Queue_Id, Stream_Id (newer versions), Thread_Id, Dispatch_Id, Kernel_Id,
  Kernel_Name, Correlation_Id, Start_Timestamp, End_Timestamp, then register, LDS and grid columns;
- hip_api_trace / hsa_api_trace / marker_api_trace / rccl_api_trace: Domain, Function, Process_Id,
  Thread_Id, Correlation_Id, Start_Timestamp, End_Timestamp (a roctx range's Function is its message);
- memory_copy_trace: Kind, Direction (MEMORY_COPY_HOST_TO_DEVICE...), Stream_Id (newer versions),
  Source_Agent_Id, Destination_Agent_Id, Correlation_Id, Start_Timestamp, End_Timestamp (no bytes).
Times are ns. Agent ids read "Agent 4" (the default, relative index over all agents), "GPU 1"
(`--agent-index=type-relative`) or a bare number (older versions, or absolute node ids). A GPU's index
is its place among the GPU agents in logical-node order, as the JSON reader numbers them: "GPU N" is
GPU N; "Agent N" and bare numbers are looked up in `<prefix>_agent_info.csv` (Node_Id, Logical_Node_Id,
Agent_Type), which every rocprofv3 CSV run writes beside its traces, by logical node id first (the
default labels) and node id second (absolute labels). Without that file they are numbered in order
among the agents that ran a kernel or sit on the device end of a copy (CPU agents never do): right
when a process used the first GPUs, low when it used, say, only the fourth. The kernels' queue is
their stream unless a HIP stream id (> 0) is recorded, as in the JSON reader.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable

KINDS = ("kernel_trace", "hip_api_trace", "hsa_api_trace", "memory_copy_trace", "marker_api_trace",
         "rccl_api_trace")
CSV_RE = re.compile(r"^(?P<prefix>.*?)_?(?P<kind>" + "|".join(KINDS) + r")\.csv$")
_HOST_KINDS = {"hip_api_trace": "cuda_runtime", "hsa_api_trace": "cuda_driver",
               "marker_api_trace": "user_annotation", "rccl_api_trace": "cpu_op"}
_COPY_NAMES = {"HOST_TO_DEVICE": "HtoD", "DEVICE_TO_HOST": "DtoH", "DEVICE_TO_DEVICE": "DtoD",
               "HOST_TO_HOST": "HtoH"}
_AGENT_RE = re.compile(r"^\s*(?:(?P<type>[A-Za-z]+)[\s_-]*)?(?P<n>\d+)\s*$")
_TIMES = ("Start_Timestamp", "End_Timestamp")
_REQUIRED = {"kernel_trace": ("Agent_Id", "Queue_Id", "Kernel_Name", "Correlation_Id") + _TIMES,
             "memory_copy_trace": ("Direction", "Source_Agent_Id", "Destination_Agent_Id", "Correlation_Id") + _TIMES}
_API_COLUMNS = ("Function", "Process_Id", "Thread_Id", "Correlation_Id") + _TIMES
_WANTED = {"kernel_trace": ("Agent_Id", "Queue_Id", "Stream_Id", "Kernel_Name", "Correlation_Id") + _TIMES,
           "memory_copy_trace": ("Direction", "Stream_Id", "Source_Agent_Id", "Destination_Agent_Id",
                                 "Correlation_Id") + _TIMES}
_TEXT = ("Agent_Id", "Source_Agent_Id", "Destination_Agent_Id", "Kernel_Name", "Function", "Direction")


def is_rocprof_csv(path: str | Path) -> bool:
    """True when a file's name is one of rocprofv3's CSV trace files (`<prefix>_kernel_trace.csv` ...)."""
    return CSV_RE.match(Path(path).name) is not None


def csv_groups(folder: Path) -> dict[str, dict[str, Path]]:
    """{prefix: {kind: path}} of the rocprofv3 CSV trace files in a folder: one group per profiled process."""
    groups: dict[str, dict[str, Path]] = {}
    for p in sorted(folder.iterdir()):
        m = CSV_RE.match(p.name)
        if m and p.is_file():
            groups.setdefault(m.group("prefix"), {})[m.group("kind")] = p
    return groups


def group_of(path: Path) -> dict[str, Path]:
    """The CSV files of the process a rocprofv3 CSV file belongs to (same folder, same prefix)."""
    m = CSV_RE.match(path.name)
    if m is None:
        raise TrainperfError(f"{path}: not a rocprofv3 CSV trace file (<prefix>_kernel_trace.csv, ...)")
    return csv_groups(path.parent).get(m.group("prefix"), {m.group("kind"): path})


def _read(path: Path, required: tuple[str, ...], wanted: tuple[str, ...]):
    """The wanted columns (those present) of one CSV file as a pyarrow Table; ids and times as int64, agent ids,
    names and directions as text (agent ids mix numbers and labels)."""
    import csv

    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TrainperfError(f"{path}: not a readable CSV file ({str(e).splitlines()[0]})") from None
    if not header:
        raise TrainperfError(f"{path}: not a readable CSV file (empty)")
    missing = [c for c in required if c not in header]
    if missing:
        raise TrainperfError(f"{path}: no {', '.join(repr(c) for c in missing)} column; is this rocprofv3 "
                             "--output-format csv output?")
    cols = [c for c in wanted if c in header]
    types = {c: (pa.string() if c in _TEXT else pa.int64()) for c in cols}
    try:
        return pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(column_types=types, include_columns=cols))
    except (OSError, pa.ArrowInvalid) as e:
        raise TrainperfError(f"{path}: not a readable rocprofv3 CSV file ({str(e).splitlines()[0]})") from None


def _ints(table, name: str, default: int = -1):
    """An int64 column as a NumPy array (absent column or empty cells: default)."""
    import numpy as np
    import pyarrow.compute as pc

    if name not in table.column_names:
        return np.full(table.num_rows, default, dtype=np.int64)
    return pc.fill_null(table.column(name), default).to_numpy().astype(np.int64, copy=False)


def _agent(label) -> tuple[str, int] | None:
    """("gpu" / "agent", number) of an Agent_Id cell, or None when unreadable."""
    m = _AGENT_RE.match(str(label)) if label is not None else None
    if m is None:
        return None
    return ("gpu" if (m.group("type") or "").lower() == "gpu" else "agent"), int(m.group("n"))


def _gpu_of(column, gpus: dict):
    """GPU index of each cell of an agent-id column, -1 where it is no GPU."""
    import numpy as np

    enc = column.combine_chunks().dictionary_encode() if column.num_chunks else None
    if enc is None or not len(enc):
        return np.zeros(0, dtype=np.int64)
    lut = np.array([gpus.get(_agent(a), -1) for a in enc.dictionary.to_pylist()] + [-1], dtype=np.int64)
    idx = enc.indices.fill_null(len(lut) - 1).to_numpy().astype(np.int64)
    return lut[idx]


def read_rocprof_csv(path: str | Path, rank: int | None = None) -> EventTable:
    """Read the rocprofv3 CSV files of one profiled process (any one of them names the group) into an
    EventTable (module docstring)."""
    import numpy as np

    from trainperf.trace.foreign_table import table_from_columns

    path = Path(path)
    group = group_of(path)
    tables = {k: _read(p, _REQUIRED.get(k, _API_COLUMNS), _WANTED.get(k, _API_COLUMNS)) for k, p in group.items()}
    agents = _agent_rows(path)
    gpus = (_agent_info(agents) if agents else None) or _gpu_numbers(tables)
    cats: list[str] = []
    names: list = []
    ints: list[np.ndarray] = []
    threads: dict = {}
    skipped = 0

    def add(cat: str, name_list: list, *, pid, tid, ts, end, corr, stream, keep) -> np.ndarray:
        """Append the rows of one CSV kind where ``keep`` holds and the span is well formed (0 <= ts <= end,
        ns); count the others as skipped; return the appended rows' indices in that file."""
        nonlocal skipped
        keep = keep & (ts >= 0) & (end >= ts)
        skipped += int((~keep).sum())
        idx = np.flatnonzero(keep)
        cats.extend([cat] * idx.size)
        names.extend(name_list[i] for i in idx.tolist())
        none = np.full(idx.size, -1, dtype=np.int64)
        ints.append(np.column_stack((ts[idx], end[idx] - ts[idx], pid[idx], tid[idx], corr[idx], stream[idx], none,
                                     none)))
        return idx

    k = tables.get("kernel_trace")
    if k is not None and k.num_rows:
        gpu = _gpu_of(k.column("Agent_Id"), gpus)
        stream = _ints(k, "Stream_Id", 0)
        q = np.where(stream > 0, stream, _ints(k, "Queue_Id", 0))
        idx = add("kernel", k.column("Kernel_Name").to_pylist(), pid=gpu, tid=q, ts=_ints(k, "Start_Timestamp"),
                  end=_ints(k, "End_Timestamp"), corr=_ints(k, "Correlation_Id"), stream=np.maximum(q, 0),
                  keep=gpu >= 0)
        for g, s, is_stream in set(zip(gpu[idx].tolist(), q[idx].tolist(), (stream[idx] > 0).tolist())):
            threads[(g, s)] = f"GPU {g} {'stream' if is_stream else 'queue'} {s}"
    c = tables.get("memory_copy_trace")
    if c is not None and c.num_rows:
        dst, src = _gpu_of(c.column("Destination_Agent_Id"), gpus), _gpu_of(c.column("Source_Agent_Id"), gpus)
        gpu = np.where(dst >= 0, dst, src)
        direction = [str(d).replace("MEMORY_COPY_", "") for d in c.column("Direction").to_pylist()]
        label = [f"Memcpy {_COPY_NAMES.get(d, d)} (rocprofv3)" for d in direction]
        stream = np.maximum(_ints(c, "Stream_Id", 0), 0)
        idx = add("gpu_memcpy", label, pid=gpu, tid=stream, ts=_ints(c, "Start_Timestamp"),
                  end=_ints(c, "End_Timestamp"), corr=_ints(c, "Correlation_Id"), stream=stream, keep=gpu >= 0)
        for key in set(zip(gpu[idx].tolist(), stream[idx].tolist())):
            threads.setdefault(key, f"GPU {key[0]} stream {key[1]}")
    for kind, cat in _HOST_KINDS.items():
        a = tables.get(kind)
        if a is None or not a.num_rows:
            continue
        pid, tid = _ints(a, "Process_Id", 0), _ints(a, "Thread_Id", 0)
        idx = add(cat, a.column("Function").to_pylist(), pid=pid, tid=tid, ts=_ints(a, "Start_Timestamp"),
                  end=_ints(a, "End_Timestamp"), corr=_ints(a, "Correlation_Id"),
                  stream=np.full(a.num_rows, -1, dtype=np.int64), keep=np.ones(a.num_rows, dtype=bool))
        for key in set(zip(pid[idx].tolist(), tid[idx].tolist())):
            threads.setdefault(key, f"thread {key[1]}")
    source = str(group.get("kernel_trace", path))
    stacked = np.concatenate(ints) if ints else np.zeros((0, 8), dtype=np.int64)
    table = table_from_columns(cats, [str(n) for n in names], stacked, source=source, producer="rocprofv3-csv",
                               rank=rank, skipped=skipped, thread_names=threads)
    devices = _device_properties(agents) if agents else []
    if devices:
        table.metadata["deviceProperties"] = devices
    return table


def _gpu_numbers(tables: dict) -> dict[tuple[str, int], int]:
    """{agent: GPU index}: "GPU N" is N; other agents in order of their number among those that ran a kernel or
    are the device end of a copy (the destination of a host-to-device or device-to-device copy, the source of a
    device-to-host one)."""
    import pyarrow.compute as pc

    labels: set = set()
    k = tables.get("kernel_trace")
    if k is not None:
        labels.update(pc.unique(k.column("Agent_Id")).to_pylist())
    c = tables.get("memory_copy_trace")
    if c is not None and c.num_rows:
        direction = c.column("Direction")
        end = pc.if_else(pc.ends_with(direction, "DEVICE_TO_HOST"), c.column("Source_Agent_Id"),
                         c.column("Destination_Agent_Id"))
        labels.update(pc.unique(pc.filter(end, pc.invert(pc.ends_with(direction, "HOST_TO_HOST")))).to_pylist())
    seen = {a for a in map(_agent, labels) if a}
    others = sorted(n for t, n in seen if t == "agent")
    out = {("agent", n): i for i, n in enumerate(others)}
    out.update({a: a[1] for a in seen if a[0] == "gpu"})
    return out


AGENT_INFO = "agent_info.csv"


def _agent_rows(path: Path) -> list[dict] | None:
    """The rows of the process's `<prefix>_agent_info.csv`, Logical_Node_Id and Node_Id made ints and Agent_Type
    upper case (None when it has none, or one without those three columns: another layout, a converter's?)."""
    import csv

    m = CSV_RE.match(path.name)
    info = path.with_name(path.name[: m.start("kind")] + AGENT_INFO) if m else None
    if info is None or not info.is_file():
        return None
    try:
        with open(info, newline="") as f:
            reader = csv.DictReader(f)
            if not {"Node_Id", "Logical_Node_Id", "Agent_Type"} <= set(reader.fieldnames or ()):
                return None
            rows = [dict(r, Logical_Node_Id=int(r["Logical_Node_Id"]), Node_Id=int(r["Node_Id"]),
                         Agent_Type=str(r["Agent_Type"]).strip().upper()) for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TrainperfError(f"{info}: not a readable CSV file ({str(e).splitlines()[0]})") from None
    except (TypeError, ValueError):
        raise TrainperfError(f"{info}: an agent row without an integer Node_Id or Logical_Node_Id") from None
    return rows


def _agent_info(rows: list[dict]) -> dict[tuple[str, int], int]:
    """{agent: GPU index} from the agent rows (_agent_rows): GPU agents indexed in Logical_Node_Id order; "Agent N" /
    bare N is the agent of logical node id N (rocprofv3's default labels; its own tests read them so), else of node
    id N (absolute labels); CPU agents map to -1 (no device track)."""
    agents = [(r["Logical_Node_Id"], r["Node_Id"], r["Agent_Type"]) for r in rows]
    gpu_index = {lnid: i for i, lnid in enumerate(sorted(ln for ln, _, t in agents if t == "GPU"))}
    out: dict[tuple[str, int], int] = {("gpu", i): i for i in gpu_index.values()}
    out.update({("agent", ln): gpu_index.get(ln, -1) for ln, _, _ in agents})
    for ln, node, _ in agents:
        out.setdefault(("agent", node), gpu_index.get(ln, -1))
    return out


def _device_properties(rows: list[dict]) -> list[dict]:
    """The GPU agents in index order (Logical_Node_Id) as Kineto's deviceProperties name a device: name (Product_Name,
    else the gfx target Name), numSms (Cu_Count), totalGlobalMem (Local_Mem_Size where not 0; an APU's reads 0)."""
    out = []
    for r in sorted((r for r in rows if r["Agent_Type"] == "GPU"), key=lambda r: r["Logical_Node_Id"]):
        props = {"id": len(out), "name": str(r.get("Product_Name") or r.get("Name") or "").strip()}
        for key, column in (("numSms", "Cu_Count"), ("totalGlobalMem", "Local_Mem_Size")):
            value = str(r.get(column) or "").strip()
            if value.isdigit() and int(value) > 0:
                props[key] = int(value)
        out.append(props)
    return out
