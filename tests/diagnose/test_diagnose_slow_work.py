"""A straggler's extra computation, operation by operation against the other ranks (diagnose/slow_work.py): the same
operations on the same shapes slower (its GPU), or more work (more calls, larger shapes).

Hand-built 4-rank jobs (answers worked by hand): every 16-ms step each rank runs aten::mm on [4096, 4096] x
[4096, 4096] (one 4-ms GEMM kernel) and aten::add on [4096, 4096] (one 1-ms kernel), then an all-reduce that ends
300 us after its last rank arrives. Rank 3 is the slow one, three ways:
- throttled: both its kernels 1.25x longer (5 ms and 1.25 ms): 1.25 ms a step more, all of it in the same work,
  slowdown 1.25;
- more work: a second aten::mm of its own, on [4096, 2048] x [2048, 4096] (2 ms): 2 ms a step more, all of it in
  work the others do not do;
- longer inputs: its aten::mm on [6144, 4096] x [4096, 4096] (6 ms; a longer sequence): 2 ms more, in a shape the
  others do not run.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose import advice  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.slow_work import (UNTRACED_KEY, RankWork, WorkComparison, compare_work,  # noqa: E402
                                          waits_left_out, work_kind)

P, STEPS, RANKS, AR = 16_000.0, 8, 4, 300.0
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"
SQUARE = [[4096, 4096], [4096, 4096]]


def _ops(rank: int, scenario: str) -> list[tuple[str, list, str, float]]:
    """(operator, input dims, kernel, kernel µs) a step on `rank`."""
    slow = rank == RANKS - 1
    ops = [("aten::mm", SQUARE, GEMM, 4000.0), ("aten::add", [[4096, 4096], [4096, 4096]], ADD, 1000.0)]
    if slow and scenario == "throttled":
        ops = [(o, d, k, us * 1.25) for o, d, k, us in ops]
    if slow and scenario == "more_work":
        ops.append(("aten::mm", [[4096, 2048], [2048, 4096]], GEMM, 2000.0))
    if slow and scenario == "longer_inputs":
        ops[0] = ("aten::mm", [[6144, 4096], [4096, 4096]], GEMM, 6000.0)
    return ops


def _write_job(tmp_path: Path, ops_of, shapes: bool = True) -> Path:
    """Every rank's steps: the operators ops_of(rank, step) gives, their kernels back to back from 110 us into the
    step, then an all-reduce that ends AR after the last rank arrives, and a device sync; shapes recorded or not."""
    builders = {r: TraceBuilder(rank=r, world_size=RANKS) for r in range(RANKS)}
    for s in range(STEPS):
        T = s * P
        ops = {r: ops_of(r, s) for r in range(RANKS)}
        last = max(110.0 + sum(us for *_, us in ops[r]) for r in range(RANKS))
        for r, b in builders.items():
            b.step(s, T, P)
            at, host = T + 110.0, T + 10.0
            for op, dims, kernel, us in ops[r]:
                args = {"Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)} if shapes else {}
                b.cpu(op, host, 8.0, **args)
                b.launch(kernel, host + 2.0, at, us)
                at += us
                host += 10.0
            b.launch(NCCL, host, at, T + last + AR - at, **{"Collective name": "allreduce", "Process Group Name": "0"})
            b.cpu("cudaDeviceSynchronize", host + 10.0, T + last + AR + 5.0 - (host + 10.0), cat="cuda_runtime")
    for r, b in builders.items():
        b.write(tmp_path / f"rank{r}.json.gz")
    return tmp_path


def _job(tmp_path: Path, scenario: str, shapes: bool = True) -> Path:
    return _write_job(tmp_path, lambda r, s: _ops(r, scenario), shapes)


def _straggler(tmp_path: Path, scenario: str, shapes: bool = True):
    d = diagnose(_job(tmp_path, scenario, shapes))
    found = [x for x in d.findings if x.kind == "straggler"]
    assert found and found[0].ranks == [RANKS - 1]
    return found[0]


def _metric(f, name: str) -> float:
    return f.evidence["metrics"][name]["value"]


def test_the_same_work_slower_names_the_device(tmp_path):
    f = _straggler(tmp_path, "throttled")
    assert _metric(f, "extra_compute_per_step") == pytest.approx(1250.0, rel=1e-3)
    assert _metric(f, "extra_from_slower_same_work") == pytest.approx(100.0)
    assert _metric(f, "extra_from_more_work") == pytest.approx(0.0, abs=1e-6)
    assert _metric(f, "same_work_slowdown") == pytest.approx(1.25)
    assert "ran 1.25x slower on rank 3" in f.recommendation and "throttle reasons" in f.recommendation
    assert f.recommendation.startswith(advice.STRAGGLER_CAUSE_RECOMMENDATION.format(rank=3, cause="")[:30])


def test_work_the_others_do_not_do_names_the_work(tmp_path):
    f = _straggler(tmp_path, "more_work")
    assert _metric(f, "extra_compute_per_step") == pytest.approx(2000.0, rel=1e-3)
    assert _metric(f, "extra_from_more_work") == pytest.approx(100.0)
    assert "Rank 3 computed more than the other ranks" in f.recommendation
    # the operator, net of shapes, and the shapes the others do not run
    assert "aten::mm (most on [4096, 2048] x [2048, 4096] bf16): 6.00 ms a step there, 4.00 on the others" in \
        f.recommendation
    assert "throttle" not in f.recommendation


def test_larger_inputs_of_the_same_operator_are_more_work_not_a_slower_device(tmp_path):
    # the same operator and kernel, 1.5x longer: by kernel name alone it would read as the same work slower
    f = _straggler(tmp_path, "longer_inputs")
    assert _metric(f, "extra_from_more_work") == pytest.approx(100.0)
    assert "aten::mm (most on [6144, 4096] x [4096, 4096] bf16): 6.00 ms a step there, 4.00 on the others" in \
        f.recommendation and "throttle" not in f.recommendation


def test_without_shapes_a_slower_kernel_is_left_open(tmp_path):
    # kernels keyed by name alone: the same kernel slower may be larger inputs, so neither cause is named
    f = _straggler(tmp_path, "throttled", shapes=False)
    assert _metric(f, "extra_from_slower_same_work") == pytest.approx(100.0)
    assert "same_work_slowdown" not in f.evidence["metrics"]
    assert f.recommendation == advice.RECOMMENDATIONS["straggler"]


def test_more_launches_say_more_work_without_shapes_too(tmp_path):
    f = _straggler(tmp_path, "more_work", shapes=False)
    assert _metric(f, "extra_from_more_work") == pytest.approx(100.0)
    assert "computed more than the other ranks" in f.recommendation


def test_the_median_rank_is_the_reference_and_the_same_works_summed_ratio_the_slowdown():
    # others: 2 ranks at 1000 / 1200 us of key a (median 1100) and 100 us of b, totals 1100 and 1300 (median 1200);
    # the slow rank: a 1.5x (1650), b 3x (300), total 1950: extra 750. Both run as often: the same work, slowed
    # unequally; its summed time over the others' is r = 1950 / 1200 = 1.625, so all of the extra is pace:
    # 1950 (1 - 1/1.625) = 750, and 1950 / 1.625 - 1200 = 0 work
    def work(a, b, b_calls=1.0):
        return RankWork(per_step={"a": (1.0, a), "b": (b_calls, b)}, shaped_share=1.0)

    others = [work(1000.0, 100.0), work(1200.0, 100.0)]
    c = compare_work([work(1650.0, 300.0)], others)
    assert c.extra_us == pytest.approx(750.0) and c.same_work_slowdown == pytest.approx(1.625)
    assert c.slower_extra_us == pytest.approx(750.0) and c.more_work_extra_us == pytest.approx(0.0)
    assert c.cause == "device"
    assert c.largest_extra()[0] == ("a", pytest.approx(1650.0), pytest.approx(1100.0), "")
    # b run twice a step on the slow rank: no longer the same work, a alone sets the pace (1.5): 1950 (1 - 1/1.5) =
    # 650 pace, 1950 / 1.5 - 1200 = 100 work
    c = compare_work([work(1650.0, 300.0, b_calls=2.0)], others)
    assert c.same_work_slowdown == pytest.approx(1.5) and c.more_work_extra_us == pytest.approx(100.0)
    assert c.slower_extra_us == pytest.approx(650.0)
    # the same shapes no faster and 3x the calls of b: the extra is work
    c = compare_work([work(1100.0, 300.0, b_calls=3.0)], others)
    assert c.same_work_slowdown == pytest.approx(1.0) and c.cause == "work"
    assert c.slower_extra_us == pytest.approx(0.0) and c.more_work_extra_us == pytest.approx(200.0)
    assert compare_work([], [work(1.0, 1.0)]) is None


def test_training_threads_compared_leave_the_waiting_ranks_untraced_time_out():
    # a CPU job's ranks wait for the slow one between traced operators (gloo's waits inside DDP's hooks): rank 0's
    # aten::mm takes 1200 us where the others' takes 1000, the others' untraced time holds their 1500-us wait beside
    # 300 us of Python each rank runs. Compared as threads (waits_untraced), the others' untraced time is capped at
    # the slow rank's 300: extra 200, all the same work slower (1.2x); as plain work, the wait reads -1300 us
    def thread(mm, untraced):
        mm_key = "aten::mm | [64, 64] x [64, 64] fp32 | host"
        return RankWork(per_step={mm_key: (1.0, mm), UNTRACED_KEY: (1.0, untraced)}, shaped_share=1.0)

    slow, others = [thread(1200.0, 300.0)], [thread(1000.0, 1800.0), thread(1000.0, 1800.0)]
    c = compare_work(slow, others, waits_untraced=True)
    assert c.extra_us == pytest.approx(200.0) and c.same_work_slowdown == pytest.approx(1.2)
    assert c.cause == "device" and c.slower_extra_us == pytest.approx(1500.0 * (1 - 1 / 1.2))
    assert compare_work(slow, others).extra_us == pytest.approx(-1300.0)
    # one job's threads side by side (`trainperf diff` of CPU runs): each rank's untraced time capped at the least of
    # theirs, the slow rank's, which waits for no one: the others' 1500-us waits go, their 300 us of Python stays
    left = waits_left_out(slow + others)
    assert [w.per_step[UNTRACED_KEY][1] for w in left] == [300.0, 300.0, 300.0]
    assert [w.total_us for w in left] == [1500.0, 1300.0, 1300.0]
    assert waits_left_out(others[:1]) == others[:1]  # one rank waits for no one


def test_shards_of_other_shapes_are_no_extra_work_when_the_shared_work_is_slower():
    # every rank runs a shard of its own shape (x, y, z) beside the shared work a; the slow rank's a is 1.5x and so
    # is its shard: by keys, all of x (3000 us, nobody else's) would read as more work; at the shared work's pace
    # (1.5) its 4500 us are 3000, the others' median total: the extra (1500) is all pace
    slow = RankWork(per_step={"a": (1.0, 1500.0), "x": (1.0, 3000.0)}, shaped_share=1.0)
    others = [RankWork(per_step={"a": (1.0, 1000.0), "y": (1.0, 1800.0)}, shaped_share=1.0),
              RankWork(per_step={"a": (1.0, 1000.0), "z": (1.0, 2200.0)}, shaped_share=1.0)]
    c = compare_work([slow], others)
    assert c.extra_us == pytest.approx(1500.0) and c.slower_extra_us == pytest.approx(1500.0)
    assert c.more_work_extra_us == pytest.approx(0.0, abs=1e-9) and c.cause == "device"


# Ranks taking turns (load_imbalance): in step s rank s % 4 is late, by one of three kinds of extra computation beside
# the step's 4-ms GEMM: a longer sequence's attention (aten::_flash_attention_forward on [1, 16, 6144, 128] where the
# others run [1, 16, 4096, 128]: 3 ms vs 1.5 ms), more tokens for its experts (aten::_grouped_mm on [6144, 4096] x
# [8, 4096, 1024] where the others run [2048, 4096]: 3 ms vs 1 ms), or the same work 1.5x slower (every kernel).
ATTN = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"
GROUPED = "void cutlass::device_kernel<at::cuda::detail::GroupedGemm>"


def _turn_ops(late: bool, scenario: str) -> list[tuple[str, list, str, float]]:
    ops = [("aten::mm", SQUARE, GEMM, 4000.0)]
    if scenario == "attention":
        ops.append(("aten::_flash_attention_forward", [[1, 16, 6144 if late else 4096, 128]] * 3, ATTN,
                    3000.0 if late else 1500.0))
    elif scenario == "experts":
        ops.append(("aten::_grouped_mm", [[6144 if late else 2048, 4096], [8, 4096, 1024]], GROUPED,
                    3000.0 if late else 1000.0))
    else:  # the same work slower on the late rank
        ops.append(("aten::_grouped_mm", [[2048, 4096], [8, 4096, 1024]], GROUPED, 1000.0))
        ops = [(o, d, k, us * (1.5 if late else 1.0)) for o, d, k, us in ops]
    return ops


def _turns_job(tmp_path: Path, scenario: str) -> Path:
    return _write_job(tmp_path, lambda r, s: _turn_ops(r == s % RANKS, scenario))


def _imbalance(tmp_path: Path, scenario: str):
    d = diagnose(_turns_job(tmp_path, scenario))
    assert not [x for x in d.findings if x.kind == "straggler"]
    return next(x for x in d.findings if x.kind == "load_imbalance")


def test_ranks_late_in_turn_with_longer_sequences_name_attention(tmp_path):
    f = _imbalance(tmp_path, "attention")
    # a late step: the late rank's attention 3000 us against the others' 1500, the GEMM alike: 1500 us more work
    assert _metric(f, "extra_compute_per_step") == pytest.approx(1500.0, rel=1e-3)
    assert _metric(f, "extra_from_more_work") == pytest.approx(100.0)
    assert "aten::_flash_attention_forward (most on [1, 16, 6144, 128] x " in f.recommendation
    assert ": 3.00 ms a step there, 1.50 on the others" in f.recommendation
    assert f.recommendation.endswith(advice.BALANCE_BY_WORK_KIND["attention"])


def test_ranks_late_in_turn_with_more_routed_tokens_name_the_experts(tmp_path):
    f = _imbalance(tmp_path, "experts")
    assert _metric(f, "extra_compute_per_step") == pytest.approx(2000.0, rel=1e-3)
    assert f.recommendation.endswith(advice.BALANCE_BY_WORK_KIND["experts"])
    assert "aten::_grouped_mm (most on [6144, 4096] x [8, 4096, 1024] bf16): 3.00 ms a step there, 1.00 on the " \
        "others" in f.recommendation


def test_ranks_late_in_turn_running_the_same_work_slower_name_the_gpus_speed(tmp_path):
    f = _imbalance(tmp_path, "device")
    # the late rank's 5000 us at 1.5x: 2500 us more, all pace
    assert _metric(f, "extra_compute_per_step") == pytest.approx(2500.0, rel=1e-3)
    assert _metric(f, "same_work_slowdown") == pytest.approx(1.5)
    assert _metric(f, "extra_from_slower_same_work") == pytest.approx(100.0)
    assert "1.50x slower" in f.recommendation and "nvidia-smi -lgc" in f.recommendation


def test_operators_are_compared_net_of_their_shapes():
    # a shard of another shape on each side (3000 us there, 2800 on the others) is 200 us more of that operator, not
    # 3000; the attention's 100 us more is a third of the 300 us extra: not most of it, so no attention fix
    by_key = {"lookup | [262144, 1440] fp32 | k": (3000.0, 0.0), "lookup | [262144, 1296] fp32 | k": (0.0, 2800.0),
              "aten::_flash_attention_forward | [1, 16, 4096, 128] bf16 | f": (500.0, 400.0)}
    c = WorkComparison(extra_us=300.0, slower_extra_us=0.0, more_work_extra_us=300.0, same_work_slowdown=1.0,
                       shaped=True, by_key=by_key)
    assert c.largest_extra() == [("lookup", 3000.0, 2800.0, "[262144, 1440] fp32"),
                                 ("aten::_flash_attention_forward", 500.0, 400.0, "[1, 16, 4096, 128] bf16")]
    assert work_kind(c) == ""
    assert work_kind(WorkComparison(**{**c.__dict__, "extra_us": 150.0})) == "attention"  # 100 of 150: most


def _late_host_job(tmp_path: Path, late, work: str) -> Path:
    """Every rank's GEMM (4 ms) and add (1 ms) alike; where late(rank, step), the rank's training thread first runs
    `work` for 3 ms (a user_annotation holding an aten::item), so its launches and its GPU's work start 3 ms late."""
    for r in range(RANKS):
        b = TraceBuilder(rank=r, world_size=RANKS)
        for s in range(STEPS):
            T = s * P
            b.step(s, T, P)
            host = T + 10.0
            if late(r, s):
                b.cpu(work, host, 3000.0, cat="user_annotation")
                b.cpu("aten::item", host + 100.0, 50.0)
                host += 3000.0
            at = max(T + 110.0, host + 100.0)
            for op, dims, kernel, us in _ops(r, "none"):
                b.cpu(op, host, 8.0, **{"Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)})
                b.launch(kernel, host + 2.0, at, us)
                at += us
                host += 10.0
            last = T + 3000.0 + 10.0 + 100.0 + 5000.0
            b.launch(NCCL, host, at, last + AR - at, **{"Collective name": "allreduce", "Process Group Name": "0"})
            b.cpu("cudaDeviceSynchronize", host + 10.0, last + AR + 5.0 - (host + 10.0), cat="cuda_runtime")
        b.write(tmp_path / f"rank{r}.json.gz")
    return tmp_path


def test_a_rank_late_for_host_work_names_that_work(tmp_path):
    d = diagnose(_late_host_job(tmp_path, lambda r, s: r == RANKS - 1, "log_metrics"))  # rank 3, every step
    f = next(x for x in d.findings if x.kind == "straggler")
    assert f.ranks == [RANKS - 1]
    # the same device work, started late by its host: the late host's fix, with what that host did beyond the
    # others (its own time: log_metrics' 3000 us less the aten::item inside it); the others' sync waits left out
    assert f.recommendation.startswith(advice.LATE_HOST_STRAGGLER_RECOMMENDATION.format(rank=3))
    assert "most in log_metrics: 2.95 ms a step there, 0.00 on the others" in f.recommendation
    assert "cudaDeviceSynchronize" not in f.recommendation


def test_one_rank_late_in_some_steps_names_its_extra_work(tmp_path):
    # rank 2 runs an evaluation GEMM (aten::addmm on [512, 4096] x [4096, 4096], 3 ms) in steps 0, 3 and 6; in the
    # other steps rank 0 or 1 is last by 50 us: not the rank the others wait for in most steps
    def ops(r: int, s: int) -> list:
        jitter = s % 2 if s % 3 else -1  # rank 0 or 1 last by 50 us in the steps without the evaluation
        out = [("aten::mm", SQUARE, GEMM, 4000.0 + (50.0 if r == jitter else 0.0))]
        return out + ([("aten::addmm", [[512, 4096], [4096, 4096]], GEMM, 3000.0)] if r == 2 and s % 3 == 0 else [])

    _write_job(tmp_path, ops)
    f = next(x for x in diagnose(tmp_path).findings if x.kind == "straggler")
    assert f.ranks == [2]
    assert f.recommendation.startswith(advice.EXTRA_WORK_STRAGGLER_RECOMMENDATION.format(rank=2))
    assert "In the steps it was late, its extra computation was most in aten::addmm (most on [512, 4096] x " \
        "[4096, 4096] bf16)" in f.recommendation


def test_a_slow_group_running_the_same_work_slower_names_their_gpus(tmp_path):
    # ranks 2 and 3 (one node's) run the same kernels 1.25x longer, each the last in some steps by +-100 us of jitter
    import random
    rng = random.Random(7)
    jitter = {(r, s): rng.uniform(-100.0, 100.0) for r in range(RANKS) for s in range(STEPS)}

    def ops(r: int, s: int) -> list:
        return [(o, d, k, us * (1.25 if r >= 2 else 1.0) + jitter[r, s]) for o, d, k, us in _ops(r, "none")]

    f = next(x for x in diagnose(_write_job(tmp_path, ops)).findings if x.kind == "straggler")
    assert f.ranks == [2, 3]
    assert "x slower on ranks 2-3 than on the other ranks" in f.recommendation and "GPU itself" in f.recommendation
    assert f.recommendation.count("exclude") == 1  # the group's own advice, said once
    # the kernels' own +-100 us jitter, added to each, moves the same work's summed time over the others' to 1.27
    assert _metric(f, "same_work_slowdown") == pytest.approx(1.25, abs=0.03)


def test_ranks_late_in_turn_for_host_work_name_it(tmp_path):
    # in step s, rank s % 4's thread serialises its metrics for 3 ms before launching (json_dump): the same device
    # work started late, a different rank each step
    _late_host_job(tmp_path, lambda r, s: r == s % RANKS, "json_dump")
    f = next(x for x in diagnose(tmp_path).findings if x.kind == "straggler")
    assert f.recommendation.startswith(advice.PAUSED_HOSTS_RECOMMENDATION)
    assert "In the steps a rank was late, its training thread's own time beyond the other ranks' was most in " \
        "json_dump: 2.95 ms a step there, 0.00 on the others" in f.recommendation


def test_a_lookup_slower_on_the_same_shapes_is_more_work_not_a_slower_gpu(tmp_path):
    # rank 3's embedding lookup (aten::embedding_dense_backward on the same shapes) takes 3 ms where the others' take
    # 1 ms (hot rows): its time is set by the indices' values, so it sets no pace; the GEMM alike: all more work
    lookup = ("aten::embedding_dense_backward", [[8192, 4096], [8192]], "void at::native::embedding_backward_kernel",
              1000.0)

    def ops(r: int, s: int) -> list:
        o, d, k, us = lookup
        return [("aten::mm", SQUARE, GEMM, 4000.0), (o, d, k, us * (3.0 if r == RANKS - 1 else 1.0))]

    f = next(x for x in diagnose(_write_job(tmp_path, ops)).findings if x.kind == "straggler")
    assert f.ranks == [RANKS - 1] and _metric(f, "extra_from_more_work") == pytest.approx(100.0)
    assert "GPU itself" not in f.recommendation
    assert f.recommendation.endswith(advice.BALANCE_BY_WORK_KIND["embeddings"])


@pytest.mark.parametrize("name,waiting", [
    ("FSDP::all_gather (layers.1)", True),        # FSDP2's record function around its all-gather and its wait
    ("FSDP::all_gather", True),
    ("megatron.all_reduce", True), ("dist.barrier", True), ("DDP broadcast", True),
    ("c10d::allreduce_", True), ("gloo:all_reduce", True), ("cudaStreamSynchronize", True),
    ("FSDP::all_gather_copy_out", False),         # copying the gathered parameters out: work, alike on every rank
    ("FSDP::post_backward_reduce", False),        # holds the reduce-scatter's call (c10d::) beside its own work
    ("aten::mm", False), ("DistributedDataParallel.forward", False), ("reduce_grads", False),
])
def test_the_host_calls_in_which_a_thread_waits_for_the_others(name, waiting):
    # a CPU job's ranks wait for the slow one inside collectives' calls and the record functions named for them;
    # host_work leaves that time out of the comparison (slow_work._host_wait)
    from trainperf.diagnose.slow_work import _host_wait

    assert _host_wait(name) == waiting


def test_one_operator_slowed_alone_is_not_the_devices_pace():
    # four keys of 1000 us on the others, run as often on the slow rank: all four 1.25x (a slower device: broad) ->
    # 1000 us of pace; one of them 2x, the rest as fast (its inputs' values, which its shapes do not show) -> the same
    # summed slowdown, 1.25x, but in 25 % of the same work: work, named, not the device
    def work(*us):
        return RankWork(per_step={f"op{i}": (1.0, x) for i, x in enumerate(us)}, shaped_share=1.0)

    others = [work(1000.0, 1000.0, 1000.0, 1000.0)]
    broad = compare_work([work(1250.0, 1250.0, 1250.0, 1250.0)], others)
    assert broad.cause == "device" and broad.slower_extra_us == pytest.approx(1000.0)
    alone = compare_work([work(2000.0, 1000.0, 1000.0, 1000.0)], others)
    assert alone.same_work_slowdown == pytest.approx(1.25) and alone.extra_us == pytest.approx(1000.0)
    assert alone.cause == "work" and alone.slower_extra_us == pytest.approx(0.0)
    assert alone.largest_extra(1)[0][0] == "op0"
