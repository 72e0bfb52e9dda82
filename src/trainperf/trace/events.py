"""The columnar event table: one rank's trace as NumPy columns with interned names.

Times are integer nanoseconds (``ts_ns``, ``dur_ns``) so that µs and ns traces share one unit
and 64-bit epoch timestamps stay exact. Strings (names, categories, collective types) are
interned: a column holds an id into ``EventTable.names``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

try:  # orjson parses ~3x faster than json; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    from json import loads as _loads

# kind of an event (column `kind`, int8)
KERNEL, MEMCPY, MEMSET, CPU_OP, RUNTIME, PYTHON, USER_ANNOTATION, GPU_ANNOTATION, GPU_SYNC, OTHER = range(10)
KIND_NAMES = ("kernel", "memcpy", "memset", "cpu_op", "runtime", "python", "user_annotation",
              "gpu_user_annotation", "gpu_sync", "other")
HOST_KINDS = (CPU_OP, RUNTIME, PYTHON, USER_ANNOTATION)  # what runs on a host thread

# kernel category (column `category`, int8); -1 for events that do not run on a device
GEMM, ATTENTION, COMMUNICATION, ELEMENTWISE, REDUCTION, OPTIMIZER, CAT_MEMCPY, CAT_MEMSET, CAT_OTHER = range(9)
CATEGORY_NAMES = ("gemm", "attention", "communication", "elementwise", "reduction_norm", "optimizer",
                  "memcpy", "memset", "other")

# raw Kineto `cat` strings (current and 2021 schema) -> kind
# Kineto's activity types (libkineto ActivityType.cpp) by the category each writes, other vendors' devices included
# (Intel's XPU, Cambricon's MLU, out-of-tree backends' privateuse1): their runtime calls launch work as CUDA's do
CAT_TO_KIND = {
    "kernel": KERNEL, "Kernel": KERNEL, "mtia_ccp_events": KERNEL,
    "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY, "mlu_memcpy": MEMCPY,
    "gpu_memset": MEMSET, "Memset": MEMSET, "mlu_memset": MEMSET,
    "cpu_op": CPU_OP, "Operator": CPU_OP, "operator": CPU_OP,
    "cuda_runtime": RUNTIME, "Runtime": RUNTIME, "cuda_driver": RUNTIME,
    "privateuse1_runtime": RUNTIME, "privateuse1_driver": RUNTIME, "mtia_runtime": RUNTIME,
    "xpu_runtime": RUNTIME, "xpu_driver": RUNTIME, "mlu_runtime": RUNTIME,
    "python_function": PYTHON, "python": PYTHON,
    "user_annotation": USER_ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION, "mlu_user_annotation": GPU_ANNOTATION,
    "cuda_sync": GPU_SYNC,
}
DEVICE_KINDS = (KERNEL, MEMCPY, MEMSET)


@dataclass
class EventTable:
    """One rank's complete events ("ph": "X"), one row per event, sorted by start time.

    Columns (NumPy arrays of equal length): kind int8, cat/name int32 (ids into `names`),
    pid/tid int64, stream int64 (-1 on the host), ts_ns/dur_ns int64 (ns), correlation int64
    (-1 if none), external_id int64, nbytes int64 (memcpy/memset bytes, -1 if unknown),
    collective int32 (id of the "Collective name" arg, -1), process_group int32 (id of the
    "Process Group Name" arg of NCCL kernels, -1), category int8 (kernel category,
    -1 on the host), step int32 (ProfilerStep number, -1 outside any step), args int32 (id into
    `arg_texts`, the compact JSON object of the args the analyses need beyond these columns: an
    operator's recorded input shapes and types, a collective's message size and group, see
    chunk.KEPT_ARGS; -1 when the event has none), seq int64 (an operator's autograd "Sequence number":
    a forward op and the backward node ("autograd::engine::evaluate_function: XBackward0") made from it
    share it; -1 when absent), fwd_tid int64 ("Fwd thread id": 0 on a forward op, on a backward node the
    profiler's own number of the thread that ran its forward; -1 when absent).
    """

    rank: int
    source: str
    names: list[str]
    kind: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    stream: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    nbytes: np.ndarray
    collective: np.ndarray
    process_group: np.ndarray
    category: np.ndarray = field(default=None)  # type: ignore[assignment]
    step: np.ndarray = field(default=None)  # type: ignore[assignment]
    args: np.ndarray = field(default=None)  # type: ignore[assignment]
    arg_texts: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)
    ts_was_float: bool = False
    n_skipped: int = 0
    seq: np.ndarray = field(default=None)  # type: ignore[assignment]
    fwd_tid: np.ndarray = field(default=None)  # type: ignore[assignment]
    # the caching allocator's samples (profile_memory=True): (n, 5) int64 rows of trace.chunk.MEMORY_COLUMNS (ts ns,
    # device type and index, the allocator's allocated and reserved bytes after the sample), by time; None: none
    memory: np.ndarray | None = None
    _kept_args: list | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.ts_ns.shape[0]
        if self.args is None:  # a table built without kept args (by hand, or by an older reader)
            self.args = np.full(n, -1, dtype=np.int32)
        for c in ("seq", "fwd_tid"):  # likewise without sequence numbers
            if getattr(self, c) is None:
                setattr(self, c, np.full(n, -1, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])

    @property
    def end_ns(self) -> np.ndarray:
        """End time of every event (ns)."""
        return self.ts_ns + self.dur_ns

    @property
    def on_device(self) -> np.ndarray:
        """Boolean mask of kernels, memcpys and memsets (events that occupy a device stream)."""
        return np.isin(self.kind, DEVICE_KINDS) & (self.stream >= 0)

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds any kernel, memcpy or memset."""
        return bool(self.on_device.any())

    def name_of(self, i: int) -> str:
        """Name of row i."""
        return self.names[int(self.name[i])]

    def name_id(self, text: str) -> int:
        """Id of an interned string, or -1 when it never occurs."""
        try:
            return self.names.index(text)
        except ValueError:
            return -1

    def ids_matching(self, predicate) -> np.ndarray:
        """Ids of the interned strings for which predicate(str) is true."""
        return np.array([i for i, s in enumerate(self.names) if predicate(s)], dtype=np.int32)

    def take(self, mask_or_idx: np.ndarray) -> "EventTable":
        """A new table holding only the selected rows (same interned names)."""
        cols = {c: getattr(self, c)[mask_or_idx] for c in COLUMNS}
        return EventTable(rank=self.rank, source=self.source, names=self.names, arg_texts=self.arg_texts,
                          metadata=self.metadata,
                          thread_names=self.thread_names, ts_was_float=self.ts_was_float,
                          n_skipped=self.n_skipped, memory=self.memory, **cols)

    def kept_args(self) -> list[dict]:
        """The parsed `arg_texts` (index = the `args` column's id), parsed once per table."""
        if self._kept_args is None or len(self._kept_args) != len(self.arg_texts):
            self._kept_args = [_loads(s) for s in self.arg_texts]
        return self._kept_args

    @property
    def nbytes_in_memory(self) -> int:
        """Bytes held by the NumPy columns."""
        return sum(getattr(self, c).nbytes for c in COLUMNS)


COLUMNS = ("kind", "cat", "name", "pid", "tid", "stream", "ts_ns", "dur_ns", "correlation",
           "external_id", "nbytes", "collective", "process_group", "category", "step", "args", "seq", "fwd_tid")
