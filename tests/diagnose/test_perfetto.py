"""`diagnose --perfetto`: one trace-event file for all ranks, clocks aligned, findings as slices and flows.

References: the Chrome trace-event format rules as Perfetto's JSON importer reads them (checked by hand
below), a hand-built job whose rank 1 clock runs 5000 µs ahead and whose all-reduces end together,
and Perfetto's own trace processor where its binary can be had (tests/diagnose/test_perfetto_tp.py).
"""

import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.perfetto import FINDING_CAT, write_job_timeline  # noqa: E402

OFFSET_US = 5000.0
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def two_rank_job(tmp_path: Path) -> Path:
    """4 steps of 3000 µs. Rank 0: GEMM, then an all-reduce it enters at +540 µs; rank 1: DataLoader
    1500 µs, GEMM, all-reduce entered at +2040 µs. Both all-reduces end at +2600 µs of the step on
    their own clock; rank 1's clock reads OFFSET_US more than rank 0's. Each rank's allocator samples
    (profile_memory=True): at +5 µs (2 + rank GiB allocated) and +600 µs (3 + rank) of each step, 4 GiB
    reserved, and one before the trace's first event (not drawn)."""
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(2):
        b = TraceBuilder(rank=rank, world_size=2)
        off = OFFSET_US if rank else 0.0
        for s in range(4):
            T = 3000.0 * s + off
            b.step(s, T, 3000)
            g = 0.0 if rank == 0 else 1500.0
            if rank:
                b.cpu(DL, T, 1500, cat="user_annotation")
            b.launch("ampere_sgemm_128x64_tn", T + g + 10, T + g + 20, 500)
            b.launch(AR, T + g + 530, T + g + 540, 2600 - (g + 540), stream=20)
            b.memory(T + 5, (2 + rank) << 30, 4 << 30)
            b.memory(T + 600, (3 + rank) << 30, 4 << 30)
        b.memory(off - 100, 1 << 30, 1 << 30)
        b.write(d / f"rank{rank}.json.gz")
    return d


def check_trace_event_rules(doc: dict) -> dict:
    """The format rules (module docstring of trainperf.diagnose.perfetto); returns slices by (pid, tid)."""
    assert isinstance(doc["traceEvents"], list)
    slices = defaultdict(list)
    flows = defaultdict(dict)
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "s", "f", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "process_labels", "thread_name",
                                 "thread_sort_index") and isinstance(e["args"], dict)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "C":  # a counter: its values by name
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
            continue
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["name"], str) and isinstance(e["cat"], str)
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e))
        else:
            assert e["ph"] not in flows[e["id"]], f"flow id {e['id']} has two '{e['ph']}' events"
            flows[e["id"]][e["ph"]] = e
    for key, sl in slices.items():  # slices on one thread nest: each starts after its parent ends or inside it
        stack = []
        for s, end, e in sorted(sl, key=lambda x: (x[0], -(x[1] - x[0]))):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"{key}: {e['name']} overlaps its parent"
            stack.append(end)
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} incomplete: {pair}"
        fin = pair["f"]
        assert fin["bp"] == "e"
        for p in (pair["s"], fin):  # each end is bound to a slice open at its time on its thread
            assert any(s <= p["ts"] <= end for s, end, _ in slices[(p["pid"], p["tid"])]), p
    return slices


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pf")
    job = two_rank_job(tmp)
    res = diagnose(job)
    out = tmp / "job.perfetto.json.gz"
    summary = write_job_timeline(out, res)
    return res, summary, json.loads(gzip.decompress(out.read_bytes()))


def test_file_follows_trace_event_rules(written):
    _, summary, doc = written
    check_trace_event_rules(doc)
    assert summary.n_events == len(doc["traceEvents"])
    assert summary.n_launch_flows == 2 * 2 * 4  # every launch of both ranks, as Kineto links them


