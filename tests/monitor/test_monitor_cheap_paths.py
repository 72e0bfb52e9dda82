"""The monitor's cheap paths keep its figures: batched metrics lines (what reaches the disk,
when, and what a killed process loses), the CPU peak memory read through getrusage against
the kernel's own VmHWM, and the metrics.jsonl fields."""

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainperf.monitor import Monitor
from trainperf.monitor import memory
from trainperf.specs import load_model

REPO_SRC = str(Path(__file__).resolve().parents[2] / "src")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _vmhwm_bytes() -> int:
    """VmHWM from /proc/self/status, read afresh (the reference: the kernel's own figure)."""
    text = Path("/proc/self/status").read_text()
    return int(text.split("VmHWM:")[1].split("kB")[0]) * 1024


def test_lines_are_batched_and_flushed_at_checkpoint_summary_and_close(tmp_path):
    mon = Monitor(tmp_path, start_time=time.time(), flush_every_steps=1000, flush_every_s=1e9)
    metrics = tmp_path / "metrics.jsonl"
    for step in range(1, 4):
        with mon.step(step, tokens=8) as st:
            st.loss = float(step)
    assert _lines(metrics) == []  # buffered: nothing written yet
    with mon.checkpoint(3):  # a checkpoint never covers a step whose line is not on disk
        assert [r["step"] for r in _lines(metrics)] == [1, 2, 3]
    with mon.step(4, tokens=8):
        pass
    assert len(_lines(metrics)) == 3
    mon.summary()  # reads the files: flushes first
    assert [r["step"] for r in _lines(metrics)] == [1, 2, 3, 4]
    with mon.step(5, tokens=8):
        pass
    mon.close()
    assert [r["step"] for r in _lines(metrics)] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in _lines(metrics)[:3]] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("every_steps, every_s, expect_after_5", [(2, 1e9, 4), (1000, 0.0, 5), (1000, 1e9, 0)])
def test_flush_policy_by_steps_and_by_time(tmp_path, every_steps, every_s, expect_after_5):
    mon = Monitor(tmp_path, start_time=time.time(), flush_every_steps=every_steps, flush_every_s=every_s)
    for step in range(1, 6):
        with mon.step(step):
            pass
    assert len(_lines(tmp_path / "metrics.jsonl")) == expect_after_5
    mon.close()
    assert len(_lines(tmp_path / "metrics.jsonl")) == 5


_CHILD = r"""
import os, signal, sys, time
from trainperf.monitor import Monitor
mon = Monitor(sys.argv[1], start_time=time.time(), flush_every_steps=1000, flush_every_s=1e9)
for step in range(1, 6):
    with mon.step(step) as st:
        st.loss = 1.0
    if step == 3:
        with mon.checkpoint(3):
            pass
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[2] == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # not reached: the monitor's handler flushes, then the process dies of SIGTERM
sys.exit(0)  # a normal exit without mon.close()
"""


@pytest.mark.parametrize("how, steps_on_disk", [("exit", [1, 2, 3, 4, 5]), ("kill", [1, 2, 3]),
                                                 ("term", [1, 2, 3, 4, 5])])
def test_what_a_process_exit_or_sigkill_leaves_on_disk(tmp_path, how, steps_on_disk):
    env = {**os.environ, "PYTHONPATH": REPO_SRC}
    rc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), how], env=env, timeout=60).returncode
    assert rc == {"exit": 0, "kill": -signal.SIGKILL, "term": -signal.SIGTERM}[how]
    # normal exit: the at-exit hook writes everything; SIGTERM (what torchrun sends surviving
    # ranks): the handler flushes everything, then the process still dies of SIGTERM; SIGKILL:
    # the steps since the last flush (here the checkpoint after step 3) are lost, none before
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == steps_on_disk


