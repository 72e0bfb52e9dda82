"""Launches made synchronous (CUDA_LAUNCH_BLOCKING=1): each call returns only after its own kernel has run. A host
sync at every launch, priced by the idle it causes (replay), worked by hand; asynchronous launches are not one."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

GEMM = "ampere_bf16_s16816gemm_bf16_128x128_tn"


def _steps(path: Path, *, call_us, kernel_at, kernel_us, every_us, synchronous=lambda i: True,
           short=lambda i: False, runtime="cudaLaunchKernel") -> Path:
    """Three 560-µs steps of five aten::mm ops, one every `every_us` from T+1; each launch call lasts call_us (or
    8 µs where synchronous(i) is false) and its kernel runs kernel_us from kernel_at after the call's start; where
    short(i), a 12-us kernel in a 25-us call instead (synchronous too: it returns 8 us after its kernel)."""
    b = TraceBuilder()
    for s in range(3):
        T = 560.0 * s
        b.step(s, T, 560)
        for i in range(5):
            at = T + 1 + every_us * i
            b.cpu("aten::mm", at - 1, every_us)
            if short(i):
                b.launch(GEMM, at, at + 5, 12, launch_dur=25, runtime=runtime)
            else:
                b.launch(GEMM, at, at + kernel_at, kernel_us, launch_dur=call_us if synchronous(i) else 8.0,
                         runtime=runtime)
    return b.write(path)


def test_launches_that_wait_for_their_kernel_are_a_host_sync(tmp_path):
    # each call [L, L+108) waits for its kernel [L+5, L+105): 100 us of its 108 with the kernel running, it
    # returns 3 us after it. Launched asynchronously the call costs the other 8 us: the host issues a step's five
    # launches in 50 us and the kernels run back to back. The analysed window is steps 0-1 (0 .. 1120 us): a step
    # of 560 us on the host, and on the device (first kernel start 6, last end 560 + 1 + 440 + 5 + 100 = 1106)
    # (1106 - 6) / 2 = 550 us; unblocked, the host's step is ~60 us and the device's ten 100-us kernels run from
    # 6 to 1006: 500 us a step. Gain 560 - 500 = 60 us a step (10.71 %), 120 us over the window's 2 steps
    d = diagnose(_steps(tmp_path / "s.json.gz", call_us=108, kernel_at=5, kernel_us=100, every_us=110))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.gain_us == pytest.approx(120) and f.gain_pct == pytest.approx(100 * 60 / 560, abs=0.01)
    m = f.evidence["metrics"]
    assert m["launches_waiting_for_their_kernel"]["value"] == 10
    assert m["sync_blocking_time"]["value"] == pytest.approx(10 * 100)  # each call beyond its own 8 us
    assert "CUDA_LAUNCH_BLOCKING" in f.recommendation
    assert [c["site"] for c in f.evidence["call_sites"]] == ["aten::mm"]


def test_the_setting_is_named_for_the_runtime(tmp_path):
    d = diagnose(_steps(tmp_path / "h.json.gz", call_us=108, kernel_at=5, kernel_us=100, every_us=110,
                        runtime="hipLaunchKernel"))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert "HIP_LAUNCH_BLOCKING=1" in f.recommendation and "CUDA_LAUNCH_BLOCKING" not in f.recommendation


def test_asynchronous_launches_are_not_a_sync(tmp_path):
    # the same kernels launched by 8-us calls that return before their kernel starts; and a full launch queue (a
    # GPU-bound loop): 108-us calls that wait for a free slot while earlier kernels run, their own kernel starting
    # only after they return
    for name, call, at in (("async", 8, 5), ("queue", 108, 200)):
        d = diagnose(_steps(tmp_path / f"{name}.json.gz", call_us=call, kernel_at=at, kernel_us=100, every_us=110))
        assert not any(x.kind == "host_sync" for x in d.findings), name


def test_a_short_kernel_inside_a_slow_call_is_chance(tmp_path):
    # 22-us calls on an idle device whose 10-us kernels run from 4 us after the call's start and end 8 us before it
    # returns: more than TOL_US with the kernel running, but not half the call
    d = diagnose(_steps(tmp_path / "c.json.gz", call_us=22, kernel_at=4, kernel_us=10, every_us=110))
    assert not any(x.kind == "host_sync" for x in d.findings)


def test_a_minority_of_waiting_launches_is_not_the_setting(tmp_path):
    # one launch in five returns after its kernel (an allocator call inside it, a slow driver moment): launch
    # blocking is a setting of the process, true of every launch, so a minority is not it
    d = diagnose(_steps(tmp_path / "m.json.gz", call_us=108, kernel_at=5, kernel_us=100, every_us=110,
                        synchronous=lambda i: i == 2))
    assert not any(x.kind == "host_sync" for x in d.findings)


def test_short_kernels_do_not_hide_the_setting(tmp_path):
    # three launches in five are of 12-us kernels whose 25-us calls return 8 us after them: synchronous, but 12 us of
    # 25 is under half the call, as asynchronous chance could be; they show nothing either way and the two 100-us
    # launches decide. The setting is the process's: once it is read, the short kernels' launches, which ended
    # inside their calls too, waited as well (5 per analysed step)
    d = diagnose(_steps(tmp_path / "k.json.gz", call_us=108, kernel_at=5, kernel_us=100, every_us=110,
                        short=lambda i: i < 3))
    f = next(x for x in d.findings if x.kind == "host_sync")
    assert f.evidence["metrics"]["launches_waiting_for_their_kernel"]["value"] == 10
    assert "CUDA_LAUNCH_BLOCKING" in f.recommendation


HTA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"
needs_hta = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/data/traces/hta not present")


def _call_tracks_kernel(path: Path) -> float:
    """From the raw JSON: the correlation of each launch call's duration with its kernel's (1: the call lasts as
    long as the kernel it launched, i.e. waits for it; ~0: it returns whatever the kernel does)."""
    import gzip
    import json

    import numpy as np

    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X" and "correlation" in e.get("args", {})
             and ("Launch" in e["name"] or e["name"].startswith("runFunction"))}
    pairs = [(calls[e["args"]["correlation"]]["dur"], e["dur"]) for e in events
             if e.get("cat") in ("kernel", "mtia_ccp_events") and e.get("args", {}).get("correlation") in calls]
    return float(np.corrcoef(np.array(pairs, dtype=float).T)[0, 1])


@needs_hta
def test_a_runtime_that_waits_for_each_job_is_named():
    """HTA's MTIA trace: each `runFunction - job_prep_and_submit_for_execution` call lasts as long as the job it
    submits (raw JSON: durations correlate 0.99999 over 3,453 pairs), on HTA's A100 trace they do not (0.12). The
    first is read as synchronous launches, by the device's own runtime (not a CUDA setting); the second is not."""
    mtia = HTA / "mtia_trace_single_rank/mtia_rank_0.json.gz"
    a100 = HTA / "nccl_parser_config/nccl_data.json.gz"
    assert _call_tracks_kernel(mtia) > 0.99 and abs(_call_tracks_kernel(a100)) < 0.5
    f = next(x for x in diagnose(mtia).findings if x.kind == "host_sync")
    assert f.evidence["metrics"]["launches_waiting_for_their_kernel"]["value"] > 100
    assert "runFunction" in f.recommendation and "device's runtime" in f.recommendation
    assert not any(x.kind == "host_sync" and x.evidence["metrics"]["launches_waiting_for_their_kernel"]["value"]
                   for x in diagnose(a100).findings)
