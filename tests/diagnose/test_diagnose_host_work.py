"""host_work: the launching thread busy for milliseconds with work that launches nothing while the GPU idles.

The references: the corpus' trace surgery (trainperf.corpus, independent of diagnose) inserts the work and measures
the step it costs; hand-built traces give the cases where nothing may be found."""

import random
import sys
from pathlib import Path

import pytest

from trainperf.corpus import kineto as K
from trainperf.corpus.build import step_time
from trainperf.corpus.inject import NotApplicable, inject_host_work
from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

STEP_US, KERNELS, OP_US = 20_000.0, 40, 500.0


def _loop(path: Path, *, gap_us: float = 0.0, gap_name: str | None = None, kernel_us: float = 40.0,
          sampled: bool = False, gap_step: int | None = None, gap_ops: int = 0, tail_us: float = 0.0,
          tail_lost: bool = False, kernels: int = KERNELS, copies: int = 0, copy_bytes: int = 0,
          copies_every_step: bool = False) -> Path:
    """6 steps of 20 ms: 40 ops (kernels) of 500 us back to back, each launching one kernel of kernel_us (40 us: the GPU
    mostly idle, waiting for the next op); before the 21st op, gap_us of work that launches nothing (inside
    gap_name, or no op at all, or gap_ops short aten::cat ops filling 90 % of it), and the step that much longer; in
    step gap_step only when given. sampled: the runtime calls' correlation ids step by 73, as in a trace that kept 1
    call in 73. tail_us: that long with no op after the last op of step 4 (the window's last: the 6th step is cut),
    the step that much longer; tail_lost: the calls' ids jump by 100 across it (events lost, not work). copies:
    that many blocking device-to-host copies of copy_bytes each (30 us apiece) just before the gap, in its step (in
    every step with copies_every_step), the step that much longer."""
    b = TraceBuilder()
    t0 = 0.0
    for s in range(6):
        gap = gap_us if gap_step is None or s == gap_step else 0.0
        tail = tail_us if s == 4 else 0.0
        n_copies = copies if gap or copies_every_step else 0
        step_us = kernels * OP_US + 30.0 * n_copies
        b.step(s, t0, step_us + gap + tail)
        at = t0
        for k in range(kernels):
            if k == kernels // 2:
                for _ in range(n_copies):
                    b.launch("Memcpy DtoH (Device -> Pageable)", at, at + 5.0, 20.0, cat="gpu_memcpy",
                             runtime="cudaMemcpyAsync", launch_dur=25.0, bytes=copy_bytes)
                    at += 30.0
            if k == kernels // 2 and gap:
                if gap_name:
                    b.cpu(gap_name, at, gap, cat="user_annotation")
                for j in range(gap_ops):
                    b.cpu("aten::cat", at + j * gap / gap_ops, 0.9 * gap / gap_ops)
                at += gap
            b.cpu("aten::mul", at, OP_US - 1.0)
            if sampled:
                b._corr += 72
            b.launch("void at::native::vectorized_elementwise_kernel<4>", at + OP_US - 20.0, at + OP_US - 10.0,
                     kernel_us, launch_dur=8.0)
            at += OP_US
        if tail and tail_lost:
            b._corr += 100
        t0 += step_us + gap + tail
    return b.write(path)


def _host_work(path: Path):
    return next((f for f in diagnose(path).findings if f.kind == "host_work"), None)


def test_host_work_inserted_by_surgery_is_found_and_priced_as_the_step_it_costs(tmp_path):
    base = K.read_events(_loop(tmp_path / "base.json.gz"))
    out, _ = inject_host_work({0: base}, 8_000.0, random.Random(3))
    before, after = step_time({0: base}), step_time(out)
    true_gain = 100.0 * (after - before) / after
    assert true_gain == pytest.approx(100 * 8 / 28, abs=1.0)  # the GPU waits through all of it
    found = _host_work(K.write_events(tmp_path / "injected.json.gz", out[0]))
    assert found is not None and found.gain_is_upper_bound
    # alone, as the surgery measured it (its marginal gain comes after launch_bound's: every op here is dispatch)
    assert found.gain_alone_pct == pytest.approx(true_gain, abs=1.0)
    assert _host_work(tmp_path / "base.json.gz") is None


@pytest.mark.parametrize("name, shown", [("compute_metrics", "compute_metrics"), (None, "no op recorded")])
def test_the_evidence_names_what_held_the_thread(tmp_path, name, shown):
    found = _host_work(_loop(tmp_path / "t.json.gz", gap_us=6_000.0, gap_name=name))
    assert found is not None and shown in found.evidence["events"][0]["name"]
    assert found.evidence["events"][0]["dur_us"] == pytest.approx(6_000.0, abs=20.0)  # + the 12 us before the op


