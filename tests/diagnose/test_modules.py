"""Time per nn.Module (diagnose/modules.py).

References: a real trace recorded here by torch.profiler (with_stack=True) on a small nn.Sequential,
checked against the profiler's own event tree (`kineto_results.experimental_event_tree()`: the
nesting PyTorch built from its call records, not from the JSON timestamps); and a GPU trace built by
hand (tests/trace/kineto_builder.py) whose kernel times are summed by hand.
"""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.modules import BACKWARD, OUTSIDE, module_breakdown  # noqa: E402
from trainperf.trace.kineto import read_kineto  # noqa: E402

ACTIVE_STEPS = 2


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """(trace path, profiler event tree) of 2 profiled steps (after 1 warm-up) of forward + backward."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(32, 32), nn.ReLU()

        def forward(self, x):
            return self.act(self.fc(x))

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(32, 4))
    x = torch.randn(16, 32)
    path = tmp_path_factory.mktemp("modules") / "trace.json"
    got = {}

    def ready(p):
        p.export_chrome_trace(str(path))
        got["tree"] = p.profiler.kineto_results.experimental_event_tree()

    with profile(activities=[ProfilerActivity.CPU], with_stack=True, on_trace_ready=ready,
                 schedule=schedule(wait=0, warmup=1, active=ACTIVE_STEPS, repeat=1)) as p:
        for _ in range(1 + ACTIVE_STEPS):
            model(x).sum().backward()
            p.step()
    return path, got["tree"]


def _reference(tree) -> dict[str, float]:
    """µs per step of the top-level operators (no operator among their ancestors; record_function user
    annotations such as ProfilerStep are not operators) by their nearest module chain, from the
    profiler's own tree; backward nodes under BACKWARD, the rest under OUTSIDE."""
    from torch._C._profiler import RecordScope, _EventType

    out: dict[str, float] = {}

    def is_op(e):
        return e.typed[0] == _EventType.TorchOp and e.typed[1].scope != RecordScope.USER_SCOPE

    def walk(e, modules, in_op):
        if e.typed[0] == _EventType.PyCall and e.typed[1].module is not None:
            modules = modules + [e.name.removeprefix("nn.Module: ")]
        if is_op(e) and not in_op:
            key = "/".join(modules) if modules else (
                BACKWARD if e.name.startswith("autograd::engine::evaluate_function:") else OUTSIDE)
            out[key] = out.get(key, 0.0) + e.duration_time_ns / 1e3 / ACTIVE_STEPS
            in_op = True
        for c in e.children:
            walk(c, modules, in_op)

    for root in tree:
        walk(root, [], False)
    return out


def test_cpu_op_time_per_module_matches_the_profilers_tree(cpu_trace):
    path, tree = cpu_trace
    ref = _reference(tree)
    b = module_breakdown(read_kineto(path), by="instance")
    assert b.basis == "cpu_op" and b.steps == ACTIVE_STEPS
    rows = {r.path: r for r in b.rows}
    leaves = {"Sequential_0/Block_0/Linear_0", "Sequential_0/Block_0/ReLU_0", "Sequential_0/Block_1/Linear_1",
              "Sequential_0/Block_1/ReLU_1", "Sequential_0/Linear_2"}
    assert leaves | {BACKWARD} <= set(ref) and set(ref) <= set(rows)
    for p, us in ref.items():  # the JSON stores ns as µs with 3 decimals: ~1 ns per operator
        assert rows[p].exclusive_us_per_step == pytest.approx(us, abs=0.01 * 20), p
    for p in leaves:
        assert rows[p].calls_per_step == 1
    # inclusive = own + children's, up the tree; the five rows of the model cover its whole forward
    assert rows["Sequential_0/Block_0"].inclusive_us_per_step == pytest.approx(
        rows["Sequential_0/Block_0/Linear_0"].inclusive_us_per_step + rows["Sequential_0/Block_0/ReLU_0"]
        .inclusive_us_per_step + rows["Sequential_0/Block_0"].exclusive_us_per_step)
    assert rows["Sequential_0"].inclusive_us_per_step == pytest.approx(sum(ref.get(p, 0) for p in ref
                                                                           if p.startswith("Sequential_0")), abs=0.5)
    assert b.total_us_per_step == pytest.approx(sum(ref.values()), abs=0.5)
    # merged by type: the two blocks' Linear share one row with 2 calls per step
    t = {r.path: r for r in module_breakdown(read_kineto(path), by="type").rows}
    assert t["Sequential/Block/Linear"].calls_per_step == 2
    assert t["Sequential/Block/Linear"].exclusive_us_per_step == pytest.approx(
        rows["Sequential_0/Block_0/Linear_0"].exclusive_us_per_step
        + rows["Sequential_0/Block_1/Linear_1"].exclusive_us_per_step)


