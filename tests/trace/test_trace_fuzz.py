"""Fuzz the loader: thousands of mutated traces, the only allowed failure is a TrainperfError."""

import gzip
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kineto_builder import TraceBuilder
from trainperf.diagnose.api import analyse_rank
from trainperf.diagnose.facts import collect_facts
from trainperf.diagnose.window import analysis_window
from trainperf.errors import TrainperfError
from trainperf.trace import kineto, read_kineto


def _seed() -> bytes:
    b = TraceBuilder()
    b.step(1, 0, 300).step(2, 300, 300)
    b.cpu("enumerate(DataLoader)#x", 0, 20, cat="user_annotation")
    b.launch("ampere_sgemm_128x64_tn", 25, 30, 100)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 60, 80, stream=20)
    b.cpu("cudaStreamSynchronize", 40, 150, cat="cuda_runtime")
    b.launch("Memcpy DtoH (Device -> Pageable)", 200, 205, 5, cat="gpu_memcpy", bytes=64)
    b.launch("k", 310, 320, 10)
    return json.dumps(b.doc(), indent=1).encode()


SEED = _seed()
_DIR = Path(tempfile.mkdtemp(prefix="trainperf-fuzz-"))
TOKENS = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"-1", b"1e400", b"null", b"true", b'"ts"', b'"dur"',
          b'"X"', b"9223372036854775808", b"NaN", b"\\u0000", b"\xff", b"\n"]

mutation = st.one_of(
    st.tuples(st.just("cut"), st.integers(0, len(SEED))),
    st.tuples(st.just("flip"), st.integers(0, len(SEED) - 1), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, len(SEED)), st.sampled_from(TOKENS)),
    st.tuples(st.just("delete"), st.integers(0, len(SEED)), st.integers(1, 40)),
)


def _apply(data: bytes, muts) -> bytes:
    for m in muts:
        if m[0] == "cut":
            data = data[: m[1]]
        elif m[0] == "flip" and m[1] < len(data):
            data = data[: m[1]] + bytes([m[2]]) + data[m[1] + 1:]
        elif m[0] == "insert":
            data = data[: m[1]] + m[2] + data[m[1]:]
        elif m[0] == "delete":
            data = data[: m[1]] + data[m[1] + m[2]:]
    return data


@settings(max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(muts=st.lists(mutation, min_size=1, max_size=4), gz=st.booleans(), chunk=st.sampled_from([1 << 20, 97]))
def test_mutated_traces_never_crash(muts, gz, chunk):
    data = _apply(SEED, muts)
    if gz:
        comp = gzip.compress(data)
        data = comp if muts[0][0] != "cut" else comp[: max(len(comp) * muts[0][1] // max(len(SEED), 1), 0)]
    p = _DIR / ("t.json.gz" if gz else "t.json")
    p.write_bytes(data)
    old = kineto.CHUNK_BYTES
    kineto.CHUNK_BYTES = chunk
    try:
        t = read_kineto(p)
    except TrainperfError as e:
        assert "\n" not in str(e)
        return
    finally:
        kineto.CHUNK_BYTES = old
    analyse_rank(collect_facts(t, analysis_window(t)))  # whatever loaded must also analyse
