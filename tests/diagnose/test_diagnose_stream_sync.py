"""A sync that waited for a collective, overlapped: a stream sync waits for its own stream's other work only, a
device sync for every stream's (replay.ONE_STREAM_SYNC_RE)."""

import sys
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
P, STEPS = 7100.0, 4


def _trace(folder: Path, sync: str) -> Path:
    """STEPS steps of P us: an all-reduce launched at +5 runs [+10, +3010) on stream 84; a pinned copy launched at
    +20 runs [+1500, +1510) on stream 25 (late: its stream waited for something the trace does not show); the host
    calls `sync` at +30 and it returns at +3013, 3 us after the all-reduce; then 4000 us of Python."""
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.launch(NCCL, T + 5.0, T + 10.0, 3000.0, stream=84)
        b.launch("Memcpy HtoD (Pinned -> Device)", T + 20.0, T + 1500.0, 10.0, stream=25, cat="gpu_memcpy",
                 runtime="cudaMemcpyAsync")
        b.cpu(sync, T + 30.0, 2983.0, cat="cuda_runtime")
        b.cpu("python_work", T + 3020.0, 4000.0)
    return b.write(folder / "t.json.gz")


@pytest.mark.parametrize("sync, waits_until", [("cudaStreamSynchronize", None), ("cudaDeviceSynchronize", 1510.0)])
def test_an_overlapped_collective_frees_a_stream_sync_of_its_own_wait(tmp_path, sync, waits_until):
    # the sync returned 3 us after the all-reduce: it waited for it (exposed_comm, the host blocked on it). Overlapped,
    # the stream sync (of the all-reduce's stream: it returned when that stream's work ended) waits for nothing
    # else there and returns at once: the step loses the 2983-us wait; the device sync still waits for the copy on
    # stream 25 until +1510: it loses 3013 - 1510 = 1503 us. (Before, both waited for the copy.) The window ends with
    # the last analysed step (the host's Python after the sync, which moves with it): the gain is three steps' worth
    # (closed at the last call before, the window ended with the last all-reduce, which no fix shortens: two)
    d = diagnose(_trace(tmp_path, sync))
    x = next(f for f in d.findings if f.kind == "exposed_comm")
    per_step = 2983.0 if waits_until is None else 3013.0 - waits_until
    assert x.gain_us == pytest.approx(3 * per_step, abs=30.0)
