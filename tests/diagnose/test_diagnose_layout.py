"""layout_transposes on hand-built A100 traces (answers worked by hand): cuDNN converting NCHW tensors to NHWC and
back around each convolution of a GPU-bound step."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import queued_steps, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import collect_facts  # noqa: E402
from trainperf.diagnose.layout import layout_transposes  # noqa: E402
from trainperf.diagnose.replay import Change  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

P, STEPS = 1500.0, 5
HOST_BOUND_STEP = 1000.0  # us: _host_bound_steps
TO_NHWC = "void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, (cudnnKernelDataType_t)0>(...)"
TO_NCHW = "void cudnn::ops::nhwcToNchwKernel<__half, __half, float, true, false, (cudnnKernelDataType_t)0>(...)"
CONV = "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1"


def _trace(folder: Path, transpose_us: float = 40.0, transposes: bool = True) -> Path:
    # each 1500-us step: 4 convolutions, each a 200-us NHWC kernel between two transposes of transpose_us (or none:
    # the model in channels_last), one 8-us aten::cudnn_convolution op per kernel launched 10 us apart from T, the
    # kernels back to back on the device from T+10; a cudaDeviceSynchronize from T+130 returns 5 us after the last
    # kernel; Python until 1 us before the next step
    conv = [("aten::cudnn_convolution", {}, TO_NHWC, transpose_us), ("aten::cudnn_convolution", {}, CONV, 200.0),
            ("aten::cudnn_convolution", {}, TO_NCHW, transpose_us)] if transposes else \
        [("aten::cudnn_convolution", {}, CONV, 200.0)]
    return queued_steps(folder, conv * 4, steps=STEPS, step_us=P, sync_at=130.0, device="NVIDIA A100-SXM4-80GB")


def _find(d):
    return next((f for f in d.findings if f.kind == "layout_transposes"), None)


def test_layout_transposes_around_convolutions_are_priced_as_neither_launched_nor_run(tmp_path):
    # 8 transposes of 40 us a step: 320 us of the 1500-us step (21.3 %), 320 of the 1120 us of kernels (28.6 %). Not
    # launched, the host's calls after the first transpose's 4-us launch call come 4 us sooner: the first convolution
    # is launched at T+8 and starts 8 us later (the trace's launch latency: the first kernel, launched at T+2, started
    # at T+10), the rest back to back: the device's step ends at T+816 instead of T+1130, the sync and the Python
    # after it following: 314 us, 20.9 % of the step
    d = diagnose(_trace(tmp_path))
    f = _find(d)
    assert f is not None and f.severity == "high"
    # 28.6 % of the kernel time, over memory_bound_unfused's bar of 25 %: they are elementwise kernels by name, but
    # no fusion removes them (a memory format does), so they are this finding's alone
    assert all(x.kind != "memory_bound_unfused" for x in d.findings)
    m = f.evidence["metrics"]
    assert m["layout_transposes"]["value"] == 8 * 4  # 4 steps in the window
    assert m["share_of_kernel_time"]["value"] == pytest.approx(100.0 * 320 / 1120, abs=0.01)
    assert f.gain_alone_pct == pytest.approx(100.0 * 314 / P, abs=0.05)
    assert f.evidence["events"][0]["name"] == f"{TO_NHWC} (16 calls, 0.6 ms)"
    assert "channels_last" in f.recommendation


def test_channels_last_or_few_transposes_are_no_finding(tmp_path):
    # in channels_last there is nothing to convert; 8 transposes of 5 us (40 of 1500 us, 2.7 %) are under the bar
    for name, kw in (("channels_last", {"transposes": False}), ("few", {"transpose_us": 5.0})):
        (tmp_path / name).mkdir()
        assert _find(diagnose(_trace(tmp_path / name, **kw))) is None, name


def _host_bound_steps(folder: Path, graphed: bool = False) -> Path:
    # each 1000-us step runs 4 convolutions as 12 kernels (a transpose of 12 us, the convolution's 30 us, a transpose
    # of 12 us), one 58-us aten::cudnn_convolution op every 60 us from T. Eager: 12 ops, each launching one kernel by
    # a 30-us cudaLaunchKernel 2 us into it, the kernel running 8 us after the call began; graphed: 4 ops, each
    # launching its convolution's three kernels by one 30-us cudaGraphLaunch 2 us into it, back to back from 8 us
    # after the call began (the device idles either way). A 5-us cudaDeviceSynchronize 2 us after the last op's slot
    # (the device is done), then Python until 1 us before the next step
    b = TraceBuilder()
    kernels = ((TO_NHWC, 12.0), (CONV, 30.0), (TO_NCHW, 12.0))
    for s in range(STEPS):
        T = s * HOST_BOUND_STEP
        b.step(s, T, HOST_BOUND_STEP)
        at = T
        for k in range(4 if graphed else 12):
            b.cpu("aten::cudnn_convolution", at, 58.0)
            if graphed:
                b.graph_launch(at + 2.0, [(n, at + 10.0 + sum(u for _, u in kernels[:i]), us)
                                          for i, (n, us) in enumerate(kernels)], launch_dur=30.0)
            else:
                kernel, us = kernels[k % 3]
                b.launch(kernel, at + 2.0, at + 10.0, us, launch_dur=30.0)
            at += 60.0
        b.cpu("cudaDeviceSynchronize", at + 2.0, 5.0, cat="cuda_runtime")
        b.cpu("python_work", at + 10.0, T + HOST_BOUND_STEP - at - 11.0)
    return write_trace(b, folder, device="NVIDIA A100-SXM4-80GB")


def test_on_a_host_bound_step_the_transposes_launches_are_what_goes(tmp_path):
    # the eager host-bound step (_host_bound_steps): each kernel runs 8 us after its launch call began, the sync at
    # T+722. The 8 transposes' kernels take 96 us the device did not need, but their 8 launch calls take 240 us of the
    # host's: not launched, every later call comes that much sooner, and the step's end with them: 240 us, 24 % of it
    step = HOST_BOUND_STEP
    path = _host_bound_steps(tmp_path)
    t = read_kineto(path)
    facts = collect_facts(t, analysis_window(t))
    x = layout_transposes(facts)
    assert x is not None and x.changes[0].kind == "remove_kernels"
    assert facts.gain(x.changes)[0] == pytest.approx(100.0 * 240 / step, abs=0.1)
    # not run but still launched (drop_rows), they cost the host's step as much as before
    assert facts.gain((Change("drop_rows", rows=x.changes[0].rows),))[0] == pytest.approx(0.0, abs=0.1)
    # measured, the fix is priced before launch_bound's bound (a CUDA graph of the whole step, which would take every
    # launch's cost, these included, and leave them ~0: dismissed, before the order of fixes put bounds last)
    d = diagnose(path)
    assert d.findings[0].kind == "layout_transposes" and d.findings[0].gain_pct == pytest.approx(24.0, abs=0.1)
    # the graph then takes the other 4 launches' 120 us and the gaps' dispatch: 38.4 % alone, 14.4 after
    graphs = next(f for f in d.findings if f.kind == "launch_bound")
    assert graphs.gain_pct == pytest.approx(graphs.gain_alone_pct - 24.0, abs=0.1)


def test_replayed_from_a_cuda_graph_the_transposes_take_no_launch_with_them(tmp_path):
    # the host-bound step graphed (_host_bound_steps). Not run, the transposes leave the graph launches, which still
    # start the convolution: the host's step as long as before, the device idle sooner: no gain. (Removing every
    # call that launched a removed kernel took the graph launches' own time: 11.4 % of the step.)
    t = read_kineto(_host_bound_steps(tmp_path, graphed=True))
    facts = collect_facts(t, analysis_window(t))
    transposes = tuple(int(r) for r in facts.window.device if t.names[int(t.name[r])] in (TO_NHWC, TO_NCHW))
    assert len(transposes) == 8 * len(facts.steps)
    for kind in ("remove_kernels", "fuse_kernels"):
        assert facts.gain((Change(kind, rows=transposes),))[0] == pytest.approx(0.0, abs=0.1), kind
