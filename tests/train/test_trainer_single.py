"""Single-process trainer runs of the tiny model: learning, run folder, exact resume, checkpoints."""

import json
import math
import shutil

import pytest

from trainperf.errors import TrainperfError
from trainperf.train.checkpoint import Checkpointer, complete_checkpoints
from trainperf.train.trainer import TrainConfig, train
from metrics_reader import losses_by_step


def _cfg(out, **kw):
    base = dict(model="tiny", steps=12, out=str(out), progress=False, record=False, peak_tflops=1.0)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    store = tmp_path_factory.mktemp("store")
    result = train(_cfg(out, steps=30, ckpt_every=10, ckpt_keep=10, profile_steps="10:12", record=True,
                        store=str(store), peak_tflops=None))
    return out, store, result


def test_loss_falls_on_the_shipped_text(demo_run):
    out, _, result = demo_run
    losses = losses_by_step(out)
    assert len(losses) == 30
    assert losses[0] == pytest.approx(math.log(256), rel=0.05)  # uniform guess over 256 byte tokens
    assert sum(losses[-5:]) / 5 < math.log(256) - 2.0  # learned: well below the uniform guess
    assert result["final_loss"] == losses[-1]


def test_run_folder_contents(demo_run):
    out, store, result = demo_run
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("step", "loss", "step_time_s", "tokens_per_s", "mfu", "hfu", "data_wait_s", "mem_peak_bytes",
                "forward_s", "backward_s", "optimizer_s", "lr", "grad_norm"):
        assert key in rec, key
    # tokens/s and MFU from the run's own figures (hand formula: tokens / s; tokens * FLOPs / peak)
    assert rec["tokens"] == 128 and rec["tokens_per_s"] == pytest.approx(128 / rec["step_time_s"])
    assert rec["mfu"] == pytest.approx(rec["tokens_per_s"] * 5_013_504 / result["peak_flops"])
    # LR: linear warm-up over 5 steps to 3e-3, then cosine to 10% over the remaining 25 (hand formula)
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs[0] == pytest.approx(3e-3 / 6) and lrs[5] == pytest.approx(3e-3)
    assert lrs[29] == pytest.approx(3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 24 / 25))))
    assert (out / "traces" / "rank0.step10-12.json").is_file()
    assert [s for s, _ in complete_checkpoints(out / "checkpoints")] == [10, 20, 30]
    assert (out / "report.html").read_text().startswith("<!doctype html") or "svg" in (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["goodput"]["goodput"] < 1
    assert summary["goodput"]["checkpoint_s"] > 0 and summary["goodput"]["startup_s"] > 0
    assert list(store.rglob("*.parquet")), result.get("record_note")
    from trainperf.store import read_runs

    runs = read_runs(str(store))
    assert len(runs) == 1 and runs[0].kind == "train" and len(runs[0].samples) == 30


def test_store_record_carries_the_peak_its_mfu_is_of(demo_run):
    """The stored record holds the peak the run measured its MFU against (here the CPU's measured matmul
    rate) and where it came from, in the store and in run_record.json alike; its MFU re-derives from it
    by hand (tokens/s x model FLOPs per token / peak)."""
    out, store, result = demo_run
    from trainperf.store import read_runs

    (run,) = read_runs(str(store))
    assert result["peak_flops"] > 0 and result["peak_source"].startswith("measured")
    assert run.peak_flops == result["peak_flops"] and run.peak_source == result["peak_source"]
    assert run.mfu == pytest.approx(run.tokens_per_s * 5_013_504 / run.peak_flops)
    local = json.loads((out / "run_record.json").read_text())
    assert (local["peak_flops"], local["peak_source"]) == (result["peak_flops"], result["peak_source"])


def test_exact_resume_and_half_written_checkpoints(demo_run, tmp_path):
    out, _, _ = demo_run
    run = tmp_path / "resumed"
    shutil.copytree(out / "checkpoints" / "step-00000010", run / "checkpoints" / "step-00000010")
    # a newer checkpoint cut short by a crash: the save folder without its commit
    shutil.copytree(out / "checkpoints" / "step-00000020", run / "checkpoints" / ".step-00000020.tmp")
    # and a committed name whose manifest is missing: not complete, never loaded
    (run / "checkpoints" / "step-00000025").mkdir()
    result = train(_cfg(run, steps=30, ckpt_every=10, peak_tflops=None))
    assert result["resumed_from"].endswith("step-00000010")
    assert losses_by_step(run) == losses_by_step(out)[10:]  # bit-identical to the uninterrupted run
    assert not (run / "checkpoints" / ".step-00000020.tmp").exists()


def test_checkpoint_of_another_model_or_layout_is_refused(demo_run, tmp_path):
    out, _, _ = demo_run
    run = tmp_path / "other"
    shutil.copytree(out / "checkpoints" / "step-00000030", run / "checkpoints" / "step-00000030")
    cfg_file = tmp_path / "two_layers.json"
    cfg_file.write_text(json.dumps({"n_layers": 2, "hidden": 128, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 352,
                                    "vocab": 256, "seq_len": 128, "tied_embeddings": True}))
    with pytest.raises(TrainperfError, match="another model: n_layers=4"):
        train(_cfg(run, model=str(cfg_file), steps=31))
    with pytest.raises(TrainperfError, match="another layout: mbs=1"):
        train(_cfg(run, layout="mbs=2", steps=31))


def test_recompute_is_bitwise_and_grad_accum_matches_micro_batch(tmp_path):
    ref = _losses_of(tmp_path / "ref", layout="mbs=2")
    assert _losses_of(tmp_path / "full", layout="mbs=2,recompute=full") == ref
    assert _losses_of(tmp_path / "sel", layout="mbs=2,recompute=selective") == ref
    ga = _losses_of(tmp_path / "ga", layout="mbs=1,ga=2")
    assert ga == pytest.approx(ref, rel=1e-4)  # same samples, summed in another order


def _losses_of(out, **kw):
    train(_cfg(out, steps=4, **kw))
    return losses_by_step(out)


def test_compile_per_block_matches_eager(tmp_path):
    ref = _losses_of(tmp_path / "eager")
    compiled = _losses_of(tmp_path / "compiled", compile=True, compile_backend="aot_eager")
    assert compiled == pytest.approx(ref, rel=1e-4)


def test_unsupported_layout_is_one_clear_error(tmp_path):
    with pytest.raises(TrainperfError, match="pp=2"):
        train(_cfg(tmp_path, layout="pp=2"))
    with pytest.raises(TrainperfError, match="does not divide 1 GPUs"):
        train(_cfg(tmp_path, layout="tp=3"))


def test_checkpointer_keeps_last_k(tmp_path):
    import torch

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    ck = Checkpointer(tmp_path, {"model": {}, "layout": {}}, keep=2, async_save=True)
    for step in (1, 2, 3):
        ck.save(step, model, opt, {"data_position": step})
    ck.wait()
    assert [s for s, _ in complete_checkpoints(tmp_path / "checkpoints")] == [2, 3]


def test_checkpoint_saves_are_named_spans_in_a_profiler_trace(tmp_path):
    """The loop's checkpoint work shows in a trace under a name diagnose's checkpoint rule reads."""
    import json

    import torch

    from trainperf.diagnose.host import CHECKPOINT_RE
    from trainperf.train.checkpoint import SAVE_SPAN

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    ck = Checkpointer(tmp_path, {"model": {}, "layout": {}}, keep=2, async_save=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ck.save(1, model, opt, {"data_position": 1})
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e.get("name") == SAVE_SPAN and e.get("ph") == "X"]
    assert len(spans) == 1 and spans[0]["dur"] > 0
    # the synchronous save (DCP write and commit) lies inside the span
    inner = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("aten::")
             and spans[0]["ts"] <= e["ts"] <= spans[0]["ts"] + spans[0]["dur"]]
    assert inner
    assert CHECKPOINT_RE.search(SAVE_SPAN)
    assert [s for s, _ in complete_checkpoints(tmp_path / "checkpoints")] == [1]
