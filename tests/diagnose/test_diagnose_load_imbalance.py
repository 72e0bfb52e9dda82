"""load_imbalance: ranks wait for each other inside collectives, but the rank they wait for changes from step to
step (unequal work per step: sequence lengths, MoE routing), against a straggler, the same rank late every step.

Hand-built 4-rank traces (answers worked by hand): every 14-ms step launches one GEMM of 8 ms, 3 ms longer on one
rank, then an all-reduce that ends 300 us after the last rank arrives; rotating: the longer rank is rank s % 4 in
step s; fixed: rank 1 in every step. Steps 0-6 are analysed (the last one, cut short by the profiler, is left out):
rotating, rank 3 waits 3 ms in the 6 steps where another rank is last (18 ms), rank 3 is last in 1 step, ranks
0-2 in 2 each, so no rank is last in most steps."""

import sys
from pathlib import Path

import numpy as np
import pytest

from trainperf.diagnose import findings as F
from trainperf.diagnose.api import diagnose
from trainperf.diagnose.crossrank import (MatchedCollective, laggard_p_value, laggards, persistent_laggard,
                                         slow_ranks)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

RANKS, STEPS, P, C, EXTRA, AR = 4, 8, 14_000.0, 8_000.0, 3_000.0, 300.0
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
JITTER = 100.0
# the span a late host's pause is recorded as, by named stall (facts.STALL_CAUSES): name, category
PAUSES = {"gc": ("Python GC", "python_function"),
          "dataloader": ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "user_annotation")}


ALL_TO_ALL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
TOKENS = 1_000_000  # elements a rank receives in an all-to-all with its fair share of the tokens


