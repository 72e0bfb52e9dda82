"""Per-operator roofline: minimum bytes of reductions, norm statistics and comparisons worked by hand, and
the roofline of a trace without device events (a CPU run) from real torch.profiler traces."""

import pytest

from trainperf.diagnose.roofline import op_cost, roofline
from trainperf.trace import read_kineto

F32 = "float"


def test_reduction_output_written_by_hand():
    # sum over the last dim of fp32 [32, 512], kept: read 32*512*4 B, write 32 floats
    c = op_cost("aten::sum", [[32, 512], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""])
    assert c.bytes == 32 * 512 * 4 + 32 * 4
    # over dim 0: 512 floats written
    c = op_cost("aten::sum", [[32, 512], [], [], []], [F32, "ScalarList", "Scalar", ""], ["", "[0]", "True", ""])
    assert c.bytes == 32 * 512 * 4 + 512 * 4
    # no dim list (sum(x) / amax(x, dim=[])): one element
    assert op_cost("aten::sum", [[32, 512], []], [F32, "Scalar"], ["", ""]).bytes == 32 * 512 * 4 + 4
    assert op_cost("aten::amax", [[8, 16], [], []], [F32, "ScalarList", "Scalar"], ["", "[]", "False"]).bytes \
        == 8 * 16 * 4 + 4
    # norm(x, p, dim): the dim list is the third input
    assert op_cost("aten::norm", [[8, 16], [], [], []], [F32, "Scalar", "ScalarList", "Scalar"],
                   ["", "2", "[1]", "False"]).bytes == 8 * 16 * 4 + 8 * 4
    # CPU's mean runs sum(x, [-1], True, out=buf): buf [32, 1] is written, not read
    c = op_cost("aten::sum", [[32, 512], [], [], [], [32, 1]], [F32, "ScalarList", "Scalar", "Scalar", F32],
                ["", "[-1]", "True", "6", ""])
    assert c.bytes == 32 * 512 * 4 + 32 * 4


def test_norm_statistics_and_bias_by_hand():
    # native_layer_norm bf16 [8, 1024] over [1024]: read x, weight, bias; write y, and 8 rows x (mean, rstd) fp32
    bf = "c10::BFloat16"
    c = op_cost("aten::native_layer_norm", [[8, 1024], [], [1024], [1024], []], [bf, "ScalarList", bf, bf, "Scalar"],
                ["", "[1024]", "", "", "1e-05"])
    assert c.bytes == 8 * 1024 * 2 * 2 + 2 * 1024 * 2 + 2 * 8 * 4
    # normalised over the last two dims [4, 256]: still 8 rows of statistics
    c = op_cost("aten::native_layer_norm", [[8, 4, 256], [], [], [], []], [F32, "ScalarList", "", "", "Scalar"],
                ["", "[4, 256]", "", "", "1e-05"])
    assert c.bytes == 2 * 8 * 1024 * 4 + 2 * 8 * 4
    # _fused_rms_norm fp32 [32, 512]: read x and weight, write y and one rstd per row
    c = op_cost("aten::_fused_rms_norm", [[32, 512], [], [512], []], [F32, "ScalarList", F32, "Scalar"],
                ["", "[512]", "", ""])
    assert c.bytes == 2 * 32 * 512 * 4 + 512 * 4 + 32 * 4
    # native_layer_norm_backward fp32 [32, 512]: read dy, x, mean, rstd, weight (bias only names dbias' shape);
    # write dx, dweight, dbias
    n, rows, cols = 32 * 512, 32, 512
    c = op_cost("aten::native_layer_norm_backward", [[32, 512], [32, 512], [], [32, 1], [32, 1], [512], [512], []],
                [F32, F32, "ScalarList", F32, F32, F32, F32, "ScalarList"])
    assert c.bytes == 4 * (2 * n + 2 * rows + cols) + 4 * (n + 2 * cols)


def test_comparison_writes_bool():
    # target != -100 over 32 int64 ids: read 32 x 8 B, write 32 bools
    assert op_cost("aten::ne", [[32], []], ["long int", "Scalar"], ["", "-100"]).bytes == 32 * 8 + 32


def _profile(tmp_path, fn, calls=3):
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn(torch)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(calls):
            fn(torch)
    p.export_chrome_trace(str(tmp_path / "cpu.json"))
    return read_kineto(tmp_path / "cpu.json")


