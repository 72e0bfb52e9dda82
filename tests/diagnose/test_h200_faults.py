"""diagnose on real H200 traces of planted faults (tests/data/h200_faults, made by
benchmarks/gpu_diagnose_faults.py): the top finding names the fault, its gain is the measured fix's within
the stated tolerance, and the healthy loops carry no finding above low; the gaps still open are strict xfails."""

import json
from pathlib import Path

import pytest

from trainperf.diagnose.api import diagnose

CASES = Path(__file__).resolve().parents[1] / "data" / "h200_faults"
SICK = sorted(p.name for p in CASES.iterdir() if p.is_dir() and not p.name.startswith("healthy"))
HEALTHY = sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name.startswith("healthy"))
# the what-if may miss what the trace cannot show (ops that run slower around every cudaFree, a profiled host's
# overhead), never by more than half of the measured gain, and never claims more than 5 pp above the largest gain
# measured for the fixes its recommendation names (labels' other_fixes: fp32 GEMMs are priced at bf16's tensor-core
# peak, an upper bound, and TF32 is the fix labelled)
MIN_SHARE_OF_TRUE_GAIN, MAX_OVER_TRUE_GAIN_PP = 0.5, 5.0
# what the traces show that diagnose does not price yet (docs/benchmarks.md, "GPU (H200)"); strict: each fails
# the test as long as the gap is there, and passes it, failing the suite, once it is closed
GAIN_MISSES: dict[str, str] = {}  # none open: the pageable copy, priced as a side-stream prefetch at 48.3 %, above
# even that fix's measured limit (40.4 %), is priced as the fix labelled (pinned, non_blocking: its copy still on its
# stream at the pinned rate), 42.2 % for 35.6 % measured


def _diagnose(case: str):
    return diagnose(CASES / case / "traces" / "rank0.json.gz"), json.loads((CASES / case / "labels.json").read_text())


def _injected(tmp_path, case: str, inject, size: float):
    """The case's trace with a fault inserted by the corpus's surgery (corpus/inject.py: `inject`, at `size`, seed 0),
    diagnosed: (its diagnosis, the truth's step before and after, µs, corpus.kineto.step_time_us)."""
    import gzip
    import random

    from trainperf.corpus import kineto as K

    doc = json.loads(gzip.open(CASES / case / "traces" / "rank0.json.gz").read())
    out, _ = inject({0: doc}, size, random.Random(0))
    (tmp_path / "rank0.json").write_text(json.dumps(out[0]))
    return diagnose(tmp_path / "rank0.json"), K.step_time_us(doc["traceEvents"]), K.step_time_us(out[0]["traceEvents"])


def _known(misses: dict, cases: list[str]) -> list:
    return [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=misses[c])) if c in misses else c
            for c in cases]


@pytest.mark.parametrize("case", SICK)
def test_the_top_finding_names_the_planted_fault(case):
    d, labels = _diagnose(case)
    assert d.findings[0].kind == labels["kind"]


@pytest.mark.parametrize("case", _known(GAIN_MISSES, SICK))
def test_the_planted_fault_is_priced_near_its_measured_fix(case):
    d, labels = _diagnose(case)
    found = next(x for x in d.findings if x.kind == labels["kind"])
    # priced on the window's steady-state step (diagnose/period.py): the DataLoader's 30 ms in front of 23 ms of GPU
    # work, 38.2 % measured, read 46.1 % of the 3-step window, whose last GPU work runs 18 ms past its host steps
    largest = max([labels["true_gain_pct"], *labels.get("other_fixes", {}).values()])
    assert MIN_SHARE_OF_TRUE_GAIN * labels["true_gain_pct"] <= found.gain_pct <= largest + MAX_OVER_TRUE_GAIN_PP


@pytest.mark.parametrize("case", HEALTHY)
def test_a_healthy_loop_has_no_finding_above_low(case):
    # the GPU-bound loop's host runs 8 steps ahead of its GPU: the kernels of the steps launched before the profiled
    # window keep the GPU busy while the window's host launches, and are busy time (before: idle_gpu, medium, 80 %
    # "idle over the steps")
    d, _ = _diagnose(case)
    assert [(x.kind, x.severity) for x in d.findings if x.severity != "low"] == []


