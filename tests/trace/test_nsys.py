"""Nsight Systems' SQLite export (trace/nsys.py): real Kineto traces written by the export's schema
(nsys_builder.py) read back as the same events, diagnosed as the faults measured on them, a job's ranks in one
report told apart, and bad files named in one line."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_builder import PUSH_POP_RANGE, SCHEMA, read_doc, write_nsys  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.errors import NotATraceError, TrainperfError  # noqa: E402
from trainperf.trace.events import CPU_OP, KERNEL, MEMCPY, RUNTIME, USER_ANNOTATION  # noqa: E402
from trainperf.trace.load import load_trace, ranks_in_file_order_note  # noqa: E402
from trainperf.trace.producers import producer_of, read_any  # noqa: E402

H200 = Path(__file__).resolve().parents[1] / "data" / "h200_faults"
STRAGGLER = Path(__file__).resolve().parents[1] / "corpus" / "data" / "straggler-high-trace_filter-slow1"
# what nsys records of a Kineto trace (no Python frames, no GPU copies of annotations, no flows)
RECORDED = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation")


def _rows(t, *, as_nvtx: bool = False) -> list[tuple]:
    """The table's events, sorted; as_nvtx: an operator with neither a namespace nor a sequence number ("detach")
    as the export holds it, a range like any user's (the emitter writes its bare name)."""
    names = t.names
    kind = t.kind.copy()
    if as_nvtx:
        bare = np.array(["::" not in names[i] for i in t.name], dtype=bool)
        kind[(kind == CPU_OP) & (t.seq < 0) & bare] = USER_ANNOTATION
    return sorted(zip(t.ts_ns.tolist(), t.dur_ns.tolist(), kind.tolist(), [names[i] for i in t.name],
                      t.pid.tolist(), t.tid.tolist(), t.stream.tolist(), t.correlation.tolist(), t.nbytes.tolist(),
                      t.step.tolist(), t.category.tolist(), t.seq.tolist()))


@pytest.mark.parametrize("case", ["pageable_copy-high-h200", "host_sync-high-h200", "data_loader_stall-high-h200"])
def test_an_export_holds_the_events_of_its_kineto_trace(case, tmp_path):
    # the same H200 trace as Kineto JSON (less what nsys does not record) and as an nsys export: every event with
    # the same time to the ns, kind, name, process, thread, stream, correlation, bytes, step, category and sequence
    # number (nsys names calls "cudaLaunchKernel_v7000" and ops "aten::mm, seq = 7, op_id = 1")
    doc = read_doc(H200 / case / "traces" / "rank0.json.gz")
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("cat") in RECORDED])))
    export = write_nsys([doc], tmp_path / "rank0.sqlite")
    assert producer_of(export) == "nsys"
    a, b = read_any(ref), read_any(export)
    assert len(a) == len(b) and _rows(a, as_nvtx=True) == _rows(b)
    assert b.metadata["deviceProperties"][0]["name"] == doc["deviceProperties"][0]["name"]


SICK = sorted(p.name for p in H200.iterdir() if p.is_dir() and not p.name.startswith("healthy"))


@pytest.mark.parametrize("case", SICK)
def test_an_export_names_the_fault_measured_on_its_trace(case, tmp_path):
    # read from the export, each planted fault of the real H200 runs is the top finding, priced as in
    # test_h200_faults: within half of the measured fix's gain and 5 pp above the largest fix measured
    labels = json.loads((H200 / case / "labels.json").read_text())
    d = diagnose(write_nsys([read_doc(H200 / case / "traces" / "rank0.json.gz")], tmp_path / "rank0.sqlite"))
    assert d.findings[0].kind == labels["kind"]
    largest = max([labels["true_gain_pct"], *labels.get("other_fixes", {}).values()])
    assert 0.5 * labels["true_gain_pct"] <= d.findings[0].gain_pct <= largest + 5.0


