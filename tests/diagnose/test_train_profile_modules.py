"""`trainperf train --profile-modules` traces the nn.Module spans, and `diagnose --modules` on that trace
gives each module of the reference model its forward and its backward time.

Reference: the model's own module tree (train/model.py: the embedding, the transformer blocks, the final
norm and the output head as named modules), and the profiler's own autograd nodes in the trace (each
backward node's sequence number names a forward op: the backward lands on the modules)."""

import json

import pytest
from typer.testing import CliRunner

from trainperf.diagnose.modules import BACKWARD, GRAD_ACCUM, module_breakdown
from trainperf.trace.kineto import read_kineto


def _train(tmp_path, *flags):
    from trainperf.cli import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--model", "tiny", "--steps", "3", "--profile-steps", "2:3", "--synthetic",
                                   "--out", str(out), "--peak-tflops", "1", *flags],
                             env={"TRAINPERF_STORE": str(tmp_path / "store")})
    assert res.exit_code == 0, res.output
    return read_kineto(out / "traces" / "rank0.step2-3.json")


@pytest.mark.slow  # one 3-step run of the tiny model: ~12 CPU-s
def test_profile_modules_gives_forward_and_backward_per_module(tmp_path):
    # (without the flag the traces hold no module spans: tests/monitor/test_profiler_modules.py)
    b = module_breakdown(_train(tmp_path, "--profile-modules"), by="type")
    rows = {r.path: r for r in b.rows}
    roots = [r for r in b.rows if r.depth == 1]
    assert len(roots) == 1 and b.steps == 2
    # every module type of the model has both passes (times are CPU time on a shared machine: no ratios)
    for p in ("Transformer/Block", "Transformer/Block/Attention", "Transformer/Block/Attention/Linear",
              "Transformer/Block/FeedForward/Linear", "Transformer/Block/RMSNorm", "Transformer/Linear",
              "Transformer/Embedding"):
        assert rows[p].forward_us_per_step > 0 and rows[p].backward_us_per_step > 0, p
    assert rows["Transformer/Block"].calls_per_step == 4  # the tiny model's 4 layers
    # the trainer records shapes: every gradient accumulation is checked against its producer's inputs and lands
    # on a module; what cannot be linked is a stated minority of the backward
    assert GRAD_ACCUM not in rows and not any("engine's order alone" in n for n in b.notes)
    assert 0 <= b.unlinked_backward_us_per_step < 0.5 * b.backward_us_per_step
    if BACKWARD in rows:
        assert any("not attributed to a module" in n for n in b.notes)
    assert json.dumps(b.to_json())