def test_each_fix_names_the_setting_that_caused_it():
    assert "CUDA_LAUNCH_BLOCKING" in _diagnose("host_sync-high-h200")[0].findings[0].recommendation
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in _diagnose("allocator_stall-high-h200")[0].findings[0].recommendation


def test_the_fp32_loop_is_not_idle_before_its_first_recorded_kernel():
    # profiled after warm-up, the fp32 loop's first recorded kernel was launched before the trace began: the 11 ms
    # before it the GPU ran unrecorded work (before: idle_gpu, medium, 64 % "idle over the steps")
    d, _ = _diagnose("fp32_matmul-high-h200")
    assert not any(x.kind == "idle_gpu" for x in d.findings)


def test_launch_bound_gives_the_floor_an_unprofiled_step_is_checked_against():
    # the GPU's busy time per step is what no host speed gets under: the same loop captured in one CUDA graph
    # (its measured step, fixed_step_ms) runs no faster than it, and not much slower (the graph keeps a few µs of
    # device time between its 140 kernels a step)
    d, labels = _diagnose("launch_bound-high-h200")
    busy = d.findings[0].evidence["metrics"]["gpu_busy_per_step"]["value"]
    assert 0.75 * labels["fixed_step_ms"] <= busy <= labels["fixed_step_ms"]


def test_host_work_a_queue_hides_from_the_window_is_priced_at_the_host_steps_excess(tmp_path):
    """The GPU-bound H200 loop (22.4 ms of GPU work a step, the host 6.1 ms and 28 ms ahead) with 17.8 ms of host work
    inserted once a step (the corpus's surgery, corpus/inject.py): the host's step, 23.9 ms, now outlasts the GPU's
    and a long run goes at its pace, but in the 3 profiled steps the queue launched before the window keeps the GPU
    busy (no idle during the work). The truth (corpus.kineto.step_time_us, independent of diagnose): 22.4 -> 23.9 ms,
    6.1 %. host_work is found on the host's excess over the device's step and priced by the replay within 0.5 pp."""
    from trainperf.corpus.inject import inject_host_work

    d, before, after = _injected(tmp_path, "healthy-h200-gpu_bound", inject_host_work, 17_790.0)
    true_gain = 100 * (after - before) / after
    assert 5.0 < true_gain < 7.0
    found = [x for x in d.findings if x.kind == "host_work"]
    assert found and found[0].gain_pct == pytest.approx(true_gain, abs=0.5)
    metrics = found[0].evidence["metrics"]
    assert metrics["gpu_idle_during_it"]["value"] == 0.0
    assert metrics["host_step_over_device_step"]["value"] == pytest.approx(after - before, rel=0.05)


def test_work_queued_before_the_profile_is_a_note_not_a_truncated_window():
    """The GPU-bound loop's host ran 28 ms ahead: as its profile opens the GPU still runs 13.5 ms of earlier steps' work,
    whose launches came before the trace (correlation ids below every recorded launch: 17 % of its GPU events). The
    window is not cut short, so no finding loses confidence for it; a note says what that work is."""
    d, _ = _diagnose("healthy-h200-gpu_bound")
    notes = " ".join(d.notes)
    assert "truncated" not in notes
    assert "17 % of the GPU events ran work launched before the trace began for 13.5 ms into the analysed steps" in notes
    assert all(x.confidence == "high" or "profiler overhead" in " ".join(x.notes) for x in d.findings)


def test_the_gpu_is_steps_behind_by_the_jobs_own_steps():
    """The fp32 loop's host queues its 3 steps in ~4.7 ms each, its GPU runs each for 243.8 ms (measured unprofiled,
    labels' faulty_step_ms): a step's GPU work ends 711 ms after its host step, 711 / 243.8 = 2.9 steps behind, not
    711 / 4.7 = 151 host steps."""
    import re

    d, labels = _diagnose("fp32_matmul-high-h200")
    note = next(n for n in d.notes if "GPU work of a step ends" in n)
    overrun_ms, behind = map(float, re.search(r"ends ([\d.]+) ms after .* \(([\d.]+) steps behind\)", note).groups())
    assert behind == pytest.approx(overrun_ms / labels["faulty_step_ms"], abs=0.1)


