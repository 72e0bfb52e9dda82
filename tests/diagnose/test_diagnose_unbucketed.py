"""unbucketed_gradients: gradients all-reduced one small message at a time, on hand-built host-bound steps (answers
worked by hand) and on HTA's V100 rank of a compiled model that all-reduces each of its 404 gradients."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

P, STEPS, PARAMS = 4000.0, 5, 40
HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"
LL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
SIMPLE = "ncclDevKernel_AllReduce_Sum_bf16_RING_SIMPLE(ncclDevComm*, unsigned long, ncclWork*)"


def _step_trace(path: Path, *, calls: int = PARAMS, kernel: str = LL, in_backward: bool = True) -> Path:
    # each 4000-us step at T: a backward node [T, T+1000) (or, in_backward=False, the forward's ops) holding `calls`
    # c10d::allreduce_ calls of 20 us from T+100, each launching a 5-us all-reduce 10 us into it; Python until the
    # next step. The device idles most of the step: the host sets the pace
    b = TraceBuilder(world_size=2)
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("autograd::engine::evaluate_function: MmBackward0" if in_backward else "aten::linear", T, 1000.0)
        for k in range(calls):
            at = T + 100.0 + 20.0 * k
            b.cpu("c10d::allreduce_", at, 20.0)
            b.launch(kernel, at + 10.0, at + 18.0, 5.0, stream=20)
        b.cpu("python_work", T + 1000.0, P - 1001.0)
    return b.write(path)


def _find(d):
    return next((f for f in d.findings if f.kind == "unbucketed_gradients"), None)


def test_gradients_all_reduced_one_by_one_are_priced_as_one_all_reduce_a_step(tmp_path):
    # 40 gradients a step, each a 20-us call and a latency-bound (LL) kernel, no sizes: coalesced into one all-reduce a
    # step, 39 calls not made: 780 us of the host-bound 4000-us step, 19.5 % (an upper bound: rated medium)
    f = _find(diagnose(_step_trace(tmp_path / "rank0.json.gz")))
    assert f is not None and f.gain_pct == pytest.approx(19.5, abs=0.05)
    assert f.gain_is_upper_bound and f.severity == "medium"
    m = f.evidence["metrics"]
    assert (m["per_step"]["value"], m["low_latency_protocol_share"]["value"]) == (40, 100.0)
    assert "flattened buffer" in f.recommendation


def test_bucketed_or_forward_all_reduces_are_not_unbucketed_gradients(tmp_path):
    # a few collectives a step (DDP's buckets), large messages' protocol (Simple), or all-reduces of the forward's
    # activations (tensor parallelism: each needs the layer before): none is this finding
    for name, kwargs in (("few", {"calls": 4}), ("simple", {"kernel": SIMPLE}), ("forward", {"in_backward": False})):
        (tmp_path / name).mkdir()
        assert _find(diagnose(_step_trace(tmp_path / name / "rank0.json.gz", **kwargs))) is None, name


@pytest.mark.skipif(not (HTA / "df_index_resolver").is_dir(), reason="needs ../shared/data/traces/hta")
def test_a_compiled_model_that_all_reduces_each_gradient():
    # HTA's V100 rank: 404 all-reduces a step inside its compiled backward, as many as its AccumulateGrad nodes
    # (2,020 over 5 steps), every one on NCCL's LL protocol
    d = diagnose(HTA / "df_index_resolver")
    f = _find(d)
    assert f is not None and f.evidence["metrics"]["per_step"]["value"] == 404
    assert f.evidence["metrics"]["low_latency_protocol_share"]["value"] == 100.0
    assert d.findings[0].kind == "launch_bound"  # the launches' bound, larger, still first