def _gpu_trace(path: Path) -> Path:
    """Two steps of 1000 µs. Forward on thread 1: Model_0 [t+10, t+200) holds Linear_0 [t+20, t+80)
    (a 100 µs GEMM), Linear_1 [t+90, t+150) (a 40 µs GEMM, and inside it a 10 µs bias kernel) and, after
    Linear_1 closed, a 5 µs kernel of Model_0 itself; backward on thread 2 (an autograd node launching a
    200 µs kernel); the optimizer's 30 µs kernel outside any module. By hand, per step: Model_0 inclusive
    155, exclusive 5; Linear_0 100; Linear_1 50; backward 200; outside 30; total 385."""
    b = TraceBuilder()
    for s in range(2):
        t = 1000.0 * s
        b.step(s, t, 1000)
        b.cpu("nn.Module: Model_0", t + 10, 190, cat="python_function")
        b.cpu("nn.Module: Linear_0", t + 20, 60, cat="python_function")
        b.cpu("nn.Module: Linear_1", t + 90, 60, cat="python_function")
        b.cpu("aten::addmm", t + 21, 50)
        b.launch("sm90_xmma_gemm_bf16", t + 25, t + 30, 100)
        b.launch("sm90_xmma_gemm_bf16", t + 95, t + 200, 40)
        b.launch("vectorized_elementwise_kernel_add", t + 100, t + 240, 10)
        b.launch("vectorized_elementwise_kernel_mul", t + 160, t + 250, 5)
        b.cpu("autograd::engine::evaluate_function: MmBackward0", t + 300, 100, tid=2)
        c = b.launch("sm90_xmma_gemm_bf16_dgrad", t + 310, t + 400, 200)
        b.events[-2]["tid"] = 2  # the backward launch runs on the autograd thread
        assert b.events[-2]["args"]["correlation"] == c
        b.cpu("Optimizer.step#SGD.step", t + 700, 100, cat="user_annotation")
        b.launch("multi_tensor_apply_kernel", t + 710, t + 720, 30)
    return b.write(path)


def test_gpu_time_per_module_by_hand(tmp_path):
    b = module_breakdown(read_kineto(_gpu_trace(tmp_path / "gpu.json")), by="instance")
    assert b.basis == "gpu" and b.steps == 2 and b.total_us_per_step == pytest.approx(385)
    rows = {r.path: r for r in b.rows}
    assert set(rows) == {"Model_0", "Model_0/Linear_0", "Model_0/Linear_1", BACKWARD, OUTSIDE}
    m, l0, l1 = rows["Model_0"], rows["Model_0/Linear_0"], rows["Model_0/Linear_1"]
    assert (m.inclusive_us_per_step, m.exclusive_us_per_step, m.events_per_step) == (155, 5, 4)
    assert (l0.inclusive_us_per_step, l0.exclusive_us_per_step, l0.depth) == (100, 100, 2)
    assert (l1.inclusive_us_per_step, l1.events_per_step, l1.calls_per_step) == (50, 2, 1)
    assert rows[BACKWARD].inclusive_us_per_step == 200 and rows[OUTSIDE].inclusive_us_per_step == 30
    assert m.pct_of_step == pytest.approx(100 * 155 / 385)
    assert b.attributed_pct == pytest.approx(100 * 155 / 385)
    assert any("backward" in n for n in b.notes)
    # by type the two Linear instances share a row (here through the by-path entry point)
    from trainperf.diagnose.modules import modules_for_trace

    t = {r.path: r for r in modules_for_trace(tmp_path / "gpu.json")[0].rows}
    assert t["Model/Linear"].inclusive_us_per_step == 150 and t["Model/Linear"].calls_per_step == 2


def test_diagnose_modules_json_and_html(tmp_path):
    from trainperf.cli import app

    trace = _gpu_trace(tmp_path / "gpu.json")
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["diagnose", str(trace), "--modules", "--json", "--html", str(html)])
    assert res.exit_code == 0, res.output
    rows = {r["module"]: r for r in json.loads(res.output)["modules"]}
    assert rows["Model/Linear"]["inclusive_us_per_step"] == 150 and rows["Model"]["basis"] == "gpu"
    assert "time per nn.Module" in html.read_text()
    res = CliRunner().invoke(app, ["diagnose", str(trace), "--modules"])
    assert res.exit_code == 0 and "backward (unattributed)" in res.output and "GPU time" in res.output


def test_no_module_spans_says_how_to_record_them(tmp_path):
    from trainperf.diagnose.api import diagnose

    b = TraceBuilder()
    b.step(0, 0, 100)
    b.launch("sm90_xmma_gemm_bf16", 5, 10, 50)
    path = b.write(tmp_path / "t.json")
    m = module_breakdown(read_kineto(path))
    assert [r.path for r in m.rows] == [OUTSIDE] and any("with_stack=True" in n for n in m.notes)
    assert "modules" not in diagnose(path).to_json()  # only when asked for


def test_a_span_overlapping_its_neighbours_end_stays_in_its_parent(tmp_path):
    # Outer_0 [0, 100) holds Inner_0 [10, 50) and Other_0 [40, 80), which outlasts Inner_0 (clock skew):
    # Other_0 is not nested in Inner_0, but still in Outer_0; its 7 µs kernel is Outer_0/Other_0's
    b = TraceBuilder()
    b.step(0, 0, 200)
    for name, ts, dur in (("Outer_0", 0, 100), ("Inner_0", 10, 40), ("Other_0", 40, 40)):
        b.cpu(f"nn.Module: {name}", ts, dur, cat="python_function")
    b.launch("sm90_xmma_gemm_bf16", 60, 120, 7)
    rows = {r.path: r for r in module_breakdown(read_kineto(b.write(tmp_path / "t.json")), by="instance").rows}
    assert rows["Outer_0/Other_0"].exclusive_us_per_step == 7 and rows["Outer_0"].inclusive_us_per_step == 7
    assert rows["Outer_0/Inner_0"].inclusive_us_per_step == 0
