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


def _must_not_train(cfg):
    raise AssertionError("training started before the arguments were checked")


@pytest.mark.parametrize("args, message", [
    (["--layout", "pp=2"], "pp=2"),
    (["--layout", "sp=1"], "sp=1 (sequence parallel) needs tp > 1"),
    (["--layout", "tp=two"], "bad value 'two' for tp"),
    (["--text", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["--profile-steps", "12:10"], "--profile-steps"),
    (["--fault", "warp-drive"], "unknown fault"),
    (["--nproc", "2", "--fault", "slow-data=soon"], "not a number"),  # refused before torchrun starts
    (["--fault", "item-sync", "--fault-steps", "5"], "--fault-steps"),
    (["--model", "llama-zz"], "unknown model 'llama-zz'"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--gpu", "zz-gpu"], "zz-gpu"),
    (["--peak-tflops", "0"], "--peak-tflops 0: must be > 0"),
    # a window past --steps 2 was silently never traced / never injected
    (["--profile-steps", "5:9"], "--profile-steps 5:9: starts after the run's last step (--steps 2)"),
    (["--profile-steps", "2:3"], "--profile-steps 2:3: ends after the run's last step (--steps 2)"),
    (["--fault", "item-sync", "--fault-steps", "3:4"], "--fault-steps 3:4: starts after the run's last step"),
    # an unusable --store was found after the whole run ("run record not stored")
    (["--store", "{tmp}/a_file"], "a_file: is a file, not a store folder"),
    (["--store", "{tmp}/a_file/store"], "a_file is a file, not a folder"),
    (["--store", "{tmp}/other"], "not a trainperf store"),
])
def test_bad_input_is_a_trainperf_error(app, tmp_path, args, message, monkeypatch):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("")
    if "--store" in args or "--profile-steps" in args:  # refused before the run, not at its end
        monkeypatch.setattr("trainperf.train.trainer.train", _must_not_train)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
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
    res = CliRunner().invoke(app, ["train", "--steps", "1", "--fused-kernels", "--out", str(tmp_path / "k"),
                                   "--peak-tflops", "1"], env={"TRAINPERF_STORE": str(tmp_path / "s")})
    assert res.exit_code == 0, res.output
    assert seen == [(2 * 4 + 1, 4)]  # tiny: two norms per layer + the final norm, one MLP per layer
    monkeypatch.setitem(sys.modules, "trainperf.kernels", None)  # absent: a clear one-line error
    res = CliRunner().invoke(app, ["train", "--steps", "1", "--kernels", "--out", str(tmp_path / "k2")])
    assert isinstance(res.exception, TrainperfError) and "--fused-kernels" in str(res.exception)


@pytest.mark.parametrize("args, message", [
    (["--layout", "tp=3"], "tp=3 does not divide the model's"),  # tiny: 4 heads
    (["--layout", "tp=2,dp=2"], "is not the 2 GPUs"),
    (["--model", "nope"], "unknown model"),
    (["--text", "/nonexistent/corpus.txt"], "/nonexistent/corpus.txt"),
    (["--seq-len", "1000000"], "shorter than one window"),
])
def test_nproc_layout_is_checked_before_torchrun(app, tmp_path, monkeypatch, args, message):
    """Issue 14 #5: a wrong layout for --nproc is one line, and torchrun never starts."""
    launched = []
    monkeypatch.setattr("trainperf.train.launch.launch", lambda *a, **k: launched.append(a) or 0)
    res = CliRunner().invoke(app, ["train", "--nproc", "2", "--steps", "2", "--out", str(tmp_path / "x"), *args])
    assert isinstance(res.exception, TrainperfError), res.output
    assert message in str(res.exception) and "\n" not in str(res.exception)
    assert launched == []


@pytest.mark.parametrize("option, value", [
    ("--steps", "0"), ("--nproc", "0"), ("--seq-len", "0"), ("--ckpt-every", "-1"), ("--ckpt-keep", "0"),
    ("--warmup-steps", "-1"), ("--num-workers", "-1"), ("--max-restarts", "-1"), ("--seed", "-1"),
    ("--seed", str(2**32)),
])
def test_out_of_range_numbers_are_usage_errors(app, tmp_path, option, value):
    res = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "x"), option, value])
    assert res.exit_code == 2 and "Invalid value" in res.output and option in res.output, res.output


