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


def _reference(tree) -> tuple[dict[str, float], dict[str, float], dict[str, set]]:
    """(forward µs per step, backward µs per step, backward node classes) by module chain, from the profiler's
    own tree: forward, the top-level operators (no operator among their ancestors; record_function user
    annotations such as ProfilerStep are not operators) by their nearest module chain; backward, each top-level
    autograd node by the module chain of the forward operator with its `sequence_number` (the last to start of
    those sharing it, outside any node), OUTSIDE when that op ran outside every module, BACKWARD when none."""
    from torch._C._profiler import RecordScope, _EventType

    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    classes: dict[str, set] = {}
    seq_chain: dict[int, tuple[int, list]] = {}
    nodes: list = []

    def is_op(e):
        return e.typed[0] == _EventType.TorchOp and e.typed[1].scope != RecordScope.USER_SCOPE

    def walk(e, modules, in_op, in_node):
        if e.typed[0] == _EventType.PyCall and e.typed[1].module is not None:
            modules = modules + [e.name.removeprefix("nn.Module: ")]
        node = is_op(e) and e.name.startswith("autograd::engine::evaluate_function:")
        if is_op(e) and not in_node and not node and e.typed[1].sequence_number >= 0:
            if e.start_time_ns >= seq_chain.get(e.typed[1].sequence_number, (-1, None))[0]:
                seq_chain[e.typed[1].sequence_number] = (e.start_time_ns, modules)
        if is_op(e) and not in_op:
            if node:
                nodes.append(e)
            else:
                key = "/".join(modules) if modules else OUTSIDE
                fwd[key] = fwd.get(key, 0.0) + e.duration_time_ns / 1e3 / ACTIVE_STEPS
            in_op = True
        for c in e.children:
            walk(c, modules, in_op, in_node or node)

    for root in tree:
        walk(root, [], False, False)
    for e in nodes:
        chain = seq_chain.get(e.typed[1].sequence_number, (0, None))[1]
        key = BACKWARD if chain is None else "/".join(chain) if chain else OUTSIDE
        bwd[key] = bwd.get(key, 0.0) + e.duration_time_ns / 1e3 / ACTIVE_STEPS
        classes.setdefault(key, set()).add(e.name.split(": ", 1)[1])
    return fwd, bwd, classes


