"""The device's memory from the allocator's samples (profile_memory=True; diagnose/memory.py): the window's peak and
floor against the device's capacity, worked by hand on built traces and read independently from HTA's
df_index_resolver trace (a V100, 28,010 samples), and the fixes it changes (launch_bound's larger batch; the
allocator at the device's edge: test_diagnose_allocator_pattern.py)."""

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.memory import DeviceMemory, batch_room_text, device_memory  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

GIB = 1 << 30
DF_INDEX = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta/df_index_resolver/df_index_resolver.json.gz"


def _steps(b: TraceBuilder, device: int = 0, n: int = 4) -> None:
    for s in range(n):
        b.step(s, 1000.0 * s, 1000)
        b.launch("ampere_sgemm_128x64_tn", 1000.0 * s + 10, 1000.0 * s + 20, 500, device=device)


def test_peak_floor_and_capacity_of_the_ranks_own_device(tmp_path):
    b = TraceBuilder()
    b.device_properties = [{"id": 0, "name": "other", "totalGlobalMem": 80 * GIB},
                           {"id": 1, "name": "A100-SXM4-16GB", "totalGlobalMem": 16 * GIB}]
    _steps(b, device=1)
    b.memory(-5000, 15 * GIB, 15 * GIB, device=1)                # before the trace's events: outside the window
    for s in range(3):                                            # steps 0-2 analysed (the last is cut)
        b.memory(1000 * s + 100, 4 * GIB, 8 * GIB, device=1)      # the step's floor
        b.memory(1000 * s + 400, 6 * GIB, 8 * GIB, device=1)      # its peak
    b.memory(500, 9 * GIB, 9 * GIB, device=0)                     # another device's samples
    b.memory(600, 1 << 20, 0, device=-1, device_type=0)           # a host tensor's (CPU) sample
    t = read_kineto(b.write(tmp_path / "t.json.gz"))
    assert t.memory.shape == (9, 5)
    m = device_memory(t, analysis_window(t))
    assert (m.device, m.capacity_bytes, m.samples) == (1, 16 * GIB, 6)
    assert (m.peak_allocated_bytes, m.peak_reserved_bytes, m.floor_allocated_bytes) == (6 * GIB, 8 * GIB, 4 * GIB)
    # by hand: 16 GiB less the 2-GiB runtime reserve = 14 usable; (14 - 4) / (2 x 1.08 fragmentation) = 4.63x
    assert m.usable_bytes == 14 * GIB and m.transient_growth == pytest.approx(10 / (2 * 1.08))
    assert not m.near_full and "~4.6x" in batch_room_text(m)


def test_no_samples_no_memory(tmp_path):
    b = TraceBuilder()
    _steps(b)
    t = read_kineto(b.write(tmp_path / "t.json.gz"))
    assert t.memory is None and device_memory(t, analysis_window(t)) is None
    assert diagnose(tmp_path / "t.json.gz").ranks[0].memory_peak_reserved_bytes is None


def test_what_the_samples_say_of_a_larger_batch():
    def mem(capacity, floor, peak, reserved):
        return DeviceMemory(device=0, capacity_bytes=capacity, peak_allocated_bytes=peak, peak_reserved_bytes=reserved,
                            floor_allocated_bytes=floor, samples=2)
    assert "has room" in batch_room_text(mem(80 * GIB, 20 * GIB, 30 * GIB, 32 * GIB))       # (78-20)/10.8 = 5.4x
    full = mem(80 * GIB, 20 * GIB, 70 * GIB, 76 * GIB)                                      # (78-20)/54 = 1.07x
    assert full.near_full and "little room" in batch_room_text(full)
    assert batch_room_text(mem(None, 20 * GIB, 30 * GIB, 32 * GIB)) is None                 # no capacity recorded
    assert batch_room_text(mem(80 * GIB, 20 * GIB, 20 * GIB, 20 * GIB)) is None              # nothing transient