def _finished(out, steps, ckpt_steps=()):
    """A run folder as a finished run leaves it: summary.json last, metrics.jsonl, committed checkpoints."""
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "attempt": 0}) + "\n"
                                               for s in range(1, steps + 1)))
    (out / "summary.json").write_text(json.dumps({"steps": steps}))
    for s in ckpt_steps:
        d = out / "checkpoints" / f"step-{s:08d}"
        d.mkdir(parents=True)
        (d / "trainperf.json").write_text("{}")
        (d / ".metadata").write_text("")


def test_rerun_into_a_finished_run_is_refused(app, tmp_path, monkeypatch):
    """Issue 14 #4: rerunning a finished run without checkpoints retrained it and appended its steps."""
    monkeypatch.setattr("trainperf.train.trainer.train", lambda cfg: pytest.fail("training started"))
    out = tmp_path / "done"
    _finished(out, 4)
    res = CliRunner().invoke(app, ["train", "--steps", "4", "--out", str(out)])
    assert isinstance(res.exception, TrainperfError), res.output
    msg = str(res.exception)
    assert "finished at step 4" in msg and str(out / "summary.json") in msg and "another --out" in msg
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_finished_run_with_a_checkpoint_continues_only_past_it(app, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("trainperf.train.trainer.train", lambda cfg: started.append(cfg.steps) or {})
    monkeypatch.setattr("trainperf.train.cli.print_summary", lambda console, result: None)
    out = tmp_path / "done"
    _finished(out, 4, ckpt_steps=(2, 4))
    res = CliRunner().invoke(app, ["train", "--steps", "4", "--out", str(out)])
    assert isinstance(res.exception, TrainperfError) and "--steps above 4" in str(res.exception), res.output
    res = CliRunner().invoke(app, ["train", "--steps", "8", "--no-resume", "--out", str(out)])
    assert isinstance(res.exception, TrainperfError) and "--resume with --steps above 4" in str(res.exception)
    res = CliRunner().invoke(app, ["train", "--steps", "8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert started == [8]


def test_torchrun_leaves_out_its_traceback_on_a_user_error(tmp_path, user_error=True):
    """Issue 14 #5: a rank's user error came wrapped in torchrun's ~40-line ChildFailedError traceback.

    (user_error=False, checked by hand: the traceback stays, as it shows a bug; ~8 s a case here.)"""
    import subprocess
    import sys

    from trainperf.train.worker import ERROR_FILE

    script = tmp_path / "rank.py"  # a rank that fails, recording a user error (as worker.py does) or not
    script.write_text("import pathlib, sys\n"
                      f"if {user_error}: (pathlib.Path(sys.argv[1]).parent / {ERROR_FILE!r}).write_text('bad')\n"
                      "sys.exit(2)\n")
    cmd = [sys.executable, "-m", "trainperf.train.launch", "--standalone", "--nproc-per-node=1",
           str(script), str(tmp_path / "train_config.json")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert ("Traceback" in res.stderr) != user_error, res.stderr


@pytest.mark.parametrize("rank,launched,printed", [("0", True, False), ("0", False, True), ("1", True, True)])
def test_worker_prints_a_user_error_once(tmp_path, monkeypatch, capsys, rank, launched, printed):
    """Rank 0's user error is recorded for the launcher, which prints it; a worker under a torchrun of
    one's own, and every other rank, print their error themselves."""
    from trainperf.train import worker
    from trainperf.train.trainer import TrainConfig

    cfg = TrainConfig(model="tiny", steps=2, out=str(tmp_path), progress=False, record=False, layout="pp=2")
    path = tmp_path / "train_config.json"
    path.write_text(cfg.to_json())
    monkeypatch.setenv("RANK", rank)
    if launched:
        monkeypatch.setenv(worker.LAUNCHER_REPORTS_ENV, "1")
    else:
        monkeypatch.delenv(worker.LAUNCHER_REPORTS_ENV, raising=False)
    assert worker.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert (f"error (rank {rank}):" in err) is printed
    assert (tmp_path / worker.ERROR_FILE).is_file() is (rank == "0")