def test_record_fields_and_their_order(tmp_path):
    mon = Monitor(tmp_path, model=load_model("tiny"), peak_flops=1e12, start_time=time.time())
    with mon.step(1, tokens=128) as st:
        with st.data():
            pass
        for name in ("forward", "backward", "forward"):  # a repeated phase adds up
            with st.phase(name):
                time.sleep(0.005)
        with st.phase("optimizer"):
            pass
        st.loss = torch.tensor(2.0)
        st.extra = {"lr": 1e-3, "grad_norm": torch.tensor(0.5)}  # a tensor in extra is written as a number
    mon.close()
    (rec,) = _lines(tmp_path / "metrics.jsonl")
    # the field order of metrics.jsonl as documented in docs/train.md
    assert list(rec) == ["step", "attempt", "loss", "step_time_s", "data_wait_s", "tokens", "tokens_per_s", "mfu",
                         "hfu", "mem_peak_bytes", "gc_pause_s", "gc_collections", "gc_full_collections", "forward_s",
                         "backward_s", "optimizer_s", "lr", "grad_norm", "t_end"]
    assert rec["loss"] == 2.0 and rec["grad_norm"] == 0.5
    assert rec["forward_s"] >= 0.010 and rec["backward_s"] >= 0.005
    assert rec["forward_s"] + rec["backward_s"] + rec["optimizer_s"] + rec["data_wait_s"] <= rec["step_time_s"]
    assert mon.phase_names == {"forward_s", "backward_s", "optimizer_s"}


def _counter_slack_bytes() -> int:
    # Linux batches per-CPU RSS counters: each CPU may hold up to max(32, 2 * ncpu) pages not
    # yet folded into the total (mm/percpu_counter, mm_struct rss_stat); getrusage reads the
    # folded total, /proc/self/status the exact sum. 1 MiB at least.
    ncpu = os.cpu_count() or 1
    return max(1 << 20, max(32, 2 * ncpu) * ncpu * os.sysconf("SC_PAGE_SIZE"))


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_cpu_peak_matches_the_kernels_vmhwm_per_step():
    memory.reset_peak("cpu")
    base = memory.peak_bytes("cpu")
    for mib in (0, 48, 8, 96, 0, 24):
        memory.reset_peak("cpu")
        if mib:
            # fresh anonymous pages, touched, so resident: a heap allocation could reuse pages a
            # warm process already holds and leave the peak where it was
            buf = mmap.mmap(-1, mib * 2**20)
            buf.write(b"x" * (mib * 2**20))
            buf.close()
        got, ref = memory.peak_bytes("cpu"), _vmhwm_bytes()
        assert abs(got - ref) <= _counter_slack_bytes(), (mib, got, ref)
        # the resident set at a reset may sit a little below the first one (pages freed since),
        # so the new peak is compared with the allocation on top of base, less the counter slack
        assert got >= base + 0.9 * mib * 2**20 - _counter_slack_bytes(), (mib, got, base)


_FLOOR_CHILD = r"""
import json, resource
from trainperf.monitor import memory
memory.reset_peak("cpu")
x = bytearray(b"x") * (16 * 2**20)  # 16 MiB, touched
del x
got = memory.peak_bytes("cpu")
text = open("/proc/self/status").read()
print(json.dumps({"got": got, "vmhwm": int(text.split("VmHWM:")[1].split("kB")[0]) * 1024,
                  "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_cpu_peak_is_right_when_getrusage_is_floored_by_the_parent():
    # A small child of a big parent: its ru_maxrss stays at the peak of the image it replaced at
    # exec (kernel/sys.c getrusage takes max(signal->maxrss, hiwater)), far above its own
    # VmHWM; the monitor must notice and read VmHWM itself.
    ballast = torch.ones(256 * 2**20 // 4)  # keep the parent >= 256 MiB above the child
    env = {**os.environ, "PYTHONPATH": REPO_SRC}
    out = subprocess.run([sys.executable, "-c", _FLOOR_CHILD], env=env, capture_output=True, text=True, timeout=60)
    del ballast
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    if r["ru_maxrss"] < r["vmhwm"] + 64 * 2**20:
        pytest.skip("this kernel/launcher leaves no exec floor in getrusage (nothing to fall back from)")
    assert abs(r["got"] - r["vmhwm"]) <= _counter_slack_bytes()


def test_profiler_does_no_work_after_its_window(tmp_path):
    from trainperf.monitor import StepProfiler

    a = torch.randn(32, 32)
    prof = StepProfiler(tmp_path, (2, 3), rank=0)
    with prof:
        for _ in range(1, 10):
            a @ a
            prof.step()
        # the trace of steps 2-3 was written when step 3 ended; later steps left torch's profiler alone
        assert (tmp_path / "traces" / "rank0.step2-3.json").is_file()
        assert prof.prof.step_num == 4
