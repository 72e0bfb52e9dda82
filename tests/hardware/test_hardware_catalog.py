"""hardware catalog: the accelerators the issue asks for, lookups and errors."""

import pytest

from trainperf.errors import TrainperfError
from trainperf.hardware import catalog, get_accelerator


def test_required_accelerators_present():
    names = set(catalog())
    for need in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-nvl", "h100-96gb", "h800", "h20", "h200",
                 "b200", "b300", "gb200", "gb300", "mi250x", "mi300x", "mi325x", "mi355x", "l40s", "tpu-v5p", "gaudi3"):
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
        assert 0.3 <= acc.gemm_eff <= 1.0 and 0.2 <= acc.attn_eff <= 0.9


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
    assert accelerator_for_device("Tesla V100-SXM2-16GB").name == "v100-sxm2-16gb"
    assert accelerator_for_device("Tesla V100-PCIE-32GB").name == "v100-pcie"
    assert accelerator_for_device("Tesla T4").name == "t4"
    assert accelerator_for_device("NVIDIA A10G").name == "a10g"  # AWS's part: its own figures, not the A10's
    assert accelerator_for_device("NVIDIA A10").name == "a10"
    assert accelerator_for_device("NVIDIA L4").name == "l4" and accelerator_for_device("NVIDIA L40") is None
    assert accelerator_for_device("NVIDIA GeForce RTX 4090").name == "rtx-4090"


def test_device_names_with_board_codes():
    # "NVIDIA A100-PG509-200" is the name in HTA's public A100 traces; NVIDIA's driver README lists
    # it with PCI ID 20B0 10DE 1450, the A100-SXM4-40GB device (20B0).
    from trainperf.hardware import accelerator_for_device

    assert accelerator_for_device("NVIDIA A100-PG509-200").name == "a100-40gb"
    # an unlisted board code falls back to the model token before it, narrowed by what the name states
    assert accelerator_for_device("NVIDIA A100-PG506-232").family == "a100"
    assert accelerator_for_device("NVIDIA A100-PCIE-40GB").hbm_gb == 40
    assert accelerator_for_device("NVIDIA H100-PG520-200").family == "h100"
    assert accelerator_for_device("NVIDIA GeForce RTX 2080 Ti") is None


def test_community_parts_datasheet_figures():
    # datasheets: V100 SXM2 125 fp16 tensor / 15.7 fp32 TFLOP/s, 900 GB/s; T4 65 / 8.1, 320 GB/s; L4 242 sparse
    # (121 dense), 300 GB/s; A40 149.7 dense, 696 GB/s; RTX 4090 165.2 with fp32 accumulate, 1,008 GB/s (Ada white
    # paper); MI250 362.1 per OAM of two GCDs = 181 per device, 3.2 TB/s per OAM
    v100, t4, l4, a40, r4090, mi250 = (get_accelerator(n) for n in ("v100", "t4", "l4", "a40", "rtx-4090", "mi250"))
    assert (v100.peak_flops("fp16"), v100.peak_flops("fp32"), v100.hbm_tbps) == (125e12, 15.7e12, 0.9)
    assert (t4.peak_flops("fp16"), t4.peak_flops("fp32"), t4.hbm_tbps) == (65e12, 8.1e12, 0.32)
    assert (l4.peak_flops("bf16"), l4.hbm_tbps) == (121e12, 0.3)
    assert (a40.peak_flops("bf16"), a40.hbm_tbps) == (149.7e12, 0.696)
    assert r4090.peak_flops("bf16") == pytest.approx(330.3e12 / 2, rel=1e-3) and r4090.hbm_tbps == 1.008
    assert mi250.peak_flops("bf16") == pytest.approx(362.1e12 / 2, rel=1e-3) and mi250.hbm_tbps == 3.2 / 2


