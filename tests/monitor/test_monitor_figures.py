"""Monitor figures against hand computation: tokens/s, MFU on a known FLOP count, memory, files."""

import json
import time

import pytest
import torch

from trainperf.monitor import Monitor, StepProfiler
from trainperf.specs import load_model

# Hand-worked training FLOPs per token of the `tiny` preset (4 layers, hidden 128, 4 heads of
# 32, 2 kv heads, SwiGLU ffn 352, vocab 256, seq 128, causal):
#   matmul weights per layer = 128*128 (q) + 2*128*64 (k, v) + 128*128 (o) + 3*128*352 = 184,320
#   forward per layer = 2*184,320 + causal attention 2*seq*q_dim = 2*128*128 -> 401,408
#   forward = 4*401,408 + LM head 2*256*128 = 1,671,168; training = 3x = 5,013,504 FLOPs/token
TINY_TRAIN_FLOPS_PER_TOKEN = 5_013_504


def test_tokens_per_s_and_mfu_hand_computed():
    spec = load_model("tiny")
    peak = 1e12
    mon = Monitor(None, model=spec, peak_flops=peak, world_size=2, recompute="full")
    with mon.step(1, tokens=4096) as st:
        with st.data():
            time.sleep(0.02)
        with st.phase("forward"):
            time.sleep(0.03)
        st.loss = torch.tensor(2.5)
    r = mon.records[0]
    assert r["loss"] == 2.5
    assert 0.05 <= r["step_time_s"] < 0.5
    assert r["tokens_per_s"] == pytest.approx(4096 / r["step_time_s"])
    assert r["mfu"] == pytest.approx(4096 / r["step_time_s"] / 2 * TINY_TRAIN_FLOPS_PER_TOKEN / peak)
    # full recompute adds one forward pass: HFU / MFU = 4/3 of everything but the LM head
    hw = TINY_TRAIN_FLOPS_PER_TOKEN + 4 * 401_408
    assert r["hfu"] == pytest.approx(r["mfu"] * hw / TINY_TRAIN_FLOPS_PER_TOKEN)
    assert 0.02 <= r["data_wait_s"] < r["step_time_s"]
    assert 0.03 <= r["forward_s"] < r["step_time_s"]


def test_cpu_peak_memory_sees_a_step_allocation():
    mon = Monitor(None)
    with mon.step(1):
        pass
    base = mon.records[0]["mem_peak_bytes"]
    with mon.step(2):
        x = torch.ones(64 * 2**20 // 4 * 4)  # 64 MiB, touched
        del x
    assert mon.records[1]["mem_peak_bytes"] >= base + 0.9 * 64 * 2**20


def test_files_attempts_and_goodput(tmp_path):
    for attempt in range(2):  # two attempts in one run folder (a relaunch)
        mon = Monitor(tmp_path, model=load_model("tiny"), peak_flops=1e12, start_time=time.time())
        for step in range(1, 4):
            with mon.step(step, tokens=128) as st:
                st.loss = 1.0
        with mon.checkpoint(3):
            time.sleep(0.01)
        s = mon.summary()
        mon.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in lines] == [0, 0, 0, 1, 1, 1]
    for key in ("step", "loss", "step_time_s", "tokens_per_s", "mfu", "data_wait_s", "mem_peak_bytes"):
        assert key in lines[0]
    assert s.goodput.attempts == 2
    assert s.goodput.lost_work_s == pytest.approx(sum(r["step_time_s"] for r in lines[:3]))
    assert s.goodput.checkpoint_s >= 0.02


def test_profiler_writes_chosen_steps(tmp_path):
    a = torch.randn(64, 64)
    for next_step in (1, 3, 2):  # a fresh run, a run resumed right at the window, one step before it
        prof = StepProfiler(tmp_path / str(next_step), (3, 5), rank=0, next_step=next_step)
        with prof:
            for _ in range(next_step, 8):
                a @ a
                prof.step()
        trace = json.loads((tmp_path / str(next_step) / "traces" / "rank0.step3-5.json").read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert "aten::mm" in names
        # A:B is inclusive and the trace's step spans carry the optimizer step numbers
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#3", "ProfilerStep#4",
                                                                       "ProfilerStep#5"}
    # a window already in the past (resumed at step 10) traces nothing
    assert StepProfiler(tmp_path, (3, 5), rank=0, next_step=10).prof is None


def test_a_line_cut_by_a_crash_does_not_swallow_the_next_record(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "attempt": 0, "loss": 2.0, "step_time_s": 0.1, '
                                            '"data_wait_s": 0, "t_end": 1.0}\n{"step": 2, "lo')
    mon = Monitor(tmp_path, start_time=time.time())
    with mon.step(2) as st:
        st.loss = 1.5
    mon.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["loss"] == 1.5 and lines[1] == '{"step": 2, "lo'


def test_any_model_with_its_own_flop_count():
    mon = Monitor(None, flops_per_token=6 * 1e6, peak_flops=2e12)  # 6N for a 1 M-parameter model
    with mon.step(1, tokens=1000):
        time.sleep(0.01)
    r = mon.records[0]
    assert r["mfu"] == pytest.approx(1000 / r["step_time_s"] * 6e6 / 2e12) and r["hfu"] == r["mfu"]