def test_cpu_op_time_per_module_matches_the_profilers_tree(cpu_trace):
    path, tree = cpu_trace
    ref_f, ref_b, classes = _reference(tree)
    b = module_breakdown(read_kineto(path), by="instance")
    assert b.basis == "cpu_op" and b.steps == ACTIVE_STEPS
    rows = {r.path: r for r in b.rows}
    leaves = {"Sequential_0/Block_0/Linear_0", "Sequential_0/Block_0/ReLU_0", "Sequential_0/Block_1/Linear_1",
              "Sequential_0/Block_1/ReLU_1", "Sequential_0/Linear_2"}
    # the backward nodes land on the module type that makes them (physics, not just bookkeeping)
    assert leaves <= set(ref_f) and leaves <= set(ref_b) and set(ref_f) | set(ref_b) <= set(rows)
    for p in leaves:
        assert classes[p] == ({"AddmmBackward0", "TBackward0"} if "Linear" in p else {"ReluBackward0"}), p
    assert classes[OUTSIDE] == {"SumBackward0"} and any("AccumulateGrad" in c for c in classes[BACKWARD])
    for p in set(ref_f) | set(ref_b):  # the JSON stores ns as µs with 3 decimals: ~1 ns per operator
        assert rows[p].exclusive_us_per_step == pytest.approx(ref_f.get(p, 0) + ref_b.get(p, 0), abs=0.01 * 20), p
        assert rows[p].backward_us_per_step - (0 if rows[p].depth == 0 else sum(
            ref_b.get(q, 0) for q in ref_b if q.startswith(p + "/"))) == pytest.approx(ref_b.get(p, 0), abs=0.2), p
    for p in leaves:
        assert rows[p].calls_per_step == 1 and rows[p].forward_us_per_step == pytest.approx(ref_f[p], abs=0.2)
    # inclusive = own + children's, up the tree; the five rows of the model cover its whole forward and backward
    assert rows["Sequential_0/Block_0"].inclusive_us_per_step == pytest.approx(
        rows["Sequential_0/Block_0/Linear_0"].inclusive_us_per_step + rows["Sequential_0/Block_0/ReLU_0"]
        .inclusive_us_per_step + rows["Sequential_0/Block_0"].exclusive_us_per_step)
    model = [p for p in set(ref_f) | set(ref_b) if p.startswith("Sequential_0")]
    assert rows["Sequential_0"].inclusive_us_per_step == pytest.approx(
        sum(ref_f.get(p, 0) + ref_b.get(p, 0) for p in model), abs=0.5)
    assert rows["Sequential_0"].backward_us_per_step == pytest.approx(sum(ref_b.get(p, 0) for p in model), abs=0.5)
    assert b.total_us_per_step == pytest.approx(sum(ref_f.values()) + sum(ref_b.values()), abs=0.5)
    assert b.unlinked_backward_us_per_step == pytest.approx(ref_b[BACKWARD], abs=0.1)
    assert any(f"{ref_b[BACKWARD]:.1f} µs per step of backward" in n for n in b.notes)
    # merged by type: the two blocks' Linear share one row with 2 calls per step
    t = {r.path: r for r in module_breakdown(read_kineto(path), by="type").rows}
    assert t["Sequential/Block/Linear"].calls_per_step == 2
    assert t["Sequential/Block/Linear"].backward_us_per_step == pytest.approx(
        rows["Sequential_0/Block_0/Linear_0"].backward_us_per_step
        + rows["Sequential_0/Block_1/Linear_1"].backward_us_per_step)


def _seq(n: int, fwd_tid: int = 0) -> dict:
    return {"Sequence number": n, "Fwd thread id": fwd_tid}


def _gpu_trace(path: Path) -> Path:
    """Two steps of 1000 µs. Forward on thread 1: Model_0 [t+10, t+200) holds Linear_0 [t+20, t+80)
    (aten::addmm, seq a, a 100 µs GEMM), Linear_1 [t+90, t+150) (aten::linear and its aten::t, seq b;
    aten::addmm, seq c: a 40 µs GEMM and inside it a 10 µs bias kernel) and, after Linear_1 closed, a 5 µs
    kernel of Model_0 itself; the loss (aten::sum, seq d) outside any module. Backward on thread 2, autograd
    nodes: SumBackward0 (d) launching 2 µs, AddmmBackward0 (c) 200 µs, TBackward0 (b) nothing, AddmmBackward0
    (a) 60 µs, AccumulateGrad (no seq) 8 µs, MmBackward0 with a seq no forward op has (its forward ran before
    the trace) 4 µs. The optimizer's 30 µs kernel outside any module and node. By hand, per step:
    forward Model_0 155 (Linear_0 100, Linear_1 50, own 5); backward Linear_1 200, Linear_0 60, so Model_0
    415 inclusive, 5 exclusive; outside 30 forward + 2 backward; unlinked backward 8 + 4 = 12 of 274;
    total 459."""
    b = TraceBuilder()
    for s in range(2):
        t = 1000.0 * s
        a, bb, c, d = (100 * s + k for k in (1, 2, 3, 4))
        b.step(s, t, 1000)
        b.cpu("nn.Module: Model_0", t + 10, 190, cat="python_function")
        b.cpu("nn.Module: Linear_0", t + 20, 60, cat="python_function")
        b.cpu("nn.Module: Linear_1", t + 90, 60, cat="python_function")
        b.cpu("aten::addmm", t + 21, 50, **_seq(a))
        b.launch("sm90_xmma_gemm_bf16", t + 25, t + 30, 100)
        b.cpu("aten::linear", t + 91, 55, **_seq(bb))
        b.cpu("aten::t", t + 92, 2, **_seq(bb))
        b.cpu("aten::addmm", t + 94, 50, **_seq(c))
        b.launch("sm90_xmma_gemm_bf16", t + 95, t + 200, 40)
        b.launch("vectorized_elementwise_kernel_add", t + 100, t + 240, 10)
        b.launch("vectorized_elementwise_kernel_mul", t + 160, t + 250, 5)
        b.cpu("aten::sum", t + 205, 5, **_seq(d))
        for name, seq, ts, dur, kernel_us in (("SumBackward0", d, 290, 8, 2), ("AddmmBackward0", c, 300, 100, 200),
                                             ("TBackward0", bb, 405, 5, 0), ("AddmmBackward0", a, 420, 50, 60),
                                             ("torch::autograd::AccumulateGrad", None, 480, 20, 8),
                                             ("MmBackward0", 99_999, 510, 20, 4)):
            b.cpu(f"autograd::engine::evaluate_function: {name}", t + ts, dur, tid=2,
                  **({} if seq is None else _seq(seq, 1)))
            b.cpu(name, t + ts + 1, dur - 2, tid=2, **({} if seq is None else _seq(seq, 1)))
            if kernel_us:
                b.launch("sm90_xmma_gemm_bf16_dgrad", t + ts + 2, t + ts + 5, kernel_us, tid=2)
        b.cpu("Optimizer.step#SGD.step", t + 700, 100, cat="user_annotation")
        b.launch("multi_tensor_apply_kernel", t + 710, t + 720, 30)
    return b.write(path)