def test_parts_named_by_compute_units_and_memory():
    # HTA's MI250 trace (ROCm 6.2) names its device "AMD Radeon Graphics", with numSms 104 and totalGlobalMem
    # 68,702,699,520 B (63.98 GiB): one GCD of an MI250 (208 CUs per OAM), not of an MI250X (220)
    from trainperf.hardware import accelerator_for_properties

    assert accelerator_for_properties("AMD Radeon Graphics") is None
    assert accelerator_for_properties("AMD Radeon Graphics", 104, 68_702_699_520).name == "mi250"
    assert accelerator_for_properties("AMD Instinct MI250X / MI250", 104, 68_702_699_520).name == "mi250"
    assert accelerator_for_properties("AMD Instinct MI250X / MI250", 110, 68_702_699_520).name == "mi250x"
    assert accelerator_for_properties("", 304, 192 * 2**30 * 0.999).name == "mi300x"
    assert accelerator_for_properties("", 304, 256 * 2**30).name == "mi325x"
    # an MI350X and an MI355X have the same CUs and memory and differ in clock: not named
    assert accelerator_for_properties("", 256, 288 * 2**30) is None
    # rocprofv3 records no memory size: the CUs alone where one part has them (104: MI250), else none (304:
    # MI300X or MI325X, whose memory differs); MI300A datasheet: 228 CUs
    assert accelerator_for_properties("gfx90a", 104).name == "mi250"
    assert accelerator_for_properties("gfx942", 304) is None
    assert accelerator_for_properties("gfx942", 228).name == "mi300a"
    # the name says GH200 but not which memory (its size reads "144G"): the family's part with the device's memory
    # (GH200 datasheet: 96 GB HBM3 or 144 GB HBM3e, 132 SMs as the H100)
    assert accelerator_for_properties("NVIDIA GH200 480GB", 132, 96 * 2**30 * 0.99).name == "gh200"
    assert accelerator_for_properties("NVIDIA GH200 144G HBM3e", 132, 144 * 2**30 * 0.97).name == "gh200-144gb"
    # the vendor the name states: an NVIDIA device with an MI250 GCD's CUs and memory is not one
    assert accelerator_for_properties("NVIDIA Graphics Device", 104, 68_702_699_520) is None
    # a MIG slice reports fewer SMs and less memory than its part: the name decides
    assert accelerator_for_properties("NVIDIA H100 80GB HBM3", 16, 10 * 2**30).name == "h100-sxm"
    assert accelerator_for_properties("NVIDIA H100 80GB HBM3", 132, 85_520_809_984).name == "h100-sxm"


def test_published_variant_figures():
    # datasheets: H100 NVL 1671 sparse bf16 = 835.5 dense, 94 GB, 3.9 TB/s; H20 148 bf16, 96 GB, 4.0 TB/s;
    # H800 = H100 SXM compute with NVLink 400 GB/s bidirectional; L40S 362 dense bf16, 48 GB, 864 GB/s
    assert get_accelerator("h100-nvl").peak_flops() == pytest.approx(835.5e12)
    assert get_accelerator("h100-nvl").hbm_gb == 94 and get_accelerator("h100-nvl").hbm_tbps == 3.9
    h20 = get_accelerator("h20")
    assert h20.peak_flops() == pytest.approx(148e12) and h20.hbm_gb == 96 and h20.hbm_tbps == 4.0
    h800, h100 = get_accelerator("h800"), get_accelerator("h100")
    assert h800.peak_flops() == h100.peak_flops() and h800.scaleup_gbps == 200 == h100.scaleup_gbps * 400 / 900
    assert get_accelerator("l40s").hbm_tbps == 0.864 and get_accelerator("mi355x").hbm_gb == 288