def test_a_graph_traced_whole_keeps_the_device_busy(tmp_path):
    # nsys's default traces a CUDA graph replay as one GRAPH_TRACE row and none of its kernels: the H200 loop that
    # replays one graph a step, read so, is as busy as with its kernels (a replay spans its kernels and the gaps
    # between them) and stays healthy; without those rows its GPU would read idle
    doc = read_doc(H200 / "healthy-h200-cuda_graph" / "traces" / "rank0.json.gz")
    node = diagnose(write_nsys([doc], tmp_path / "node.sqlite"))
    whole = diagnose(write_nsys([doc], tmp_path / "graph.sqlite", graphs="graph"))
    t = read_any(tmp_path / "graph.sqlite")
    replays = [t.names[int(i)] for i in t.name[t.kind == KERNEL]]
    assert sum(n.startswith("CUDA graph ") for n in replays) == sum(
        1 for e in doc["traceEvents"] if e.get("name", "").startswith("cudaGraphLaunch"))
    assert whole.ranks[0].idle_pct <= node.ranks[0].idle_pct + 0.5
    assert [(x.kind, x.severity) for x in whole.findings if x.severity != "low"] == []
    assert not any(x.kind == "gpu_analyses_skipped" for x in whole.findings)  # what no device work at all gives


def test_a_worker_process_without_gpu_work_is_left_out(tmp_path):
    # a DataLoader worker (or the launcher) is another process of the report, with host events and no GPU work: the
    # one rank is the GPU process's, with none of the worker's events
    doc = read_doc(H200 / "data_loader_stall-high-h200" / "traces" / "rank0.json.gz")
    worker = {"traceEvents": [dict(e, pid=777, tid=778) for e in doc["traceEvents"] if e.get("cat") == "cpu_op"][:50]}
    tables = load_trace(write_nsys([doc, worker], tmp_path / "job.sqlite", pids=[4321, 777]))
    assert list(tables) == [0] and 777 not in set(tables[0].pid.tolist())
    assert 4321 in set(tables[0].pid.tolist())


def test_a_report_of_several_processes_holds_one_rank_each(tmp_path):
    # `nsys profile torchrun ...` writes every process into one report: each that ran GPU work is a rank, ranked by
    # its device (LOCAL_RANK); the corpus's straggler case (rank 1 slowed) read from one export names rank 1
    docs = [read_doc(STRAGGLER / "traces" / f"rank{r}.json.gz") for r in (1, 0)]  # written out of rank order
    export = write_nsys(docs, tmp_path / "job.sqlite", pids=[4045, 4037])
    tables = load_trace(export)
    assert sorted(tables) == [0, 1]
    for r, t in tables.items():
        assert set(t.pid[t.kind == KERNEL].tolist()) == {r}
        assert len(t) == len(read_any(STRAGGLER / "traces" / f"rank{r}.json.gz"))  - int(sum(
            1 for e in docs[1 - r]["traceEvents"] if e.get("ph") == "X" and e.get("cat") not in RECORDED))
    labels = json.loads((STRAGGLER / "labels.json").read_text())
    f = diagnose(export).findings[0]
    assert f.kind == labels["kind"] and f.ranks == labels["ranks"]
    with pytest.raises(TrainperfError, match="2 processes"):
        read_any(export)


def _report(path: Path, rows: dict[str, list[tuple]], schema: str = SCHEMA) -> Path:
    """An SQLite file of the schema's tables holding the given rows."""
    db = sqlite3.connect(path)
    db.executescript(schema)
    for table, values in rows.items():
        for v in values:
            db.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(v))})", v)
    db.commit()
    db.close()
    return path