def test_the_fix_follows_what_the_loop_does(tmp_path):
    # the loop above has no backward node and no optimizer step: forward-only (serving, generation), whose host work
    # between model steps is the engine's scheduling; with an optimizer step per iteration it is a training loop
    d = diagnose(_loop(tmp_path / "serve.json.gz", gap_us=6_000.0))
    found = next(f for f in d.findings if f.kind == "host_work")
    assert "forward-only loop" in found.recommendation and "ZeRO-Offload" not in found.recommendation
    assert d.to_json()["ranks"][0]["loop"] == "inference"
    path = _loop(tmp_path / "train.json.gz", gap_us=6_000.0)
    events = K.read_events(path)
    steps = [e for e in events["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    events["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": 10,
                               "tid": 1, "ts": e["ts"] + 1.0, "dur": 5.0, "args": {}} for e in steps]
    found = _host_work(K.write_events(tmp_path / "train2.json.gz", events))
    assert "ZeRO-Offload" in found.recommendation


def test_a_block_of_many_short_ops_is_named_by_them(tmp_path):
    # 6 ms of 40 aten::cat ops, one every 150 us, 135 us each (no launch among them), from G: no op spans half of the
    # block, so the evidence names the ops that fill it. By hand: the block is the 6000 us of work beyond the usual
    # 492-us dispatch before the next launch (at G + 6480), i.e. [G + 480, G + 6480): the cats from the 5th on
    # (starting at G + 600) lie inside it, 36 of them, 36 x 135 = 4860 us: 81 % of it
    found = _host_work(_loop(tmp_path / "t.json.gz", gap_us=6_000.0, gap_ops=40))
    assert found.evidence["events"][0]["name"] == "36 ops (aten::cat x36): 81 % of it inside them"


def test_the_shortest_block_read_is_a_share_of_a_short_step(tmp_path):
    """A 600-us block is 7.0 % of an 8.6-ms step (16 ops of 500 us, plus it): over 5 % of it
    (HOST_WORK_MIN_GAP_STEP_SHARE), so it is read though under 1 ms, and priced as the step the surgery measures it
    to cost. In a 20.6-ms step the same block is 2.9 %; 250 us in the short step 3.0 %: neither is read."""
    base = K.read_events(_loop(tmp_path / "base.json.gz", kernels=16))
    out, _ = inject_host_work({0: base}, 600.0, random.Random(3))
    true_gain = 100.0 * (step_time(out) - step_time({0: base})) / step_time(out)
    assert true_gain == pytest.approx(100 * 600 / 8_600, abs=0.5)
    found = _host_work(K.write_events(tmp_path / "injected.json.gz", out[0]))
    assert found is not None and found.gain_alone_pct == pytest.approx(true_gain, abs=0.5)
    assert _host_work(_loop(tmp_path / "short.json.gz", gap_us=600.0, kernels=16)) is not None
    assert _host_work(_loop(tmp_path / "long.json.gz", gap_us=600.0)) is None
    assert _host_work(_loop(tmp_path / "small.json.gz", gap_us=250.0, kernels=16)) is None


def test_no_host_work_while_the_gpu_is_busy_through_it(tmp_path):
    """The same 6-ms gap while the first 20 kernels, of 2 ms each, still run: the GPU does not run dry."""
    assert _host_work(_loop(tmp_path / "t.json.gz", gap_us=6_000.0, kernel_us=2_000.0)) is None


def test_a_sampled_trace_has_no_host_work(tmp_path):
    """Gaps across which the calls' ids jump by 73 are events the sampling dropped, not work."""
    assert _host_work(_loop(tmp_path / "t.json.gz", gap_us=6_000.0, sampled=True)) is None
    base = K.read_events(_loop(tmp_path / "s.json.gz", sampled=True))
    with pytest.raises(NotApplicable, match="sampled"):
        inject_host_work({0: base}, 8_000.0, random.Random(3))


def _after_backward(path: Path, metrics_us: float) -> Path:
    """4 steps of 200 us + metrics_us. Main thread (tid 1): aten::mm [T, +30) launches a forward GEMM at T+10 (GPU
    [T+20, +40)); then it waits in backward() while the autograd thread (tid 2) runs aten::mm [T+50, +30),
    launching a backward GEMM at T+60 (GPU [T+70, +10)), its last call ending at T+64; woken, the main thread runs
    metrics_us of its own ops (aten::cat, launching nothing) from T+70, then aten::add_ [T+70+m, +30) launches the
    optimizer kernel 10 us in (GPU 10 us later, 100 us) and cudaStreamSynchronize waits for it (returns 5 us after
    it); the next step starts 5 us later."""
    b = TraceBuilder()
    T, step = 0.0, 200.0 + metrics_us
    for s in range(4):
        b.step(s, T, step)
        b.cpu("aten::mm", T, 30)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", T + 10, T + 20, 40)
        b.cpu("aten::mm", T + 50, 30, tid=2)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64", T + 60, T + 70, 10, tid=2)
        if metrics_us:
            b.cpu("aten::cat", T + 70, metrics_us)
        opt = T + 70 + metrics_us
        b.cpu("aten::add_", opt, 30)
        b.launch("void at::native::vectorized_elementwise_kernel<4>", opt + 10, opt + 20, 100)
        b.cpu("cudaStreamSynchronize", opt + 30, 95, cat="cuda_runtime")
        T += step
    return b.write(path)