def _job(path: Path, rotating: bool, ranks: int = RANKS, extra: float = EXTRA, paused: bool = False,
         queued: bool = False, group: tuple[int, ...] = (), paused_in: str = "", routed: str = "",
         kernel: str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") -> Path:
    # paused: the late rank of a step computes C like the others but its host launches the GEMM `extra` later
    # (a pause with no op recorded, as Python's garbage collector leaves it; paused_in: recorded as a span of that
    # named stall, PAUSES, e.g. a "Python GC" span as PyTorch's record_python_gc_info records one); queued: it
    # launches on time, but a copy of `extra` us launched just before runs first on its stream; group: every rank of
    # it is late by `extra` in every step, and one of them (in turn) by JITTER more, the last of that step. routed:
    # the step is an expert-parallel layer, an all-to-all dispatch before the GEMM (the ranks arrive together) and a
    # combine after it in place of the all-reduce; "tokens": the dispatch delivers each rank tokens in proportion to
    # its GEMM's time (the late rank's experts drew more), "equal": every rank the same (its GPU is slower)
    def late(r: int, s: int) -> float:
        if group:
            return extra + (JITTER if r == group[s % len(group)] else 0.0) if r in group else 0.0
        return extra if r == (s % ranks if rotating else 1) else 0.0

    def compute(r: int, s: int) -> float:
        return C + (0.0 if paused or queued else late(r, s))

    def start(r: int, s: int) -> float:  # the GEMM's start after T + 110
        return late(r, s) if paused or queued else 0.0

    def host(r: int, s: int) -> float:  # the host's delay
        return late(r, s) if paused else 0.0

    for r in range(ranks):
        b = TraceBuilder(rank=r, world_size=ranks)
        for s in range(STEPS):
            T = s * P
            b.step(s, T, P)
            if queued and late(r, s):
                b.launch("Memcpy DtoH (Device -> Pinned)", T + 90, T + 110, late(r, s), cat="gpu_memcpy",
                         runtime="cudaMemcpyAsync")
            if paused_in and host(r, s):
                b.cpu(PAUSES[paused_in][0], T + 100, host(r, s) - 1, cat=PAUSES[paused_in][1])
            if routed:
                tokens = TOKENS * (compute(r, s) / C if routed == "tokens" else 1.0)
                b.launch(ALL_TO_ALL, T + 95, T + 100, 5.0, **_all_to_all_args(tokens))
            b.launch(kernel, T + 100 + host(r, s), T + 110 + start(r, s), compute(r, s))
            last = T + 110 + max(start(q, s) + compute(q, s) for q in range(ranks))
            arrive = T + 110 + start(r, s) + compute(r, s)
            b.launch(ALL_TO_ALL if routed else NCCL, T + 140 + host(r, s), arrive, last + AR - arrive,
                     **(_all_to_all_args(TOKENS) if routed else {"Collective name": "allreduce",
                                                                 "Process Group Name": "0"}))
            b.cpu("cudaDeviceSynchronize", T + 300 + host(r, s), last + AR + 5 - (T + 300 + host(r, s)),
                  cat="cuda_runtime")
        b.write(path / f"rank{r}.json.gz")
    return path


def _all_to_all_args(received: float) -> dict:
    # an expert-parallel all-to-all's args as PyTorch >= 2.1 records them: it sends a fair share, receives `received`
    return {"Collective name": "all_to_all", "Process Group Name": "ep", "In msg nelems": TOKENS,
            "Out msg nelems": int(received), "dtype": "BFloat16", "Group size": RANKS}


def _find(d, kind):
    return next((f for f in d.findings if f.kind == kind), None)


def test_waits_for_a_rank_that_changes_each_step_are_load_imbalance_not_a_straggler(tmp_path):
    d = diagnose(_job(tmp_path, rotating=True))
    assert _find(d, "straggler") is None
    f = _find(d, "load_imbalance")
    assert f is not None and d.findings[0].kind == "load_imbalance" and f.ranks == [0, 1, 2, 3]
    m = f.evidence["metrics"]
    assert m["waited_in_collectives"]["value"] == pytest.approx(6 * EXTRA)  # rank 3, the rank that waited most
    assert [m[f"steps_rank_{r}_was_waited_for"]["value"] for r in range(RANKS)] == [2, 2, 2, 1]
    # the replay gives back exactly the waits: every later event of the rank moves up by them
    assert f.gain_alone_pct == pytest.approx(m["waited_share"]["value"], abs=0.05)
    assert d.cross_rank["straggler_persistent"] is False


def test_ranks_late_in_turn_without_more_work_are_paused_hosts_not_load_imbalance(tmp_path):
    # the same waits as the rotating job (rank 3 waits 3 ms in 6 of the 7 analysed steps), but the late rank of each
    # step computes 8 ms like the others, launched 3 ms late: its extra computation accounts for none of the
    # lateness (0 of 3 ms a step): transient stragglers whose hosts paused (the garbage collector), priced the same
    d = diagnose(_job(tmp_path, rotating=True, paused=True))
    assert _find(d, "load_imbalance") is None
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [0, 1, 2, 3]
    m = f.evidence["metrics"]
    assert m["lateness_from_extra_compute"]["value"] == pytest.approx(0.0)
    assert m["lateness_from_gpu_idle"]["value"] == pytest.approx(100.0)  # its GPU waited 3 ms more for its host
    assert m["waited_in_collectives"]["value"] == pytest.approx(6 * EXTRA)
    assert f.gain_alone_pct == pytest.approx(m["waited_share"]["value"], abs=0.05)
    assert "garbage collector" in f.recommendation
    # with the extra work instead, all of the lateness is extra computation: unequal work
    (tmp_path / "work").mkdir()
    d = diagnose(_job(tmp_path / "work", rotating=True))
    f = _find(d, "load_imbalance")
    assert f is not None and f.evidence["metrics"]["lateness_from_extra_compute"]["value"] == pytest.approx(100.0)


def test_ranks_late_in_turn_because_of_their_own_collections_are_told_the_collectors_fix(tmp_path):
    # the paused job with each pause recorded as the late rank's garbage collection (3 ms less 1 us): its collection
    # accounts for all of its lateness in each step, (EXTRA - 1) / EXTRA; the fix named is the collector's, the share
    # stated; without the collector's spans the lateness has no named cause (the job above)
    d = diagnose(_job(tmp_path, rotating=True, paused=True, paused_in="gc"))
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [0, 1, 2, 3]
    m = f.evidence["metrics"]
    assert m["lateness_from_gc"]["value"] == pytest.approx(100.0 * (EXTRA - 1) / EXTRA, abs=1e-3)
    assert m["lateness_from_extra_compute"]["value"] == pytest.approx(0.0)
    assert f.recommendation.startswith("The late ranks' own garbage collections in the steps they were late "
                                       "account for 100 % of their lateness") and "gc.freeze()" in f.recommendation
    (tmp_path / "plain").mkdir()
    f = _find(diagnose(_job(tmp_path / "plain", rotating=True, paused=True)), "straggler")
    assert "lateness_from_gc" not in f.evidence["metrics"] and not f.recommendation.startswith("The late ranks' own")


def test_the_same_rank_late_every_step_with_its_collections_recorded_is_told_the_collectors_fix(tmp_path):
    # rank 1 pauses 3 ms in its collector every step; the other ranks' traces have no collection: 0 in each step
    d = diagnose(_job(tmp_path, rotating=False, paused=True, paused_in="gc"))
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [1]
    assert f.evidence["metrics"]["lateness_from_gc"]["value"] == pytest.approx(100.0 * (EXTRA - 1) / EXTRA, abs=1e-3)
    assert f.recommendation.startswith("The late ranks' own garbage collections")


def test_ranks_late_in_turn_because_of_their_own_data_loading_are_told_the_loaders_fix(tmp_path):
    # the same pauses recorded as the late rank's DataLoader waits: the loaders' fix with the share, the stall's
    # own finding on each late rank beside it; the collector's spans absent, no GC share is said
    d = diagnose(_job(tmp_path, rotating=True, paused=True, paused_in="dataloader"))
    f = _find(d, "straggler")
    m = f.evidence["metrics"]
    assert m["lateness_from_dataloader"]["value"] == pytest.approx(100.0 * (EXTRA - 1) / EXTRA, abs=1e-3)
    assert "lateness_from_gc" not in m
    assert f.recommendation.startswith("The late ranks' own DataLoader waits in the steps they were late account "
                                       "for 100 % of their lateness") and "num_workers" in f.recommendation
    assert _find(d, "data_loader_stall") is not None


def test_the_same_rank_late_every_step_is_a_straggler(tmp_path):
    d = diagnose(_job(tmp_path, rotating=False))
    assert _find(d, "load_imbalance") is None
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [1] and d.findings[0].kind == "straggler"
    assert d.cross_rank["steps_each_rank_was_waited_for"] == {1: 7}
    m = f.evidence["metrics"]
    assert m["steps_it_was_waited_for"]["value"] == m["steps_with_waits"]["value"] == 7


def test_the_same_rank_late_every_step_with_the_same_work_is_a_late_host(tmp_path):
    # rank 1 launches its 8-ms GEMM 3 ms late in every step: a straggler (the same rank each step) whose lateness
    # no extra computation explains; the fix points at its host, not its GPU
    d = diagnose(_job(tmp_path, rotating=False, paused=True))
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [1] and _find(d, "load_imbalance") is None
    assert f.evidence["metrics"]["lateness_from_extra_compute"]["value"] == pytest.approx(0.0)
    assert f.recommendation.startswith("Rank 1 arrives late") and "thermal" not in f.recommendation
    (tmp_path / "work").mkdir()
    f = _find(diagnose(_job(tmp_path / "work", rotating=False)), "straggler")
    assert f.evidence["metrics"]["lateness_from_extra_compute"]["value"] == pytest.approx(100.0)
    assert "thermal" in f.recommendation


def test_late_behind_queued_device_work_is_not_a_paused_host(tmp_path):
    # rank 1 launches on time, but a 3-ms copy runs ahead of its GEMM every step: the same computation (0 % of the
    # lateness), its GPU busy, not idle (0 %): the fix points at the work queued ahead, not at its host
    d = diagnose(_job(tmp_path, rotating=False, queued=True))
    f = _find(d, "straggler")
    m = f.evidence["metrics"]
    assert f.ranks == [1] and m["lateness_from_extra_compute"]["value"] == pytest.approx(0.0)
    assert m["lateness_from_gpu_idle"]["value"] == pytest.approx(0.0)
    assert "queued ahead" in f.recommendation and "garbage" not in f.recommendation
    # taking turns the same way: not hosts paused (no GC advice), the ranks' unequal work
    (tmp_path / "turns").mkdir()
    d = diagnose(_job(tmp_path / "turns", rotating=True, queued=True))
    assert _find(d, "load_imbalance") is not None and _find(d, "straggler") is None


def test_a_small_imbalance_over_many_ranks_is_found(tmp_path):
    """8 ranks take turns being 1 ms late (7 % of the step): each causes the others' waits in 1 of the 7 analysed
    steps, 7 ms in all, under the straggler's bar (2 % of the window per other rank, ~13.6 ms); the ranks' mean
    wait, 7/8 ms per step (6 %), is over it."""
    d = diagnose(_job(tmp_path, rotating=True, ranks=8, extra=1_000.0))
    f = _find(d, "load_imbalance")
    assert f is not None and f.ranks == list(range(7)) and _find(d, "straggler") is None
    # the shown rank waited 1 ms in each analysed step where another was late: 6 of them (ranks 0-6) or 7 (rank 7)
    assert f.evidence["metrics"]["waited_in_collectives"]["value"] in (6_000.0, 7_000.0)


def test_two_ranks_taking_turns_are_not_a_straggler_of_the_majority(tmp_path):
    """2 ranks, late in turn: rank 0 in steps 0, 2, 4, 6 of the 7 analysed, a majority of 4; ranks taking turns at
    random give one of them 4 or more of 7 always (p = 1): load imbalance, no straggler."""
    d = diagnose(_job(tmp_path, rotating=True, ranks=2))
    assert d.cross_rank["steps_each_rank_was_waited_for"] == {0: 4, 1: 3}
    assert _find(d, "straggler") is None and _find(d, "load_imbalance") is not None


def test_a_group_of_ranks_late_every_step_is_a_slow_node_not_load_imbalance(tmp_path):
    """8 ranks; ranks 4-7 compute 3 ms longer in every step (a slow node), one of them 100 us more in turn, the last
    of its step: each is the last in 1 or 2 of the 7 analysed steps, which the laggard count reads as ranks taking
    turns. But the order of arrival holds: ranks 4-7 after ranks 0-3 in every step (p at the draws' floor, 1e-4),
    and the laggard is one of them in 7 of 7 steps: a straggler group, priced as the others' waits removed."""
    d = diagnose(_job(tmp_path, rotating=False, ranks=8, group=(4, 5, 6, 7)))
    assert _find(d, "load_imbalance") is None
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [4, 5, 6, 7] and d.findings[0].kind == "straggler"
    assert d.cross_rank["slow_ranks"] == [4, 5, 6, 7] and d.cross_rank["straggler_persistent"] is False
    m = f.evidence["metrics"]
    assert d.cross_rank["slow_ranks_p_value"] == pytest.approx(1e-4) and "p_value_arrival_order_random" in m
    assert m["waited_in_collectives"]["value"] == pytest.approx(7 * (EXTRA + JITTER))  # a rank of 0-3
    assert f.gain_alone_pct == pytest.approx(m["waited_share"]["value"], abs=0.05)
    assert f.recommendation.startswith("Ranks 4-7 arrived late") and "clocks" in f.recommendation
    assert F.rank_list([5, 0, 3, 4, 9]) == "0, 3-5, 9" and F.rank_list([7]) == "7"
    # the same group launching the same work late (their hosts): the cause named is the hosts'
    (tmp_path / "hosts").mkdir()
    f = _find(diagnose(_job(tmp_path / "hosts", rotating=False, ranks=8, group=(4, 5, 6, 7), paused=True)),
              "straggler")
    assert f.ranks == [4, 5, 6, 7] and "start late" in f.recommendation and "clocks" not in f.recommendation


def test_a_slow_pair_among_many_ranks_is_named_whole(tmp_path):
    """16 ranks; ranks 14 and 15 compute 3 ms longer in every step, the last in turn: rank 14 in 4 of the 7 analysed
    steps, which the laggard test alone calls one straggler (16 x P(X >= 4 | 7, 1/16) = 0.015); both are late in
    every step, and naming one would leave the other slow: the pair is named."""
    d = diagnose(_job(tmp_path, rotating=False, ranks=16, group=(14, 15)))
    assert d.cross_rank["steps_each_rank_was_waited_for"] == {14: 4, 15: 3}
    assert laggard_p_value(4, 7, 16) < 0.05
    f = _find(d, "straggler")
    assert f.ranks == [14, 15] and _find(d, "load_imbalance") is None


def test_traces_of_part_of_the_job_say_waits_may_be_for_untraced_ranks(tmp_path):
    """The slow-node job with only its fast ranks' traces (0-3 of 8): they arrive together and wait 3 ms in every
    all-reduce for ranks nobody traced, which reads as exposed communication; the traces' world size (8) says 4 ranks
    are missing, and every cross-rank finding carries the note, at medium confidence at most."""
    _job(tmp_path, rotating=False, ranks=8, group=(4, 5, 6, 7))
    for r in (4, 5, 6, 7):
        (tmp_path / f"rank{r}.json.gz").unlink()
    d = diagnose(tmp_path)
    note = "4 of the job's 8 ranks traced"
    assert any(note in n for n in d.notes)
    comm = _find(d, "exposed_comm")
    assert comm is not None and any(note in n for n in comm.notes) and comm.confidence in ("medium", "low")
    # every rank traced: no such note
    (tmp_path / "all").mkdir()
    assert not any("ranks traced" in n for n in diagnose(_job(tmp_path / "all", rotating=False, ranks=8,
                                                              group=(4, 5, 6, 7))).notes)


def test_slow_ranks_p_value_against_exact_enumeration():
    """3 ranks, 6 steps: rank 2 arrives last in every step, ranks 0 and 1 in alternating order. Friedman's statistic
    (sum of squared position sums) is 9^2 + 9^2 + 18^2 = 486; the exact p, over all 6^6 orderings, counted here; the
    function's 9,999 draws agree within their error (exact 378 / 46,656 = 0.0081: standard error ~0.0009)."""
    import itertools

    late = {s: {0: 10.0 * (s % 2), 1: 10.0 * (1 - s % 2), 2: 50.0} for s in range(6)}
    last = {s: (2, 50.0) for s in range(6)}
    perms = list(itertools.permutations((1, 2, 3)))
    hits = 0
    for pattern in itertools.product(perms, repeat=6):
        sums = np.sum(pattern, axis=0)
        hits += int((sums ** 2).sum() >= 486)
    exact = hits / len(perms) ** 6
    group, p = slow_ranks(late, last, 0.05)
    assert group == [2] and p == pytest.approx(exact, abs=0.003)
    # the same order, but the others waited for ranks 0 or 1 in most steps (a clock offset the alignment left
    # orders the arrivals, not the lateness that costs): no slow group
    assert slow_ranks(late, {s: (s % 2, 50.0) for s in range(6)}, 0.05)[0] == []
    # arrivals in a random order each step: no group, p large
    rng = np.random.default_rng(0)
    shuffled = {s: dict(zip(range(8), rng.permutation(8).astype(float))) for s in range(7)}
    group, p = slow_ranks(shuffled, {s: (0, 1.0) for s in range(7)}, 0.05)
    assert group == [] and p > 0.05
    # three of four ranks late: the odd one out is fast, its wait its own idle: no slow group of three
    late3 = {s: {0: 0.0, 1: 30.0 + s % 3, 2: 31.0 - s % 3, 3: 30.5} for s in range(7)}
    assert slow_ranks(late3, {s: (1, 1.0) for s in range(7)}, 0.05)[0] == []


@pytest.mark.parametrize("computing, late_steps, kind", [(False, (3,), "straggler"), (True, (2, 5), "straggler"),
                                                       (True, (3,), "load_imbalance")])
def test_one_ranks_pause_is_named_alone_beside_jitter_laggards(tmp_path, computing, late_steps, kind):
    """8 ranks compute 8 ms +-100 us a step; in step 3 rank 0's host spends 6 ms in its evaluation before launching:
    the others wait ~6 ms for it there, and 0.1 ms for whichever rank the jitter made last in the other steps. The
    laggard changes from step to step and rank 0 computes no more (paused hosts), but the waiting is rank 0's:
    rank 0 caused ~42 ms of it (6 ms x 7 ranks), each jitter laggard under 1.4 ms, under half the mean (~3.5 ms):
    rank 0 is named alone, with what only it does on its training thread. Computing (a 6-ms longer GEMM instead of
    the host's pause) in two steps: the same rank, a straggler of those steps doing work only it does, not load
    imbalance; in one step only, the largest draw of unequal work looks the same (a straggler must recur): load
    imbalance, still naming rank 0 alone."""
    import random

    rng = random.Random(0)
    builders = {r: TraceBuilder(rank=r, world_size=8) for r in range(8)}
    for s in range(STEPS):
        T = s * P
        extra = {r: 6_000.0 if r == 0 and s in late_steps else 0.0 for r in range(8)}
        host = {r: 0.0 if computing else extra[r] for r in range(8)}
        gemm = {r: C + rng.uniform(-100.0, 100.0) + (extra[r] if computing else 0.0) for r in range(8)}
        arrive = {r: T + 110 + host[r] + gemm[r] for r in range(8)}
        last = max(arrive.values())
        for r, b in builders.items():
            b.step(s, T, P)
            if host[r]:
                b.cpu("evaluate", T + 10, host[r], cat="user_annotation")
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 100 + host[r], T + 110 + host[r], gemm[r])
            b.launch(NCCL, T + 140 + host[r], arrive[r], last + AR - arrive[r],
                     **{"Collective name": "allreduce", "Process Group Name": "0"})
            b.cpu("cudaDeviceSynchronize", T + 300 + host[r], last + AR + 5 - (T + 300 + host[r]), cat="cuda_runtime")
    for r, b in builders.items():
        b.write(tmp_path / f"rank{r}.json.gz")
    d = diagnose(tmp_path)
    assert d.cross_rank["straggler_persistent"] is False and len(d.cross_rank["steps_each_rank_was_waited_for"]) > 1
    f = _find(d, kind)
    assert f is not None and f.ranks == [0] and _find(d, "load_imbalance" if kind == "straggler" else "straggler") is None
    if kind == "straggler":
        start = "Rank 0 holds the others" if computing else "Rank 0 arrives late"
        assert f.recommendation.startswith(start) and "garbage collector" not in f.recommendation


