"""CPU-only (gloo) straggler: hand-built 2-rank traces with a known answer.

Each step lasts 100 ms on both ranks (the collectives keep them in step). Rank 1 computes 30 ms longer
(a sleep with no op); rank 0's training-loop thread waits those 30 ms inside DistributedDataParallel.forward,
after c10d::broadcast_ returns and with gloo:broadcast open on the gloo worker thread. Expected: straggler
rank 1, gain 30 ms per 100 ms step = 30%.
"""

import json

import pytest

from trainperf.diagnose.api import diagnose
from trainperf.diagnose.crossrank import host_step_waits, host_straggler
from trainperf.trace import load_trace

STEP_MS, EXTRA_MS, STEPS = 100.0, 30.0, 4


def _x(name, ts_ms, dur_ms, tid, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3,
            "args": {}}


def _rank_events(rank: int, extra_ms: dict[int, float], fetching: bool = False) -> list[dict]:
    """One rank's steps; extra_ms[step]: how much longer rank 1 computes in that step (fetching: rank 1
    spends that time fetching its batch, inside a DataLoader span, instead of computing)."""
    ev = []
    for k in range(STEPS):
        s = 1000.0 + k * STEP_MS
        x = extra_ms.get(k, 0.0)
        ev.append(_x(f"ProfilerStep#{k + 1}", s, STEP_MS - 0.01, 10, "user_annotation"))
        if rank == 0:   # waits x ms for rank 1 at the buffer broadcast
            fwd = s + 1.0
            ev += [_x("DistributedDataParallel.forward", fwd, 59.0, 10, "user_annotation"),
                   _x("c10d::broadcast_", fwd + 0.5, 0.2, 10),
                   _x("gloo:broadcast", fwd + 0.6, x + 0.4, 20),
                   _x("aten::mm", fwd + 1.0 + x, 58.0 - 1.0 - x, 10)]
        else:           # computes x ms longer (a sleep: no op on the loop thread), then forward at once
            fwd = s + 1.0 + x
            if fetching and x:
                ev.append(_x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s + 1.0, x, 10,
                             "user_annotation"))
            ev += [_x("DistributedDataParallel.forward", fwd, 59.0 - x, 10, "user_annotation"),
                   _x("c10d::broadcast_", fwd + 0.5, 0.2, 10),
                   _x("gloo:broadcast", fwd + 0.6, 0.4, 20),
                   _x("aten::mm", fwd + 1.0, 58.0 - 1.0 - x, 10)]
        ev.append(_x("aten::mm", s + 61.0, 38.0, 10))
    return ev


def _write(tmp_path, extra_ms, fetching: bool = False):
    for r in (0, 1):
        doc = {"traceEvents": _rank_events(r, extra_ms, fetching),
               "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2}}
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    return tmp_path


def test_host_waits_are_the_blocked_time_inside_the_broadcast(tmp_path):
    tables = load_trace(_write(tmp_path, {k: EXTRA_MS for k in range(STEPS)}))
    w0, w1 = host_step_waits(tables[0]), host_step_waits(tables[1])
    assert sorted(w0) == [1, 2, 3, 4]
    # rank 0: no child op from fwd+0.5 (inside c10d::broadcast_, then DDP.forward) to the mm at fwd+31.0;
    # gloo:broadcast is open fwd+0.6 .. fwd+31.0: blocked 30.4 ms
    assert w0[2][1] == pytest.approx((EXTRA_MS + 0.4) * 1e3, abs=1.0)
    # rank 1: the same with no wait: fwd+0.6 .. fwd+1.0 = 0.4 ms
    assert w1[2][1] == pytest.approx(0.4e3, abs=1.0)


def test_the_rank_that_computes_longer_is_the_straggler(tmp_path):
    hs = host_straggler(load_trace(_write(tmp_path, {k: EXTRA_MS for k in range(STEPS)})))
    assert hs.rank == 1
    # own work: rank 1 100 - 0.4, rank 0 100 - 30.4: extra 30 ms, covered by rank 0's 30.4 ms wait
    assert hs.gain_us == pytest.approx(EXTRA_MS * 1e3, abs=5.0)
    assert hs.gain_pct == pytest.approx(100 * EXTRA_MS / STEP_MS, abs=0.1)
    d = diagnose(tmp_path)
    top = [f for f in d.findings if f.kind == "straggler"]
    assert len(top) == 1 and top[0].ranks == [1]
    assert top[0].gain_pct == pytest.approx(30.0, abs=0.1)


def test_a_rank_late_because_it_fetches_its_batch_is_a_data_loader_stall_not_a_straggler(tmp_path):
    """Rank 1 spends the same 30 ms per step inside its DataLoader instead of computing: rank 0 waits for
    it just as much, but the fix is the data loader's (the others' wait goes when the fetch does), so own
    work = step - wait - stall is alike on both ranks: no straggler, a data-loader stall on rank 1 of
    30 ms per 100-ms step (its what-if removes the fetch: 30 %)."""
    w1 = host_step_waits(load_trace(_write(tmp_path, {k: EXTRA_MS for k in range(STEPS)}, fetching=True))[1])
    assert w1[2] == pytest.approx((STEP_MS * 1e3 - 10.0, 0.4e3, EXTRA_MS * 1e3), abs=1.0)
    hs = host_straggler(load_trace(tmp_path))
    assert hs.gain_pct == pytest.approx(0.0, abs=0.5)   # own work 100 - 0.4 - 30 vs 100 - 30.4
    d = diagnose(tmp_path)
    assert not [f for f in d.findings if f.kind == "straggler"]
    assert d.findings[0].kind == "data_loader_stall" and d.findings[0].ranks == [1]


def test_a_one_off_wait_in_one_step_is_not_a_straggler(tmp_path):
    d = diagnose(_write(tmp_path, {0: EXTRA_MS}))   # start-up: rank 1 late in the first step only
    assert not [f for f in d.findings if f.kind == "straggler"]
    assert host_straggler(load_trace(tmp_path)).gain_pct == pytest.approx(0.0, abs=0.5)


def _p2p_rank(rank: int, late_ms: float) -> dict:
    """A rank with 3 steps of one GEMM then one ncclKernel_SendRecv; rank 1's kernels start late_ms later
    (its partner is a pipeline stage outside the trace, so no wait can be read from the pairing)."""
    ev = []
    for k in range(3):
        s = 1000.0 + k * 50.0
        ev.append(_x(f"ProfilerStep#{k + 1}", s, 49.9, 10, "user_annotation"))
        for j, (name, cat, off, dur) in enumerate((("sm90_xmma_gemm_f16", "kernel", 1.0, 20.0),
                                                   ("ncclKernel_SendRecv_RING_LL", "kernel", 22.0, 5.0))):
            corr = 100 * k + j + 1
            ev.append({**_x("cudaLaunchKernel", s + off - 0.5, 0.01, 10, "cuda_runtime"), "args": {"correlation": corr}})
            ev.append({**_x(name, s + off + (late_ms if rank == 1 else 0.0), dur, 7, cat),
                       "pid": 0, "args": {"correlation": corr, "stream": 7, "device": 0}})
    return {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}}