def test_gpu_time_per_module_by_hand(tmp_path):
    b = module_breakdown(read_kineto(_gpu_trace(tmp_path / "gpu.json")), by="instance")
    assert b.basis == "gpu" and b.steps == 2 and b.total_us_per_step == pytest.approx(459)
    rows = {r.path: r for r in b.rows}
    assert set(rows) == {"Model_0", "Model_0/Linear_0", "Model_0/Linear_1", BACKWARD, OUTSIDE}
    m, l0, l1 = rows["Model_0"], rows["Model_0/Linear_0"], rows["Model_0/Linear_1"]
    assert (m.forward_us_per_step, m.backward_us_per_step, m.inclusive_us_per_step) == (155, 260, 415)
    assert (m.exclusive_us_per_step, m.events_per_step) == (5, 6)
    assert (l0.forward_us_per_step, l0.backward_us_per_step, l0.exclusive_us_per_step, l0.depth) == (100, 60, 160, 2)
    assert (l1.forward_us_per_step, l1.backward_us_per_step, l1.events_per_step, l1.calls_per_step) == (50, 200, 3, 1)
    out, unl = rows[OUTSIDE], rows[BACKWARD]
    assert (out.forward_us_per_step, out.backward_us_per_step) == (30, 2)
    assert (unl.forward_us_per_step, unl.backward_us_per_step, unl.events_per_step) == (0, 12, 2)
    assert (b.backward_us_per_step, b.unlinked_backward_us_per_step) == (274, 12)
    assert m.pct_of_step == pytest.approx(100 * 415 / 459)
    assert b.in_modules_pct == pytest.approx(100 * 415 / 459) and b.attributed_pct == pytest.approx(100 * 155 / 459)
    note = next(n for n in b.notes if "not linked" in n)
    assert "12.0 µs per step of backward (4.4% of backward time)" in note
    assert "8.0 µs in nodes without a sequence number" in note and "4.0 µs in nodes whose forward op" in note
    # by type the two Linear instances share a row (here through the by-path entry point)
    from trainperf.diagnose.modules import modules_for_trace

    t = {r.path: r for r in modules_for_trace(tmp_path / "gpu.json")[0].rows}
    assert t["Model/Linear"].inclusive_us_per_step == 410 and t["Model/Linear"].calls_per_step == 2
    assert t["Model/Linear"].backward_us_per_step == 260


