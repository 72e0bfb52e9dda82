"""Gains as shares of the window's steady-state step (diagnose/period.py), worked by hand: a profiled window of a
few steps holds the first step's host work before any GPU work and the last step's GPU work after its host is done,
which a long run pays once, not each step."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402
import test_diagnose_kinds as K  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

H200 = Path(__file__).resolve().parents[1] / "data" / "h200_faults"

GEMM = "ampere_bf16_s16816gemm_bf16_128x128_tn"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _loader_in_front_of_the_gpu(path: Path) -> Path:
    """Four 40-ms steps (3 analysed, the last one closes the window): a 30-ms DataLoader span, then at +31 ms one
    launch of a 23-ms GEMM, which starts 5 us later on an idle GPU."""
    b = TraceBuilder()
    for s in range(4):
        T = 40_000.0 * s
        b.step(s, T, 40_000)
        b.cpu(LOADER, T, 30_000, cat="user_annotation")
        b.cpu("aten::mm", T + 31_000, 10)
        b.launch(GEMM, T + 31_000, T + 31_005, 23_000)
    return b.write(path)


def test_a_host_stall_is_priced_per_step_not_per_window(tmp_path):
    # analysed: steps 0-2 (0 .. 120 ms). A step is 40 ms on the host; the GPU works 23 ms of it. Without the
    # DataLoader the host launches a step in ~1 ms and the GEMMs run back to back: 23 ms a step. Gain (40 - 23) / 40
    # = 42.5 %, 17 ms a step, 51 ms over the 3 steps. The window's makespan (0 .. 80 + 31.005 + 23 = 134.005 ms, to
    # ~1.005 + 69 = 70.005 ms) would read 47.8 %: it counts the last GEMM's 14 ms past the host's window once, as a
    # share of only 3 steps
    d = diagnose(_loader_in_front_of_the_gpu(tmp_path / "dl.json.gz"))
    f = next(x for x in d.findings if x.kind == "data_loader_stall")
    assert f.gain_pct == pytest.approx(42.5, abs=0.01) and f.gain_us == pytest.approx(51_000, abs=1)
    # the step the gains are shares of, in the rank's summary: the host's 40 ms; the device's from the first GEMM's
    # start (31.005 ms) to the last one's end (134.005 ms) over 3 steps
    r = d.ranks[0]
    assert r.steady_step_us == pytest.approx(40_000) and r.steady_step_host_us == pytest.approx(40_000)
    assert r.steady_step_device_us == pytest.approx(103_000 / 3) and not r.host_paced_by_device


def _facts(path: Path):
    t = next(iter(load_trace(path).values()))
    return collect_facts(t, analysis_window(t))


def test_a_host_is_paced_by_the_device_only_when_it_keeps_its_pace_with_a_queue(tmp_path):
    # the ROCm DDP rank: every kernel starts 27 ms after its launch, 32-ms steps on host and device alike: the host's
    # spacing is the GPU's (its exposed all-reduce is priced on the device's step alone: test_diagnose_kinds)
    paced = _facts(K._rocm_ddp(tmp_path / "r.json.gz"))
    assert paced.paced_by_device and paced.period_us == pytest.approx(32_000)
    # a host that ran steps ahead of the GPU (6.1 ms a step against 22.4: H200) runs at its own pace, and one the GPU
    # waits for (a DataLoader in front of each step) is the pace
    for path in (H200 / "healthy-h200-gpu_bound" / "traces", _loader_in_front_of_the_gpu(tmp_path / "dl.json.gz")):
        assert not _facts(path).paced_by_device