def test_many_steps_take_friedmans_chi_square_which_agrees_with_the_draws(monkeypatch):
    """A trace without steps has a block per collective: thousands, whose permutations would hold billions of
    positions. From FRIEDMAN_CHI2_MIN_BLOCKS blocks on, scipy's chi-square approximation; just below, the draws and
    the approximation agree (19 steps of 8 ranks, one rank 0.5 sd later: 0.633 drawn, 0.628 approximated)."""
    from trainperf.diagnose import crossrank

    x = np.random.default_rng(1).normal(size=(19, 8))
    x[:, 7] += 0.5
    drawn = crossrank.arrival_order_p_value(x)
    monkeypatch.setattr(crossrank, "FRIEDMAN_CHI2_MIN_BLOCKS", 2)
    assert crossrank.arrival_order_p_value(x) == pytest.approx(drawn, abs=0.02)
    monkeypatch.undo()
    late = np.random.default_rng(2).normal(size=(2000, 64))
    assert crossrank.arrival_order_p_value(late) > 0.05               # no lasting order
    late[:, 60:] += 1.0                                                  # four ranks 1 sd later in every block
    assert crossrank.arrival_order_p_value(late) < 1e-6
    assert crossrank.arrival_order_p_value(np.zeros((30, 5))) == 1.0    # every block tied