def test_cpu_trace_counts_each_operator_that_did_the_work_once(tmp_path):
    # A real CPU profile (no device events): linear dispatches to addmm (counted once, as addmm, like on a GPU);
    # mean runs sum(out=) and div_ (they are counted, mean is not); x + 1.5 wraps the scalar in a 0-dim tensor
    # copied inside add (add is counted with its whole span, the tiny copy not); softmax runs _softmax.
    a, w, b = (None,) * 3

    def step(torch):
        nonlocal a, w, b
        if a is None:
            a, w, b = torch.randn(16, 64), torch.randn(32, 64), torch.randn(32)
        torch.nn.functional.linear(a, w, b)
        a.mean(-1, keepdim=True)
        a + 1.5
        torch.softmax(a, -1)

    t = _profile(tmp_path, step)
    rows = {r.op: r for r in roofline(t)}
    assert "aten::linear" not in rows and "aten::mean" not in rows and "aten::copy_" not in rows
    assert rows["aten::addmm"].count == 3 and rows["aten::addmm"].flops == 2 * 16 * 64 * 32
    assert rows["aten::addmm"].bytes == 4 * (32 + 16 * 64 + 64 * 32 + 16 * 32)  # bias, a, w read; out written
    assert rows["aten::sum"].bytes == 4 * (16 * 64 + 16)  # mean's sum: read a, write 16 means
    assert rows["aten::add"].bytes == 4 * (16 * 64 + 16 * 64) + 8  # a and the 0-dim double read, out written
    assert rows["aten::_softmax"].bytes == 4 * 2 * 16 * 64
    # each counted operator's time is its own host span (µs), so the rows add up to no more than the ops' spans
    ops = [i for i in range(len(t)) if t.names[int(t.name[i])] == "aten::_softmax"]
    assert rows["aten::_softmax"].time_us == pytest.approx(sum(t.dur_ns[i] for i in ops) / 1e3)


def test_same_shapes_reducing_other_dims_are_separate_rows(tmp_path):
    # sum over dim 0 and over dim 1 of the same [32, 512]: 512 and 32 floats written, two rows
    x = None

    def step(torch):
        nonlocal x
        x = torch.randn(32, 512) if x is None else x
        x.sum(0, keepdim=True)
        x.sum(1, keepdim=True)

    sums = sorted(r.bytes for r in roofline(_profile(tmp_path, step)) if r.op == "aten::sum")
    assert sums == [4 * (32 * 512 + 32), 4 * (32 * 512 + 512)]


def test_roofline_verb_on_a_cpu_trace(tmp_path):
    # `trainperf roofline` on a CPU profile: rows with achieved rates (GB/s are millionths of a TB/s: the JSON keeps
    # 6 significant digits, not 4 decimals that would print 0) and no bound without a known device
    import json

    from typer.testing import CliRunner

    from trainperf.cli import app

    x = None

    def step(torch):
        nonlocal x
        x = torch.randn(64, 1024) if x is None else x
        torch.softmax(x, -1)

    t = _profile(tmp_path, step)
    r = CliRunner().invoke(app, ["roofline", str(tmp_path / "cpu.json"), "--json"])
    assert r.exit_code == 0, r.output
    row = next(w for w in json.loads(r.output)["ranks"]["0"]["rows"] if w["op"] == "aten::_softmax")
    ops = [i for i in range(len(t)) if t.names[int(t.name[i])] == "aten::_softmax"]
    us = sum(t.dur_ns[i] for i in ops) / 1e3
    assert row["bytes"] == 2 * 64 * 1024 * 4 and row["count"] == 3
    tbps = 3 * 2 * 64 * 1024 * 4 / (us * 1e6)  # bytes of 3 calls over their host spans
    assert row["achieved_tbps"] > 0 and row["achieved_tbps"] == pytest.approx(tbps, rel=1e-5)
    assert row["bound"] == "" and row["roofline_pct"] is None


def test_gpu_run_without_its_device_events_gives_no_host_rows(tmp_path):
    # The same softmax op (a real shape record) in a trace of a GPU run profiled without the CUDA activity: its
    # host span timed a launch, not the work, so no rows - whether the run shows by a device in deviceProperties
    # or by its runtime calls; with neither (a CPU run) the op is a row
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
    from kineto_builder import TraceBuilder

    def trace(props, runtime):
        b = TraceBuilder()
        b.cpu("aten::_softmax", 0, 30, **{"Input Dims": [[64, 1024], [], []], "Input type": [F32, "Scalar", "Scalar"],
                                          "Concrete Inputs": ["", "-1", "False"]})
        if runtime:
            b.cpu("cudaLaunchKernel", 5, 4, cat="cuda_runtime", correlation=1)
        doc = b.doc()
        doc["deviceProperties"] = props
        p = tmp_path / f"t{len(props)}{int(runtime)}.json"
        p.write_text(json.dumps(doc))
        return roofline(read_kineto(p))

    assert trace([{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], False) == []
    assert trace([], True) == []
    rows = trace([], False)
    assert [(r.op, r.bytes, r.time_us) for r in rows] == [("aten::_softmax", 2 * 64 * 1024 * 4, 30.0)]
