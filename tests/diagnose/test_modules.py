"""Time per nn.Module (diagnose/modules.py).

References: a real trace recorded here by torch.profiler (with_stack=True, record_shapes=True) on a small
nn.Sequential, checked against the profiler's own event tree (`kineto_results.experimental_event_tree()`:
the nesting PyTorch built from its call records, not from the JSON timestamps), where each gradient
accumulation names its parameter through a post-accumulate-grad hook (a record_function inside the
AccumulateGrad node: which parameter, hence which module, it is, straight from autograd); and GPU traces
built by hand (tests/trace/kineto_builder.py) whose kernel times are summed by hand.
"""

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.autograd_links import ACCUMULATE_UNKNOWN as ACC_UNKNOWN  # noqa: E402
from trainperf.diagnose.modules import BACKWARD, GRAD_ACCUM, OUTSIDE, module_breakdown  # noqa: E402
from trainperf.trace.kineto import read_kineto  # noqa: E402

ACTIVE_STEPS = 2
PARAM_MARK = "param:"
# parameter name -> the module span path that owns it, by hand from the model below
PARAM_MODULE = {"0.fc": "Sequential_0/Block_0/Linear_0", "1.fc": "Sequential_0/Block_1/Linear_1",
                "2": "Sequential_0/Linear_2"}


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """(trace path, profiler event tree) of 2 profiled steps (after 1 warm-up) of forward + backward."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(32, 32), nn.ReLU()

        def forward(self, x):
            return self.act(self.fc(x))

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(32, 4))
    for name, param in model.named_parameters():  # the reference's label of each gradient accumulation
        param.register_post_accumulate_grad_hook(lambda _, n=name: record_function(PARAM_MARK + n).__enter__()
                                                 .__exit__(None, None, None))
    x = torch.randn(16, 32)
    path = tmp_path_factory.mktemp("modules") / "trace.json"
    got = {}

    def ready(p):
        p.export_chrome_trace(str(path))
        got["tree"] = p.profiler.kineto_results.experimental_event_tree()

    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True, on_trace_ready=ready,
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
    those sharing it, outside any node), OUTSIDE when that op ran outside every module, BACKWARD when none; a
    gradient accumulation by the module owning the parameter its hook names."""
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
    def param_of(e):
        if e.name.startswith(PARAM_MARK):
            return e.name[len(PARAM_MARK):]
        return next((p for c in e.children if (p := param_of(c))), None)

    for e in nodes:
        chain = seq_chain.get(e.typed[1].sequence_number, (0, None))[1]
        key = BACKWARD if chain is None else "/".join(chain) if chain else OUTSIDE
        if e.name.endswith("AccumulateGrad"):
            param = param_of(e)
            key = PARAM_MODULE[param.rsplit(".", 1)[0]] if param else GRAD_ACCUM
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
    acc = "torch::autograd::AccumulateGrad"
    for p in leaves:  # each Linear's gradient accumulation (weight and bias) is its own backward
        assert classes[p] == ({"AddmmBackward0", "TBackward0", acc} if "Linear" in p else {"ReluBackward0"}), p
    assert classes[OUTSIDE] == {"SumBackward0"} and BACKWARD not in ref_b and GRAD_ACCUM not in ref_b
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
    assert b.unlinked_backward_us_per_step == 0 and not any("engine's order alone" in n for n in b.notes)
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
    (a) 60 µs, AccumulateGrad (no seq, no shapes recorded) 8 µs right after it, so Linear_0's by the engine's
    order, MmBackward0 with a seq no forward op has (its forward ran before the trace) 4 µs. The optimizer's
    30 µs kernel outside any module and node. By hand, per step: forward Model_0 155 (Linear_0 100, Linear_1
    50, own 5); backward Linear_1 200, Linear_0 60 + 8, so Model_0 423 inclusive, 5 exclusive; outside 30
    forward + 2 backward; unlinked backward 4 of 274; total 459."""
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
    assert (m.forward_us_per_step, m.backward_us_per_step, m.inclusive_us_per_step) == (155, 268, 423)
    assert (m.exclusive_us_per_step, m.events_per_step) == (5, 7)
    assert (l0.forward_us_per_step, l0.backward_us_per_step, l0.exclusive_us_per_step, l0.depth) == (100, 68, 168, 2)
    assert (l1.forward_us_per_step, l1.backward_us_per_step, l1.events_per_step, l1.calls_per_step) == (50, 200, 3, 1)
    out, unl = rows[OUTSIDE], rows[BACKWARD]
    assert (out.forward_us_per_step, out.backward_us_per_step) == (30, 2)
    assert (unl.forward_us_per_step, unl.backward_us_per_step, unl.events_per_step) == (0, 4, 1)
    assert (b.backward_us_per_step, b.unlinked_backward_us_per_step) == (274, 4)
    assert m.pct_of_step == pytest.approx(100 * 423 / 459)
    assert b.in_modules_pct == pytest.approx(100 * 423 / 459) and b.attributed_pct == pytest.approx(100 * 155 / 459)
    note = next(n for n in b.notes if "not attributed" in n)
    assert "4.0 µs per step of backward (1.5% of backward time)" in note
    assert "4.0 µs in nodes whose forward op" in note
    assert any("8.0 µs per step of gradient accumulation attributed by the autograd engine's order alone" in n
               for n in b.notes)
    # by type the two Linear instances share a row (here through the by-path entry point)
    from trainperf.diagnose.modules import modules_for_trace

    t = {r.path: r for r in modules_for_trace(tmp_path / "gpu.json")[0].rows}
    assert t["Model/Linear"].inclusive_us_per_step == 418 and t["Model/Linear"].calls_per_step == 2
    assert t["Model/Linear"].backward_us_per_step == 268


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
    assert rows["Model/Linear"]["inclusive_us_per_step"] == 418 and rows["Model"]["basis"] == "gpu"
    assert (rows["Model/Linear"]["forward_us_per_step"], rows["Model/Linear"]["backward_us_per_step"]) == (150, 268)
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


def _dims(*shapes) -> dict:
    return {"Input Dims": [list(x) for x in shapes], "Input type": ["float"] * len(shapes)}


def test_gradient_accumulation_goes_to_the_module_of_its_producing_node(tmp_path):
    # Conv_0's forward op (aten::convolution, seq 1) took x [8,3,32,32], its weight [16,3,3,3] and bias [16]; Lin_0's
    # (aten::addmm, seq 2) took bias [10], x and weight^T [16,10]. Backward on thread 2, in engine order:
    # AddmmBackward0 (2) 50 µs; AccumulateGrad of a [10] gradient 3 µs (an input of addmm: Lin_0's);
    # ConvolutionBackward0 (1) 70 µs; two AccumulateGrads back to back, [16,3,3,3] 5 µs and [16] 2 µs (both inputs of
    # the convolution: Conv_0's, the second after the first); an AccumulateGrad of a [7,7] gradient, no input of the
    # convolution, 11 µs: its module cannot be told (its own row); its post hook (outside the inner
    # AccumulateGrad record) launches a 40 µs all-reduce: hooks belong to no module (BACKWARD).
    b = TraceBuilder()
    b.step(0, 0, 2000)
    b.cpu("nn.Module: Conv_0", 10, 40, cat="python_function")
    b.cpu("aten::convolution", 11, 30, **_seq(1), **_dims((8, 3, 32, 32), (16, 3, 3, 3), (16,)))
    b.cpu("nn.Module: Lin_0", 60, 40, cat="python_function")
    b.cpu("aten::addmm", 61, 30, **_seq(2), **_dims((10,), (8, 16), (16, 10)))
    ts = 200
    for name, seq, shape, us in (("AddmmBackward0", 2, None, 50), ("torch::autograd::AccumulateGrad", None, (10,), 3),
                                 ("ConvolutionBackward0", 1, None, 70),
                                 ("torch::autograd::AccumulateGrad", None, (16, 3, 3, 3), 5),
                                 ("torch::autograd::AccumulateGrad", None, (16,), 2),
                                 ("torch::autograd::AccumulateGrad", None, (7, 7), 11)):
        b.cpu(f"autograd::engine::evaluate_function: {name}", ts, 40, tid=2, **({} if seq is None else _seq(seq, 1)))
        b.cpu(name, ts + 1, 20, tid=2, **(_seq(seq, 1) if seq is not None else _dims(shape)))
        b.launch("elementwise_kernel" if seq is None else "sm90_xmma_gemm_bf16_dgrad", ts + 2, 1000 + ts, us, tid=2)
        ts += 50
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts - 50 + 30, 1500, 40, tid=2)  # in the last node's hook
    m = module_breakdown(read_kineto(b.write(tmp_path / "t.json")), by="instance")
    rows = {r.path: r for r in m.rows}
    assert rows["Lin_0"].backward_us_per_step == 50 + 3
    assert rows["Conv_0"].backward_us_per_step == 70 + 5 + 2
    assert rows[GRAD_ACCUM].backward_us_per_step == 11 and rows[GRAD_ACCUM].depth == 0
    assert rows[BACKWARD].backward_us_per_step == 40
    assert m.unlinked_backward_us_per_step == 51
    note = next(n for n in m.notes if "not attributed" in n)
    assert "11.0 µs in gradient accumulation (AccumulateGrad) whose parameter's module could not be told" in note
    assert "40.0 µs in hooks run after gradient accumulation" in note
    assert not any("engine's order alone" in n for n in m.notes)  # every link here was checked by shape


def test_gradient_accumulation_without_a_producer_before_it_is_its_own_row(tmp_path):
    b = TraceBuilder()
    b.step(0, 0, 1000)
    b.cpu("nn.Module: Lin_0", 10, 40, cat="python_function")
    b.cpu("aten::addmm", 11, 30, **_seq(2))
    b.cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 100, 20, tid=2)
    b.launch("elementwise_kernel", 101, 300, 6, tid=2)
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 130, 20, tid=2, **_seq(2, 1))
    b.launch("sm90_xmma_gemm_bf16_dgrad", 131, 320, 9, tid=2)
    rows = {r.path: r for r in module_breakdown(read_kineto(b.write(tmp_path / "t.json")), by="instance").rows}
    assert rows["Lin_0"].backward_us_per_step == 9 and rows[GRAD_ACCUM].backward_us_per_step == 6


HTA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"


def test_real_ddp_trace_its_bucket_all_reduce_stays_out_of_gradient_accumulation():
    # HTA's nccl_parser_config trace (a real DDP run, no module spans): DDP launches its all-reduce from the
    # AccumulateGrad nodes' post hooks. Reference: the kernel names. Every NCCL kernel launched inside an
    # AccumulateGrad node is hook time (no module's), the unattributed backward is exactly that hook time, and the
    # accumulation itself links to the node before it, as the engine runs it
    import numpy as np

    from trainperf.diagnose.autograd_links import HOOK, LINKED_OUTSIDE, NOT_BACKWARD
    from trainperf.diagnose.modules import _attribute, module_spans
    from trainperf.trace.annotate import correlated_host_row
    from trainperf.trace.events import DEVICE_KINDS

    path = HTA / "nccl_parser_config/nccl_data.json.gz"
    if not path.is_file():
        pytest.skip("../shared/data/traces/hta not present")
    t = read_kineto(path)
    dev = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & (t.stream >= 0))
    _, links = _attribute(t, module_spans(t), correlated_host_row(t)[dev])
    nccl = np.array(["ncclKernel_AllReduce" in t.name_of(i) for i in dev])
    in_backward = links.state != NOT_BACKWARD
    assert (nccl & in_backward).sum() >= 10 and (links.state[nccl & in_backward] == HOOK).all()
    assert not (links.state == ACC_UNKNOWN).any() and (links.state == LINKED_OUTSIDE).any()
    b = module_breakdown(t)
    hook_us = float(t.dur_ns[dev[links.state == HOOK]].sum()) / 1e3 / b.steps
    assert b.unlinked_backward_us_per_step == pytest.approx(hook_us)
