"""A device clock behind the host's (device_clock.py): read from the launches, undone before the analyses."""

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.corpus.formats import device_clock_behind  # noqa: E402
from trainperf.diagnose.device_clock import USUAL_FLOOR_US, device_clock_behind_us, with_device_clock_aligned  # noqa
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.replay import BLOCK_SYNC  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.kineto import read_kineto  # noqa: E402


def _synced_steps(path: Path, kernel_after_launch_us: float) -> Path:
    # 4 steps of 1000 us: 30 launches 10 us apart from T+10, each kernel 20 us long starting kernel_after_launch_us
    # after its call; then a device-to-host copy (`.item()`) called at T+320, its 3-us copy after the last kernel, the
    # call returning 5 us after the copy ends (it blocked: within replay's 20 us of the copy's end)
    b = TraceBuilder()
    for s in range(4):
        T = s * 1000.0
        b.step(s, T, 1000.0)
        last_end = 0.0
        for k in range(30):
            start = max(T + 10 + 10 * k + kernel_after_launch_us, last_end)
            b.launch("volta_sgemm_32x32_nn", T + 10 + 10 * k, start, 20.0)
            last_end = start + 20.0
        b.launch("Memcpy DtoH (Device -> Pageable)", T + 320, last_end, 3.0, cat="gpu_memcpy",
                 runtime="cudaMemcpyAsync", launch_dur=last_end + 3 + 5 - (T + 320))
    return b.write(path)


def test_the_clock_is_read_from_the_launches_floor(tmp_path):
    # kernels written 5 us before their calls: the 1st-percentile latency is -5 us, the clock behind by 5 + the usual 7
    early = read_kineto(_synced_steps(tmp_path / "early.json.gz", -5.0))
    assert device_clock_behind_us(early) == pytest.approx(5.0 + USUAL_FLOOR_US)
    # 8 us after: a clock that agrees
    assert device_clock_behind_us(read_kineto(_synced_steps(tmp_path / "ok.json.gz", 8.0))) == 0.0


def test_a_sync_the_device_clock_hides_reads_as_blocking_once_aligned(tmp_path):
    # the same steps written by a device clock 20 us behind (corpus.formats.device_clock_behind): each copy call seems
    # to return 25 us after its copy ended, too late to have waited for it; aligned (the latency floor 8 - 20 = -12 us,
    # so 12 + 7 = 19 us later) it returns 6 us after: every copy blocks again, as on the untouched trace
    src = _synced_steps(tmp_path / "t.json.gz", 8.0)
    untouched = read_kineto(src)
    doc = json.loads(gzip.decompress(src.read_bytes()))
    (tmp_path / "behind.json").write_text(json.dumps(device_clock_behind(doc, 0)))
    behind = read_kineto(tmp_path / "behind.json")

    def blocking(t):
        g = collect_facts(t, analysis_window(t)).graph
        return int((g.block_class == BLOCK_SYNC).sum())

    aligned, note = with_device_clock_aligned(behind)
    assert "device clock reads 19.0 µs behind" in note  # 20 us early: latency floor 8 - 20 = -12, so 12 + 7
    assert np.all(np.diff(aligned.ts_ns) >= 0)
    assert blocking(untouched) == 3 and blocking(aligned) == 3 and blocking(behind) == 0


def test_a_diff_against_the_same_steps_written_by_a_clock_behind_finds_them_the_same(tmp_path):
    # trainperf diff reads the device clock as diagnose does. Each 1000-us step: 30 kernels back to back [T+18, T+618],
    # then one launched at T+610 while the last runs and started at T+720 (queued: 102 us of "idle: other"). Written 20
    # us behind, the device seems idle before that launch: read as is, the gap is "idle: host"; aligned, the same
    # breakdown (µs per step) and step time, and the candidate's side says it was corrected
    from trainperf.diagnose.diff import diff

    b = TraceBuilder()
    for s in range(4):
        T = s * 1000.0
        b.step(s, T, 1000.0)
        for k in range(30):
            b.launch("volta_sgemm_32x32_nn", T + 10 + 10 * k, T + 18 + 20 * k, 20.0)
        b.launch("volta_sgemm_64x64_nn", T + 610, T + 720, 20.0)
    src = b.write(tmp_path / "t.json.gz")
    doc = json.loads(gzip.decompress(src.read_bytes()))
    (tmp_path / "behind.json").write_text(json.dumps(device_clock_behind(doc, 0)))
    d = diff(src, tmp_path / "behind.json")
    assert d.candidate.median_us == pytest.approx(d.baseline.median_us, abs=0.5)
    assert dict((n, b) for n, b, _ in d.decomposition).get("idle: other", 0.0) > 50.0
    for name, before, after in d.decomposition:
        assert after == pytest.approx(before, abs=1.5), name
    assert any("device clock reads 19.0 µs behind" in n for n in d.notes)
