"""Injectors and the truth's step window against hand-worked timelines (µs) on synthetic Kineto traces."""

import random

import pytest

from trainperf.corpus import kineto as K
from trainperf.corpus.build import build_corpus
from trainperf.corpus.inject import NotApplicable, inject_checkpoint_stall, inject_exposed_comm, inject_pageable_copy

HOST, GPU = (1, 1), (0, 7)


def _x(name, cat, pid_tid, ts, dur, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid_tid[0], "tid": pid_tid[1], "ts": ts, "dur": dur, "args": {}}
    if corr is not None:
        e["args"] = {"correlation": corr, "stream": pid_tid[1]}
    return e


def steps_then_a_cut_one(launch="cudaLaunchKernel"):
    """3 steps of 100 µs (each launches at +10 one 50 µs kernel starting at +15), then a 4th step
    the profiler's stop cut after 10 µs, with no device work."""
    ev = []
    for k in range(3):
        t = 100.0 * k
        ev += [_x(f"ProfilerStep#{k + 1}", "user_annotation", HOST, t, 100.0),
               _x(launch, "cuda_runtime", HOST, t + 10, 5.0, corr=k + 1),
               _x("gemm", "kernel", GPU, t + 15, 50.0, corr=k + 1)]
    ev.append(_x("ProfilerStep#4", "user_annotation", HOST, 300.0, 10.0))
    return {"traceEvents": ev}


def test_step_time_is_over_every_step_but_the_last():
    doc = steps_then_a_cut_one()
    assert [s.number for s in K.window_steps(doc["traceEvents"])] == [1, 2, 3]
    assert K.step_time_us(doc["traceEvents"]) == 100.0  # (300 - 0) / 3; the 10 µs step would give 77.5


def test_one_off_checkpoint_gain_is_its_share_of_the_window():
    # 30 µs saved at the end of step 2 (the middle of 4): the device has drained (gemm ended at 165),
    # so the host stops 30 µs and the window grows from 300 to 330 µs: gain 30 / 330
    doc = steps_then_a_cut_one()
    out, touched = inject_checkpoint_stall({0: doc}, 30.0, random.Random(0))
    before, after = K.step_time_us(doc["traceEvents"]), K.step_time_us(out[0]["traceEvents"])
    assert (before, after) == (100.0, 110.0)
    assert 100 * (after - before) / after == pytest.approx(100 * 30 / 330)
    assert touched == [0]


def test_rocm_base_gets_hip_names():
    doc = steps_then_a_cut_one(launch="hipLaunchKernel")
    out, _ = inject_pageable_copy({0: doc}, 20.0, random.Random(0))
    names = {e["name"] for e in out[0]["traceEvents"]}
    # HTA's MI250 trace: a blocking host-to-device copy is hipMemcpyWithStream + "Memcpy HtoD (Host -> Device)"
    assert {"hipMemcpyWithStream", "Memcpy HtoD (Host -> Device)"} <= names
    assert not any(n.startswith("cuda") or "Pageable" in n for n in names)
    out, _ = inject_pageable_copy({0: steps_then_a_cut_one()}, 20.0, random.Random(0))
    assert {"cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)"} <= {e["name"] for e in out[0]["traceEvents"]}


def test_a_kind_the_base_cannot_hold_is_skipped_with_its_reason(tmp_path):
    doc = steps_then_a_cut_one()
    with pytest.raises(NotApplicable, match="no collective"):
        inject_exposed_comm({0: doc}, 1.0, random.Random(0))
    path = tmp_path / "rank0.json.gz"
    K.write_events(path, doc)
    from trainperf.corpus.build import Base

    logged = []
    labels = build_corpus(tmp_path / "c", [Base("toy", (str(path),))], kinds=("exposed_comm", "straggler"),
                          severities=("high",), log=logged.append)
    assert [lab["kind"] for lab in labels] == ["healthy"]
    assert any("exposed_comm" in s and "no collective" in s for s in logged)
    assert any("straggler" in s and "at least 2 ranks" in s for s in logged)
