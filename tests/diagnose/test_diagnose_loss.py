"""unfused_cross_entropy (diagnose/loss.py): a cross-entropy's log-softmax and NLL run as separate kernels.

Real profiles (tests/data/loss, torch 2.13 CPU, record_shapes): one small language model trained with
F.cross_entropy, with the log-softmax and NLL written out, in bf16 with an upcast, under autocast, and with a
distillation loss (a log-softmax and no NLL); a tiny Hugging Face LlamaForCausalLM whose loss transformers computes.
A hand-built H100 trace prices the finding against a hand-worked fused-kernel time."""

import gzip
import json
import sys
from pathlib import Path

import pytest

from trainperf.corpus.formats import no_operator_ids
from trainperf.diagnose.api import diagnose
from trainperf.diagnose.facts import collect_facts
from trainperf.diagnose.loss import loss_regions, loss_work, unfused_cross_entropy, window_loss_regions
from trainperf.diagnose.window import analysis_window
from trainperf.trace import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from gpu_bound import backward_node, end_gpu_bound_step, write_trace  # noqa: E402
from kineto_builder import TraceBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "loss"
HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"
V, N = 4096, 512  # the real profiles' vocabulary and rows of logits (8 sequences of 64 tokens)


def _finding(d):
    return next((x for x in d.findings if x.kind == "unfused_cross_entropy"), None)


