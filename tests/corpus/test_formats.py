"""Format variants of a Kineto trace: each rewrites what it says and nothing else, and diagnose reads the same run
the same way in every one of them (the committed corpus cases, each variant)."""

import functools
from pathlib import Path

import pytest

from trainperf.corpus.formats import (CLOCK_SKEW_US, VARIANTS, begin_end, clock_skew, hip_runtime, no_flows,
                                     old_pytorch, rocm)
from trainperf.corpus.kineto import read_events, write_events
from trainperf.diagnose.api import diagnose

DATA = Path(__file__).parent / "data"

DOC = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 100.0, "dur": 50.0, "pid": 1, "tid": 1,
     "args": {"External id": 3, "Sequence number": 9}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 110.0, "dur": 30.0, "pid": 1, "tid": 1,
     "args": {"correlation": 7, "External id": 3}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 112.0, "dur": 20.0,
     "pid": 0, "tid": 7, "args": {"correlation": 7}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 140.0, "dur": 5.0,
     "pid": 0, "tid": 7, "args": {"correlation": 8}},
    {"ph": "X", "cat": "python_function", "name": "train.py(10): step", "ts": 90.0, "dur": 80.0, "pid": 1, "tid": 1},
    {"ph": "s", "cat": "ac2g", "id": 7, "ts": 110.0, "pid": 1, "tid": 1},
    {"ph": "f", "cat": "ac2g", "id": 7, "ts": 112.0, "pid": 0, "tid": 7, "bp": "e"},
], "baseTimeNanoseconds": 1_000_000}


def test_hip_names_follow_the_hip_api():
    assert hip_runtime("cudaLaunchKernel") == "hipLaunchKernel"
    assert hip_runtime("cudaStreamSynchronize") == "hipStreamSynchronize"
    assert hip_runtime("cuLaunchKernel") == "hipModuleLaunchKernel"
    assert hip_runtime("cudaHostAlloc") == "hipHostMalloc"
    assert hip_runtime("aten::mm") == "aten::mm"


def test_rocm_names_copies_by_direction_only_and_keeps_times():
    out = rocm(DOC, 0)["traceEvents"]
    assert out[1]["name"] == "hipMemcpyWithStream"  # a pageable copy: PyTorch's blocking copy_ on ROCm
    other = {**DOC, "traceEvents": [{**DOC["traceEvents"][1], "args": {"correlation": 8}}]}  # the pinned copy's
    assert rocm(other, 0)["traceEvents"][0]["name"] == "hipMemcpyAsync"
    assert out[2]["name"] == "Memcpy HtoD (Host -> Device)"
    assert out[3]["name"] == "Memcpy DtoH (Device -> Host)"
    assert [e["ts"] for e in out] == [e["ts"] for e in DOC["traceEvents"]]
    assert DOC["traceEvents"][1]["name"] == "cudaMemcpyAsync"  # the input is not changed


def test_clock_skew_shifts_every_stamp_of_rank_r_by_r_times_the_skew():
    out = clock_skew(DOC, 2)
    assert [e["ts"] - d["ts"] for e, d in zip(out["traceEvents"], DOC["traceEvents"])] == [2 * CLOCK_SKEW_US] * 7
    assert out["baseTimeNanoseconds"] == 1_000_000 + int(2 * CLOCK_SKEW_US * 1e3)
    assert clock_skew(DOC, 0) is DOC


def test_flows_and_new_categories_removed():
    assert [e["ph"] for e in no_flows(DOC, 0)["traceEvents"]] == ["X"] * 5
    cats = [e["cat"] for e in old_pytorch(DOC, 0)["traceEvents"]]
    assert cats == ["Operator", "Runtime", "Memcpy", "Memcpy", "ac2g", "ac2g"]


@functools.lru_cache(maxsize=None)
def _top(folder: Path) -> tuple[str, str]:
    first = diagnose(folder, top=1).to_json()["findings"][0]
    return first["kind"], first["severity"]


@pytest.mark.parametrize("case", ["data_loader_stall-high-trace_filter", "pageable_copy-high-trace_filter",
                                  "straggler-high-trace_filter-slow1"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_diagnose_reads_the_run_not_the_format(tmp_path, case, variant):
    traces = DATA / case / "traces"
    for f in sorted(traces.glob("rank*.json.gz")):
        rank = int(f.name[4:f.name.index(".")])
        write_events(tmp_path / f.name, VARIANTS[variant](read_events(f), rank))
    assert _top(tmp_path) == _top(traces)


def test_begin_end_writes_nested_spans_as_pairs_in_time_order_and_keeps_overlaps_complete():
    x = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
         {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
         {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 90, "dur": 30},  # past the step
         {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 2, "ts": 5, "dur": 10},
         {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 12, "dur": 3}]
    out = begin_end({"traceEvents": x}, 0)["traceEvents"]
    main = [(e["ph"], e.get("name"), e["ts"]) for e in out if e.get("tid") == 1]
    assert main == [("B", "ProfilerStep#1", 0), ("B", "aten::mm", 10), ("E", None, 30),
                    ("X", "aten::add", 90), ("E", None, 100)]
    assert [(e["ph"], e["ts"]) for e in out if e.get("tid") == 2] == [("B", 5), ("E", 15)]
    assert x[4] in out  # device work untouched


def test_device_clock_behind_moves_device_events_and_their_flow_ends_only():
    from trainperf.corpus.formats import DEVICE_CLOCK_BEHIND_US, device_clock_behind
    x = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 100.0, "dur": 5},
         {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 110.0, "dur": 50},
         {"ph": "s", "cat": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 100.0},
         {"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 110.0}]
    out = device_clock_behind({"traceEvents": x}, 0)["traceEvents"]
    assert [e["ts"] for e in out] == [100.0, 110.0 - DEVICE_CLOCK_BEHIND_US, 100.0, 110.0 - DEVICE_CLOCK_BEHIND_US]
