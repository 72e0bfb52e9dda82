"""Load a trace: one Kineto file or a folder of per-rank files, ranks parsed in parallel processes."""

from __future__ import annotations

import os
import re
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from trainperf.errors import NotATraceError, TrainperfError
from trainperf.trace.events import HOST_KINDS, EventTable


class LoadWarning(UserWarning):
    """A file of a trace folder that loading did not read (the subclasses say why)."""


class NotATraceWarning(LoadWarning):
    """A file of a trace folder that holds no trace (skipped)."""


RANK_IN_NAME_RE = re.compile(r"rank[-_ ]?(\d+)", re.I)
TRACE_SUFFIXES = (".json", ".json.gz", ".gz", ".xplane.pb", ".sqlite")
ROCPD_SUFFIX = "_results.db"  # rocprofv3's rocpd database, <pid>_results.db
# subfolders of one job's traces, one per rank or per node ("rank3", "rank_3", "node1", "worker-2"); other
# subfolders (torchtitan's profile_trace/iteration_N/, one per profiled iteration or run) are diagnosed one at a time
RANK_OR_NODE_FOLDER_RE = re.compile(r"(?:rank|node|worker)[-_ ]?\d+", re.I)


def trace_files(path: str | Path) -> list[Path]:
    """The trace files at path: the file itself, or the .json/.json.gz/.xplane.pb/.sqlite files of a folder and one
    file (the kernel trace where there is one) per process of its rocprofv3 CSV files, the reader taking
    that process's other CSV files beside it; a process whose `<prefix>_results.json` is there too is read
    from the JSON (sorted). A folder with no trace file of its own whose subfolders are one a rank or a node
    (RANK_OR_NODE_FOLDER_RE: rank0/, node1/): their files, subfolder by subfolder in natural order."""
    from trainperf.trace.rocprof_csv import csv_groups

    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise TrainperfError(f"{path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if is_run_folder(path, files):  # checked first: its run_record.json ends in .json but is no trace
        if (path / "traces").is_dir():
            raise TrainperfError(f"{path} is a run folder: its traces are in {path / 'traces'}/")
        raise TrainperfError(f"{path} is a run folder with no traces: run `trainperf train` with "
                             "--profile-steps A:B to record some (they go to its traces/ folder)")
    names = {p.name for p in files}
    for prefix, group in csv_groups(path).items():
        if f"{prefix}_results.json" not in names:
            files.append(group.get("kernel_trace") or next(iter(group.values())))
    from trainperf.trace.nsys import REPORT_SUFFIXES

    reports = sorted(p.name for p in path.iterdir() if p.name.endswith(REPORT_SUFFIXES))
    if not files and reports:
        raise TrainperfError(f"{path}: Nsight Systems reports ({', '.join(reports[:3])}) only nsys reads: export each "
                             "with `nsys export --type sqlite -o <name>.sqlite <name>.nsys-rep`")
    databases = sorted(p.name for p in path.iterdir() if p.is_file() and p.name.endswith(ROCPD_SUFFIX))
    if not files and databases:  # rocprofv3's default output since ROCm 7 (docs/diagnose.md, "Trace formats")
        raise TrainperfError(f"{path}: rocpd databases ({', '.join(databases[:3])}), rocprofv3's SQLite output, are "
                             "not read directly: convert each with `rocpd convert --output-format csv -i <name>.db` "
                             "and pass the folder it writes")
    if not files:
        # traces one level down: a folder per profiled iteration (torchtitan's profile_trace/iteration_N/) or per run
        below = sorted((p for p in path.iterdir() if p.is_dir()
                        and any(q.is_file() and q.name.endswith(TRACE_SUFFIXES) for q in p.iterdir())),
                       key=_natural_key)
        if below and all(RANK_OR_NODE_FOLDER_RE.fullmatch(p.name) for p in below):
            # a folder per rank or per node (rank0/, node1/ ...): the job's traces, read together
            return [f for p in below for f in trace_files(p)]
        shown = [p.name for p in below] or _trace_folders_deeper(path)
        hint = (f"; its subfolders hold some ({', '.join(p + '/' for p in shown[-3:])}"
                f"{', ...' if len(shown) > 3 else ''}): diagnose one of them" if shown else "")
        raise TrainperfError(f"{path}: no trace files in this folder (.json, .json.gz, .xplane.pb, nsys's .sqlite "
                             f"export, or rocprofv3's <pid>_kernel_trace.csv ...){hint}")
    return sorted(files)


RUN_FOLDER_FILES = ("run_record.json", "metrics.jsonl")  # what `trainperf train` writes in every run folder


def is_run_folder(path: Path, files: list[Path]) -> bool:
    """True when folder path is a `trainperf train` run folder: a run record (RUN_FOLDER_FILES), or a
    traces/ subfolder and no trace file of its own (files: its .json/.json.gz files)."""
    if any((path / n).is_file() for n in RUN_FOLDER_FILES):
        return True
    return (path / "traces").is_dir() and not files


def rank_from_name(path: Path) -> int | None:
    """Rank number written in a file name ("rank3", "rank-3", "rank_3"), else in its folder's name when that is a
    rank's (trace_files: rank3/trace.json), else None."""
    m = RANK_IN_NAME_RE.search(path.name) or RANK_IN_NAME_RE.fullmatch(path.parent.name)
    return int(m.group(1)) if m else None


def _read_one(path: Path) -> list[EventTable] | NotATraceError:
    """The file's EventTables (one a rank: several in an Nsight Systems report of several processes), or the
    NotATraceError of a file that holds no trace at all (returned, not raised, so that the other files of a folder
    still load)."""
    from trainperf.trace.producers import read_tables  # Kineto, rocprofv3, JAX or nsys, by the file's content

    try:
        return read_tables(path)
    except NotATraceError as e:
        return e


def load_trace(path: str | Path, ranks: list[int] | None = None, workers: int | None = None,
               progress: bool = False) -> dict[int, EventTable]:
    """Read every rank's trace at path; return {rank: EventTable} sorted by rank.

    Rank comes from distributedInfo.rank, else from the file name, else (a single file) 0; in a folder where no
    file carries one, from the files' order (_number_ranks_in_file_order; ranks_in_file_order_note says so); a
    folder where only some do, duplicate ranks or ranks from two different jobs is an error. The ranks of a file
    that holds several (an Nsight Systems report per node) follow those of the files before it in name order.
    """
    files = trace_files(path)
    tables = _read_all(files, workers, progress)
    _number_ranks_across_reports(tables)
    # a folder may hold other JSON beside its traces (labels, configs): skipped, said so; nothing else a trace
    traces = [(f, t) for f, ts in zip(files, tables) if not isinstance(ts, NotATraceError) for t in ts]
    if not traces:
        if Path(path).is_dir() and (Path(path) / "traces").is_dir():
            raise TrainperfError(f"{path}: no trace in this folder ({', '.join(f.name for f in files)} hold none); "
                                 f"its traces are in {Path(path) / 'traces'}/")
        raise tables[0]
    for f, t in zip(files, tables):
        if isinstance(t, NotATraceError):
            warnings.warn(f"{f}: holds no trace events (not a trace): skipped", NotATraceWarning, stacklevel=2)
    traces = _latest_cycles(traces)
    files, tables = zip(*traces)
    _number_ranks_in_file_order(files, tables)
    by_rank: dict[int, EventTable] = {}
    world_sizes = {}
    for f, t in zip(files, tables):
        if t.rank < 0:
            r = rank_from_name(f)
            if r is None:
                if len(files) > 1:
                    producer = t.metadata.get("producer")
                    hint = (f"profile each rank with rocprofv3 -o rank%rank% (rank{len(by_rank)}_kernel_trace.csv "
                            "...)" if producer == "rocprofv3-csv" else
                            f"rename it e.g. rank{len(by_rank)}.sqlite, or profile each node's ranks into one "
                            "report (nsys profile torchrun ...)" if producer == "nsys" else
                            f"rename it e.g. rank{len(by_rank)}.json.gz")
                    raise TrainperfError(
                        f"{f}: cannot tell its rank (no distributedInfo.rank in the trace, no 'rank<N>' in the "
                        f"file name); {hint}")
                r = 0
            t.rank = r
        if t.rank in by_rank:
            raise TrainperfError(f"{f}: duplicate rank {t.rank} (also in {by_rank[t.rank].source}); "
                                 "keep one file per rank")
        dist = t.metadata.get("distributedInfo")
        if isinstance(dist, dict) and "world_size" in dist:
            world_sizes[str(f)] = dist.get("world_size")
        by_rank[t.rank] = t
    if len(set(map(str, world_sizes.values()))) > 1:
        detail = ", ".join(f"{Path(k).name}: {v}" for k, v in world_sizes.items())
        raise TrainperfError(f"{path}: the folder mixes traces of different jobs (world sizes differ: {detail})")
    _check_same_job(path, by_rank)
    if ranks is not None:
        missing = [r for r in ranks if r not in by_rank]
        if missing:
            raise TrainperfError(f"{path}: rank(s) {missing} not found; ranks present: {sorted(by_rank)}")
        by_rank = {r: by_rank[r] for r in ranks}
    return dict(sorted(by_rank.items()))


class EarlierCyclesWarning(LoadWarning):
    """Earlier profiling cycles of the processes of a trace folder (skipped: the latest is analysed)."""


class CopiesWarning(LoadWarning):
    """Files of a trace folder that hold the same events as another (skipped)."""


def _host_pid(t: EventTable) -> int | None:
    """The process id of the trace's host events (the most frequent one), None without host events."""
    pids = t.pid[np.isin(t.kind, HOST_KINDS)]
    if not pids.size:
        return None
    values, counts = np.unique(pids, return_counts=True)
    return int(values[np.argmax(counts)])


def _time_span_ns(t: EventTable) -> tuple[int, int]:
    """(first event's start, last event's end) of a trace with events, ns."""
    return int(t.ts_ns.min()), int((t.ts_ns + t.dur_ns).max())


def _same_trace(a: tuple[Path, EventTable], b: tuple[Path, EventTable]) -> bool:
    """Whether two files are one trace saved twice: a .json beside its .json.gz (`gzip -k`), the same events."""
    (fa, ta), (fb, tb) = a, b
    return (fa.name.removesuffix(".gz") == fb.name.removesuffix(".gz") and len(ta) == len(tb)
            and np.array_equal(ta.ts_ns, tb.ts_ns) and np.array_equal(ta.dur_ns, tb.dur_ns))


def _latest_cycles(traces: list[tuple[Path, EventTable]]) -> list[tuple[Path, EventTable]]:
    """The folder's traces less the copies and the earlier profiling cycles of each process: files of one rank
    (recorded, or none recorded) and one host process id that are a .json beside its .json.gz with the same events are
    one trace saved twice, the first by name kept (CopiesWarning); those whose time spans follow one another are one
    process profiled in several cycles (a schedule with repeat under tensorboard_trace_handler, one file each): its
    latest is kept and the others named in an EarlierCyclesWarning. Ranks profiled over different numbers of cycles
    are an error: their latest files would be of different moments."""
    groups: dict[tuple, list[int]] = {}
    for i, (f, t) in enumerate(traces):
        pid = _host_pid(t)
        if pid is not None and len(t):
            groups.setdefault((t.rank if t.rank >= 0 else rank_from_name(f), pid), []).append(i)
    copies = []
    for key, members in groups.items():
        kept: list[int] = []
        for i in sorted(members, key=lambda i: traces[i][0].name):
            (copies if any(_same_trace(traces[j], traces[i]) for j in kept) else kept).append(i)
        groups[key] = kept
    if copies:
        warnings.warn(f"{traces[0][0].parent}: {', '.join(traces[i][0].name for i in copies[:3])}"
                      f"{', ...' if len(copies) > 3 else ''}: the same trace as the file of its name without .gz "
                      "(saved twice): skipped", CopiesWarning, stacklevel=3)
    dropped, cycles = list(copies), {}
    for (rank, _), members in groups.items():
        if len(members) < 2:
            continue
        spans = {i: _time_span_ns(traces[i][1]) for i in members}
        members.sort(key=lambda i: spans[i][0])
        # overlapping: not successive cycles (load_trace says so)
        if any(spans[b][0] < spans[a][1] for a, b in zip(members, members[1:])):
            continue
        dropped += members[:-1]
        cycles[rank] = len(members)
    if not dropped:
        return traces
    counts = {r: n for r, n in cycles.items() if r is not None}
    single = [r for (r, _), m in groups.items() if r is not None and len(m) == 1]
    if counts and (len(set(counts.values())) > 1 or single):
        shown = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
        raise TrainperfError(f"{traces[0][0].parent}: ranks profiled over different numbers of cycles ({shown}"
                             f"{', '.join([''] + [f'rank {r}: 1' for r in sorted(single)])}): their latest files are "
                             "of different moments; put one cycle's files in a folder of their own")
    earlier = [i for i in dropped if i not in copies]
    if earlier:
        names = ", ".join(traces[i][0].name for i in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        warnings.warn(f"{traces[0][0].parent}: {len(earlier)} earlier profiling cycle(s) skipped ({names}): "
                      "successive files of one process (a profiler schedule's cycles); the latest of each process is "
                      "analysed; diagnose an earlier one by naming its file(s)", EarlierCyclesWarning, stacklevel=3)
    left_out = set(dropped)
    return [x for i, x in enumerate(traces) if i not in left_out]


# the metadata key of a rank numbered by its file's place in the folder (ranks_in_file_order_note says so)
RANK_FROM_FILE_ORDER = "rank_from_file_order"


# how deep below a folder without traces the error looks for folders that hold some (HTA's critical-path examples
# keep theirs at end_to_end/simple_add/input/)
TRACE_FOLDER_SEARCH_DEPTH = 3


def _trace_folders_deeper(path: Path) -> list[str]:
    """The folders two to TRACE_FOLDER_SEARCH_DEPTH levels below path that hold a trace file, as paths relative to
    it ("simple_add/input"), in natural order; for the error that names where a folder's traces are."""
    found = []
    for root, dirs, names in os.walk(path):
        depth = len(Path(root).relative_to(path).parts)
        if depth >= TRACE_FOLDER_SEARCH_DEPTH:
            dirs.clear()
        if depth >= 2 and any(n.endswith(TRACE_SUFFIXES) for n in names):
            found.append(Path(root).relative_to(path))
    return sorted((p.as_posix() for p in found), key=_natural_text_key)


def _natural_key(path: Path) -> list:
    """Sort key of a file name with its numbers compared as numbers (host2 before host10)."""
    return _natural_text_key(path.name)


def _natural_text_key(text: str) -> list:
    """Sort key of a text with its numbers compared as numbers."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", text)]


def _number_ranks_in_file_order(files: tuple, tables: tuple) -> None:
    """Where no trace of a folder of several records its rank, in its distributedInfo or its file name (a JAX
    host's `<host>.xplane.pb`, nsys's report1.sqlite, rocprofv3's `<pid>_...`), number them 0.. in the files'
    natural order and mark each (RANK_FROM_FILE_ORDER): the job is diagnosed, its ranks named by file. Files that
    never ran at the same time are refused (one process profiled in several cycles); a folder where only some files
    carry a rank stays an error (load_trace): numbering the others would guess between real ranks. (One process's
    successive cycles were reduced to its latest before: _latest_cycles.)"""
    if len(tables) < 2 or any(t.rank >= 0 or rank_from_name(f) is not None for f, t in zip(files, tables)):
        return
    # ranks of one job run together: files whose time spans do not overlap are successive profiles of one process
    # (a schedule's cycles, one file each under tensorboard_trace_handler), not ranks
    spans = [_time_span_ns(t) for t in tables if len(t)]
    if spans and max(a for a, _ in spans) >= min(b for _, b in spans):
        first, second = sorted(files, key=_natural_key)[:2]
        raise TrainperfError(f"{first.parent}: no file records its rank and their time spans do not overlap "
                             f"({first.name}, {second.name}, ...): profiles of different moments, not ranks of "
                             "one job; diagnose each file alone")
    order = sorted(range(len(files)), key=lambda i: _natural_key(files[i]))
    for rank, i in enumerate(order):
        tables[i].rank = rank
        tables[i].metadata[RANK_FROM_FILE_ORDER] = files[i].name


def ranks_in_file_order_note(tables: dict[int, EventTable]) -> str | None:
    """The note that says which file each rank is, where the ranks were numbered in file order; None otherwise."""
    named = {r: t.metadata.get(RANK_FROM_FILE_ORDER) for r, t in sorted(tables.items())}
    if not named or not all(named.values()):
        return None
    shown = ", ".join(f"{r} = {n}" for r, n in list(named.items())[:8]) + (", ..." if len(named) > 8 else "")
    return (f"no trace records its rank (distributedInfo) nor has one in its file name: ranks numbered in file-name "
            f"order ({shown}); name the files rank<N> (or profile under torch.distributed) for the job's own ranks")


def _number_ranks_across_reports(tables: list) -> None:
    """Files that hold several ranks each (Nsight Systems reports, one a node: its processes ranked 0.. by device)
    would repeat their ranks: with two or more such files, each file's ranks follow the previous files' (files in
    name order, as node0, node1)."""
    reports = [ts for ts in tables if isinstance(ts, list) and len(ts) > 1]
    if len(reports) < 2:
        return
    offset = 0
    for ts in reports:
        for i, t in enumerate(sorted(ts, key=lambda t: t.rank)):
            t.rank = offset + i
        offset += len(ts)


def _check_same_job(path, by_rank: dict[int, EventTable]) -> None:
    """Ranks of one job were profiled over the same wall-clock stretch: disjoint spans mean two jobs."""
    spans = [(t.ts_ns.min(), t.ts_ns.max(), t) for t in by_rank.values() if len(t)]
    if len(spans) < 2:
        return
    for a in spans:
        for b in spans:
            gap_ns = max(a[0], b[0]) - min(a[1], b[1])
            longest = max(a[1] - a[0], b[1] - b[0], 1)
            if gap_ns > 10 * longest and gap_ns > 60e9:
                raise TrainperfError(
                    f"{path}: the folder mixes traces of different jobs ({Path(a[2].source).name} and "
                    f"{Path(b[2].source).name} were recorded {gap_ns / 1e9:.0f} s apart)")


def _read_all(files: list[Path], workers: int | None, progress: bool) -> list[list[EventTable] | NotATraceError]:
    workers = min(len(files), workers or os.cpu_count() or 1)
    bar = None
    if progress:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # On stderr: stdout carries the verb's results (JSON with --json). Only on a terminal: elsewhere
        # rich cannot erase it and a transient bar leaves a blank line before the verb's error or output.
        console = Console(stderr=True)
        if console.is_terminal:
            bar = Progress(TextColumn("loading traces"), BarColumn(),
                           TextColumn("{task.completed}/{task.total} ranks"), TimeElapsedColumn(), transient=True,
                           console=console)
    tables: list = [None] * len(files)
    if bar:
        bar.start()
        task = bar.add_task("load", total=len(files))
    try:
        if workers <= 1:
            for i, f in enumerate(files):
                tables[i] = _read_one(f)
                if bar:
                    bar.advance(task)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_read_one, f): i for i, f in enumerate(files)}
                from concurrent.futures import as_completed

                for fut in as_completed(futures):
                    tables[futures[fut]] = fut.result()
                    if bar:
                        bar.advance(task)
    finally:
        if bar:
            bar.stop()
    return tables  # type: ignore[return-value]