def test_sequence_numbers_shared_by_two_forward_threads(tmp_path):
    # forward threads 1 and 3 both use seq 7 (each thread numbers its own ops); A_0's seq 5 is only on thread 1,
    # B_0's seq 6 only on thread 3: nodes for them teach that the profiler's forward thread 1 is tid 1 and 2 is
    # tid 3, so the node (7, fwd 2) is B_0's; a node (7, fwd 9) names a thread never seen: unlinked
    b = TraceBuilder()
    b.step(0, 0, 1000)
    for tid, mod, ts, seqs in ((1, "A_0", 10, (5, 7)), (3, "B_0", 10, (6, 7))):
        b.cpu(f"nn.Module: {mod}", ts, 50, cat="python_function", tid=tid)
        for k, seq in enumerate(seqs):
            b.cpu("aten::mm", ts + 1 + 20 * k, 10, tid=tid, **_seq(seq))
    for k, (seq, fwd, us) in enumerate(((5, 1, 11), (6, 2, 13), (7, 2, 17), (7, 9, 19))):
        b.cpu("autograd::engine::evaluate_function: MmBackward0", 100 + 50 * k, 40, tid=2, **_seq(seq, fwd))
        b.launch("sm90_xmma_gemm_bf16_dgrad", 101 + 50 * k, 300 + 50 * k, us, tid=2)
    m = module_breakdown(read_kineto(b.write(tmp_path / "t.json")), by="instance")
    rows = {r.path: r for r in m.rows}
    assert rows["A_0"].backward_us_per_step == 11 and rows["B_0"].backward_us_per_step == 13 + 17
    assert rows[BACKWARD].backward_us_per_step == 19
    assert any("19.0 µs in nodes whose sequence number several forward threads used" in n for n in m.notes)


def test_a_trace_without_fwd_thread_ids_still_links(tmp_path):
    # no "Fwd thread id" args: the backward op inside the node (same seq, later start) is not taken for the
    # forward op, so the node's 9 µs kernel is Linear_0's
    b = TraceBuilder()
    b.step(0, 0, 1000)
    b.cpu("nn.Module: Linear_0", 10, 50, cat="python_function")
    b.cpu("aten::addmm", 11, 40, **{"Sequence number": 3})
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 100, 40, tid=2, **{"Sequence number": 3})
    b.cpu("AddmmBackward0", 101, 38, tid=2, **{"Sequence number": 3})
    b.launch("sm90_xmma_gemm_bf16_dgrad", 102, 300, 9, tid=2)
    rows = {r.path: r for r in module_breakdown(read_kineto(b.write(tmp_path / "t.json")), by="instance").rows}
    assert rows["Linear_0"].backward_us_per_step == 9 and set(rows) == {"Linear_0"}


def test_diagnose_modules_json_and_html(tmp_path):
    from trainperf.cli import app

    trace = _gpu_trace(tmp_path / "gpu.json")
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["diagnose", str(trace), "--modules", "--json", "--html", str(html)])
    assert res.exit_code == 0, res.output
    rows = {r["module"]: r for r in json.loads(res.output)["modules"]}
    assert rows["Model/Linear"]["inclusive_us_per_step"] == 410 and rows["Model"]["basis"] == "gpu"
    assert (rows["Model/Linear"]["forward_us_per_step"], rows["Model/Linear"]["backward_us_per_step"]) == (150, 260)
    assert "time per nn.Module" in html.read_text()
    res = CliRunner().invoke(app, ["diagnose", str(trace), "--modules"])
    assert res.exit_code == 0 and "backward (unattributed)" in res.output and "GPU time" in res.output
    assert "bwd ms" in res.output and "calls" in res.output  # the table fits the terminal's 80 columns


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
