"""The fast loader path (msgspec typed structs, isal's igzip) against the generic one (orjson or json
dicts, zlib): identical tables on any input, and a clear error on bad gzip with either inflater.

Reference: the generic dict path, itself checked against `json.load` in test_trace_loader.py.
"""

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kineto_builder import TraceBuilder
from trainperf.errors import TrainperfError
from trainperf.trace import kineto, read_kineto
from trainperf.trace.events import COLUMNS

DATA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"


def _as_comparable(t) -> dict:
    d = {c: getattr(t, c) for c in COLUMNS}
    for c in ("cat", "name", "collective", "process_group"):
        d[c] = [t.names[i] if i >= 0 else None for i in d[c]]
    d["args"] = [t.arg_texts[i] if i >= 0 else None for i in d["args"]]
    d["meta"] = (t.rank, t.metadata, t.thread_names, t.ts_was_float, t.n_skipped)
    d["memory"] = np.zeros((0, 5), dtype=np.int64) if t.memory is None else t.memory
    return d


def _assert_same(a, b):
    x, y = _as_comparable(a), _as_comparable(b)
    for k in x:
        if isinstance(x[k], np.ndarray):
            assert np.array_equal(x[k], y[k]), k
        else:
            assert x[k] == y[k], k
    assert a.names == b.names  # ids are canonical (sorted strings), whatever the parser or chunking
    assert a.arg_texts == b.arg_texts


def _generic(monkeypatch):
    monkeypatch.setattr(kineto, "_typed_decode", None)


def _read_both(path, monkeypatch, chunk=1 << 20):
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    fast = read_kineto(path)
    with monkeypatch.context() as m:
        _generic(m)
        slow = read_kineto(path)
    return fast, slow


def test_typed_path_is_used_and_matches_dicts(tmp_path, monkeypatch):
    pytest.importorskip("msgspec")
    b = TraceBuilder()
    b.step(1, 0, 500)
    for i in range(200):
        b.launch(f"kernel_{i % 7}", 10 + i, 20 + i, 3, stream=7 + i % 3)
    p = b.write(tmp_path / "t.json.gz")
    calls = []
    real = kineto._typed_decode
    monkeypatch.setattr(kineto, "_typed_decode", lambda data, loads: calls.append(real(data, loads)) or calls[-1])
    fast, slow = _read_both(p, monkeypatch, chunk=4096)
    assert calls and all(c is not None for c in calls)  # every batch took the typed path
    _assert_same(fast, slow)