def test_laggard_p_value_by_hand():
    # P(one given rank is last in all 7 steps | 2 ranks at random) = 1/128; times 2 ranks: 1/64
    assert laggard_p_value(7, 7, 2) == pytest.approx(1 / 64)
    # 4 ranks, 7 of 7: 4 x (1/4)^7; 2 of 7 is what turns give
    assert laggard_p_value(7, 7, 4) == pytest.approx(4 / 4 ** 7)
    assert laggard_p_value(2, 7, 4) == 1.0
    assert persistent_laggard(7, 7, 2, 0.05) and not persistent_laggard(4, 7, 2, 0.05)
    # 5 steps of 2 ranks cannot pass the test (p >= 1/16): the majority decides
    assert persistent_laggard(4, 5, 2, 0.05) and not persistent_laggard(2, 5, 2, 0.05)


def test_laggards_name_per_step_the_rank_the_others_waited_for_most():
    def c(seq, last, waits):
        return MatchedCollective("0/all_reduce", seq, {}, waits, last)
    # step 0: rank 1 made the others wait 5 ms in two collectives, rank 0 2 ms in one; step 1: nobody waited
    cs = [c(0, 1, {0: 2000.0, 1: 0.0}), c(1, 0, {0: 0.0, 1: 2000.0}), c(2, 1, {0: 3000.0, 1: 0.0}),
          c(3, 0, {0: 0.0, 1: 0.0})]
    steps = {0: 0, 1: 0, 2: 0, 3: 1}
    assert laggards(cs, lambda x: steps[x.seq]) == {0: (1, 5000.0)}


