"""2-process torchrun (gloo) runs of the tiny model: DDP, FSDP2, TP, TP+SP parity with one process, and
a rank killed with SIGKILL mid-run, relaunched, resuming bit-for-bit."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trainperf.specs import Layout
from trainperf.train.launch import launch, torchrun_command
from trainperf.train.trainer import TrainConfig, train
from metrics_reader import losses_by_step

pytestmark = pytest.mark.distributed

STEPS = 12


def _cfg(out, **kw):
    base = dict(model="tiny", steps=STEPS, out=str(out), progress=False, record=False, peak_tflops=1.0,
                ckpt_keep=10)
    base.update(kw)
    return TrainConfig(**base)


def _env(tmp):
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINPERF_STORE=str(tmp / "store"))
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    env = _env(tmp)
    out = {}
    # single-process references: mbs=2 is what 2 data-parallel ranks of mbs=1 read per step
    train(_cfg(tmp / "single_mbs2", layout="mbs=2"))
    train(_cfg(tmp / "single_mbs1", layout="mbs=1"))
    for name, kw in {"fsdp": dict(layout="zero=3", ckpt_every=3),
                     # recorded: summary.ranks; profiled: the DDP work its traces show
                     "ddp": dict(layout="zero=0", record=True, profile_steps="5:6"),
                     "tp": dict(layout="tp=2"),
                     "tp_sp": dict(layout="tp=2,sp=1,recompute=selective", ckpt_every=6),
                     # the canonical string `trainperf plan` prints (Layout.to_string): ZeRO-2, bf16
                     "planned": dict(layout=Layout(tp=1, pp=1, dp=2, zero=2, mbs=1, grad_accum=1,
                                                   precision="bf16").to_string())}.items():
        assert launch(_cfg(tmp / name, **kw), 2, env=env) == 0, name
    out = {p.name: p for p in tmp.iterdir()}
    out["tmp"] = tmp
    return out


def test_fsdp_matches_single_process(runs):
    ref, got = losses_by_step(runs["single_mbs2"]), losses_by_step(runs["fsdp"])
    assert len(got) == STEPS
    assert got == pytest.approx(ref, rel=2e-4)  # same samples; reduction order differs
    summary = json.loads((runs["fsdp"] / "summary.json").read_text())
    assert summary["strategy"] == "fsdp" and summary["world_size"] == 2
    assert summary["tokens_per_s"] > 0 and summary["mem_peak_bytes"] > 0


def test_two_rank_checkpoint_refused_by_one_process(runs, tmp_path):
    import shutil

    from trainperf.errors import TrainperfError

    shutil.copytree(runs["fsdp"] / "checkpoints", tmp_path / "checkpoints")
    with pytest.raises(TrainperfError, match="another layout: dp=2"):
        train(_cfg(tmp_path, layout="zero=3", steps=STEPS + 1))


def test_a_planner_layout_string_runs_fsdp_in_bf16(runs):
    run = json.loads((runs["planned"] / "run.json").read_text())
    assert run["layout"] == "tp=1,pp=1,dp=2,cp=1,vpp=1,sp=0,recompute=none,zero=2,mbs=1,ga=1,precision=bf16"
    assert run["strategy"] == "fsdp-no-reshard"
    # bf16 parameters and activations (FSDP mixed precision), fp32 gradients: bf16 tolerance
    assert losses_by_step(runs["planned"]) == pytest.approx(losses_by_step(runs["single_mbs2"]), rel=3e-2)


def test_ddp_matches_single_process(runs):
    assert losses_by_step(runs["ddp"]) == pytest.approx(losses_by_step(runs["single_mbs2"]), rel=2e-4)


def test_ddp_runs_without_its_own_per_step_work(runs):
    """The trainer's DDP (broadcast_buffers=False, gradient_as_bucket_view=True), read from its own profile as
    diagnose reads a user's: DDP's forward is recorded, but no buffer broadcast before it (its rotary tables are
    alike on every rank) and no reduced gradient copied out of its bucket (diagnose/ddp.py's kinds)."""
    from trainperf.diagnose.ddp import BROADCAST_RE, DDP_FORWARD_RE, GRADIENT_COPY_RE
    from trainperf.trace.load import load_trace

    tables = load_trace(runs["ddp"] / "traces", workers=1)
    assert sorted(tables) == [0, 1]
    for t in tables.values():
        assert any(DDP_FORWARD_RE.search(n) for n in t.names), t.source
        assert not any(BROADCAST_RE.search(n) or GRADIENT_COPY_RE.search(n) for n in t.names), t.source


def test_two_rank_record_lists_each_ranks_host_and_busy_time(runs):
    """Rank 0 gathers every rank's host and median busy s (its own compute per step, collective
    waits and data wait excluded) into the record's summary; fleet tree reads it per host."""
    import socket
    import statistics

    from trainperf.fleet.tree import fleet_tree, rank_hosts
    from trainperf.store import RunFilter, open_store

    rec = json.loads((runs["ddp"] / "run_record.json").read_text())
    ranks = rec["config"]["summary"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["host"] == socket.gethostname() for r in ranks)
    step = rec["step_time_s"]  # rank 0's median step time
    assert all(0 < r["busy_s"] <= step for r in ranks), (ranks, step)
    # rank 0's busy time: its median of forward + backward + optimizer less the measured DDP comm wait
    # over the steps the summary's medians use (the trainer skips 2 warm-up steps; the step time checks it)
    lines = [json.loads(x) for x in (runs["ddp"] / "metrics.jsonl").read_text().splitlines()][2:]
    assert statistics.median(r["step_time_s"] for r in lines) == step
    assert all(r["comm_wait_s"] >= 0 for r in lines)  # DDP on CPU: the gradient all-reduces' wait
    own = statistics.median(r["forward_s"] + r["backward_s"] + r["optimizer_s"] - r.get("comm_wait_s", 0.0)
                            for r in lines)
    assert ranks[0]["busy_s"] == pytest.approx(own, rel=1e-9)
    store = str(runs["tmp"] / "store")
    stored = next(r for r in open_store(store).read(RunFilter(), samples=False) if r.run_id == rec["run_id"])
    assert rank_hosts(stored) == [(socket.gethostname(), r["busy_s"]) for r in ranks]
    t = fleet_tree(store)
    acc = next(a for a in t.accounts if a.run_id == rec["run_id"])
    assert list(acc.host_parts) == [socket.gethostname()]
    for k, v in acc.parts.items():  # one host: it holds the whole run
        assert acc.host_parts[socket.gethostname()][k] == pytest.approx(v), k


def test_tensor_parallel_matches_single_process(runs):
    assert losses_by_step(runs["tp"]) == pytest.approx(losses_by_step(runs["single_mbs1"]), rel=2e-4)
    assert json.loads((runs["tp"] / "run.json").read_text())["layout"].startswith("tp=2,pp=1,dp=1")
    # sequence parallel (with selective recompute) shards the residual stream, not the math
    assert losses_by_step(runs["tp_sp"]) == pytest.approx(losses_by_step(runs["single_mbs1"]), rel=2e-4)
    assert (runs["tp_sp"] / "checkpoints" / "step-00000012" / "trainperf.json").is_file()


def _rank_pid(parent: int, rank: int) -> int | None:
    """Return the pid of the worker with RANK=rank below ``parent`` (walks /proc children)."""
    todo = [parent]
    while todo:
        pid = todo.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            try:
                env = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + str(rank).encode() in env:
                return kid
            todo.append(kid)
    return None


def test_sigkilled_rank_relaunch_resumes_bit_identical(runs):
    tmp = runs["tmp"]
    run = tmp / "killed"
    cfg = _cfg(run, layout="zero=3", ckpt_every=3)
    run.mkdir()
    (run / "train_config.json").write_text(cfg.to_json())
    proc = subprocess.Popen(torchrun_command(run / "train_config.json", 2), env=_env(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_after = None
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None:
            metrics = run / "metrics.jsonl"
            lines = metrics.read_text().splitlines() if metrics.is_file() else []
            if len(lines) >= 7:
                pid = _rank_pid(proc.pid, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed_after = len(lines)
                    break
            time.sleep(0.01)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed_after is not None, "the run ended before a rank could be killed"
    assert rc != 0
    assert len(losses_by_step(run)) < STEPS  # the job really died mid-run
    assert launch(cfg, 2, env=_env(tmp)) == 0  # relaunch: auto-resume from the newest complete checkpoint
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] is not None
    assert losses_by_step(run) == losses_by_step(runs["fsdp"])  # bit-identical to the uninterrupted run
    gp = summary["goodput"]
    assert gp["attempts"] == 2 and gp["restart_s"] > 0 and gp["startup_s"] > 0
    parts = sum(gp[k] for k in ("productive_s", "startup_s", "data_wait_s", "checkpoint_s", "restart_s",
                                "lost_work_s", "other_s"))
    assert parts == pytest.approx(gp["total_s"])