def test_work_after_waiting_for_another_thread_is_priced(tmp_path):
    # the optimizer's launch waited for the autograd thread (its launch ended at T+64) and then for the main thread's
    # metrics: its call starts 16 + m after that launch's end, m + 10 of it the main thread's own ops. Without the
    # metrics it starts 16 us after the wake (T+80; the op's 10-us dispatch stays), its kernel runs at T+90 after
    # the backward GEMM (T+80): every step m shorter. Three steps analysed, the window ending at the third step's end
    # (9600 us, 5 us after its sync returns): 3 x 3000 / 9600 = 93.75 % alone (an upper bound: high -> medium); the
    # syncs' fix comes first
    # in the order of fixes and takes a little of it. The same job without the metrics has no host_work. Kept as a
    # fixed lag (before), the work after the wake gave no gain at all.
    found = _host_work(_after_backward(tmp_path / "m.json.gz", 3000.0))
    assert found is not None and found.severity == "medium"
    assert found.gain_alone_pct == pytest.approx(100 * 3 * 3000 / 9600, abs=0.01)
    assert _host_work(_after_backward(tmp_path / "none.json.gz", 0.0)) is None


def _first_allocation(path: Path, later_us: float) -> Path:
    """5 steps: each opens with aten::empty_strided launching nothing (2200 us in the first step, later_us in the
    others), then 20 ops of 100 us each launching a 20-us kernel (the GPU idles between them)."""
    b = TraceBuilder()
    T = 0.0
    for s in range(5):
        alloc = 2200.0 if s == 0 else later_us
        b.step(s, T, alloc + 2050.0)
        b.cpu("aten::empty_strided", T, alloc)
        at = T + alloc + 10.0
        for _ in range(20):
            b.cpu("aten::mul", at, 99.0)
            b.launch("void at::native::vectorized_elementwise_kernel<4>", at + 80.0, at + 90.0, 20.0, launch_dur=8.0)
            at += 100.0
        T += alloc + 2050.0
    return b.write(path)


def test_a_first_call_initialising_is_warm_up_not_host_work(tmp_path):
    # the first aten::empty_strided holds the thread 2.2 ms, the later ones 8 us: one-off initialisation (the first
    # allocation), 275x the later calls (> replay.ONE_OFF_FACTOR), which a steady step does not pay, as HTA's
    # with_gpu_user_annotation trace shows (2194 us, then ~8 us); when every step pays it, it is host work
    assert _host_work(_first_allocation(tmp_path / "warm.json.gz", 8.0)) is None
    assert _host_work(_first_allocation(tmp_path / "every.json.gz", 2200.0)) is not None


def test_host_work_in_one_step_of_several_is_periodic_work(tmp_path):
    # 40 ms with no op in step 2 only (of the 5 analysed): one step holds all of the GPU's idle during it, so it is
    # work done every N steps (an unnamed checkpoint save), and the fix says so; in every step it is not
    found = _host_work(_loop(tmp_path / "once.json.gz", gap_us=40_000.0, gap_step=2))
    assert found is not None and found.evidence["metrics"]["steps_with_it"]["value"] == 1
    assert "one of the 5 analysed steps" in found.recommendation and "async_save" in found.recommendation
    found = _host_work(_loop(tmp_path / "every.json.gz", gap_us=6_000.0))
    assert found.evidence["metrics"]["steps_with_it"]["value"] == 5 and "async_save" not in found.recommendation