def test_isal_and_zlib_inflate_the_same(tmp_path, monkeypatch):
    pytest.importorskip("isal")
    b = TraceBuilder()
    b.launch("k", 0, 5, 10)
    p = b.write(tmp_path / "t.json.gz")
    fast = read_kineto(p)
    monkeypatch.setattr(kineto, "_gzip_module", gzip)
    monkeypatch.setattr(kineto, "_IsalError", zlib.error)
    _assert_same(fast, read_kineto(p))


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_bad_gzip_is_one_clear_line_with_either_inflater(tmp_path, monkeypatch, inflater, damage):
    if inflater == "isal":
        pytest.importorskip("isal")
    else:
        monkeypatch.setattr(kineto, "_gzip_module", gzip)
        monkeypatch.setattr(kineto, "_IsalError", zlib.error)
    b = TraceBuilder()
    for i in range(300):
        b.launch(f"k{i}", i, i + 1, 2)
    data = bytearray(b.write(tmp_path / "ok.json.gz").read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        for i in range(len(data) // 3, len(data) // 3 + 8):
            data[i] ^= 0x5A
    p = tmp_path / "bad.json.gz"
    p.write_bytes(bytes(data))
    if damage == "truncate":  # a cut file: the events before the cut, marked as cut, whichever inflater
        t = read_kineto(p)
        assert 0 < t.metadata["truncated"]["events_read"] == len(t) < 600
        return
    with pytest.raises(TrainperfError, match="gzip|invalid JSON") as e:
        read_kineto(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/traces/hta not present")
@pytest.mark.parametrize("trace", ["ns_resolution_trace", "amd_trace", "trace_filter", "nccl_parser_config",
                                   "df_index_resolver"])
def test_real_traces_same_on_both_paths(trace, monkeypatch):
    # float (ns) times, a ROCm trace with string streams ("0x0"), float durations, NCCL args, the allocator's samples
    # (df_index_resolver: profile_memory=True)
    for f in sorted((DATA / trace).glob("*.gz"))[:1]:
        fast, slow = _read_both(f, monkeypatch, chunk=1 << 16)
        _assert_same(fast, slow)


# any JSON value where a field is expected: the typed path must give the dict path's table
_num = st.one_of(st.integers(-(1 << 64), 1 << 64), st.integers(-(1 << 63), (1 << 63) - 1),
                 st.integers(-2000, 2000), st.floats(allow_nan=False, allow_infinity=False),
                 st.floats(-1e6, 1e6).map(lambda v: round(v, 3)), st.just(-(1 << 63)))
_any = st.one_of(_num, st.none(), st.booleans(), st.text(max_size=4), st.sampled_from(["0x0", "12", "Spans"]),
                 st.lists(st.integers(), max_size=2))
_int_times = st.one_of(st.integers(0, 1 << 52), st.integers(-5, 5),  # and µs whose ns overflow int64:
                       st.sampled_from([1 << 62, -(1 << 62), 9223372036854776, 9223372036854775]))
_time = st.one_of(_int_times, _int_times, _int_times, st.floats(0, 1e13).map(lambda v: round(v, 3)))
_big = st.one_of(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(0, 1 << 40),
                st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 63, 1 << 64]))  # int64 edges, beyond int64
_id = st.one_of(_big, st.sampled_from(["Spans", "0x0", "17"]))


def _without(event: dict, key: str) -> dict:
    return {k: v for k, v in event.items() if k != key}


def _event(dirty: bool):
    """A Kineto-like event; well-typed (as profilers write them) or with any value anywhere."""
    def f(s):
        return st.one_of(s, s, s, _any) if dirty else s
    args = st.fixed_dictionaries({}, optional={
        "correlation": f(_big), "stream": f(_id), "External id": f(_big),
        "bytes": f(st.integers(0, 1 << 30)), "Collective name": f(st.sampled_from(["allreduce", "allgather"])),
        "Process Group Name": f(st.sampled_from(["0", "1"])), "grid": st.just([1, 2, 3]), "name": _any,
        "Input Dims": f(st.lists(st.lists(st.integers(0, 1 << 20), max_size=3), max_size=3)),
        "Input type": f(st.lists(st.sampled_from(["float", "c10::BFloat16", "", "Scalar"]), max_size=3)),
        "Input Strides": f(st.lists(st.lists(st.integers(0, 1 << 20), max_size=3), max_size=3)),
        "In msg nelems": f(_big), "dtype": f(st.sampled_from(["Float", "BFloat16"])),
        "Process Group Ranks": f(st.sampled_from(["[0, 1]", "[0,1,2,3]"])), "Src Rank": f(st.sampled_from([0, 3])),
        "Dst Rank": f(st.sampled_from([1, "2"])), "In split size": f(st.sampled_from(["[]", "[1, 2]", [3, 4]])),
        "Out split size": f(st.sampled_from(["[5, 6]", "[7, ...]"])),
        # an allocator sample's ("[memory]", an instant event)
        "Device Type": f(st.sampled_from([0, 1])), "Device Id": f(st.sampled_from([-1, 0, 3])),
        "Total Allocated": f(_big), "Total Reserved": f(_big)})
    required = {"ph": f(st.sampled_from(["X", "X", "X", "M", "i", "f", "s"])), "ts": f(_time)}
    optional = {"name": f(st.sampled_from(["thread_name", "aten::mm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                                           "[memory]", "[OutOfMemory]"])),
                "pid": f(_id), "tid": f(_id), "args": f(args)}
    if dirty:
        optional.update(cat=f(st.sampled_from(["kernel", "Trace"])), dur=f(_time))
    else:  # as profilers write them: every complete event has a category and a duration
        required.update(cat=st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "Trace"]), dur=_time)
    return st.fixed_dictionaries(required, optional=optional)


_events = st.one_of(st.lists(_event(False), min_size=1, max_size=30),
                    st.lists(_event(False).flatmap(lambda e: st.sampled_from([e, _without(e, "cat"),
                                                                               _without(e, "dur")])),
                             min_size=1, max_size=30),  # well typed, some without cat or dur (dropped, as HTA)
                    st.lists(st.one_of(_event(False), _event(True), _any), min_size=1, max_size=30))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(events=_events,
       chunk=st.sampled_from([1 << 20, 200]))
def test_typed_and_dict_paths_agree_on_any_field_types(events, chunk, tmp_path_factory):
    pytest.importorskip("msgspec")
    p = tmp_path_factory.mktemp("agree") / "t.json"
    p.write_text(json.dumps({"traceEvents": events}, indent=1))
    results = []
    for typed in (True, False):
        old = kineto._typed_decode, kineto.CHUNK_BYTES
        kineto.CHUNK_BYTES = chunk
        if not typed:
            kineto._typed_decode = None
        try:
            results.append(read_kineto(p))
        except TrainperfError as e:
            results.append(str(e))
        finally:
            kineto._typed_decode, kineto.CHUNK_BYTES = old
    fast, slow = results
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
    else:
        _assert_same(fast, slow)


_WITHOUT = r"""
import json, sys
for m in sys.argv[2].split(","):
    sys.modules[m] = None  # makes `import m` raise ImportError, as if the package were not installed
from trainperf.trace import kineto, read_kineto
t = read_kineto(sys.argv[1])
print(json.dumps({"typed": kineto._typed_decode is not None, "inflater": kineto._gzip_module.__name__,
                  "loads": kineto._loads.__module__, "names": t.names, "name": t.name.tolist(),
                  "ts": t.ts_ns.tolist(), "dur": t.dur_ns.tolist(), "stream": t.stream.tolist(),
                  "nbytes": t.nbytes.tolist(), "step": t.step.tolist(), "category": t.category.tolist()}))
"""


@pytest.mark.parametrize("blocked", ["msgspec", "isal", "msgspec,isal,orjson"])
def test_loader_without_optional_packages_reads_the_same(tmp_path, blocked):
    # each optional package really absent (import fails in a fresh interpreter): same table, other parser
    import subprocess
    import sys

    b = TraceBuilder(ns=True)
    b.step(1, 0, 500)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10.5, 20.25, 30.125, stream=9)
    b.launch("Memcpy HtoD (Pageable -> Device)", 60, 200, 10, cat="gpu_memcpy", runtime="cudaMemcpyAsync", bytes=4096)
    p = b.write(tmp_path / "t.json.gz")
    runs = {}
    for mods in ("no_such_package", blocked):
        r = subprocess.run([sys.executable, "-c", _WITHOUT, str(p), mods], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        runs[mods] = json.loads(r.stdout)
    full, without = runs["no_such_package"], runs[blocked]
    assert full["typed"] and full["inflater"] == "isal.igzip" and full["loads"] == "orjson"
    assert without["typed"] is ("msgspec" not in blocked)
    assert (without["inflater"] == "gzip") is ("isal" in blocked)
    assert (without["loads"] == "json") is ("orjson" in blocked)
    for k in ("names", "name", "ts", "dur", "stream", "nbytes", "step", "category"):
        assert full[k] == without[k], k
