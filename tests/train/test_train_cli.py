"""The `trainperf train` command: a short run prints its summary; bad input is one clear line."""

import json

import pytest
import typer
from typer.testing import CliRunner

from trainperf.errors import TrainperfError
from trainperf.train.cli import register


@pytest.fixture()
def app():
    a = typer.Typer()

    @a.callback()
    def _root() -> None:  # keep `train` a sub-command even when it is the only one registered
        pass

    register(a)
    return a


def test_train_command_runs_and_summarises(app, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPERF_STORE", str(tmp_path / "store"))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--model", "tiny", "--steps", "4", "--out", str(out),
                                   "--peak-tflops", "1"])
    assert res.exit_code == 0, res.output
    assert "MFU" in res.output and "goodput" in res.output and str(out) in res.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


@pytest.mark.parametrize("args, message", [
    (["--layout", "pp=2"], "pp=2"),
    (["--layout", "sp=1"], "sp=1 (sequence parallel) needs tp > 1"),
    (["--layout", "tp=two"], "bad value 'two' for tp"),
    (["--text", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["--profile-steps", "12:10"], "--profile-steps"),
    (["--fault", "warp-drive"], "unknown fault"),
    (["--nproc", "2", "--fault", "slow-data=soon"], "not a number"),  # refused before torchrun starts
    (["--fault", "item-sync", "--fault-steps", "5"], "--fault-steps"),
])
def test_bad_input_is_a_trainperf_error(app, tmp_path, args, message):
    res = CliRunner().invoke(app, ["train", "--steps", "2", "--out", str(tmp_path / "x"), *args])
    assert isinstance(res.exception, TrainperfError), res.output
    assert message in str(res.exception)
    assert "\n" not in str(res.exception)


def test_kernels_flag_calls_the_kernels_api(app, tmp_path, monkeypatch):
    import sys
    import types

    from trainperf.train.model import FeedForward, RMSNorm

    seen = []

    def fake_apply(model):  # the contract: called once with the unwrapped model, before compile/FSDP
        seen.append((sum(isinstance(m, RMSNorm) for m in model.modules()),
                     sum(isinstance(m, FeedForward) for m in model.modules())))

    monkeypatch.setitem(sys.modules, "trainperf.kernels", types.SimpleNamespace(apply=fake_apply))
    res = CliRunner().invoke(app, ["train", "--steps", "1", "--kernels", "--out", str(tmp_path / "k"),
                                   "--peak-tflops", "1"], env={"TRAINPERF_STORE": str(tmp_path / "s")})
    assert res.exit_code == 0, res.output
    assert seen == [(2 * 4 + 1, 4)]  # tiny: two norms per layer + the final norm, one MLP per layer
    monkeypatch.setitem(sys.modules, "trainperf.kernels", None)  # absent: a clear one-line error
    res = CliRunner().invoke(app, ["train", "--steps", "1", "--kernels", "--out", str(tmp_path / "k2")])
    assert isinstance(res.exception, TrainperfError) and "--kernels" in str(res.exception)