@pytest.mark.skipif(not DF_INDEX.is_file(), reason="../shared/data/traces/hta not present")
def test_a_real_trace_s_memory_and_its_launch_bound_fix():
    raw = json.load(gzip.open(DF_INDEX))
    cuda = [e["args"] for e in raw["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    capacity = next(p["totalGlobalMem"] for p in raw["deviceProperties"] if p["id"] == cuda[0]["Device Id"])
    d = diagnose(DF_INDEX.parent)
    r = d.ranks[0]
    # the window holds the trace's extremes: its figures are the samples' own
    assert r.memory_peak_allocated_bytes == max(a["Total Allocated"] for a in cuda)
    assert r.memory_peak_reserved_bytes == max(a["Total Reserved"] for a in cuda)
    assert r.memory_kept_bytes == min(a["Total Allocated"] for a in cuda)
    assert r.device_memory_bytes == capacity == 34089730048  # a V100-SXM2-32GB
    lb = next(f for f in d.findings if f.kind == "launch_bound")
    # (31.75 - 2 GiB reserve - 3.82 kept) / (2.36 transient x 1.08) = 10.2x: a larger micro batch fits
    assert "Memory has room for a larger micro batch" in lb.recommendation and "~10.2x" in lb.recommendation


def test_diff_says_how_the_memory_moved(tmp_path):
    from trainperf.diagnose.diff import diff, memory_change_text

    def side(name: str, peak: int, reserved: int) -> Path:
        b = TraceBuilder()
        b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
        _steps(b)
        for s in range(4):
            b.memory(1000 * s + 100, 4 * GIB, reserved)
            b.memory(1000 * s + 300, peak, reserved)
        b.memory(9000, 15 * GIB, 15 * GIB)  # after the steps: not theirs
        (tmp_path / name).mkdir()
        b.write(tmp_path / name / "rank0.json.gz")
        return tmp_path / name

    d = diff(side("base", 8 * GIB, 10 * GIB), side("recompute", 5 * GIB, 6 * GIB))
    assert memory_change_text(d.baseline.memory, d.candidate.memory) == (
        "peak reserved 10.00 -> 6.00 GiB (-4.00), allocated 8.00 -> 5.00 GiB (-3.00), kept 4.00 -> 4.00 GiB (+0.00)")
    j = d.to_json()
    assert j["candidate"]["memory"] == {"peak_allocated_bytes": 5 * GIB, "peak_reserved_bytes": 6 * GIB,
                                        "kept_bytes": 4 * GIB, "device_bytes": 16 * GIB}
    assert memory_change_text(None, d.candidate.memory) == ""


def test_a_forward_only_loop_keeps_its_own_fix(tmp_path):
    """A serving loop preallocates most of the device (vLLM's KV cache at gpu_memory_utilization=0.9): its launch-bound
    fix is the serving engines' (CUDA graphs of the decode batch sizes, continuous batching), not a training batch
    the samples would say does not fit."""
    b = TraceBuilder()
    b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 80 * GIB}]
    for s in range(4):  # forward only: 50 kernels of 12 us a step, each launched 28 us after the last one ended
        T = 2000.0 * s
        b.step(s, T, 2000)
        for i in range(50):
            b.cpu("aten::linear", T + 40.0 * i, 35)
            b.launch("ampere_sgemm_32x32_tn", T + 40.0 * i + 20, T + 40.0 * i + 28, 12)
        b.memory(T + 10, 70 * GIB, 72 * GIB)
        b.memory(T + 900, 71 * GIB, 72 * GIB)
    d = diagnose(b.write(tmp_path / "serve.json.gz"))
    lb = next(f for f in d.findings if f.kind == "launch_bound")
    assert "forward-only" in lb.recommendation and "Memory" not in lb.recommendation
    assert d.ranks[0].memory_peak_reserved_bytes == 72 * GIB


