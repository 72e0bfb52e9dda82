"""`trainperf diff`'s compute change (diagnose/diff_compute.py): the side computing more a step against the other,
operation by operation (diagnose/slow_work.py), on hand-built one-rank traces worked by hand.

Baseline: every 10-ms step runs aten::mm on [4096, 4096] x [4096, 4096] (4 ms) and aten::add on [4096, 4096]
(1 ms). Candidates: the same kernels 1.25x longer (a slower device, driver or library: 1.25 ms more, all the
same work); the same plus an aten::mm on [4096, 2048] x [2048, 4096] (2 ms more, all other work); the same
without shapes recorded (1.25x longer kernels: by name alone, no cause); the product in fp32 (12 ms) with and without
shapes (8 ms more, named by its dims, or by the GEMM kernels' names: 12 ms of fp32 against the baseline's 4 of bf16).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.diff import diff  # noqa: E402

P, STEPS = 10_000.0, 6
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"
OPS = [("aten::mm", [[4096, 4096], [4096, 4096]], GEMM, 4000.0),
       ("aten::add", [[4096, 4096], [4096, 4096]], ADD, 1000.0)]


def _trace(path: Path, ops: list, shapes: bool = True, dtype: dict | None = None, period: float = P,
           beside: bool = False) -> Path:
    """One rank's steps of `period` us running `ops` (operator, dims, kernel, us) back to back; each operator's
    inputs typed bf16 unless dtype names another for it; beside: an all-reduce (stream 20) beside each kernel, as
    long as it."""
    path.mkdir()
    b = TraceBuilder(rank=0, world_size=1)
    for s in range(STEPS):
        T = s * period
        b.step(s, T, period)
        at, host = T + 110.0, T + 10.0
        for op, dims, kernel, us in ops:
            typed = (dtype or {}).get(op, "c10::BFloat16")
            args = {"Input Dims": dims, "Input type": [typed] * len(dims)} if shapes else {}
            b.cpu(op, host, 8.0, **args)
            b.launch(kernel, host + 2.0, at, us)
            if beside:
                b.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", host + 4.0, at, us, stream=20, tid=2)
            at += us
            host += 10.0
        b.cpu("cudaDeviceSynchronize", host, at + 5.0 - host, cat="cuda_runtime")
    b.write(path / "rank0.json.gz")
    return path


def test_the_same_work_slower_is_named_as_such(tmp_path):
    d = diff(_trace(tmp_path / "a", OPS), _trace(tmp_path / "b", [(o, s, k, us * 1.25) for o, s, k, us in OPS]))
    c = d.to_json()["compute_change"]
    assert c["side_computing_more"] == "candidate" and c["cause"] == "device"
    assert c["extra_us"] == pytest.approx(1250.0) and c["same_work_slowdown"] == pytest.approx(1.25)
    assert c["from_slower_same_work_pct"] == pytest.approx(100.0)
    assert any("the same operations on the same shapes run 1.25x longer" in n and "the same work runs slower" in n
               for n in d.notes)
    assert not any("beside collectives" in n for n in d.notes)  # neither side's computation ran beside one
    # where the extra sits, whatever its cause: the product's 1 ms first (5 vs 4 ms a step), the add's 0.25 ms next
    assert any("most in aten::mm on [4096, 4096] x [4096, 4096] bf16 5.00 ms vs 4.00 ms; aten::add" in n
               for n in d.notes)


def test_other_work_is_named_with_its_operator(tmp_path):
    more = OPS + [("aten::mm", [[4096, 2048], [2048, 4096]], GEMM, 2000.0)]
    d = diff(_trace(tmp_path / "a", OPS), _trace(tmp_path / "b", more))
    c = d.to_json()["compute_change"]
    assert c["cause"] == "work" and c["extra_us"] == pytest.approx(2000.0)
    assert c["largest"][0] == {"operator": "aten::mm", "shapes": "[4096, 2048] x [2048, 4096] bf16",
                               "us": pytest.approx(6000.0), "other_side_us": pytest.approx(4000.0)}
    # the other way round: the baseline computes more
    d = diff(_trace(tmp_path / "c", more), _trace(tmp_path / "d", OPS))
    assert d.to_json()["compute_change"]["side_computing_more"] == "baseline"


def test_without_shapes_the_same_kernels_longer_name_no_cause(tmp_path):
    d = diff(_trace(tmp_path / "a", OPS, shapes=False),
             _trace(tmp_path / "b", [(o, s, k, us * 1.25) for o, s, k, us in OPS], shapes=False))
    c = d.to_json()["compute_change"]
    assert c["cause"] == "" and not c["shapes_recorded"]
    assert any("the same kernels by name (no shapes recorded" in n for n in d.notes)


def test_the_same_computation_has_no_compute_change(tmp_path):
    d = diff(_trace(tmp_path / "a", OPS), _trace(tmp_path / "b", OPS))
    assert d.to_json()["compute_change"] is None


def test_the_same_operations_at_another_precision_are_named(tmp_path):
    # the candidate runs the product in fp32 (autocast off): the same dims, 3x longer, another kernel
    fp32 = [("aten::mm", [[4096, 4096], [4096, 4096]], "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", 12000.0), OPS[1]]

    d = diff(_trace(tmp_path / "a", OPS, period=20_000.0),
             _trace(tmp_path / "b", fp32, dtype={"aten::mm": "float"}, period=20_000.0))
    note = next(n for n in d.notes if n.startswith("computation a step"))
    assert "the same operations at another precision: aten::mm on [4096, 4096] x [4096, 4096] in fp32 where the " \
        "baseline runs bf16 (8.00 ms a step)" in note


def test_without_shapes_the_gemm_kernels_names_tell_another_precision(tmp_path):
    # no shapes recorded: the candidate's product runs as an fp32 cuBLAS kernel (12 ms) where the baseline's is bf16
    # (4 ms): 8 ms more a step, all in kernels the baseline does not run; the names give 12 ms of fp32 GEMM time
    # against 0, and the baseline's 4 ms of bf16 GEMMs the candidate does not run
    fp32 = [("aten::mm", [[4096, 4096], [4096, 4096]], "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", 12000.0), OPS[1]]
    d = diff(_trace(tmp_path / "a", OPS, shapes=False, period=20_000.0),
             _trace(tmp_path / "b", fp32, shapes=False, period=20_000.0))
    c = d.to_json()["compute_change"]
    assert c["cause"] == "work" and c["extra_us"] == pytest.approx(8000.0)
    assert c["precision_move"] == {"by": "kernel names", "precision": "fp32", "us": pytest.approx(12000.0),
                                   "other_side_us_by_precision": {"reduced": pytest.approx(4000.0)}}
    note = next(n for n in d.notes if n.startswith("computation a step"))
    assert "most of it GEMM kernels in fp32 by their names (12.0 ms a step more than the baseline's), where the " \
        "baseline runs its GEMMs in other kernels (4.00 ms a step in bf16/fp16/fp8)" in note
    # with shapes the same move is named by the operator and its dims
    d = diff(_trace(tmp_path / "c", OPS, period=20_000.0),
             _trace(tmp_path / "d", fp32, dtype={"aten::mm": "float"}, period=20_000.0))
    assert d.to_json()["compute_change"]["precision_move"] == {
        "by": "shapes", "operator": "aten::mm", "dims": "[4096, 4096] x [4096, 4096]", "precision": "fp32",
        "other_side_precision": "bf16", "us": pytest.approx(8000.0)}


def test_without_shapes_more_products_at_the_same_precision_are_no_precision_move(tmp_path):
    # the candidate adds a second bf16 product (2 ms): more bf16 GEMM time, none of another precision given up
    more = OPS + [("aten::mm", [[4096, 2048], [2048, 4096]], GEMM, 2000.0)]
    d = diff(_trace(tmp_path / "a", OPS, shapes=False), _trace(tmp_path / "b", more, shapes=False))
    c = d.to_json()["compute_change"]
    assert c["cause"] == "work" and c["precision_move"] is None
    assert not any("another precision" in n for n in d.notes)


def test_cpu_runs_compare_their_training_threads_own_time(tmp_path):
    # no device events: each step's host ops are the work. The candidate's thread adds a 3-ms `log_metrics` (holding a
    # 1-ms aten::item) beside the same aten::mm (4 ms): 3 ms more a step, all other work, log_metrics' own 2 ms first
    def cpu_trace(path: Path, log: bool) -> Path:
        path.mkdir()
        b = TraceBuilder(rank=0, world_size=1)
        for s in range(STEPS):
            T = s * P
            b.step(s, T, 4200.0 + (3000.0 if log else 0.0))  # the step span holds its work and 200 us of Python
            b.cpu("aten::mm", T + 10.0, 4000.0, **{"Input Dims": [[512, 512], [512, 512]], "Input type": ["float"] * 2})
            if log:
                b.cpu("log_metrics", T + 4100.0, 3000.0, cat="user_annotation")
                b.cpu("aten::item", T + 4200.0, 1000.0)
        b.write(path / "rank0.json.gz")
        return path

    d = diff(cpu_trace(tmp_path / "a", False), cpu_trace(tmp_path / "b", True))
    c = d.to_json()["compute_change"]
    assert c["on_host"] and c["side_computing_more"] == "candidate" and c["cause"] == "work"
    assert c["extra_us"] == pytest.approx(3000.0) and c["from_more_work_pct"] == pytest.approx(100.0)
    assert c["largest"][0]["operator"] == "log_metrics" and c["largest"][0]["us"] == pytest.approx(2000.0)
    assert any(n.startswith("the training thread's own time a step (no device events)") for n in d.notes)


def test_the_same_work_slower_beside_collectives_says_so(tmp_path):
    # the candidate's kernels 1.25x longer with an all-reduce beside each (overlapped communication): all of its
    # computation beside collectives, none of the baseline's
    slow = [(o, s, k, us * 1.25) for o, s, k, us in OPS]
    d = diff(_trace(tmp_path / "a", OPS), _trace(tmp_path / "b", slow, beside=True))
    c = d.to_json()["compute_change"]
    assert c["cause"] == "device"
    assert c["computation_beside_communication_pct"] == {"side_computing_more": pytest.approx(100.0),
                                                         "other_side": pytest.approx(0.0)}
    assert any("100 % of its computation runs beside collectives against 0 % of the baseline's" in n
               for n in d.notes)
