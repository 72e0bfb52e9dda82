"""ddp_buffer_broadcast, ddp_gradient_copies and ddp_unused_parameter_search: on a hand-built host-bound DDP step
(answers worked by hand) and on HTA's real A100 ResNet-50 rank (counts checked against the model's own buffers and
parameters)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

P, STEPS = 2000.0, 5
HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"
DTOD = "Memcpy DtoD (Device -> Device)"


def _copy(b: TraceBuilder, at: float, dur: float = 50.0) -> None:
    """An aten::copy_ of `dur` us whose cudaMemcpyAsync (4 us, 10 us before its end) copies for 5 us on the device."""
    b.cpu("aten::copy_", at, dur)
    b.launch(DTOD, at + dur - 10.0, at + dur - 2.0, 5.0, cat="gpu_memcpy", runtime="cudaMemcpyAsync")


def _ddp_trace(path: Path, *, buffers: bool = True, gradient_copies: int = 3, search_us: float = 0.0) -> Path:
    # each 2000-us step at T: DDP's forward span [T, T+1000): with buffers, its buffer sync first (flatten 50 us with a
    # 5-us cat kernel, a broadcast 30 us with a 20-us NCCL kernel, unflatten 20 us, 4 copies of 50 us: [T, T+300)),
    # then the module's 7 aten::mm of 100 us (a 20-us kernel each) from T+300; without, the mm ops alone from T+300.
    # With search_us, the forward's last search_us are the reducer's search for unused parameters (the last mm ops
    # end sooner). Then `gradient_copies` copy_bucket_to_grad spans of 50 us from T+1000, each holding one copy;
    # Python until 1 us before the next step. The device is idle most of the step: the host sets the pace
    b = TraceBuilder(world_size=2)
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("DistributedDataParallel.forward", T, 1000.0, cat="user_annotation")
        b.cpu("DistributedDataParallel.forward", T, 1000.0)
        if buffers:
            b.cpu("aten::flatten_dense_tensors", T, 50.0)
            b.launch("void at::native::CatArrayBatchedCopy<float>(...)", T + 40.0, T + 48.0, 5.0)
            b.cpu("c10d::broadcast_", T + 50.0, 30.0)
            b.launch("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", T + 60.0, T + 68.0,
                     20.0)
            b.cpu("aten::unflatten_dense_tensors", T + 80.0, 20.0)
            for k in range(4):
                _copy(b, T + 100.0 + 50.0 * k)
        mm_us = (700.0 - search_us) / 7
        for k in range(7):
            at = T + 300.0 + mm_us * k
            b.cpu("aten::mm", at, mm_us)
            b.launch("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32", at + mm_us - 10.0,
                     at + mm_us - 2.0, 20.0)
        if search_us:
            b.cpu("torch.distributed.ddp.reducer::search_unused_parameters", T + 1000.0 - search_us, search_us)
        for k in range(gradient_copies):
            at = T + 1000.0 + 50.0 * k
            b.cpu("torch.distributed.ddp.reducer::copy_bucket_to_grad", at, 50.0)
            _copy(b, at)
        end = T + 1000.0 + 50.0 * gradient_copies
        b.cpu("python_work", end, P - (end - T) - 1.0)
    return b.write(path)


def _find(d, kind):
    return next((f for f in d.findings if f.kind == kind), None)


def test_ddp_buffer_broadcast_and_gradient_copies_are_priced_as_not_run(tmp_path):
    # host-bound: each step is its host's 2000 us. Without the buffer sync the host's calls from the module's first
    # mm on come 300 us sooner (the sync's [T, T+300): its ops, its calls and the gaps between them): 300 of 2000 us,
    # 15 %; without the 3 gradient copies, 150 us: 7.5 %. Priced in that order (largest first), the second adds its
    # 150 us to the first's 300
    d = diagnose(_ddp_trace(tmp_path / "rank0.json.gz"))
    broadcast, copies = _find(d, "ddp_buffer_broadcast"), _find(d, "ddp_gradient_copies")
    assert broadcast is not None and copies is not None
    assert broadcast.gain_pct == pytest.approx(15.0, abs=0.1) and broadcast.severity == "high"
    assert copies.gain_pct == pytest.approx(7.5, abs=0.1) and copies.severity == "medium"
    # priced first (measured); ranked after the host's work that launches nothing, a bound of 40.7 % after them, whose
    # half (findings.BOUND_REALISED_SHARE) is more than the broadcast's 15 %
    assert broadcast.fix_order == 1 and [f.kind for f in d.findings[:2]] == ["host_work", "ddp_buffer_broadcast"]
    m = broadcast.evidence["metrics"]
    # the last profiler step is left out of the window (as HTA): 4 forwards, 4 buffer copies and 1 broadcast each
    assert (m["forwards_broadcasting"]["value"], m["buffer_copies"]["value"], m["broadcasts"]["value"]) == (4, 16, 4)
    assert m["their_time"]["value"] == pytest.approx(4 * 300.0)
    assert copies.evidence["metrics"]["spans"]["value"] == 12
    assert "broadcast_buffers=False" in broadcast.recommendation
    assert "gradient_as_bucket_view=True" in copies.recommendation


def test_ddp_searching_for_unused_parameters_is_priced_as_not_searching(tmp_path):
    # a 100-us search closing each forward: 100 of the host-bound 2000-us step, 5 %, after the buffer sync (15 %) and
    # the gradient copies (7.5 %), which it does not overlap
    d = diagnose(_ddp_trace(tmp_path / "rank0.json.gz", search_us=100.0))
    search = _find(d, "ddp_unused_parameter_search")
    assert search is not None and search.gain_pct == pytest.approx(5.0, abs=0.1) and search.severity == "medium"
    assert search.evidence["metrics"]["per_step"]["value"] == 1
    assert "find_unused_parameters=False" in search.recommendation and "static_graph=True" in search.recommendation
    assert _find(d, "ddp_buffer_broadcast").gain_pct == pytest.approx(15.0, abs=0.1)


def test_ddp_without_buffers_or_with_gradient_views_has_neither_finding(tmp_path):
    # broadcast_buffers=False: the forward span holds the module's operators only; gradient_as_bucket_view=True: the
    # reducer records no copy_bucket_to_grad
    d = diagnose(_ddp_trace(tmp_path / "rank0.json.gz", buffers=False, gradient_copies=0))
    assert not {"ddp_buffer_broadcast", "ddp_gradient_copies"} & {f.kind for f in d.findings}


def test_a_copy_of_the_module_after_its_first_operator_is_not_the_buffer_sync(tmp_path):
    # the same forward with the module's own aten::copy_ ops between its mm ops: no broadcast among them, no sync
    b = TraceBuilder(world_size=2)
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("DistributedDataParallel.forward", T, 1000.0)
        for k in range(5):
            at = T + 100.0 + 150.0 * k
            b.cpu("aten::mm", at, 100.0)
            b.launch("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32", at + 90.0, at + 98.0, 20.0)
            _copy(b, at + 100.0)
        b.cpu("python_work", T + 1000.0, P - 1001.0)
    d = diagnose(b.write(tmp_path / "rank0.json.gz"))
    assert _find(d, "ddp_buffer_broadcast") is None


@pytest.mark.skipif(not (HTA / "nccl_parser_config").is_dir(), reason="needs ../shared/data/traces/hta")
def test_resnet50_ddp_rank_broadcasts_its_batch_norm_buffers_and_copies_every_gradient():
    # HTA's A100 rank of a DDP ResNet-50: 53 BatchNorm layers of 3 buffers each (running mean, running variance,
    # batches seen) are copied back after each forward's broadcast: 159 a forward; its 161 parameter tensors (53
    # convolution weights, 53 x 2 BatchNorm affine, the classifier's weight and bias) are copied out of their buckets
    # every step. The host sets the pace: the sync is the largest single item of its 222-ms step
    d = diagnose(HTA / "nccl_parser_config")
    broadcast, copies = _find(d, "ddp_buffer_broadcast"), _find(d, "ddp_gradient_copies")
    m = broadcast.evidence["metrics"]
    assert m["buffer_copies"]["value"] == 159 * m["forwards_broadcasting"]["value"]
    assert copies.evidence["metrics"]["per_step"]["value"] == 161
    assert _find(d, "ddp_unused_parameter_search") is None  # find_unused_parameters=False: no search recorded
    assert d.findings[0] is broadcast and broadcast.severity == "high"


def _host_only_rank(folder: Path, rank: int, broadcast_us: float) -> Path:
    # a CPU job (gloo, no GPU events): each 2000-us step's DDP forward opens with its buffer sync, flatten 50 us, the
    # broadcast `broadcast_us` (the wait for the other rank inside it), unflatten 20 us, 4 copies of 50 us; then the
    # module's work and Python until the next step
    b = TraceBuilder(rank=rank, world_size=2)
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("DistributedDataParallel.forward", T, 1500.0)
        b.cpu("aten::flatten_dense_tensors", T, 50.0)
        b.cpu("c10d::broadcast_", T + 50.0, broadcast_us)
        at = T + 50.0 + broadcast_us
        b.cpu("aten::unflatten_dense_tensors", at, 20.0)
        for k in range(4):
            b.cpu("aten::copy_", at + 20.0 + 50.0 * k, 50.0)
        b.cpu("aten::mm", at + 220.0, T + 1500.0 - at - 220.0)
        b.cpu("python_work", T + 1500.0, P - 1501.0)
    return b.write(folder / f"rank{rank}.json.gz")


def test_a_cpu_jobs_buffer_sync_is_priced_at_the_rank_that_waited_least(tmp_path):
    # rank 0's broadcast waits 450 us for rank 1 (500 us against 50): its sync holds 770 us a step, rank 1's 320, the
    # sync's own cost (the other 450 us rank 0 would wait at the next collective). Priced at 320 of 2000 us: 16 %.
    # One rank's trace alone cannot tell its wait from the transfer: its operators only, 270 us, 13.5 %
    _host_only_rank(tmp_path, 0, 500.0)
    _host_only_rank(tmp_path, 1, 50.0)
    job = _find(diagnose(tmp_path), "ddp_buffer_broadcast")
    assert job.gain_pct == pytest.approx(16.0, abs=0.05) and job.ranks == [0, 1]
    alone = _find(diagnose(tmp_path / "rank0.json.gz"), "ddp_buffer_broadcast")
    assert alone.gain_pct == pytest.approx(13.5, abs=0.05)


def test_a_removed_broadcast_keeps_its_measured_wait_for_a_late_rank(tmp_path):
    # the hand-built step's broadcast kernels (20 us each) given a measured 15-us wait for another rank: removing the
    # buffer sync takes the copies and the cat off the device and the broadcast's transfer, not its wait (the late
    # rank arrives no sooner; the next collective would wait for it instead)
    from trainperf.diagnose.ddp import buffer_broadcasts
    from trainperf.diagnose.replay import Change, build_graph, replay
    from trainperf.diagnose.window import analysis_window
    from trainperf.trace.load import load_trace

    t = load_trace(_ddp_trace(tmp_path / "rank0.json.gz"))[0]
    w = analysis_window(t)
    broadcasts = [int(r) for r in w.device if "Broadcast" in t.name_of(int(r))]
    g = build_graph(t, w, {r: (15.0, 1) for r in broadcasts})
    spans = tuple((int(t.tid[x[0]]), float(w.ts_us[x].min()), float(w.end_us[x].max()))
                  for x in buffer_broadcasts(t, w))
    r = replay(g, Change("remove_spans", spans=spans))
    dur = dict(zip(g.rows.tolist(), (r.end - r.start).tolist()))
    assert broadcasts and all(dur[b] == pytest.approx(15.0) for b in broadcasts)
    copies = sorted(dur[int(x)] for x in w.device if "DtoD" in t.name_of(int(x)))
    assert copies == [0.0] * 16 + [5.0] * 12  # the 4 analysed forwards' buffer copies gone, the gradient copies kept
