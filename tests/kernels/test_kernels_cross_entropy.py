"""Cross-entropy and fused linear cross-entropy vs torch.nn.functional.cross_entropy (fp64) and edge cases."""

import pytest
import torch
import torch.nn.functional as F

import trainperf.kernels as K
from trainperf.errors import TrainperfError
from trainperf.kernels import linear_cross_entropy as flce_module
from trainperf.kernels import reference as R
from kernel_checks import check_bf16_no_worse_than_eager, check_fp32_against_fp64


def _targets(rows, vocab, seed, n_ignored=0):
    t = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed))
    t[:n_ignored] = -100
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_matches_torch_fp64(reduction, smoothing):
    rows, vocab = 37, 301
    t = _targets(rows, vocab, 1, n_ignored=3)
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2)) * 4
    check_fp32_against_fp64(
        lambda x: K.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing),
        lambda x: F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing), [x])


def test_z_loss_matches_hand_formula():
    # z-loss (PaLM): z * logsumexp(x)^2 added per non-ignored row; reference built from torch.logsumexp.
    t = _targets(20, 50, 3, n_ignored=2)
    x = torch.randn(20, 50, generator=torch.Generator().manual_seed(4))
    ref = lambda x: R.cross_entropy(x, t, z_loss=1e-2, label_smoothing=0.05)  # noqa: E731
    check_fp32_against_fp64(lambda x: K.cross_entropy(x, t, z_loss=1e-2, label_smoothing=0.05), ref, [x])


def test_cross_entropy_never_overwrites_logits_and_handles_large_logits():
    x = torch.randn(8, 1000, generator=torch.Generator().manual_seed(5)) * 1e3  # logsumexp far beyond exp range
    t = _targets(8, 1000, 6)
    before = x.clone()
    xg = x.clone().requires_grad_()
    loss = K.cross_entropy(xg, t)
    loss.backward()
    assert torch.equal(xg.detach(), before)
    x64 = before.double().requires_grad_()
    ref = F.cross_entropy(x64, t)
    ref.backward()
    torch.testing.assert_close(loss.double(), ref, atol=1e-3, rtol=1e-6)
    torch.testing.assert_close(xg.grad.double(), x64.grad, atol=1e-6, rtol=1e-4)


def test_all_ignored_gives_zero_loss_and_zero_grad():
    # PyTorch returns NaN (0/0) here; we return 0 so one empty micro-batch cannot poison training.
    x = torch.randn(4, 10, requires_grad=True)
    t = torch.full((4,), -100)
    loss = K.cross_entropy(x, t)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(x.grad) == 0
    assert torch.isnan(F.cross_entropy(x.detach(), t))


def test_custom_ignore_index_one_row_and_bf16():
    x = torch.randn(1, 17)
    t = torch.tensor([3])
    torch.testing.assert_close(K.cross_entropy(x, t, ignore_index=3), torch.tensor(0.0))
    torch.testing.assert_close(K.cross_entropy(x, t, ignore_index=0), F.cross_entropy(x, t))
    t2 = _targets(30, 257, 7, n_ignored=4)
    x2 = torch.randn(30, 257, generator=torch.Generator().manual_seed(8)) * 3
    check_bf16_no_worse_than_eager(lambda x: K.cross_entropy(x, t2), lambda x: R.cross_entropy(x, t2), [x2])


def test_bad_input_is_a_user_error():
    with pytest.raises(TrainperfError, match="outside"):
        K.cross_entropy(torch.randn(3, 5), torch.tensor([0, 5, 1]))
    with pytest.raises(TrainperfError, match="reduction"):
        K.cross_entropy(torch.randn(3, 5), torch.tensor([0, 1, 1]), reduction="avg")
    with pytest.raises(TrainperfError, match="shape"):
        K.cross_entropy(torch.randn(3, 5), torch.tensor([0, 1]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_linear_cross_entropy_matches_unfused_fp64(reduction, monkeypatch):
    # Force several row chunks (4 rows each, last one partial) so chunk boundaries are exercised.
    monkeypatch.setattr(flce_module, "chunk_rows", lambda n, h, v: 4)
    rows, hidden, vocab = 19, 24, 300
    t = _targets(rows, vocab, 9, n_ignored=3)
    g = torch.Generator().manual_seed(10)
    h, w = torch.randn(rows, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.3
    check_fp32_against_fp64(
        lambda h, w: K.fused_linear_cross_entropy(h, w, t, reduction=reduction, label_smoothing=0.1, z_loss=1e-3),
        lambda h, w: R.linear_cross_entropy(h, w, t, reduction=reduction, label_smoothing=0.1, z_loss=1e-3), [h, w])


def test_fused_linear_cross_entropy_bf16_and_no_grad_path():
    rows, hidden, vocab = 32, 16, 200
    t = _targets(rows, vocab, 11, n_ignored=2)
    g = torch.Generator().manual_seed(12)
    h, w = torch.randn(rows, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.3
    check_bf16_no_worse_than_eager(lambda h, w: K.fused_linear_cross_entropy(h, w, t),
                                   lambda h, w: R.linear_cross_entropy(h, w, t), [h, w])
    with torch.no_grad():
        torch.testing.assert_close(K.fused_linear_cross_entropy(h, w, t), F.cross_entropy(h @ w.t(), t),
                                   atol=1e-5, rtol=1e-5)


def test_chunk_size_bounds_the_logits_buffer():
    # About 4x as many logits per chunk as hidden-state elements, at least 1024 rows (or all rows).
    assert flce_module.chunk_rows(8192, 4096, 128256) == 1024
    assert flce_module.chunk_rows(100, 4096, 128256) == 100
    assert flce_module.chunk_rows(65536, 8192, 32000) == 65536
    assert flce_module.chunk_rows(65536, 2048, 256000) == 2048