@pytest.mark.parametrize("text,name,watts,gbit,fabric", [
    ("H100-SXM 80GB HBM3, 700W (Grand Teton), RoCE 400Gbps", "h100-sxm", 700.0, 400.0, "roce"),
    ("H100 96GB HBM2e, 500W power limit", "h100-96gb", 500.0, None, None),
    ("NVIDIA Ampere (A100)", "a100-80gb", None, None, None),
    ("A100 40GB", "a100-40gb", None, None, None),
    ("H100 NVL 94GB", "h100-nvl", None, None, None),
    ("GB300 NVL72", "gb300", None, None, None),
    ("H800, InfiniBand NDR 400 Gb/s, 8 GPUs per node", "h800", None, 400.0, "ib"),
    ("AMD Instinct MI250X", "mi250x", None, None, None),
])
def test_free_text_descriptions(text, name, watts, gbit, fabric):
    from trainperf.hardware import parse_gpu_description

    d = parse_gpu_description(text)
    assert (d.accelerator.name, d.power_cap_w, d.nic_gbit_per_gpu, d.fabric) == (name, watts, gbit, fabric)


def test_unknown_description_one_line_with_names():
    from trainperf.hardware import parse_gpu_description

    with pytest.raises(TrainperfError) as e:
        parse_gpu_description("Tesla P100 16GB, 250W")
    msg = str(e.value)
    assert "\n" not in msg and "known: " in msg and "h100-sxm" in msg and "mi355x" in msg


def test_power_cap_lowers_the_clock_by_the_cube_root():
    from trainperf.hardware import clock_scale
    from trainperf.plan.estimate import estimate
    from trainperf.specs import Layout, load_model, make_cluster

    h100 = get_accelerator("h100")
    assert clock_scale(h100, None) == 1.0 and clock_scale(h100, 800) == 1.0
    assert clock_scale(h100, 500) == pytest.approx((500 / 700) ** (1 / 3))  # P ~ f^3
    full = make_cluster("h100", 8)
    capped = make_cluster("H100 SXM, 500W", 8)
    assert capped.power_cap_w == 500 and capped.clock_scale < 1
    m, lay = load_model("llama3-8b"), Layout(zero=1)
    a, b = estimate(m, full, lay, 32), estimate(m, capped, lay, 32)
    assert b.breakdown["compute"] > a.breakdown["compute"] and b.breakdown["optimizer"] == a.breakdown["optimizer"]
    # a NIC rate in the description (Gb/s) becomes the scale-out GB/s per GPU
    assert make_cluster("H100-SXM 80GB, RoCE 200Gbps", 16).scaleout_gbps == 25.0
    assert make_cluster("h100", 16, nic_gbit_per_gpu=100).scaleout_gbps == 12.5