def test_a_first_call_that_waited_for_the_device_is_not_warm_up(tmp_path):
    """The H200 DataLoader loop (its own 10-us pageable copies each step) with a pageable copy inserted at each step's
    start by the corpus's surgery: each waits for the previous step's kernels (13-17 ms). The first of the kind costs
    far more than the median of the later ones (the loop's own 10-us copies), but it waited for the device: not
    warm-up, which a steady step would not pay (the note said so of it and lowered every finding's confidence)."""
    from trainperf.corpus.inject import inject_pageable_copy

    d, _, _ = _injected(tmp_path, "data_loader_stall-high-h200", inject_pageable_copy, 0.0027)
    copies = next(x for x in d.findings if x.kind == "pageable_copy")
    assert max(e["dur_us"] for e in copies.evidence["events"]) > 10_000  # the inserted copies waited > 10 ms
    assert not any("warm-up" in n for n in d.notes)


def test_small_kernels_a_queue_hides_from_the_window_are_read_from_the_host_steps_excess(tmp_path):
    """The GPU-bound H200 loop with 1,860 tiny kernels launched a step (the corpus's surgery), among the launches of
    its whole step, its AdamW step's included: the host's step now outlasts the GPU's, but in the profiled steps the
    queue launched before the window keeps the GPU busy, so it never idles before them. Their launches cost the host's
    excess in a long run: small_kernels is found (it was not), its fix alone priced within 6 pp of the truth (the
    fused optimizer, whose span most of the launches fell in, is priced before it). The corpus plants them outside the
    optimizer's step now (there they are a per-parameter optimizer's); where the GPU then waits for them in the window
    is test_surgery's and the corpus's."""
    from functools import partial

    from trainperf.corpus.inject import inject_small_kernels

    anywhere = partial(inject_small_kernels, outside_optimizer=False)
    d, before, after = _injected(tmp_path, "healthy-h200-gpu_bound", anywhere, 1860)
    found = [x for x in d.findings if x.kind == "small_kernels"]
    metrics = found[0].evidence["metrics"] if found else {}
    assert metrics["gpu_idle_before_them"]["value"] == 0.0 and metrics["host_step_over_device_step"]["value"] > 0
    assert found[0].gain_alone_pct == pytest.approx(100 * (after - before) / after, abs=6.0)


@pytest.mark.parametrize("case,noted", [("host_sync-high-h200", True), ("allocator_stall-high-h200", True),
                                        ("data_loader_stall-high-h200", False), ("pageable_copy-high-h200", False)])
def test_a_wait_removed_from_a_host_paced_profiled_step_is_said_to_be_worth_more_unprofiled(case, noted):
    # CUDA_LAUNCH_BLOCKING priced 29.3 % for 55.6 measured without the profiler, the allocator off 56.3 for 78.0: the
    # profiler's ~4 ms a step (1,030 ops at ~4 us) stays in the step the fix leaves (17.89 x 0.707 - 4.12 = 8.5 ms,
    # still above the GPU's 3.5), so the fix's share of the job's own step is larger, and the finding says so. The
    # DataLoader and pageable loops are paced by their GPU: no such note
    d, labels = _diagnose(case)
    found = next(x for x in d.findings if x.kind == labels["kind"])
    assert any("stays in the step this fix leaves" in n for n in found.notes) == noted
    assert found.gain_pct < labels["true_gain_pct"] or not noted


@pytest.mark.parametrize("case, says", [
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1: frees spread where tensors die (56 stretches a step)
    ("allocator_stall-high-h200", "the caching allocator is off"),
    # torch.cuda.empty_cache() after each step: 36 frees a step in one stretch, outside every operator
    ("allocator_stall-high-h200-empty_cache", "torch.cuda.empty_cache() (or code calling it"),
    # a DataLoader without workers: its iterator, _SingleProcessDataLoaderIter, says so
    ("data_loader_stall-high-h200", "no worker processes (num_workers=0"),
])
def test_the_fix_named_is_the_runs_own(case, says):
    d, labels = _diagnose(case)
    found = next(x for x in d.findings if x.kind == labels["kind"])
    assert says in found.recommendation, labels["fixed_by"]
