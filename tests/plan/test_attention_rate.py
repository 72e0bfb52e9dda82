"""Flash attention's rate is tied to the GEMM rate of the same part (plan/efficiency.resolve).

References: the FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608, Fig. 5: forward,
causal, head dim 128, bf16, H100 SXM5) measures cuDNN flash attention at 539 TFLOP/s at 16K
tokens; a large bf16 GEMM (8192^3) runs at ~790 TFLOP/s on the same 132-SM Hopper die
(/work/shared/facts.md, measured on an H200). Both run on the same tensor cores at the same
clock, so their ratio, 539 / 790, is a property of the kernels that holds whatever clock or
GEMM efficiency a training run sustains.
"""

import pytest

from trainperf.hardware import catalog, get_accelerator
from trainperf.plan.efficiency import Efficiency, resolve

CUDNN_CAUSAL_HD128_16K_TFLOPS = 539.0  # FA3 paper, Fig. 5
GEMM_8192_TFLOPS = 790.0  # facts.md, bf16 8192^3 on H200 (same SMs and peak as H100 SXM)
HOPPER = ("h100", "h200", "h800", "h20")


def test_hopper_attention_is_the_published_share_of_the_gemm_rate():
    ratio = CUDNN_CAUSAL_HD128_16K_TFLOPS / GEMM_8192_TFLOPS  # 0.682
    parts = [a for a in catalog().values() if a.family in HOPPER]
    assert len(parts) >= 6  # sxm, pcie, nvl, 96gb, h200, h800, h20
    for acc in parts:
        # one ratio for every Hopper part, whatever clock its board power lets it hold
        assert acc.attn_eff / acc.gemm_eff == pytest.approx(ratio, abs=0.005), acc.name


def test_attention_moves_with_the_gemm_efficiency():
    acc = get_accelerator("h100")
    # hand-worked: the catalog's pair (0.664, 0.452) at a GEMM efficiency of 0.60 -> 0.452 x 0.60 / 0.664
    out = resolve(Efficiency(gemm_eff_max=0.60), acc)
    assert out.attn_eff == pytest.approx(acc.attn_eff * 0.60 / acc.gemm_eff, rel=1e-12)
    assert out.attn_eff == pytest.approx(0.4084, abs=1e-3)
    # FlashAttention-2 on the same tensor cores moves the same way
    fa2 = resolve(Efficiency(gemm_eff_max=0.60), acc, "fa2")
    assert fa2.attn_eff == pytest.approx(acc.fa2_eff * 0.60 / acc.gemm_eff, rel=1e-12)
    # at the catalog's own GEMM efficiency nothing moves
    assert resolve(Efficiency(), acc).attn_eff == pytest.approx(acc.attn_eff, rel=1e-12)


def test_an_attention_fraction_stated_is_kept():
    acc = get_accelerator("h100")
    assert resolve(Efficiency(gemm_eff_max=0.60, attn_eff=0.55), acc).attn_eff == 0.55