def test_tpu_generations_from_cloud_tpu_pages():
    # Cloud TPU system-architecture tables: v4 275 TFLOP/s, 32 GiB, 1.1 PB/s all-reduce per 4,096 chips;
    # v5e 197, 400 GB/s bidirectional ICI; v5p 459, 1,200 GB/s bidirectional ICI, DCN 50 Gb/s per chip;
    # v6e (Trillium) 918, 32 GB, 1,638 GB/s, 800 GB/s bidirectional ICI
    from trainperf.hardware import parse_gpu_description

    v4, v5e, v5p, v6e = (get_accelerator(n) for n in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"))
    assert (v4.bf16_tflops, v5e.bf16_tflops, v5p.bf16_tflops, v6e.bf16_tflops) == (275, 197, 459, 918)
    assert v4.scaleup_gbps == pytest.approx(1.1e15 / 4096 / 1e9, rel=0.01)
    assert (v5e.scaleup_gbps, v5p.scaleup_gbps, v6e.scaleup_gbps) == (400 / 2, 1200 / 2, 800 / 2)
    assert v5p.scaleout_gbps == 50 / 8
    assert parse_gpu_description("TPU v6e (Trillium)").accelerator.name == "tpu-v6e"
    assert get_accelerator("trillium").name == "tpu-v6e"
    assert parse_gpu_description("Cloud TPU v4").accelerator.name == "tpu-v4"


def test_sustained_clock_fraction_follows_board_power():
    from trainperf.hardware import sustained_clock_fraction

    # hand formula: (tdp / (400/312 W per TFLOP/s x peak))^(1/3), capped at 1; fixed-clock TPUs: 1
    h100 = get_accelerator("h100")
    assert sustained_clock_fraction(h100) == pytest.approx((700 / (400 / 312 * 989.4)) ** (1 / 3))
    assert sustained_clock_fraction(get_accelerator("a100")) == 1.0
    assert sustained_clock_fraction(get_accelerator("tpu-v5p")) == 1.0
    assert sustained_clock_fraction(get_accelerator("gb200")) == pytest.approx((1200 / (400 / 312 * 2500)) ** (1 / 3))
    # measured reference (docs/benchmarks.md, ../shared/facts.md): a bf16 8192^3 GEMM on an H200 (700 W,
    # H100's 989 TFLOP/s) ran at ~790 TFLOP/s = 0.80 of peak; the power law gives 0.82 of the rated clock
    assert 790 / 989.4 == pytest.approx(sustained_clock_fraction(get_accelerator("h200")), abs=0.03)
    # a power cap below TDP lowers it further, a higher-TDP part of the same peak holds more
    assert sustained_clock_fraction(get_accelerator("gb300")) > sustained_clock_fraction(get_accelerator("gb200"))


def test_mi350x_is_the_mi355x_die_at_lower_power():
    # AMD datasheets: MI350X 2.3 PF bf16 / 4.6 PF fp8 dense at 1000 W; MI355X 2.5 / 5.0 at 1400 W, both 288 GB at 8 TB/s
    from trainperf.hardware import sustained_clock_fraction

    mi350, mi355 = get_accelerator("amd-mi350x"), get_accelerator("mi355x")
    assert mi350.name == "mi350x" and mi350.peak_flops() == pytest.approx(2300e12)
    assert mi350.hbm_gb == mi355.hbm_gb == 288 and mi350.hbm_tbps == mi355.hbm_tbps
    # lower board power holds a lower clock: (1000 / (400/312 x 2300))^(1/3) against (1400 / (400/312 x 2500))^(1/3)
    assert sustained_clock_fraction(mi350) == pytest.approx((1000 / (400 / 312 * 2300)) ** (1 / 3))
    assert sustained_clock_fraction(mi350) < sustained_clock_fraction(mi355)
    # the free-text description MLPerf's system file gives parses to it
    from trainperf.specs import make_cluster

    assert make_cluster("AMD Instinct MI350X 288GB HBM3e", 8, 8).accelerator.name == "mi350x"


def test_nvlink_in_a_description_is_not_the_nvl_variant():
    # MLPerf's Eos system description names the fabric "NVLink"; the part is the SXM H100, not the H100 NVL
    from trainperf.specs import make_cluster

    eos = "NVIDIA H100-SXM5-80GB (Eos), NVLink Gen4 900 GB/s, 8x ConnectX-7 IB NDR 400Gb/s per node"
    assert make_cluster(eos, 8, 8).accelerator.name == "h100-sxm"
    assert make_cluster("H100 NVL 94GB", 8, 8).accelerator.name == "h100-nvl"
    assert make_cluster("GB200 NVL72", 72, 4).accelerator.name == "gb200"


def test_a_visible_device_is_named_by_its_properties():
    # torch.cuda.get_device_properties on ROCm 6.2 with an MI250 GCD: a generic name, 104 CUs, 64 GiB
    from types import SimpleNamespace
    from unittest import mock

    from trainperf.hardware import accelerator_for_torch_device

    props = SimpleNamespace(name="AMD Radeon Graphics", multi_processor_count=104, total_memory=68_702_699_520)
    with mock.patch("torch.cuda.get_device_properties", return_value=props) as get:
        assert accelerator_for_torch_device().name == "mi250"
    get.assert_called_once_with(None)