def test_export_names_and_kinds_follow_kineto(tmp_path):
    # by hand, in the export's own columns: a ProfilerStep range, an operator range with its sequence number,
    # an NVTX mark (no range), a launch and a pageable copy with their device work; times from the session's epoch
    g = (4321 << 24) | 17  # globalTid: pid 4321, tid 17
    strings = [(1, "cudaLaunchKernel_v7000"), (2, "cudaMemcpyAsync_v3020"), (3, "ampere_sgemm_128x64_nn"),
               (4, "sgemm")]
    nvtx_cols = "(start, end, eventType, text, globalTid)"
    path = _report(tmp_path / "r.sqlite", {
        "StringIds": strings,
        "TARGET_INFO_SESSION_START_TIME": [(1_700_000_000_000_000_000, "", "")],
    })
    db = sqlite3.connect(path)
    db.execute(f"INSERT INTO NVTX_EVENTS {nvtx_cols} VALUES (0, 100000, ?, 'ProfilerStep#5', ?)", (PUSH_POP_RANGE, g))
    db.execute(f"INSERT INTO NVTX_EVENTS {nvtx_cols} VALUES (1000, 9000, ?, 'aten::mm, seq = 41, op_id = 7, "
               "sizes = [[8, 8], [8, 8]]', ?)", (PUSH_POP_RANGE, g))
    db.execute(f"INSERT INTO NVTX_EVENTS {nvtx_cols} VALUES (500, NULL, 34, 'a mark', ?)", (g,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (2000, 6000, 0, ?, 9, 1, 0, NULL)", (g,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (20000, 90000, 0, ?, 10, 2, 0, NULL)", (g,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
               "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
               "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) VALUES "
               "(8000, 18000, 0, 1, 7, 9, ?, 3, 4, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0)", (4321 << 24,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, "
               "globalPid, bytes, copyKind, srcKind, dstKind) VALUES (25000, 85000, 0, 1, 7, 10, ?, 4096, 1, 1, 3)",
               (4321 << 24,))
    db.commit()
    db.close()
    t = read_any(path)
    by_name = {t.names[int(t.name[i])]: i for i in range(len(t))}
    assert set(by_name) == {"ProfilerStep#5", "aten::mm", "cudaLaunchKernel", "cudaMemcpyAsync",
                            "ampere_sgemm_128x64_nn", "Memcpy HtoD (Pageable -> Device)"}
    kinds = {n: int(t.kind[i]) for n, i in by_name.items()}
    assert kinds == {"ProfilerStep#5": USER_ANNOTATION, "aten::mm": CPU_OP, "cudaLaunchKernel": RUNTIME,
                     "cudaMemcpyAsync": RUNTIME, "ampere_sgemm_128x64_nn": KERNEL,
                     "Memcpy HtoD (Pageable -> Device)": MEMCPY}
    mm, launch, copy = by_name["aten::mm"], by_name["cudaLaunchKernel"], by_name["Memcpy HtoD (Pageable -> Device)"]
    assert (int(t.pid[mm]), int(t.tid[mm]), int(t.seq[mm])) == (4321, 17, 41)
    assert int(t.ts_ns[launch]) == 1_700_000_000_000_002_000 and int(t.dur_ns[launch]) == 4000
    assert int(t.nbytes[copy]) == 4096 and int(t.stream[copy]) == 7 and int(t.correlation[copy]) == 10
    assert np.all(t.step[[mm, launch, copy]] == 5)
    # the op range names its inputs' sizes (--pytorch=autograd-shapes-nvtx): profiler overhead, as record_shapes,
    # named as nsys's option
    assert t.metadata["profiler"]["record_shapes"] is True
    notes = " ".join(diagnose(path).notes)
    assert "profiler overhead (operator ranges naming their input sizes, --pytorch=autograd-shapes-nvtx)" in notes
    assert read_any(write_nsys([read_doc(H200 / "host_sync-high-h200" / "traces" / "rank0.json.gz")],
                               tmp_path / "plain.sqlite")).metadata["profiler"]["record_shapes"] is False


def test_bad_nsys_files_are_named_in_one_line(tmp_path, capsys):
    from trainperf.cli import main

    report = tmp_path / "profile.nsys-rep"
    report.write_bytes(b"\x00binary")
    with pytest.raises(SystemExit) as e:
        main(["diagnose", str(report)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "nsys export --type sqlite -o profile.sqlite profile.nsys-rep" in err
    with pytest.raises(TrainperfError, match="only nsys reads: export each"):
        load_trace(tmp_path)  # a folder of reports only
    with pytest.raises(NotATraceError, match="no CUPTI_ACTIVITY_KIND_"):
        read_any(_report(tmp_path / "other.sqlite", {}, "CREATE TABLE t (x INTEGER)"))
    with pytest.raises(TrainperfError, match="rocpd convert --output-format csv -i 1234_results.db"):
        read_any(_report(tmp_path / "1234_results.db", {}, "CREATE TABLE rocpd_kernel_dispatch (id INTEGER)"))
    no_work = _report(tmp_path / "empty.sqlite", {"StringIds": [(1, "x")]})
    with pytest.raises(TrainperfError, match="no kernel, copy or fill"):
        read_any(no_work)


def test_processes_that_each_see_their_gpu_as_device_0_are_ranked_by_the_gpu(tmp_path):
    # CUDA_VISIBLE_DEVICES gives each process one GPU, its device 0: the export's TARGET_INFO_CUDA_DEVICE maps
    # (process, device 0) to the node's GPU; process 4037 (rank 0's trace) on GPU 1, process 4045 on GPU 0
    docs = [read_doc(STRAGGLER / "traces" / f"rank{r}.json.gz") for r in (0, 1)]
    export = write_nsys(docs, tmp_path / "job.sqlite", pids=[4037, 4045])
    db = sqlite3.connect(export)
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 0")
    db.execute("DELETE FROM TARGET_INFO_CUDA_DEVICE")
    db.execute("INSERT INTO TARGET_INFO_CUDA_DEVICE (gpuId, cudaId, pid) VALUES (1, 0, 4037), (0, 0, 4045)")
    db.commit()
    db.close()
    tables = load_trace(export)
    assert {r: Path(t.source).name for r, t in tables.items()} == {0: "job.sqlite", 1: "job.sqlite"}
    # rank 1 holds process 4037's host calls, rank 0 process 4045's
    assert set(tables[1].pid[tables[1].kind == RUNTIME].tolist()) == {4037}
    assert set(tables[0].pid[tables[0].kind == RUNTIME].tolist()) == {4045}


def test_one_process_reports_without_a_rank_in_their_names_are_ranked_in_file_order(tmp_path):
    # report9 and report10, neither naming its rank: ranked in natural file order (9 before 10), and said so; with
    # one of them named rank1, the other cannot be told apart from a real rank: still an error
    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        write_nsys([read_doc(STRAGGLER / "traces" / f"rank{r}.json.gz")], folder / f"report{r + 9}.sqlite")
    tables = load_trace(folder)
    assert sorted(tables) == [0, 1] and Path(tables[0].source).name == "report9.sqlite"
    assert "0 = report9.sqlite, 1 = report10.sqlite" in ranks_in_file_order_note(tables)
    (folder / "report10.sqlite").rename(folder / "rank1.sqlite")
    with pytest.raises(TrainperfError, match=r"report9\.sqlite: cannot tell its rank .* e\.g\. rank\d\.sqlite"):
        load_trace(folder)


def test_reports_of_two_nodes_number_their_ranks_in_file_order(tmp_path):
    # one report per node, each of 2 processes ranked 0 and 1 by device: node1's follow node0's (ranks 2 and 3)
    docs = [read_doc(STRAGGLER / "traces" / f"rank{r}.json.gz") for r in (0, 1)]
    folder = tmp_path / "job"
    folder.mkdir()
    write_nsys(docs, folder / "node0.sqlite", pids=[100, 101])
    write_nsys(docs, folder / "node1.sqlite", pids=[200, 201])
    tables = load_trace(folder)
    assert sorted(tables) == [0, 1, 2, 3]
    assert [Path(tables[r].source).name for r in range(4)] == ["node0.sqlite"] * 2 + ["node1.sqlite"] * 2
    assert [int(tables[r].pid[tables[r].kind == KERNEL][0]) for r in range(4)] == [0, 1, 0, 1]


CORRUPTIONS = [
    'ALTER TABLE StringIds DROP COLUMN value',
    "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET nameId = 'x' WHERE rowid % 5 = 0",
    'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "start" - 10 WHERE rowid % 3 = 0',
    'UPDATE NVTX_EVENTS SET text = NULL WHERE rowid % 2 = 0',
    'ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN globalPid',
    'ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind',
    'DROP TABLE TARGET_INFO_SESSION_START_TIME',
    'DROP TABLE StringIds',
]


@pytest.mark.parametrize("sql", CORRUPTIONS)
def test_a_damaged_export_is_read_or_named_never_a_traceback(sql, tmp_path):
    # columns a version lacks, values of the wrong type, missing tables: diagnose reads what is there (names it
    # could not resolve read "kernel <id>" / "call <id>") or says in one line what is wrong
    export = write_nsys([read_doc(H200 / "host_sync-high-h200" / "traces" / "rank0.json.gz")], tmp_path / "r.sqlite")
    db = sqlite3.connect(export)
    db.execute(sql)
    db.commit()
    db.close()
    try:
        d = diagnose(export)
    except TrainperfError as e:
        assert str(e).startswith(str(export)) and "\n" not in str(e)
    else:
        assert d.ranks


def test_unnamed_host_work_in_an_export_is_named_the_nsys_way(tmp_path):
    # nsys records no Python frame: the advice to name host work no op holds is an NVTX range, not with_stack=True.
    # The H200 DataLoader loop with its DataLoader spans removed: 30 ms a step of host work that nothing names
    doc = read_doc(H200 / "data_loader_stall-high-h200" / "traces" / "rank0.json.gz")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "DataLoader" not in e.get("name", "")]
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(doc))
    kineto, nsys = diagnose(ref), diagnose(write_nsys([doc], tmp_path / "r.sqlite"))
    assert kineto.findings[0].kind == nsys.findings[0].kind == "host_work"
    assert "with_stack=True" in kineto.findings[0].recommendation
    assert "with_stack" not in nsys.findings[0].recommendation
    assert "torch.cuda.nvtx.range" in nsys.findings[0].recommendation


def test_an_export_without_steps_is_told_how_nsys_marks_them(tmp_path):
    # no ProfilerStep range: the whole report is the window, and the way to mark steps is nsys's (an NVTX range named
    # ProfilerStep#N, a capture range), not prof.step()
    doc = read_doc(H200 / "launch_bound-high-h200" / "traces" / "rank0.json.gz")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    notes = " ".join(diagnose(write_nsys([doc], tmp_path / "r.sqlite")).notes)
    assert "no complete profiler step" in notes and "prof.step()" not in notes
    assert 'torch.cuda.nvtx.range(f"ProfilerStep#{i}")' in notes and "--capture-range=cudaProfilerApi" in notes


def test_numbered_iteration_ranges_are_the_steps_where_none_is_named_profilerstep(tmp_path):
    # the H200 launch-bound loop with its steps named by the user ("iteration 7") instead of ProfilerStep#7: the
    # same steps and the same findings as with ProfilerStep ranges; ranges that overlap (not one per iteration) or a
    # single one are no steps
    doc = read_doc(H200 / "launch_bound-high-h200" / "traces" / "rank0.json.gz")
    named = json.loads(json.dumps(doc))
    for e in named["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = "iteration " + e["name"].split("#")[1]
    want = diagnose(write_nsys([doc], tmp_path / "steps.sqlite"))
    got = diagnose(write_nsys([named], tmp_path / "iterations.sqlite"))
    assert [(x.kind, x.gain_pct) for x in got.findings] == [(x.kind, x.gain_pct) for x in want.findings]
    assert np.unique(read_any(tmp_path / "iterations.sqlite").step).size > 2
    overlapping = json.loads(json.dumps(named))
    overlapping["traceEvents"] += [dict(e, name="step 99", ts=float(e["ts"]) + 1.0)
                                   for e in named["traceEvents"] if e.get("name") == "iteration 3"]
    for e in overlapping["traceEvents"]:
        if e.get("name", "").startswith("iteration "):
            e["name"] = "step " + e["name"].split(" ")[1]
    t = read_any(write_nsys([overlapping], tmp_path / "overlapping.sqlite"))
    assert (t.step < 0).all()
