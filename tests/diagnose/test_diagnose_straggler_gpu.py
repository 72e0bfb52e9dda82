"""GPU straggler when the collectives cannot be matched across ranks (point-to-point with partners outside
the trace): decided from each rank's computation per step against the other ranks' median.

Hand-built 2-rank trace (answer worked by hand): every 10 ms step launches one GEMM and one send/recv kernel
and then synchronizes; rank 0's GEMM takes 4 ms, rank 1's 6 ms. Rank 1 computes 1.5x the other rank's
median, 2 ms more per step; its compute at rank 0's pace ends every sync, and so every later launch, 2 ms
earlier: gain 2 ms per analysed step (alone; the syncs' own fix, priced first, takes part of it).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.crossrank import compute_per_step, compute_straggler, slowest_rank_p_value  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

P, STEPS = 10_000.0, 5


def _rank(path: Path, rank: int, gemm_us: float) -> None:
    b = TraceBuilder(rank=rank, world_size=2)
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.launch("sm80_xmma_gemm_f16f16_f16f32", T + 100, T + 110, gemm_us)
        b.launch("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", T + 200, T + 210, 50, stream=9)
        end = T + 110 + gemm_us
        b.cpu("cudaDeviceSynchronize", T + 300, end + 5 - (T + 300), cat="cuda_runtime")
    b.write(path / f"rank{rank}.json.gz")


def _job(tmp_path: Path, gemm_us: dict[int, float]) -> Path:
    for r, us in gemm_us.items():
        _rank(tmp_path, r, us)
    return tmp_path


def test_compute_per_step_is_the_compute_each_step_launched(tmp_path):
    t = load_trace(_job(tmp_path, {0: 4000.0, 1: 6000.0}))[1]
    per = compute_per_step(t, analysis_window(t))
    assert per and all(v == pytest.approx(6000.0) for v in per.values())  # the send/recv kernel is not compute


def test_the_median_of_the_other_ranks_is_the_reference():
    # three ranks: rank 2 computes 9 ms per step against the others' median (4 and 5 ms -> 4.5): ratio 2
    cs = compute_straggler({0: {1: 4000.0, 2: 4000.0}, 1: {1: 5000.0, 2: 5000.0}, 2: {1: 9000.0, 2: 9000.0}})
    assert cs.rank == 2 and cs.ratio == pytest.approx(2.0) and cs.extra_us == pytest.approx(2 * 4500.0)
    assert compute_straggler({0: {1: 4000.0}}) is None  # one rank: no reference


def test_the_slower_computing_rank_is_the_straggler_priced_at_the_others_pace(tmp_path):
    d = diagnose(_job(tmp_path, {0: 4000.0, 1: 6000.0}))
    f = next(x for x in d.findings if x.kind == "straggler")
    assert f.ranks == [1]
    m = f.evidence["metrics"]
    assert m["compute_vs_other_ranks"]["value"] == pytest.approx(1.5)
    # steps 0-3 are analysed (the window ends where the last ProfilerStep starts); rank 1's span runs from
    # step 0's start to step 3's end, 4 P; at rank 0's pace each of the 4 syncs ends 2 ms sooner, and the host's
    # time after it (no op: untraced) follows it
    assert f.steps == [0, 1, 2, 3]
    assert m["extra_compute"]["value"] == pytest.approx(4 * 2000.0)
    assert f.gain_alone_pct == pytest.approx(100 * 4 * 2000.0 / (4 * P), abs=0.02)


def test_ranks_that_compute_alike_have_no_straggler(tmp_path):
    d = diagnose(_job(tmp_path, {0: 4000.0, 1: 4040.0}))  # 1 % apart: noise, not a slow rank
    assert not [x for x in d.findings if x.kind == "straggler"]


def test_one_rank_of_facts_at_a_time_and_the_straggler_still_seen(tmp_path, monkeypatch):
    # a job holds every rank's event table but the replay graph of one rank at a time (api.diagnose: DeviceTiming
    # first, then each rank's facts, rules and gains): when a rank is analysed, no earlier rank's facts are alive
    import gc
    import weakref

    from trainperf.diagnose import api

    alive: list = []
    seen_alive: list[int] = []
    orig = api.analyse_rank

    def analyse_rank(f, *a, **k):
        gc.collect()
        seen_alive.append(sum(1 for r in alive if r() is not None))
        alive.append(weakref.ref(f))
        return orig(f, *a, **k)

    monkeypatch.setattr(api, "analyse_rank", analyse_rank)
    d = api.diagnose(_job(tmp_path, {0: 4000.0, 1: 6000.0, 2: 4000.0}))
    assert seen_alive == [0, 0, 0]
    assert next(x for x in d.findings if x.kind == "straggler").ranks == [1]


def test_the_slowest_rank_test_is_scipys_within_step_permutation_test():
    # reference: scipy.stats.permutation_test, permutation_type "samples" (each step's values shuffled among the
    # ranks, exact: (3!)^4 = 1,296 arrangements) with the same statistic; ours draws 9,999 of them
    from scipy.stats import permutation_test

    def statistic(*ranks, axis=-1):
        m = np.stack(ranks, axis=-1)
        z, k = m - m.mean(axis=-1, keepdims=True), m.shape[-2]
        return np.max([(z[..., k - n:, :].sum(axis=-2) / np.sqrt(n)).max(axis=-1) for n in range(2, k + 1)], axis=0)

    for seed in range(4):
        x = np.random.default_rng(seed).normal(size=(4, 3))
        x[:, 2] += 0.5 * seed  # rank 2 slower by 0, 0.5, 1, 1.5 standard deviations
        exact = permutation_test(tuple(x.T), statistic, permutation_type="samples", alternative="greater",
                                 n_resamples=np.inf, vectorized=True, axis=-1).pvalue
        assert slowest_rank_p_value(x) == pytest.approx(exact, abs=0.01)
    # one rank the slowest in all 4 steps of 4, by far: shuffles do that with chance 4 x (1/4)^4
    x = np.full((4, 4), 24000.0)
    x[:, 1] = 25440.0
    assert slowest_rank_p_value(x) == pytest.approx(1 / 64, abs=0.004)
    assert slowest_rank_p_value(np.full((4, 4), 24000.0)) == 1.0  # all alike: no rank stands out