def test_ranks_are_processes(written):
    _, _, doc = written
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    tids = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tids[e["pid"]].add(e["tid"])
    assert not tids[0] & tids[1]  # threads are never shared between ranks


def test_clocks_aligned_on_collectives(written):
    # hand reference: the k-th all-reduce ends at 3000 k + 2600 µs on rank 0's clock, and at the same
    # moment on rank 1's clock + 5000 µs; after alignment they end at the same time in the file
    res, summary, doc = written
    assert summary.clock_offset_us[1] == pytest.approx(OFFSET_US)
    ends = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == AR:
            ends[e["pid"]].append(e["ts"] + e["dur"])
    assert len(ends[0]) == len(ends[1]) == 4
    for a, b in zip(sorted(ends[0]), sorted(ends[1])):
        assert a == pytest.approx(b, abs=1e-3)
    assert sorted(ends[0])[1] - sorted(ends[0])[0] == pytest.approx(3000.0)


def test_memory_samples_are_counter_tracks_on_the_aligned_clock(written):
    # each rank's 8 samples inside its events' span (the one before them left out), by hand: rank 1's sample at
    # +5 µs of its step lands where rank 0's does once its clock's 5000 µs are taken off
    _, _, doc = written
    counters = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            counters[e["pid"]].append(e)
    assert sorted(counters) == [0, 1] and len(counters[0]) == len(counters[1]) == 8
    for r in (0, 1):
        assert {e["name"] for e in counters[r]} == {"device 0 memory (GiB)"}
        assert sorted(e["args"]["allocated"] for e in counters[r]) == [2.0 + r] * 4 + [3.0 + r] * 4
        assert {e["args"]["reserved"] for e in counters[r]} == {4.0}
    t0 = sorted(e["ts"] for e in counters[0])
    t1 = sorted(e["ts"] for e in counters[1])
    assert t0 == pytest.approx(t1, abs=1e-3) and t0[2] - t0[0] == pytest.approx(3000.0)


