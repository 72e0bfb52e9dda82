"""hardware catalog: the accelerators the issue asks for, lookups and errors."""

import pytest

from trainperf.errors import TrainperfError
from trainperf.hardware import catalog, get_accelerator


def test_required_accelerators_present():
    names = set(catalog())
    for need in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "gb200", "mi300x", "mi325x",
                 "tpu-v5p", "gaudi3"):
        assert need in names


def test_datasheet_figures_and_units():
    h100 = get_accelerator("h100")
    # NVIDIA H100 SXM datasheet: 989.4 dense bf16 TFLOP/s, 1979 fp8, 80 GB (= 80 GiB: 81,559 MiB in nvidia-smi)
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp8") == pytest.approx(1978.9e12)
    assert h100.hbm_bytes == 80 * 2**30
    # A100 has no fp8: falls back to bf16
    assert get_accelerator("a100").peak_flops("fp8") == pytest.approx(312e12)
    for acc in catalog().values():
        assert 0.3 <= acc.gemm_eff <= 0.95 and 0.2 <= acc.attn_eff <= 0.9


def test_aliases_and_paper_names():
    assert get_accelerator("H100-SXM 80GB (DGX H100)").name == "h100-sxm"
    assert get_accelerator("A100-SXM4-80GB (Selene)").name == "a100-80gb"


def test_unknown_gpu_lists_names():
    with pytest.raises(TrainperfError, match="known: .*h100-sxm"):
        get_accelerator("v100x")


def test_device_names_as_drivers_report_them():
    # reference: torch.cuda.get_device_name() strings seen on these parts
    from trainperf.hardware import accelerator_for_device

    assert accelerator_for_device("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert accelerator_for_device("NVIDIA H100 PCIe").name == "h100-pcie"
    assert accelerator_for_device("NVIDIA H200").name == "h200"
    assert accelerator_for_device("NVIDIA A100-SXM4-40GB").name == "a100-40gb"
    assert accelerator_for_device("AMD Instinct MI300X").name == "mi300x"
    assert accelerator_for_device("Tesla V100-SXM2-16GB") is None
