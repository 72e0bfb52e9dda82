"""Which profiler wrote a trace file, and its reader: Kineto (PyTorch), rocprofv3 JSON or CSV, JAX (XPlane
protobuf or the trace JSON beside it), Nsight Systems (its SQLite export). Decided from the file's first bytes, not
its name, except the binary XSpace (`.xplane.pb`) and rocprofv3's CSV files (`<prefix>_kernel_trace.csv`, ...: one
profiled process writes several, read together)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.trace.events import EventTable
from trainperf.trace.kineto import read_kineto

HEAD_BYTES = 1 << 16
XPLANE_SUFFIX = ".xplane.pb"


def head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first n bytes of a file, decompressed when it is gzip (b"" when unreadable: the reader says why)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(2)
            f.seek(0)
            if raw == b"\x1f\x8b":
                with gzip.open(f) as g:
                    return g.read(n)
            return f.read(n)
    except (OSError, EOFError, zlib.error):
        return b""


def producer_of(path: str | Path) -> str:
    """"kineto", "rocprofv3", "rocprofv3-csv", "jax-trace-json", "jax-xplane" or "nsys"."""
    path = Path(path)
    if path.name.endswith(XPLANE_SUFFIX):
        return "jax-xplane"
    from trainperf.trace.nsys import REPORT_SUFFIXES, looks_like_sqlite

    if path.name.endswith(REPORT_SUFFIXES):
        raise TrainperfError(f"{path}: an Nsight Systems report, which only nsys reads: export it with "
                             f"`nsys export --type sqlite -o {path.stem}.sqlite {path.name}` and pass the .sqlite")
    from trainperf.trace.rocprof import looks_like_rocprof
    from trainperf.trace.rocprof_csv import is_rocprof_csv

    if is_rocprof_csv(path):
        return "rocprofv3-csv"
    from trainperf.trace.xplane import looks_like_jax_trace

    h = head(path)
    if looks_like_sqlite(h):
        return "nsys"
    if looks_like_rocprof(h):
        return "rocprofv3"
    if looks_like_jax_trace(h):
        return "jax-trace-json"
    return "kineto"


def read_tables(path: str | Path, rank: int | None = None) -> list[EventTable]:
    """Every rank's EventTable in one trace file of any supported producer: one, except an Nsight Systems report of
    several processes. rank: the rank of a one-rank file (else from the file)."""
    path = Path(path)
    if not path.is_file():
        raise TrainperfError(f"{path}: no such file")
    kind = producer_of(path)
    if kind == "nsys":
        from trainperf.trace.nsys import read_nsys

        return read_nsys(path, rank)
    if kind == "kineto":
        return [read_kineto(path, rank)]
    if kind == "rocprofv3":
        from trainperf.trace.rocprof import read_rocprof

        return [read_rocprof(path, rank)]
    if kind == "rocprofv3-csv":
        from trainperf.trace.rocprof_csv import read_rocprof_csv

        return [read_rocprof_csv(path, rank)]
    from trainperf.trace.xplane import read_jax_trace_json, read_xplane

    return [read_xplane(path, rank) if kind == "jax-xplane" else read_jax_trace_json(path, rank)]


def read_any(path: str | Path, rank: int | None = None) -> EventTable:
    """Read one trace file (one rank) of any supported producer into an EventTable."""
    tables = read_tables(path, rank)
    if len(tables) > 1:
        raise TrainperfError(f"{path}: an Nsight Systems report of {len(tables)} processes (ranks): read it "
                             "with trainperf.trace.load_trace")
    return tables[0]