def test_findings_are_annotated_with_flows_to_their_evidence(written):
    res, summary, doc = written
    kinds = {f.kind for f in res.findings}
    assert "data_loader_stall" in kinds  # rank 1's DataLoader (its straggling follows from it: one fix)
    ev = doc["traceEvents"]
    fs = [e for e in ev if e["ph"] == "X" and e["cat"] == FINDING_CAT]
    by_kind = defaultdict(list)
    for e in fs:
        by_kind[e["args"].get("kind") or e["args"]["finding"]].append(e)
    assert set(by_kind) == kinds
    lanes = {e["args"]["name"] for e in ev if e["name"] == "thread_name" and e["args"]["name"].startswith("finding:")}
    assert "finding: data_loader_stall" in lanes
    # the data-loader evidence is on rank 1 (the only rank with a DataLoader) and a flow leads to the DataLoader span
    dl = [e for e in by_kind["data_loader_stall"] if "evidence" in e["args"]]
    assert dl and all(e["pid"] == 1 for e in dl)
    summary_slice = next(e for e in by_kind["data_loader_stall"] if "recommendation" in e["args"])
    assert "num_workers" in summary_slice["args"]["recommendation"] and summary_slice["args"]["gain_pct"] > 0
    flows = defaultdict(dict)
    for e in ev:
        if e["ph"] in "sf" and e["cat"] == FINDING_CAT:
            flows[e["id"]][e["ph"]] = e
    assert summary.n_finding_flows == len(flows) >= 1
    slices = check_trace_event_rules(doc)
    targets = []
    for pair in flows.values():
        f = pair["f"]
        targets += [x for s, end, x in slices[(f["pid"], f["tid"])] if s == f["ts"]]
    assert any(t["name"] == DL and t["pid"] == 1 for t in targets)
    # each evidence slice sits where the evidence says: DataLoader spans start at 3000 k on rank 0's time axis
    starts = sorted(e["ts"] for e in dl)
    assert starts[0] == pytest.approx(starts[0] // 3000 * 3000, abs=1e-3)


def test_plain_json_output(tmp_path):
    job = two_rank_job(tmp_path)
    res = diagnose(job, steps="1:2")
    out = tmp_path / "t.json"
    write_job_timeline(out, res)  # the steps diagnose was given
    doc = json.loads(out.read_text())
    check_trace_event_rules(doc)
    steps = {e["args"].get("step") for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != FINDING_CAT}
    assert steps <= {1, 2}


def test_cli_option(tmp_path):
    from typer.testing import CliRunner

    from trainperf.cli import app

    job = two_rank_job(tmp_path)
    out = tmp_path / "all.json.gz"
    r = CliRunner().invoke(app, ["diagnose", str(job), "--perfetto", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(gzip.decompress(out.read_bytes()))
    check_trace_event_rules(doc)
    assert any(e.get("cat") == FINDING_CAT for e in doc["traceEvents"])


def test_jax_profile_timeline(tmp_path):
    # any producer: a real JAX profile (tests/trace/data/jax) written as one timeline keeps its events
    xplane = Path(__file__).resolve().parents[1] / "trace" / "data" / "jax" / "jax_cpu.xplane.pb"
    res = diagnose(xplane)
    out = tmp_path / "jax.json"
    s = write_job_timeline(out, res)
    doc = json.loads(out.read_text())
    check_trace_event_rules(doc)
    n_rows = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != FINDING_CAT)
    assert n_rows == 119 and s.n_launch_flows == 0


def test_one_launch_many_device_events(tmp_path):
    # a graph launch runs several kernels under one correlation id: one arrow to each, ids never reused
    b = TraceBuilder()
    for s in range(3):
        T = 1000.0 * s
        b.step(s, T, 1000)
        c = b.launch("ampere_sgemm_128x64_tn", T + 10, T + 20, 100, runtime="cudaGraphLaunch")
        b.events.append({"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 7,
                         "ts": T + 130, "dur": 50, "args": {"correlation": c, "stream": 7}})
    p = b.write(tmp_path / "g.json.gz")
    out = tmp_path / "g.perfetto.json"
    s = write_job_timeline(out, diagnose(p))
    check_trace_event_rules(json.loads(out.read_text()))
    assert s.n_launch_flows == 6


def test_straggler_evidence_links_to_the_late_collective(tmp_path):
    # rank 1's GEMM takes 2000 µs, rank 0's 500 µs: rank 1 enters each all-reduce 1500 µs late (both end
    # at +2600 µs); the straggler finding's evidence ("all_reduce #k (rank 1 arrived last)") is linked
    # to rank 1's all-reduce kernel, which starts when rank 1 arrives; each step ends 5 µs after the host's
    # cudaDeviceSynchronize returns (2605 µs)
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(2):
        b = TraceBuilder(rank=rank, world_size=2)
        gemm = 500.0 if rank == 0 else 2000.0
        for s in range(4):
            T = 2610.0 * s
            b.step(s, T, 2610)
            b.launch("ampere_sgemm_128x64_tn", T + 10, T + 20, gemm)
            b.launch(AR, T + 15, T + 20 + gemm, 2600 - (20 + gemm), stream=20)
            b.cpu("cudaDeviceSynchronize", T + 30, 2575, cat="cuda_runtime")
        b.write(d / f"rank{rank}.json.gz")
    res = diagnose(d)
    assert "straggler" in {f.kind for f in res.findings}
    out = tmp_path / "s.json"
    write_job_timeline(out, res)
    doc = json.loads(out.read_text())
    slices = check_trace_event_rules(doc)
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == FINDING_CAT and e["name"] == "straggler"]
    assert ends
    for f in ends:
        target = [x for s, _, x in slices[(f["pid"], f["tid"])] if s == f["ts"] and x["cat"] != FINDING_CAT]
        assert f["pid"] == 1 and [x["name"] for x in target] == [AR]
