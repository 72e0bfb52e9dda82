"""Token streams: data-parallel sharding, windows, errors."""

import itertools

import pytest
import torch

from trainperf.errors import TrainperfError
from trainperf.train.data import RankSampler, SyntheticTokens, TextWindows, read_byte_tokens, shipped_text_path


def test_dp_ranks_read_what_one_rank_reads_with_a_larger_micro_batch():
    one = list(itertools.islice(RankSampler(0, 1, 4, 0), 12))
    r0 = list(itertools.islice(RankSampler(0, 2, 2, 0), 6))
    r1 = list(itertools.islice(RankSampler(1, 2, 2, 0), 6))
    for step in range(3):  # step t: one rank's batch == union of the two ranks' batches
        assert sorted(one[4 * step:4 * step + 4]) == sorted(r0[2 * step:2 * step + 2] + r1[2 * step:2 * step + 2])
    # resuming at a position continues the same sequence
    assert list(itertools.islice(RankSampler(1, 2, 2, 4), 2)) == r1[4:6]


def test_text_windows_shift_and_cover_an_epoch():
    tokens = read_byte_tokens([shipped_text_path()])
    assert tokens.size > 150_000
    ds = TextWindows(tokens, seq_len=64, seed=3)
    x, y = ds[5]
    assert torch.equal(x[1:], y[:-1])
    starts = set()
    for g in range(ds.n_windows):
        x, _ = ds[g]
        starts.add(bytes(x.to(torch.uint8).numpy())[:64])
    assert len(starts) == ds.n_windows  # every window exactly once per epoch
    assert not torch.equal(ds[ds.n_windows][0], ds[0][0]) or ds.n_windows == 1  # reshuffled next epoch


def test_synthetic_tokens_are_a_function_of_the_index():
    ds = SyntheticTokens(vocab=1000, seq_len=16, seed=1)
    assert torch.equal(ds[7][0], ds[7][0]) and not torch.equal(ds[7][0], ds[8][0])
    assert int(ds[7][0].max()) < 1000


def test_bad_text_path_is_named(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(TrainperfError, match="nope.txt"):
        read_byte_tokens([missing])
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(TrainperfError, match="empty"):
        read_byte_tokens([empty])


def test_worker_processes_give_the_same_batches_from_a_position():
    from trainperf.train.data import DataConfig, make_dataset, make_loader

    def first_batches(workers, position):
        cfg = DataConfig(num_workers=workers, prefetch_factor=2)
        it = iter(make_loader(make_dataset(cfg, 256, 32), cfg, dp_rank=1, dp=2, mbs=2, position=position,
                              pin_memory=False))
        return [next(it) for _ in range(3)]

    ref = first_batches(0, 0)
    for (x0, y0), (x1, y1) in zip(ref, first_batches(2, 0)):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
    resumed = first_batches(0, 2)  # position = samples consumed: 2 = one micro-batch of 2
    assert torch.equal(resumed[0][0], ref[1][0])
