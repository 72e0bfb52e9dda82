"""CPU-only checkpoint stall: a hand-built one-rank trace whose loop saves a checkpoint in a named span."""

import json

from trainperf.diagnose.api import diagnose
from trainperf.train.checkpoint import SAVE_SPAN

STEP_MS, SAVE_MS, STEPS = 100.0, 25.0, 4


def _x(name, ts_ms, dur_ms, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 10, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3,
            "args": {}}


def test_a_checkpoint_in_the_loop_is_found_without_gpu_activity(tmp_path):
    """Each step: 75 ms of compute, then a 25 ms synchronous save (the trainer's span name).
    Expected: checkpoint_stall with 25 % of the window, a host-only upper bound."""
    ev = []
    for k in range(STEPS):
        s = 1000.0 + k * STEP_MS
        ev += [_x(f"ProfilerStep#{k + 1}", s, STEP_MS, "user_annotation"),
               _x("aten::mm", s, STEP_MS - SAVE_MS),
               _x(SAVE_SPAN, s + STEP_MS - SAVE_MS, SAVE_MS, "user_annotation")]
    (tmp_path / "rank0.json").write_text(json.dumps({"traceEvents": ev}))
    found = {f.kind: f for f in diagnose(tmp_path).findings}
    assert "checkpoint_stall" in found
    assert abs(found["checkpoint_stall"].gain_pct - 100.0 * SAVE_MS / STEP_MS) < 1.0