@pytest.mark.parametrize("paused, kind", [(True, "straggler"), (False, "load_imbalance")])
def test_without_profiler_steps_the_work_before_each_collective_decides(tmp_path, paused, kind):
    # the same jobs profiled without prof.step(): each collective is its own step, and the computation each rank ran
    # since its previous collective (crossrank.compute_before_collectives) is compared instead of the step's
    import json

    from trainperf.corpus.formats import no_profiler_steps
    from trainperf.corpus.kineto import read_events

    (tmp_path / "src").mkdir()
    (tmp_path / "flat").mkdir()
    _job(tmp_path / "src", rotating=True, paused=paused)
    for r in range(RANKS):
        doc = no_profiler_steps(read_events(tmp_path / "src" / f"rank{r}.json.gz"), r)
        (tmp_path / "flat" / f"rank{r}.json").write_text(json.dumps(doc))
    d = diagnose(tmp_path / "flat")
    f = _find(d, kind)
    assert f is not None and _find(d, "load_imbalance" if paused else "straggler") is None
    assert f.evidence["metrics"]["lateness_from_extra_compute"]["value"] == pytest.approx(0.0 if paused else 100.0)


def test_lateness_share_by_hand():
    from trainperf.diagnose.crossrank import lateness_share
    # 3 ranks. Step 1: rank 0 made the 2 others wait 6 ms in all (3 ms each), computing 1 ms more than their median
    # (11 vs 10): 1 of 3 ms. Step 2: rank 2 late by 2 ms each (4 ms summed) with 5 ms more (capped at 2): 2 of 2.
    # Step 3 is not in every rank's steps: left out. (1 + 2) / (3 + 2) = 0.6
    per = {0: {1: 11.0e3, 2: 10.0e3}, 1: {1: 10.0e3, 2: 10.0e3, 3: 1.0}, 2: {1: 10.0e3, 2: 15.0e3}}
    last = {1: (0, 6000.0), 2: (2, 4000.0), 3: (1, 9000.0)}
    assert lateness_share(last, per, 3) == pytest.approx(0.6)
    assert lateness_share({3: (1, 9000.0)}, per, 3) is None  # no comparable step