def test_the_chart_keeps_every_peak_and_the_html_draws_it(tmp_path):
    # 5,000 samples in the window, one spike among them: the chart's 2,000 points still reach it
    from trainperf.diagnose.memory import TIMELINE_POINTS
    from trainperf.report.diagnose import write_report

    b = TraceBuilder()
    b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
    _steps(b)
    for i in range(5000):
        b.memory(0.5 * i + 1, (9 if i == 3333 else 4) * GIB, 10 * GIB)
    path = b.write(tmp_path / "t.json.gz")
    d = diagnose(path)
    m = d.memory[0]
    assert m.samples == 5000 and m.timeline.shape == (TIMELINE_POINTS, 3)
    assert m.timeline[:, 1].max() == 9 * GIB == m.peak_allocated_bytes
    assert (m.timeline[:, 1] == 4 * GIB).sum() == TIMELINE_POINTS - 1  # the spike's chunk alone reads it
    html = write_report(d, tmp_path / "r.html").read_text()
    assert "Device memory over the window (rank 0)" in html and "peak 9.00 GiB allocated" in html


def test_the_memory_line_of_a_job_names_its_highest_and_lowest_peaks(tmp_path):
    from trainperf.diagnose.render import memory_line

    for rank, reserved in ((0, 6), (1, 9), (2, 7)):
        b = TraceBuilder(rank=rank, world_size=3)
        b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
        _steps(b)
        b.memory(100, 4 * GIB, reserved * GIB)
        b.memory(400, 5 * GIB, reserved * GIB)
        b.write(tmp_path / f"rank{rank}.json.gz")
    line = memory_line(diagnose(tmp_path))
    assert line.startswith("device memory (rank 1, the highest reserved peak of 3, the lowest 6.00 GiB): peak 5.00 "
                           "GiB allocated, 9.00 GiB reserved of the device's 16.00 GiB")


@pytest.mark.parametrize("floors_mib, grows", [
    ((4096, 4160, 4224, 4288), True),   # 64 MiB more kept every step: the note, 64.0 MiB a step
    ((4096, 4096, 4096, 4096), False),  # the same floor step after step (HTA's df_index_resolver: to the byte)
    ((4096, 4608, 4608, 4608), False),  # one rise (an optimizer's state made in the first step), then flat
])
def test_memory_kept_from_every_step_is_noted(tmp_path, floors_mib, grows):
    # steps 0-2 analysed (the last is cut); in each, the floor then 2 GiB more; 16-GiB device, 14 usable
    b = TraceBuilder()
    b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
    _steps(b)
    for s, floor in enumerate(floors_mib):
        b.memory(1000 * s + 100, floor << 20, 8 * GIB)
        b.memory(1000 * s + 400, (floor << 20) + 2 * GIB, 8 * GIB)
    d = diagnose(b.write(tmp_path / "t.json.gz"))
    notes = [n for n in d.notes if "memory kept between steps grows" in n]
    if not grows:
        assert not notes
        return
    # by hand: (4224 - 4096) / 2 = 64 MiB a step over steps 0-2; free at the peak 14 - 8 = 6 GiB: 6144 / 64 = 96 steps
    assert len(notes) == 1 and "grows 64.0 MiB a step over 3 steps (4.00 -> 4.12 GiB" in notes[0]
    assert "used in ~96 steps" in notes[0]


def test_failed_allocations_are_noted(tmp_path):
    # two [OutOfMemory] events of the GPU (and one of the host's CPU, not the device's) in a trace that goes on
    b = TraceBuilder()
    b.device_properties = [{"id": 0, "name": "gpu", "totalGlobalMem": 16 * GIB}]
    _steps(b)
    b.memory(100, 4 * GIB, 15 * GIB)
    b.memory(150, 4 * GIB, 15 * GIB, name="[OutOfMemory]", nbytes=2 * GIB)
    b.memory(1150, 4 * GIB, 15 * GIB, name="[OutOfMemory]", nbytes=2 * GIB)
    b.memory(1160, 1 << 20, 0, device=-1, device_type=0, name="[OutOfMemory]")
    path = b.write(tmp_path / "t.json.gz")
    assert read_kineto(path).metadata["out_of_memory_events"] == 2
    notes = [n for n in diagnose(path).notes if "[OutOfMemory]" in n]
    assert len(notes) == 1 and notes[0].startswith("rank 0: 2 device allocation(s) failed in the trace")
    assert "15.00 GiB reserved of the device's 16.00 GiB" in notes[0]
