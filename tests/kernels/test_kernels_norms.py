"""RMSNorm and LayerNorm kernels vs PyTorch references (trainperf.kernels.reference, F.layer_norm) in fp64."""

import pytest
import torch

import trainperf.kernels as K
from trainperf.kernels import _runtime
from trainperf.kernels import reference as R
from kernel_checks import check_bf16_no_worse_than_eager, check_fp32_against_fp64

SHAPES = [(1, 1), (1, 7), (37, 200), (3, 5, 96), (130, 33)]  # one row, odd and non-power-of-two hidden


@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_fp32_matches_fp64_reference(shape):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
    check_fp32_against_fp64(lambda x, w: K.rms_norm(x, w, 1e-6), lambda x, w: R.rms_norm(x, w, 1e-6), [x, w])


@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_fp32_matches_fp64_reference(shape):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=g) * 3 + 5  # a large mean tests the two-pass variance
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    check_fp32_against_fp64(lambda x, w, b: K.layer_norm(x, w, b, 1e-5),
                            lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5), [x, w, b])


def test_layer_norm_without_bias():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 50, generator=g), torch.randn(50, generator=g)
    check_fp32_against_fp64(lambda x, w: K.layer_norm(x, w, None, 1e-5),
                            lambda x, w: torch.nn.functional.layer_norm(x, (50,), w, None, 1e-5), [x, w])


def test_norms_bf16_as_accurate_as_eager_bf16():
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(64, 300, generator=g), torch.randn(300, generator=g), torch.randn(300, generator=g)
    check_bf16_no_worse_than_eager(lambda x, w: K.rms_norm(x, w, 1e-6), lambda x, w: R.rms_norm(x, w, 1e-6), [x, w])
    check_bf16_no_worse_than_eager(lambda x, w, b: K.layer_norm(x, w, b, 1e-5),
                                   lambda x, w, b: R.layer_norm(x, w, b, 1e-5), [x, w, b])


def test_looped_wide_row_path_matches(monkeypatch):
    # Shrink the register budget so rows of 300 take the chunked (hidden > budget) kernels.
    monkeypatch.setattr(_runtime, "REGISTER_BUDGET_ELEMS", 256)
    assert not _runtime.row_tile(8, 300, live=2)[2]
    g = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(19, 300, generator=g), torch.randn(300, generator=g), torch.randn(300, generator=g)
    check_fp32_against_fp64(lambda x, w: K.rms_norm(x, w, 1e-6), lambda x, w: R.rms_norm(x, w, 1e-6), [x, w])
    check_fp32_against_fp64(lambda x, w, b: K.layer_norm(x, w, b, 1e-5),
                            lambda x, w, b: torch.nn.functional.layer_norm(x, (300,), w, b, 1e-5), [x + 4, w, b])


def test_strided_rows_are_read_in_place():
    # A slice of a wider tensor (row stride 2*hidden) gives the same result as its contiguous copy.
    g = torch.Generator().manual_seed(6)
    wide = torch.randn(10, 128, generator=g, requires_grad=True)
    w = torch.randn(64, generator=g, requires_grad=True)
    view = wide[:, 32:96]
    assert not view.is_contiguous()
    y = K.rms_norm(view, w)
    torch.testing.assert_close(y, R.rms_norm(view.detach(), w.detach()), atol=1e-5, rtol=1e-5)
    y.sum().backward()
    ref_wide = wide.detach().clone().requires_grad_()
    R.rms_norm(ref_wide[:, 32:96], w.detach()).sum().backward()
    torch.testing.assert_close(wide.grad, ref_wide.grad, atol=1e-5, rtol=1e-5)


def test_module_keeps_weight_and_eps():
    norm = K.RMSNorm(16, eps=1e-5)
    assert norm.weight.shape == (16,) and norm.eps == 1e-5
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(norm(x), R.rms_norm(x, norm.weight.detach(), 1e-5))
    with pytest.raises(ValueError):
        K.rms_norm(x, torch.ones(15))