def test_overlapping_hides_a_collectives_transfer_not_its_wait_for_a_late_rank(tmp_path):
    # rotating 200 us: in each step three ranks wait 200 us for the late one, 150 us a rank and step on average, ~1 %
    # of the 14-ms step: under the load-imbalance bar (STRAGGLER_MIN_WAIT_PCT), so no finding names the waits. The
    # all-reduce is exposed (nothing overlaps it), and overlapping it would hide its 300-us transfer, 300 / 14,000 =
    # 2.14 % of the step; the wait for the late rank's data stays (it arrives when that rank is done), which the
    # one-rank replay credited to overlapping before (3.37 %, medium, ranked above the host's 39 %)
    d = diagnose(_job(tmp_path, rotating=True, extra=200.0))
    kinds = [f.kind for f in d.findings]
    assert "load_imbalance" not in kinds and "straggler" not in kinds
    exposed = next(f for f in d.findings if f.kind == "exposed_comm")
    assert exposed.gain_pct == pytest.approx(100 * AR / P, abs=0.05)
    assert exposed.severity == "low" and kinds.index("exposed_comm") > kinds.index("host_work")


def test_late_ranks_that_receive_more_of_the_all_to_all_are_told_their_experts_draw_more_tokens(tmp_path):
    # an expert-parallel layer a step, no shapes recorded: the late rank's GEMM runs 11 ms where the others' run 8,
    # and its dispatch delivered it 11/8 of the others' tokens; with the combine's equal share, (11/8 + 1) / 2 = 1.1875x
    # the others' all-to-all data (routing.RoutingEvidence), whose excess, doubled (the combine's half), is all of its
    # 3/8 extra computation. Turn by turn: load_imbalance with the experts'
    # balancing; one rank every step: a straggler, the same. A slower GPU receives what the others do: 1.00x, not named
    for name in ("turns", "hot", "tables", "slow_gpu"):
        (tmp_path / name).mkdir()
    d = diagnose(_job(tmp_path / "turns", rotating=True, routed="tokens"))
    f = _find(d, "load_imbalance")
    m = f.evidence["metrics"]
    assert m["all_to_all_received_vs_others"]["value"] == pytest.approx(1.1875, abs=1e-3)
    assert m["extra_compute_from_routed_tokens"]["value"] == pytest.approx(100.0)
    assert "received 1.19x the other ranks' all-to-all data" in f.recommendation and "EPLB" in f.recommendation
    d = diagnose(_job(tmp_path / "hot", rotating=False, routed="tokens"))
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [1] and "Rank 1 received 1.19x" in f.recommendation
    # the same with the lookups of sharded embedding tables (FBGEMM's kernels) as the work: the shards' balancing
    d = diagnose(_job(tmp_path / "tables", rotating=False, routed="tokens",
                      kernel="split_embedding_codegen_forward_unweighted_kernel"))
    f = _find(d, "straggler")
    assert "more lookups are sent to the embedding shards" in f.recommendation and "sharding" in f.recommendation
    d = diagnose(_job(tmp_path / "slow_gpu", rotating=False, routed="equal"))
    f = _find(d, "straggler")
    assert f is not None and f.ranks == [1]
    assert f.evidence["metrics"]["all_to_all_received_vs_others"]["value"] == pytest.approx(1.0, abs=1e-3)
    assert f.evidence["metrics"]["extra_compute_from_routed_tokens"]["value"] == pytest.approx(0.0)
    assert "all-to-all data" not in f.recommendation
