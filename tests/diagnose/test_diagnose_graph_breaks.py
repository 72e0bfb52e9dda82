"""graph_breaks: torch.compile's graph broken inside the step, on a hand-built host-bound step (answer worked by hand)
and on a real CPU profile of a compiled MLP whose forward breaks twice (tests/data/compile/make_traces.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

COMPILE = Path(__file__).resolve().parents[1] / "data" / "compile"
P, STEPS = 2000.0, 5
KERNEL = "triton_poi_fused_add_mul_0"


def _find(d):
    return next((f for f in d.findings if f.kind == "graph_breaks"), None)


def _broken_step_trace(path: Path) -> Path:
    # each 2000-us step at T: the guards (T, 20 us), then region 0/0 [T+20, T+620): its CompiledFunction [T+30, T+230)
    # calling graph a [T+40, T+220), the break's eager aten::mul [T+240, T+290), the resume frame's guards [T+300,
    # T+320) and region 1/0 [T+320, T+600), whose CompiledFunction [T+330, T+590) calls graph b [T+340, T+560). The
    # backward: CompiledFunctionBackward nodes [T+700, T+900) calling graph c [T+720, T+880) and [T+900, T+1000)
    # calling graph d [T+910, T+960). Each graph and the mul launch one 10-us kernel 10 us before they end; Python
    # until the next step
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("TorchDynamo Cache Lookup", T, 20.0)
        b.cpu("Torch-Compiled Region: 0/0", T + 20.0, 600.0)
        b.cpu("CompiledFunction", T + 30.0, 200.0)
        for name, start, end in (("a", 40.0, 220.0), ("b", 340.0, 560.0), ("c", 720.0, 880.0), ("d", 910.0, 960.0)):
            b.cpu(f"## Call CompiledFxGraph {name} ##", T + start, end - start)
            b.launch(KERNEL, T + end - 10.0, T + end - 2.0, 10.0)
        b.cpu("aten::mul", T + 240.0, 50.0)
        b.launch("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", T + 280.0, T + 288.0, 10.0)
        b.cpu("TorchDynamo Cache Lookup", T + 300.0, 20.0)
        b.cpu("Torch-Compiled Region: 1/0", T + 320.0, 280.0)
        b.cpu("CompiledFunction", T + 330.0, 260.0)
        for start, dur in ((700.0, 200.0), (900.0, 100.0)):
            b.cpu("autograd::engine::evaluate_function: CompiledFunctionBackward", T + start, dur)
            b.cpu("CompiledFunctionBackward", T + start + 1.0, dur - 2.0)
        b.cpu("python_work", T + 1000.0, P - 1001.0)
    return b.write(path)


def test_a_broken_graph_is_priced_at_its_extra_graphs_own_cost(tmp_path):
    # one break a step: region 1/0's time outside graph b, [T+320, T+340) and [T+560, T+600), 60 us, and its guards
    # [T+300, T+320), 20 us; the shorter backward node's time outside graph d, 100 - 50 = 50 us: 130 of the host-bound
    # 2000-us step, 6.5 %. The eager mul stays (compiled, it would fuse: not counted)
    d = diagnose(_broken_step_trace(tmp_path / "rank0.json.gz"))
    f = _find(d)
    assert f is not None and f.gain_pct == pytest.approx(6.5, abs=0.05) and f.severity == "medium"
    m = f.evidence["metrics"]
    assert (m["graph_breaks"]["value"], m["per_step"]["value"]) == (4, 1)  # 4 analysed steps
    assert m["their_time"]["value"] == pytest.approx(4 * 130.0)
    assert "TORCH_LOGS" in f.recommendation and "fullgraph=True" in f.recommendation


@pytest.mark.skipif(not (COMPILE / "graph_breaks.json.gz").is_file(), reason="needs tests/data/compile")
def test_a_real_compiled_mlp_that_breaks_twice_a_step():
    # the real profile: 2 resume frames a step; priced on their guards and wrappers alone, under what removing the
    # breaks measured unprofiled on the same machine (1.235 -> 1.021 ms a step, 17.3 %: the eager code and fusion
    # across the breaks make the rest); a compiled MLP without breaks (steady.json.gz) has no finding
    f = _find(diagnose(COMPILE / "graph_breaks.json.gz"))
    assert f is not None and f.evidence["metrics"]["per_step"]["value"] == 2
    assert 5.0 < f.gain_pct < 17.3
    assert _find(diagnose(COMPILE / "steady.json.gz")) is None
