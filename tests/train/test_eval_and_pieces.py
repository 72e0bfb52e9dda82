"""--eval-every: the held-out loss on the fixed split, driven through the trainer's pieces
(setup / train_step / finish), against the loss computed by hand on the text's last windows."""

import json
import math

import numpy as np
import pytest
import torch

from trainperf.train.data import HOLDOUT_FRACTION, read_byte_tokens, shipped_text_path
from trainperf.train.trainer import TrainConfig, finish, setup, train_step


def test_eval_loss_is_the_loss_on_the_held_out_tail(tmp_path):
    cfg = TrainConfig(model="tiny", steps=4, out=str(tmp_path), progress=False, record=False, peak_tflops=1.0,
                      eval_every=2, eval_batches=2, layout="mbs=2")
    run = setup(cfg)
    recs = [train_step(run, step) for step in range(1, 5)]
    assert [r.get("eval_loss") is not None for r in recs] == [False, True, False, True]
    assert all(r["eval_s"] > 0 for r in recs if "eval_loss" in r)
    # by hand: the held-out split is the last 5% of the 128-token windows of the shipped text
    tokens = read_byte_tokens([shipped_text_path()]).astype(np.int64)
    n_total = (len(tokens) - 1) // 128
    first = n_total - max(1, round(HOLDOUT_FRACTION * n_total))
    wins = torch.from_numpy(np.stack([tokens[(first + j) * 128:(first + j) * 128 + 129] for j in range(4)]))
    with torch.no_grad():
        by_hand = 0.5 * (run.model(wins[:2, :-1], wins[:2, 1:]) + run.model(wins[2:, :-1], wins[2:, 1:]))
    assert recs[-1]["eval_loss"] == pytest.approx(float(by_hand), rel=1e-6)
    assert recs[1]["eval_loss"] > recs[-1]["eval_loss"]  # it learns
    assert recs[-1]["eval_loss"] < math.log(256)
    result = finish(run)
    assert result["final_eval_loss"] == recs[-1]["eval_loss"]
    assert "Held-out loss" in (tmp_path / "report.html").read_text()
    comparable = json.loads((tmp_path / "run.json").read_text())["comparable"]
    assert comparable["seed"] == 0 and comparable["samples_per_step"] == 2 and len(comparable["data"]) == 64
    assert comparable["stack"] == "pytorch-fsdp" and comparable["eval_batches"] == 2