def _raw_analysed(path: Path, name: str) -> int:
    """From the raw JSON: ops called `name` inside the analysed ProfilerSteps (every step but the last, which the
    profiler's stop cuts), counted independently of the loader."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name", "").startswith("ProfilerStep#"))[:-1]
    return sum(1 for e in ev if e.get("name") == name and e.get("cat") == "cpu_op"
               and any(a <= e["ts"] < b for a, b in steps))


@pytest.mark.parametrize("name, loss_op", [("cross_entropy", "aten::cross_entropy_loss"),
                                           ("written_out", "aten::log_softmax")])
def test_a_cross_entropy_over_the_vocabulary_is_found_with_its_shape(name, loss_op):
    # one region per analysed step, named by its loss operator; the logits [512, 4096] in fp32: 8 MiB
    p = DATA / f"{name}.json.gz"
    x = _finding(diagnose(p))
    assert x is not None and x.severity == "low" and not x.priced and x.confidence == "low"  # host only
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == _raw_analysed(p, loss_op) == 2
    assert (m["vocabulary"]["value"], m["tokens"]["value"]) == (V, N)
    assert m["logits_bytes"]["value"] == N * V * 4
    assert x.evidence["events"][0]["name"].startswith(loss_op)
    # the fixes it names are this package's own kernels (and Liger's)
    import trainperf.kernels as kernels
    for fix in ("CrossEntropyLoss", "FusedLinearCrossEntropyLoss"):
        assert f"trainperf.kernels.{fix}" in x.recommendation and hasattr(kernels, fix)


def test_an_upcast_of_the_bf16_logits_is_a_copy_the_region_holds():
    # the model in bf16, logits.float() before F.cross_entropy: aten::to holding aten::_to_copy over the [8, 64,
    # 4096] logits, the loss's input [512, 4096] fp32; a `.float()` of fp32 logits returns them and is no copy
    p = DATA / "upcast.json.gz"
    x = _finding(diagnose(p))
    m = x.evidence["metrics"]
    # from the raw JSON: the forward casts of the logits (Fwd thread id 0), each with the ToCopyBackward0 that casts
    # its gradient back under the same sequence number (what links it to the region)
    ev = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name", "").startswith("ProfilerStep#"))[:-1]
    casts = [e["args"]["Sequence number"] for e in ev if e.get("name") == "aten::to" and e["args"].get(
        "Fwd thread id") == 0 and e["args"]["Input Dims"][0] == [8, 64, V] and any(a <= e["ts"] < b for a, b in steps)]
    back = {e["args"]["Sequence number"] for e in ev if e.get("name") == "ToCopyBackward0"}
    assert len(casts) == 2 and set(casts) <= back
    assert m["copies_of_the_logits"]["value"] == len(casts)
    assert m["logits_bytes"]["value"] == N * V * 4
    assert _finding(diagnose(DATA / "cross_entropy.json.gz")).evidence["metrics"]["copies_of_the_logits"]["value"] == 0


def test_under_autocast_the_outer_loss_holding_the_upcast_is_the_region():
    # torch.autocast runs F.cross_entropy on bf16 logits as an aten::cross_entropy_loss of them holding their upcast
    # (aten::to) and an fp32 aten::cross_entropy_loss with the log-softmax: one region per step, the outer one, its
    # logits bf16 (N x V x 2 bytes), the upcast inside it. (Read as two nested losses, neither was a region.)
    p = DATA / "autocast.json.gz"
    t = next(iter(load_trace(p).values()))
    regions = loss_regions(t)
    ev = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
    outer = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "aten::cross_entropy_loss"
                   and e["args"]["Input type"][0] == "c10::BFloat16")
    assert [x for r in regions for x in (r.start_ns / 1e3, r.end_ns / 1e3)] == pytest.approx(
        [x for span in outer for x in span], abs=0.01)
    upcasts = [e["ts"] for e in ev if e.get("name") == "aten::to" and e["args"]["Input Dims"][0] == [N, V]
               and e["args"]["Input type"][0] == "c10::BFloat16"]
    assert len(upcasts) == len(outer) == 3 and all(a <= u < b for u, (a, b) in zip(upcasts, outer))
    assert all(r.dtype == "c10::BFloat16" and t.name_of(r.log_softmax_row) == "aten::log_softmax" for r in regions)
    assert all(r.log_softmax_dtype == "float" and r.fused_traffic_share == 0.5 for r in regions)
    x = _finding(diagnose(p))
    assert x is not None and x.evidence["metrics"]["logits_bytes"]["value"] == N * V * 2


def test_hugging_faces_own_loss_path_upcasts_the_logits_six_operators_before_the_loss():
    # transformers 4.57's ForCausalLMLoss on a 2-layer LlamaForCausalLM in bf16: logits.float() (an aten::to holding
    # aten::_to_copy over [4, 64, 4096]), then the labels padded, shifted and flattened (aten::pad, slice,
    # contiguous, view, view, to: 6 siblings), then F.cross_entropy over [256, 4096] fp32. The copy is the region's
    p = DATA / "hf_llama.json.gz"
    t = next(iter(load_trace(p).values()))
    regions = loss_regions(t)
    assert len(regions) == 3 and all(r.copies == 1 and (r.tokens, r.vocab, r.dtype) == (256, V, "float")
                                     for r in regions)
    ev = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
    casts = sorted(e["ts"] for e in ev if e.get("name") == "aten::to" and e["args"].get("Fwd thread id") == 0
                   and e["args"]["Input Dims"][0] == [4, 64, V])
    assert [round(r.start_ns / 1e3, 3) for r in regions] == pytest.approx(casts, abs=0.01)
    x = _finding(diagnose(p))
    assert x is not None and x.evidence["metrics"]["copies_of_the_logits"]["value"] == 2  # the analysed steps'


def test_the_regions_backward_is_the_nodes_its_operators_made():
    # each F.cross_entropy region: aten::cross_entropy_loss holds the log-softmax and the NLL; its backward nodes
    # (NllLossBackward0, LogSoftmaxBackward0) carry their sequence numbers
    t = next(iter(load_trace(DATA / "cross_entropy.json.gz").values()))
    regions = loss_regions(t)
    # every step's loss, the cut last step's too
    assert len(regions) == _raw_analysed(DATA / "cross_entropy.json.gz", "aten::cross_entropy_loss") + 1
    for r in regions:
        assert t.name_of(r.row) == "aten::cross_entropy_loss" and t.name_of(r.log_softmax_row) == "aten::log_softmax"
        assert r.start_ns <= t.ts_ns[r.log_softmax_row] < r.end_ns


def test_a_log_softmax_without_an_nll_is_not_a_cross_entropy():
    # a distillation loss: F.kl_div(F.log_softmax(student), teacher)
    assert loss_regions(next(iter(load_trace(DATA / "kl_div.json.gz").values()))) == []
    assert _finding(diagnose(DATA / "kl_div.json.gz")) is None


@pytest.mark.skipif(not (HTA / "ns_resolution_trace").exists(), reason="HTA traces not present")
def test_a_classifiers_loss_on_a_real_gpu_trace_is_found_and_too_small_to_flag():
    # HTA's ns_resolution (A100, PyTorch's CUDA kernels): each analysed step's aten::cross_entropy_loss launches the
    # log-softmax's softmax_warp_forward (template flag is_log_softmax = true) and, through the nodes its operators
    # made, softmax_warp_backward; over a handful of classes it is ~0.03 % of the span: no finding
    t = next(iter(load_trace(HTA / "ns_resolution_trace").values()))
    w = analysis_window(t)
    f = collect_facts(t, w)
    regions = window_loss_regions(f)
    assert len(regions) == 4 and all(t.name_of(r.row) == "aten::cross_entropy_loss" for r in regions)
    work, log_softmax = loss_work(f, regions)
    assert work.backward and {t.name_of(int(r)).split("<")[0] for r in log_softmax} == {
        "void (anonymous namespace)::softmax_warp_forward"}
    assert any(t.name_of(int(r)).startswith("void (anonymous namespace)::softmax_warp_backward") for r in work.kernels)
    assert unfused_cross_entropy(f) is None


STEPS, P = 4, 11_700.0  # P: the step, 190 us past its device work (an upcast's copies lengthen both)
LOG_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
               "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>")
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _h100_trace(folder: Path, *, log_softmax_us: float = 800.0, fill_us: float = 400.0, backward_us: float = 1200.0,
                cast_us: float = 0.0, shapes: bool = True) -> Path:
    """STEPS steps of P us on an H100, each GPU-bound: the projection onto the vocabulary (a 3000-us GEMM), then
    aten::cross_entropy_loss over [8192, 32000] bf16 logits holding aten::log_softmax (its kernel log_softmax_us)
    and aten::nll_loss_nd (20 us); backward, NllLossBackward0 (a fill_us zero-fill of the gradient, a 20-us
    scatter), LogSoftmaxBackward0 (backward_us) and the GEMM's (2 x 3000 us), the kernels back to back from +50 us.
    cast_us: the logits upcast to fp32 first (aten::to holding aten::_to_copy, then a view; the loss then takes fp32
    logits), a cast_us copy kernel forward and the same in its ToCopyBackward0; shapes: the operators' recorded
    shapes."""
    b = TraceBuilder()

    def shaped(dims, types):
        return {"Input Dims": dims, "Input type": types} if shapes else {}

    logits_type = "float" if cast_us else "c10::BFloat16"
    step_us = P + 2.0 * cast_us
    for s in range(STEPS):
        T, seq = s * step_us, 100 * s
        b.step(s, T, step_us)
        b.cpu("aten::linear", T, 4.0, **{"Sequence number": seq + 10, "Fwd thread id": 0})
        b.launch(GEMM, T + 1.0, T + 50.0, 3000.0)
        at = T + 3050.0
        if cast_us:
            b.cpu("aten::to", T + 5.0, 2.0, **{"Sequence number": seq + 9, "Fwd thread id": 0,
                                               **shaped([[4, 2048, 32000], [], [], [], []],
                                                        ["c10::BFloat16", "Scalar", "Scalar", "Scalar", ""])})
            b.cpu("aten::_to_copy", T + 5.2, 1.6)
            b.launch("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", T + 5.5,
                     at, cast_us)
            at += cast_us
            b.cpu("aten::view", T + 8.0, 1.0, **shaped([[4, 2048, 32000], []], ["float", "ScalarList"]))
        b.cpu("aten::cross_entropy_loss", T + 10.0, 30.0, **{
            "Sequence number": seq + 11, "Fwd thread id": 0,
            **shaped([[8192, 32000], [8192], [], [], [], []],
                     [logits_type, "long int", "", "Scalar", "Scalar", "Scalar"])})
        b.cpu("aten::log_softmax", T + 12.0, 10.0, **{
            "Sequence number": seq + 11, "Fwd thread id": 0,
            **shaped([[8192, 32000], [], []], [logits_type, "Scalar", ""])})
        b.launch(LOG_SOFTMAX, T + 14.0, at, log_softmax_us)
        at += log_softmax_us
        b.cpu("aten::nll_loss_nd", T + 25.0, 10.0, **{"Sequence number": seq + 12, "Fwd thread id": 0})
        b.launch("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>",
                 T + 27.0, at, 20.0)
        at = backward_node(b, "NllLossBackward0", T + 100.0, seq + 12, [
            ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", fill_us),
            ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>", 20.0)],
            at + 20.0)
        at = backward_node(b, "LogSoftmaxBackward0", T + 130.0, seq + 11, [
            ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
             "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>", backward_us)], at)
        if cast_us:
            at = backward_node(b, "ToCopyBackward0", T + 150.0, seq + 9, [
                ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", cast_us)], at)
        at = backward_node(b, "MmBackward0", T + 170.0, seq + 10, [(GEMM, 3000.0), (GEMM, 3000.0)], at)
        end_gpu_bound_step(b, T, step_us, at, sync_at=200.0)
    return write_trace(b, folder)


def test_unfused_cross_entropy_priced_as_one_kernel_at_its_log_softmax_time(tmp_path):
    # per step the loss's kernels take 800 + 20 + 400 + 20 + 1200 = 2440 us of a GPU-bound step; one fused kernel
    # costs the forward log-softmax's 800 us (one read and one write of the logits), so 1640 us saved per step,
    # 3.05x on those kernels; the logits [8192, 32000] bf16: 524,288,000 bytes
    d = diagnose(_h100_trace(tmp_path))
    x = _finding(d)
    assert x is not None and d.findings[0] is x and x.priced and x.confidence == "medium"
    assert x.gain_pct == pytest.approx(100.0 * 1640.0 / P, abs=0.1) and x.severity == "high"
    m = x.evidence["metrics"]
    assert m["regions"]["value"] == STEPS - 1
    assert m["loss_kernel_time"]["value"] == pytest.approx(2440.0 * (STEPS - 1))
    assert m["fused_kernel_estimate"]["value"] == pytest.approx(800.0 * (STEPS - 1))
    assert m["logits_bytes"]["value"] == 8192 * 32000 * 2 and m["backward_in_trace"]["value"] == 1
    assert m["fused_traffic_share"]["value"] == 1.0  # the log-softmax ran on the bf16 logits themselves
    assert x.gain_us / (STEPS - 1) == pytest.approx(2440.0 - 800.0, rel=0.01)


def test_without_sequence_numbers_the_losss_backward_is_its_first_nodes_by_name(tmp_path):
    # the same step through an exporter that drops operator ids (corpus.formats.no_operator_ids: no External id, no
    # Sequence number): the loss is the autograd graph's root, so the first NllLossBackward0 and LogSoftmaxBackward0
    # after it are its backward; priced as with the numbers, 1640 us a step (only the forward's 20 us without them)
    p = _h100_trace(tmp_path)
    doc = json.loads(gzip.decompress(p.read_bytes()))
    (tmp_path / "bare").mkdir()
    bare = tmp_path / "bare" / "t.json.gz"
    bare.write_bytes(gzip.compress(json.dumps(no_operator_ids(doc, 0)).encode()))
    t = next(iter(load_trace(bare).values()))
    assert not (t.seq >= 0).any()
    x = _finding(diagnose(bare))
    assert x is not None and x.evidence["metrics"]["backward_in_trace"]["value"] == 1
    assert x.gain_us / (STEPS - 1) == pytest.approx(2440.0 - 800.0, rel=0.01)


def test_a_loss_under_the_threshold_is_not_a_finding(tmp_path):
    # a small vocabulary's loss: 50 + 20 + 20 + 20 + 60 = 170 us of a ~9,220-us device step, 1.8 %: under
    # UNFUSED_LOSS_MIN_PCT (3 %)
    assert _finding(diagnose(_h100_trace(tmp_path, log_softmax_us=50.0, fill_us=20.0, backward_us=60.0))) is None


def test_an_upcast_of_the_logits_before_the_loss_is_part_of_it(tmp_path):
    # logits.float() before the loss (Hugging Face's eager code): a 600-us copy forward and its ToCopyBackward0's
    # 600 us, which a fused kernel on the bf16 logits does without: the region's kernels 2440 + 1200 = 3640 us a
    # step; the fused kernel moves the bf16 logits, half the bytes of the fp32 log-softmax's 800 us: 400 us, 3240 us
    # saved per step
    x = _finding(diagnose(_h100_trace(tmp_path, cast_us=600.0)))
    m = x.evidence["metrics"]
    assert m["copies_of_the_logits"]["value"] == STEPS - 1 and m["logits_bytes"]["value"] == 8192 * 32000 * 4
    assert m["loss_kernel_time"]["value"] == pytest.approx(3640.0 * (STEPS - 1))
    assert m["fused_traffic_share"]["value"] == 0.5
    assert m["fused_kernel_estimate"]["value"] == pytest.approx(400.0 * (STEPS - 1))
    assert x.gain_us / (STEPS - 1) == pytest.approx(3640.0 - 400.0, rel=0.01)
    # without recorded shapes the copy is not known to be of the logits, nor the types: the loss's own kernels only,
    # the log-softmax's time whole
    (tmp_path / "bare").mkdir()
    x = _finding(diagnose(_h100_trace(tmp_path / "bare", cast_us=600.0, shapes=False)))
    assert "copies_of_the_logits" not in x.evidence["metrics"]
    assert x.evidence["metrics"]["fused_traffic_share"]["value"] == 1.0
    assert x.gain_us / (STEPS - 1) == pytest.approx(2440.0 - 800.0, rel=0.01)


def test_a_backward_node_found_by_name_is_its_own_function_not_the_hooks_around_it(tmp_path):
    # a real CPU profile's loss (F.cross_entropy), through an exporter that drops operator ids, with a 6-ms hook
    # wrapped around each NllLossBackward0 node's function, as FSDP's pre-backward unshard runs on the first node of
    # a real FSDP2 backward (6 ms around a 34-us function): the loss's backward host time is its functions' alone,
    # as with the operator ids (by sequence number); before, the hooks counted (a real FSDP2 profile without ids
    # read 4.7 % of its host time as the loss's and named unfused_cross_entropy)
    src = DATA / "cross_entropy.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    bare = no_operator_ids(doc, 0)
    events = bare["traceEvents"]
    nodes = [e for e in events if e.get("name") == "autograd::engine::evaluate_function: NllLossBackward0"]
    for node in sorted(nodes, key=lambda e: -e["ts"]):  # 6 ms inserted at each node's start, later events shifted
        at = node["ts"]
        for e in events:
            if "ts" in e and e["ts"] >= at and e is not node:
                e["ts"] += 6000.0
        node["dur"] += 6000.0
        events.append({**node, "name": "FSDP::pre_backward", "ts": at, "dur": 5999.0, "args": {}})
    (tmp_path / "t.json").write_text(json.dumps(bare))
    with_ids = next(iter(load_trace(src).values()))
    hooked = next(iter(load_trace(tmp_path / "t.json").values()))

    def host_us(t):
        f = collect_facts(t, analysis_window(t))
        return loss_work(f, window_loss_regions(f))[0].host_us

    assert host_us(hooked) == pytest.approx(host_us(with_ids), rel=0.02)


def test_a_node_whose_evaluate_function_records_no_sequence_number_is_linked_through_its_function(tmp_path):
    # in a real FSDP2 CPU profile the first node of each backward (NllLossBackward0, run inside FSDP's pre-backward
    # hook) records its sequence number on its function op only; the same here on the real cross_entropy profile:
    # the loss's backward still holds both nodes' work (within the NLL evaluate_function's own few us), where it
    # lost the NLL node before
    src = DATA / "cross_entropy.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("name") == "autograd::engine::evaluate_function: NllLossBackward0":
            e["args"].pop("Sequence number", None)
    (tmp_path / "t.json").write_text(json.dumps(doc))

    def host_us(path):
        t = next(iter(load_trace(path).values()))
        f = collect_facts(t, analysis_window(t))
        return loss_work(f, window_loss_regions(f))[0].host_us

    whole, stripped = host_us(src), host_us(tmp_path / "t.json")
    nll = sum(float(e["dur"]) for e in doc["traceEvents"] if e.get("name") == "NllLossBackward0")
    assert whole - stripped < 0.1 * nll  # the function's span, not nothing
