"""A step replayed from a CUDA graph: one cudaGraphLaunch starts every kernel, each carrying its correlation id.

Its kernels are not launched one by one, so neither the launches' cost (launch_bound) nor tiny kernels' launches
(small_kernels) can be its bottleneck, and recommending CUDA graphs would recommend what is done. The reference: the
same kernels launched one by one (its eager twin, built the same way), where those findings are what the trace shows."""

import sys
from pathlib import Path

from trainperf.corpus import kineto as K
from trainperf.diagnose.api import diagnose

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

KERNELS, KERNEL_US, STEPS = 200, 6.0, 6
OP_US = 15.0  # eager: the op's dispatch and its launch call, longer than the 6-us kernel it launches


def _decode(path: Path, graphed: bool) -> Path:
    """6 steps of a decode-like loop: 200 tiny kernels (6 us), then .item() reads the sampled token. graphed: one
    cudaGraphLaunch starts them all back to back; else one aten op and launch per kernel, the GPU waiting between."""
    b = TraceBuilder()
    t0 = 0.0
    for s in range(STEPS):
        at = t0 + 50.0
        if graphed:
            b.graph_launch(at, [(f"triton_poi_fused_add_{k % 7}", at + 20.0 + k * (KERNEL_US + 1.0), KERNEL_US)
                                for k in range(KERNELS)], launch_dur=15.0)
            host_at, gpu_end = at + 20.0, at + 20.0 + KERNELS * (KERNEL_US + 1.0)
        else:
            for k in range(KERNELS):
                b.cpu("aten::add", at, OP_US - 1.0)
                b.launch(f"void at::native::vectorized_elementwise_kernel<4, add_{k % 7}>", at + OP_US - 6.0,
                         at + OP_US, KERNEL_US, launch_dur=4.0)
                at += OP_US
            host_at, gpu_end = at, at + KERNEL_US
        # .item() on the sampled token: waits for the last kernel, then a 2-us read
        b.cpu("aten::item", host_at, gpu_end + 10.0 - host_at)
        b.launch("Memcpy DtoH (Device -> Pageable)", host_at + 2.0, gpu_end + 1.0, 2.0, cat="gpu_memcpy",
                 runtime="cudaMemcpyAsync", launch_dur=gpu_end + 6.0 - host_at)
        step = gpu_end + 60.0 - t0
        b.step(s, t0, step)
        t0 += step
    return b.write(path)


def _kinds(path: Path) -> list[str]:
    return [f.kind for f in diagnose(path).findings]


def test_a_graph_replayed_step_is_not_launch_bound_nor_small_kernels(tmp_path):
    kinds = _kinds(_decode(tmp_path / "graphed.json.gz", graphed=True))
    assert "small_kernels" not in kinds and "launch_bound" not in kinds


def test_its_eager_twin_is(tmp_path):
    found = diagnose(_decode(tmp_path / "eager.json.gz", graphed=False)).findings
    assert found and found[0].kind in ("launch_bound", "small_kernels")
    # a decode loop trains nothing: the fix is the inference one (CUDA graphs, batching), not fused optimizers
    assert "forward-only loop" in found[0].recommendation and "optimizer" not in found[0].recommendation


def test_a_forward_only_loop_gets_the_inference_fix_for_its_reads(tmp_path):
    # the graphed decode: its per-step .item() is the finding; nothing in the loop trains (no backward node, no
    # optimizer span), so the fix is to overlap the next step's host work, not to log every N steps. The same loop
    # with an optimizer step in each iteration is a training loop and keeps the training advice
    f = diagnose(_decode(tmp_path / "g.json.gz", graphed=True)).findings[0]
    assert f.kind == "host_sync" and "forward-only loop" in f.recommendation and "log losses" not in f.recommendation
    doc = K.read_events(_decode(tmp_path / "t.json.gz", graphed=True))
    steps = [e for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    doc["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 10,
                            "tid": 1, "ts": s["ts"] + 1.0, "dur": 5.0, "args": {}} for s in steps]
    f = diagnose(K.write_events(tmp_path / "train.json.gz", doc)).findings[0]
    assert f.kind == "host_sync" and "log losses" in f.recommendation