def test_point_to_point_kernels_are_not_paired_across_ranks(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(_p2p_rank(r, 10.0)))
    d = diagnose(tmp_path)
    assert d.cross_rank["n_collectives_matched"] == 0
    assert d.cross_rank["clock_offset_us"] == {0: 0.0, 1: 0.0}
    assert any("point-to-point" in n for n in d.notes)
    assert not [f for f in d.findings if f.kind == "straggler"]


def _noisy_rank_events(rank: int, delays_ms: dict[int, list[float]]) -> list[dict]:
    """Like _rank_events, but either rank may compute longer in a step: rank r starts its forward d_r ms late
    and waits max(d) - d_r ms inside the broadcast (gloo:broadcast open meanwhile)."""
    ev = []
    for k in range(len(delays_ms[0])):
        s = 1000.0 + k * STEP_MS
        d = delays_ms[rank][k]
        wait = max(v[k] for v in delays_ms.values()) - d
        fwd = s + 1.0 + d
        ev += [_x(f"ProfilerStep#{k + 1}", s, STEP_MS - 0.01, 10, "user_annotation"),
               _x("DistributedDataParallel.forward", fwd, 59.0 - d, 10, "user_annotation"),
               _x("c10d::broadcast_", fwd + 0.5, 0.2, 10),
               _x("gloo:broadcast", fwd + 0.6, wait + 0.4, 20),
               _x("aten::mm", fwd + 1.0 + wait, 57.0 - d - wait, 10),
               _x("aten::mm", s + 61.0, 38.0, 10)]
    return ev


def test_a_rank_slower_only_in_some_steps_is_noise_not_a_straggler(tmp_path):
    # rank 1 computes 30, 45, 20 ms longer in steps 1-3, rank 0 25 and 35 ms longer in steps 4-5: rank 1's
    # extra work per step is +30, +45, +20, -25, -35 ms: median 20, median absolute deviation 25 -> 0.8 < 1.
    # Its covered wait (20 ms per 100-ms step, the median of 30, 45, 20, 0, 0) alone would pass the 5 % bar.
    delays = {0: [0.0, 0.0, 0.0, 25.0, 35.0], 1: [30.0, 45.0, 20.0, 0.0, 0.0]}
    for r in (0, 1):
        doc = {"traceEvents": _noisy_rank_events(r, delays),
               "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2}}
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    hs = host_straggler(load_trace(tmp_path))
    assert hs.rank == 1 and hs.gain_pct == pytest.approx(20.0, abs=0.5)
    assert hs.snr == pytest.approx(20.0 / 25.0, abs=0.02)
    assert not [f for f in diagnose(tmp_path).findings if f.kind == "straggler"]
