"""trainperf compare on real runs of the reference trainer (tiny model, 16 steps): the same samples
summed in another order are equivalent, a 10x learning rate diverges, another seed is not comparable."""

import pytest

from trainperf.compare import compare_runs
from trainperf.train.trainer import TrainConfig, train


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp")
    out = {}
    for name, kw in {"a": {}, "order": {"layout": "mbs=2,ga=1"}, "lr10": {"lr": 3e-2}, "seed1": {"seed": 1}}.items():
        cfg = dict(model="tiny", steps=16, out=str(tmp / name), progress=False, record=False, peak_tflops=1.0,
                   layout="mbs=1,ga=2", eval_every=8, eval_batches=1)
        cfg.update(kw)
        train(TrainConfig(**cfg))
        out[name] = str(tmp / name)
    return out


def test_summation_order_is_equivalent(runs):
    c = compare_runs(runs["a"], runs["order"])
    assert c.numerics.verdict == "equivalent"
    assert c.numerics.changed["layout"][1].startswith("tp=1,pp=1,dp=1")  # what differs is listed
    assert c.numerics.eval_loss is not None and c.numerics.time_to_target["A"] is not None


def test_ten_times_the_learning_rate_diverges(runs):
    c = compare_runs(runs["a"], runs["lr10"])
    assert c.numerics.verdict.startswith("diverges at step")
    assert c.headline.endswith(c.numerics.verdict)


def test_another_seed_is_not_comparable(runs):
    assert compare_runs(runs["a"], runs["seed1"]).numerics.verdict == "not comparable (different seed 0 vs 1)"
