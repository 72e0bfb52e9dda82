"""The loader keeps each operator's autograd "Sequence number" and "Fwd thread id" (EventTable.seq,
EventTable.fwd_tid; -1 when absent), alike on the typed (msgspec) and the generic (dict) path.

References: the values as written in the file, read back with `json.load`; the dict path for odd types.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_trace_parsers import _assert_same, _read_both
from trainperf.trace import read_kineto

DATA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"


def _expected(path: Path) -> dict:
    """{(name, ts_ns): (seq, fwd_tid)} of the file's complete events, by json.load."""
    raw = json.loads((gzip.open if path.suffix == ".gz" else open)(path, "rb").read())
    out = {}
    for e in raw["traceEvents"]:
        if e.get("ph") == "X" and "cat" in e and "dur" in e:
            a = e.get("args") or {}
            out[(e["name"], int(round(e["ts"] * 1000)))] = (a.get("Sequence number", -1), a.get("Fwd thread id", -1))
    return out


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/traces/hta not present")
@pytest.mark.parametrize("trace", ["call_stack/backward_thread.json",
                                   "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"])
def test_sequence_numbers_as_written(trace, monkeypatch):
    path = DATA / trace
    t = read_kineto(path)
    want = _expected(path)
    got = {(t.name_of(i), int(t.ts_ns[i])): (int(t.seq[i]), int(t.fwd_tid[i])) for i in range(len(t))}
    assert got == want
    assert (t.seq >= 0).any() and t.seq.dtype == np.int64 and t.fwd_tid.dtype == np.int64
    fast, slow = _read_both(path, monkeypatch, chunk=1 << 12)
    _assert_same(fast, slow)


def test_backward_node_and_its_forward_op_share_the_number():
    # HTA's backward-thread sample: the autograd node and the backward op inside it carry seq 714649 and the
    # forward thread's id 1; the kernel and the launch carry none
    if not DATA.is_dir():
        pytest.skip("../shared/data/traces/hta not present")
    t = read_kineto(DATA / "call_stack/backward_thread.json")
    by = {t.name_of(i): (int(t.seq[i]), int(t.fwd_tid[i])) for i in range(len(t))}
    assert by["autograd::engine::evaluate_function: AddmmBackward0"] == (714649, 1)
    assert by["AddmmBackward0"] == (714649, 1)
    assert by["aten::mm"] == (-1, -1) and by["cudaLaunchKernel"] == (-1, -1)
    assert t.take(t.seq >= 0).seq.tolist() == [714649, 714649]


_value = st.one_of(st.integers(-(1 << 64), 1 << 64), st.integers(0, 1 << 40), st.floats(allow_nan=False,
                                                                              allow_infinity=False),
                   st.text(max_size=4), st.none(), st.just(-(1 << 63)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(values=st.lists(st.tuples(_value, _value, st.booleans()), min_size=1, max_size=12))
def test_typed_and_dict_paths_agree_on_any_sequence_values(values, tmp_path_factory):
    pytest.importorskip("msgspec")
    from trainperf.trace import kineto

    events = []
    for i, (seq, fwd, both) in enumerate(values):
        args = {"Sequence number": seq, "Fwd thread id": fwd} if both else {"Sequence number": seq}
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": i, "dur": 1,
                       "args": args})
    p = tmp_path_factory.mktemp("seq") / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    fast = read_kineto(p)
    real = kineto._typed_decode
    try:
        kineto._typed_decode = None
        slow = read_kineto(p)
    finally:
        kineto._typed_decode = real
    _assert_same(fast, slow)
    for i, (seq, fwd, both) in enumerate(values):  # plain 64-bit ints are kept as written
        if seq.__class__ is int and abs(seq) < 1 << 62:
            assert fast.seq[i] == seq
