"""Insufficient evidence as a result: each limit lowers the confidence of the findings it touches, with a note."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.report.diagnose import write_report  # noqa: E402


def _stall(b: TraceBuilder, steps: int = 4, py_frames: int = 0, shapes: bool = False) -> TraceBuilder:
    # each 2000-us step: DataLoader 1500 us, then 5 GEMM launches
    for s in range(steps):
        T = 2000.0 * s
        b.step(s, T, 2000)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", T, 1500, cat="user_annotation")
        for i in range(5):
            if shapes:
                b.cpu("aten::mm", T + 1500 + 10 * i, 5, **{"Input Dims": [[64, 64], [64, 64]]})
            for k in range(py_frames):
                b.cpu(f"train.py({10 + k}): step", T + 1500 + 10 * i, 6, cat="python_function")
            b.launch("ampere_sgemm_128x64_tn", T + 1500 + 10 * i, T + 1510 + 100 * i, 100)
    return b


def test_clean_trace_keeps_high_confidence(tmp_path):
    d = diagnose(_stall(TraceBuilder()).write(tmp_path / "c.json.gz"))
    assert d.findings and all(f.confidence == "high" and not f.notes for f in d.findings)
    assert d.ranks[0].confidence == "high"


def test_one_step_lowers_every_finding(tmp_path):
    # 2 ProfilerSteps: the last is excluded (HTA's window), one step analysed
    d = diagnose(_stall(TraceBuilder(), steps=2).write(tmp_path / "o.json.gz"))
    assert d.findings and all(f.confidence == "medium" for f in d.findings)
    assert all(any("1 complete profiler step" in n for n in f.notes) for f in d.findings)
    assert any("1 complete profiler step" in n for n in d.notes)


def test_profiler_overhead_lowers_host_findings_only(tmp_path):
    b = _stall(TraceBuilder(), py_frames=3, shapes=True)
    # a blocking copy finding is not about host time and keeps its confidence
    for s in range(3):
        T = 2000.0 * s + 1600
        b.launch("Memcpy HtoD (Pageable -> Device)", T, T + 5, 300, cat="gpu_memcpy", launch_dur=310,
                 runtime="cudaMemcpyAsync", bytes=1_000_000)
    d = diagnose(b.write(tmp_path / "p.json.gz"))
    by = {f.kind: f for f in d.findings}
    dl = by["data_loader_stall"]
    assert dl.confidence == "medium"
    assert any("with_stack=True" in n and "record_shapes=True" in n and "overstated" in n for n in dl.notes)
    assert by["pageable_copy"].confidence == "high"


def test_missing_gpu_activity_and_truncated_window(tmp_path):
    b = _stall(TraceBuilder())
    # 20 launches whose kernels were not recorded, and 10 kernels whose launches fall before the profile
    for i in range(20):
        b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 1,
                         "ts": 1700 + i, "dur": 1, "args": {"correlation": 90_000 + i}})
    for i in range(10):
        b.events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7,
                         "ts": 20 + 10 * i, "dur": 5, "args": {"correlation": 80_000 + i, "stream": 7}})
    d = diagnose(b.write(tmp_path / "m.json.gz"))
    notes = " ".join(d.notes)
    assert "have no GPU event" in notes and "truncated" in notes
    assert all(f.confidence == "medium" for f in d.findings)


def test_a_trace_of_gpu_activity_only_is_not_truncated(tmp_path):
    # profiled with activities=[ProfilerActivity.CUDA]: the kernels' correlation ids point at launches never recorded;
    # nothing was cut off, the host's side is missing
    b = TraceBuilder()
    for i in range(10):
        b.launch("ampere_sgemm_128x64_tn", 10 * i, 20 + 100 * i, 100)
    b.events = [e for e in b.events if e["cat"] != "cuda_runtime"]
    notes = " ".join(diagnose(b.write(tmp_path / "g.json.gz")).notes)
    assert "GPU activity only" in notes and "ProfilerActivity.CPU" in notes
    assert "truncated" not in notes


def test_clock_offsets_between_ranks_lower_cross_rank_findings(tmp_path):
    # rank 1's clock runs 5 ms ahead and its collective ends disagree with rank 0's by 0 / 400 / 0 / 400 us:
    # the alignment spreads 400 us (IQR) > 50 us -> a note, and cross-rank findings are medium
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(2):
        b = TraceBuilder(rank=rank, world_size=2)
        off = 5000.0 if rank else 0.0
        for k in range(4):
            T = 2000.0 * k + off
            arrive = 100 if rank == 0 else 900
            end = 1000 + (400 if rank and k % 2 else 0)
            b.launch("ampere_sgemm_128x64_tn", T, T + 5, arrive - 5)
            b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", T + 1, T + arrive, end - arrive, stream=20)
        b.write(d / f"rank{rank}.json.gz")
    res = diagnose(d)
    assert any("rank clocks differ" in n for n in res.notes)
    for f in res.findings:
        if f.kind in ("straggler", "exposed_comm"):
            assert f.confidence == "medium"
    assert res.cross_rank["clock_offset_us"][1] > 4000


def test_confidence_and_notes_reach_json_and_html(tmp_path):
    d = diagnose(_stall(TraceBuilder(), steps=2).write(tmp_path / "o.json.gz"))
    doc = json.loads(json.dumps(d.to_json()))
    f = doc["findings"][0]
    assert f["confidence"] == "medium" and f["notes"] and "changes" not in f
    assert doc["ranks"][0]["confidence"] == "medium"
    html = write_report(d, tmp_path / "r.html").read_text()
    assert "confidence medium" in html and "1 complete profiler step" in html


def _two_gpus(path: Path, together: bool, aten: bool = True) -> Path:
    # one process, GPUs 0 and 1 (Kineto's device index as pid), 4 steps of 3000 us: each GPU runs one 1000-us GEMM
    # a step, both at [T+100, T+1100) (together) or GPU 1 after GPU 0, at [T+1100, T+2100) (in turn); aten: a
    # PyTorch operator opens each step (a PyTorch process)
    b = TraceBuilder()
    for s in range(4):
        T = 3000.0 * s
        b.step(s, T, 3000.0)
        if aten:
            b.cpu("aten::copy_", T + 1, 2.0)
        for dev in (0, 1):
            start = T + 100 + (0 if together or dev == 0 else 1000)
            b.launch("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 10 + dev, start, 1000.0, device=dev)
        b.cpu("cudaDeviceSynchronize", T + 20, 2200.0, cat="cuda_runtime")
    return b.write(path)


def test_several_gpus_in_one_process_are_named_with_their_own_busy_share(tmp_path):
    # window: the first GEMM's start to the last one's end over the 3 analysed steps. Together: [100, 7100) = 7000 us,
    # each GPU busy 3 x 1000 us = 43 %; in turn: [100, 8100) = 8000 us, each 38 %, their busy time summed (6000 us)
    # equal to the union's (6000): never side by side, which devices_take_turns finds (test_diagnose_devices.py); run
    # side by side, the chain ends 1000 us sooner, and each 3000-us step with it: 33.3 %
    together = diagnose(_two_gpus(tmp_path / "t.json.gz", together=True))
    assert "drove 2 GPUs" in " ".join(together.notes) and "GPU 0 43%, GPU 1 43%" in " ".join(together.notes)
    assert not any(x.kind == "devices_take_turns" for x in together.findings)
    assert "DistributedDataParallel" in " ".join(together.notes)
    # devices side by side in a process without PyTorch's operators (a JAX host's): no DataParallel advice
    assert "DataParallel" not in " ".join(diagnose(_two_gpus(tmp_path / "j.json.gz", True, aten=False)).notes)
    in_turn = diagnose(_two_gpus(tmp_path / "s.json.gz", together=False))
    assert "GPU 0 38%, GPU 1 38%" in " ".join(in_turn.notes) and "DataParallel" not in " ".join(in_turn.notes)
    x = next(x for x in in_turn.findings if x.kind == "devices_take_turns")
    assert x.gain_alone_pct == pytest.approx(100 / 3, abs=0.05) and "one after another" in x.recommendation
    assert "drove" not in " ".join(diagnose(_stall(TraceBuilder()).write(tmp_path / "one.json.gz")).notes)


def _one_step_past_session(session_us: float) -> TraceBuilder:
    # one 2000-us step (DataLoader 1500 us, then 5 GEMMs) whose ProfilerStep span closes 200 ms later, after the
    # profiling session (Kineto's "PyTorch Profiler (0)" span, 0-2100 us) stopped recording: HTA's triton_example
    b = _stall(TraceBuilder(), steps=1)
    b.events = [e for e in b.events if not e["name"].startswith("ProfilerStep")]
    b.step(0, 0.0, 200_000)
    if session_us:
        b.cpu("PyTorch Profiler (0)", 0.0, session_us, cat="Trace")
    return b


def test_a_step_running_past_the_profiling_session_is_cut_at_its_end(tmp_path):
    cut = diagnose(_one_step_past_session(2100).write(tmp_path / "cut.json.gz"))
    # the step is read up to the session's end: 2100 us, not the 200,000 its span claims
    assert cut.ranks[0].step_time_median_us == pytest.approx(2100.0)
    assert any("ProfilerStep#0 ends 197.9 ms after the profiling session" in n for n in cut.notes)
    assert any("no complete profiler step" in n for n in cut.notes)
    assert cut.findings[0].kind == "data_loader_stall" and cut.findings[0].confidence == "medium"
    # a session that ends a hair before the step (a clock's rounding: 0.5 % of the step) cuts it, without a note
    hair = _one_step_past_session(2100)
    next(e for e in hair.events if e["name"] == "ProfilerStep#0")["dur"] = 2110.0
    near = diagnose(hair.write(tmp_path / "hair.json.gz"))
    assert near.ranks[0].step_time_median_us == pytest.approx(2100.0)
    assert not any("profiling session" in n for n in near.notes)
    # without the session span nothing says where recording stopped, and a step inside it is whole: taken as it is
    for session_us in (0, 300_000):
        whole = diagnose(_one_step_past_session(session_us).write(tmp_path / f"whole{session_us}.json.gz"))
        assert whole.ranks[0].step_time_median_us == pytest.approx(200_000.0)
        assert not any("profiling session" in n for n in whole.notes)