def test_periodic_work_after_the_state_is_copied_to_the_host_is_a_checkpoint_save(tmp_path):
    # the 40-ms block of step 2 after 32 blocking device-to-host copies of 4 MiB (128 MiB, none in the other steps):
    # a save copying the model's state before it writes it, named so though no op names it
    d = diagnose(_loop(tmp_path / "save.json.gz", gap_us=40_000.0, gap_step=2, copies=32, copy_bytes=4 * 2**20))
    found = next(f for f in d.findings if f.kind == "checkpoint_stall")
    assert found.evidence["metrics"]["copies_to_host_in_that_step"]["value"] == 32
    assert found.evidence["metrics"]["bytes_to_host_in_that_step"]["value"] == 32 * 4 * 2**20
    assert "32 device-to-host copies (128 MiB)" in found.recommendation and "async_save" in found.recommendation
    assert not any(f.kind == "host_work" for f in d.findings)
    # a gain equal to the periodic host work's without the copies (the same block, the same replay)
    plain = _host_work(_loop(tmp_path / "plain.json.gz", gap_us=40_000.0, gap_step=2))
    assert found.gain_alone_pct == pytest.approx(plain.gain_alone_pct, abs=0.2)
    # not a model's state: 32 copies of 4 KiB (an evaluation's outputs, metrics), 4 of 64 MiB, or as many every step
    for name, kw in (("small", dict(copies=32, copy_bytes=4096)), ("few", dict(copies=4, copy_bytes=64 * 2**20)),
                     ("every", dict(copies=32, copy_bytes=4 * 2**20, copies_every_step=True))):
        kinds = {f.kind for f in diagnose(_loop(tmp_path / f"{name}.json.gz", gap_us=40_000.0, gap_step=2,
                                                **kw)).findings}
        assert "host_work" in kinds and "checkpoint_stall" not in kinds, name


def test_host_work_after_the_last_launch_of_the_window_is_seen(tmp_path):
    # 30 ms with no op after the last launch of the window's last step (a checkpoint save whose Python frames the
    # trace lacks): the step ends 30 ms later, the GPU idle through it, so the window (5 steps, 130 ms) is 23 % host
    # work. Before, the replay closed the thread's chain at its last call and never saw it (the corpus's checkpoint
    # cases without Python stacks read launch_bound or small_kernels).
    found = _host_work(_loop(tmp_path / "tail.json.gz", tail_us=30_000.0))
    assert found is not None and found.evidence["metrics"]["steps_with_it"]["value"] == 1
    assert found.gain_alone_pct == pytest.approx(100 * 30 / 130, abs=0.5)
    # the calls' ids jump by 100 across it: events lost, not work
    assert _host_work(_loop(tmp_path / "lost.json.gz", tail_us=30_000.0, tail_lost=True)) is None


@pytest.mark.parametrize("ops, loop", [(["aten::mul"], "inference"),
                                       (["aten::mul", "autograd::engine::evaluate_function: MulBackward0"], "training"),
                                       (["aten::mul", "Optimizer.step#AdamW.step"], "training"),
                                       (["jit_train_step", "fusion.12"], "unknown")])
def test_what_the_loop_does_is_read_from_its_ops(tmp_path, ops, loop):
    # ATen ops with no backward node and no optimizer step: forward-only; no ATen op at all (an XLA program, a
    # profiler that records no autograd node): nothing tells
    from trainperf.diagnose.facts import collect_facts, loop_kind, window_ops
    from trainperf.diagnose.window import analysis_window
    from trainperf.trace.load import load_trace

    b = TraceBuilder()
    for i, name in enumerate(ops):
        b.cpu(name, 100.0 * i, 50.0)
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 10.0, 20.0, 5.0)
    t = load_trace(b.write(tmp_path / "t.json.gz"))[0]
    w = analysis_window(t)
    assert loop_kind(t, window_ops(t, w), collect_facts(t, w).optimizer) == loop


def test_host_work_after_a_call_added_with_an_id_of_its_own_is_read(tmp_path):
    # a blocking copy just before the 6-ms block, its call and copy given correlation ids from 10^6 on (written into
    # the trace afterwards, numbered past its largest id): the ids jump across the gap after it, but the launch after
    # the gap is in sequence with the call before the copy, so no events were lost there. The block is read, as
    # without the renumbering; ids that step by 73 throughout (a sampled trace) still hide it
    path = _loop(tmp_path / "t.json.gz", gap_us=6_000.0, copies=1)
    events = K.read_events(path)
    calls = {K.correlation(e) for e in events["traceEvents"] if e.get("name") == "cudaMemcpyAsync"}
    renumbered = {c: 1_000_000 + k for k, c in enumerate(sorted(calls))}
    for e in events["traceEvents"]:
        if K.correlation(e) in renumbered:
            e["args"]["correlation"] = renumbered[K.correlation(e)]
        if e.get("ph") in ("s", "f") and e.get("id") in renumbered:
            e["id"] = renumbered[e["id"]]
    found = _host_work(K.write_events(tmp_path / "added.json.gz", events))
    assert found is not None and found.evidence["events"][0]["dur_us"] == pytest.approx(6_000.0, abs=20.0)
    assert _host_work(_loop(tmp_path / "s.json.gz", gap_us=6_000.0, copies=1, sampled=True)) is None
