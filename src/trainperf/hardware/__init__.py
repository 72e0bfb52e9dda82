"""Accelerator and interconnect catalog: a data file (catalog.yaml, with sources) and its loader."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from trainperf.errors import TrainperfError


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's catalog entry. Units are in the field names; peaks are dense."""

    name: str
    vendor: str
    bf16_tflops: float
    fp16_tflops: float
    fp8_tflops: float | None
    fp32_tflops: float | None
    hbm_gb: float
    hbm_tbps: float
    scaleup_gbps: float
    scaleup_domain: int
    gpus_per_node: int
    scaleout_gbps: float
    tdp_w: float
    usd_per_hour: float
    sources: str
    aliases: tuple[str, ...] = ()
    # Achieved fraction of the dense bf16 peak in training runs: large GEMMs and flash
    # attention forward. Fitted on published runs for A100 and H100; other accelerators are
    # estimates by generation (see catalog.yaml); `trainperf calibrate` measures them.
    gemm_eff: float = 0.70
    attn_eff: float = 0.45
    # FlashAttention-2 forward (PyTorch SDPA's flash backend) as a fraction of the dense bf16
    # peak; 0: same as attn_eff (FA2 is the best kernel on Ampere and CDNA).
    fa2_eff: float = 0.0
    family: str = ""  # part name that free-text descriptions are matched on ("h100")
    # True where the vendor's peak is at a fixed clock the chip holds under load (TPUs); False
    # where it is at the boost clock, which a dense GEMM cannot hold within the board power
    # (NVIDIA, AMD, Intel parts): see sustained_clock_fraction.
    fixed_clock: bool = False
    # NCCL all-to-all rate per GPU (GB/s, achieved) to peers in the scale-up domain but not in the
    # GPU's own node, where the domain spans nodes (GB200/GB300 NVL72 trays); 0: the scale-up rate.
    scaleup_a2a_gbps: float = 0.0
    # HBM the runtime holds before training allocates (GiB): CUDA/ROCm context, NCCL and cuBLAS/TE
    # workspaces on GPUs; on TPUs the runtime's share (HBM minus the bytes_limit JAX reports; catalog.yaml)
    runtime_reserved_gib: float = 2.0
    # Streaming multiprocessors (NVIDIA) or compute units (AMD) of one device as PyTorch sees it (deviceProperties
    # numSms): with the memory size it names the part where the driver's name does not (ROCm 6.2 calls an MI250 GCD
    # "AMD Radeon Graphics"); None where not recorded.
    compute_units: int | None = None
    # The device's link to its host CPU, one direction (GB/s, peak): PCIe Gen3/4/5 x16 (16/32/64), NVLink-C2C on
    # Grace parts (450); what a copy from pinned host memory runs at, less its efficiency (diagnose/host_link.py).
    # None where no such copy applies (TPUs, the MI300A's shared memory).
    host_link_gbps: float | None = None

    @property
    def runtime_reserved_bytes(self) -> float:
        """HBM the runtime holds before training allocates anything (bytes)."""
        return self.runtime_reserved_gib * 2**30

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity in bytes.

        Vendors' HBM "GB" are binary: an "80 GB" H100 shows 81,559 MiB in nvidia-smi, a
        "192 GB" MI300X 196,608 MiB, so capacity is ``hbm_gb * 2**30``.
        """
        return self.hbm_gb * 2**30

    def peak_flops(self, precision: str = "bf16") -> float:
        """Return the dense peak for ``precision`` in FLOP/s (fp8 falls back to bf16 where absent)."""
        table = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops,
                 "fp32": self.fp32_tflops}
        if precision not in table:
            raise TrainperfError(f"unknown precision {precision!r} (bf16, fp16, fp8, fp32)")
        value = table[precision] if table[precision] is not None else self.bf16_tflops
        return float(value) * 1e12


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@lru_cache(maxsize=1)
def catalog() -> dict[str, Accelerator]:
    """Return the catalog as {name: Accelerator}, read from the packaged catalog.yaml."""
    text = resources.files("trainperf.hardware").joinpath("catalog.yaml").read_text()
    out = {}
    for row in yaml.safe_load(text)["accelerators"]:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases", ()))
        out[row["name"]] = Accelerator(**row)
    return out


def get_accelerator(name: str) -> Accelerator:
    """Return the catalog entry for a name or alias; raise TrainperfError listing known names."""
    key = _key(name)
    cat = catalog()
    if key in cat:
        return cat[key]
    for acc in cat.values():
        if key in acc.aliases:
            return acc
    # loose match for names as written in papers: "H100-SXM 80GB (DGX H100)", "A100-SXM4-80GB (Selene)"
    squashed = key.split("(")[0].strip("-")
    for cand in (squashed, squashed.replace("-80gb", ""), squashed.replace("-sxm", "").replace("-80gb", "")):
        if cand in cat:
            return cat[cand]
        for acc in cat.values():
            if cand in acc.aliases:
                return acc
    raise TrainperfError(f"unknown GPU {name!r} (known: {', '.join(cat)})")


FABRICS = ("ib", "roce")
_FABRIC_WORDS = {"roce": "roce", "rocev2": "roce", "ethernet": "roce", "infiniband": "ib", "ib": "ib", "ndr": "ib",
                 "hdr": "ib", "xdr": "ib"}
_VARIANTS = ("pcie", "nvl", "sxm")


@dataclass(frozen=True, kw_only=True)
class GpuDescription:
    """What a free-text cluster description states: the part and what differs between clusters.

    ``power_cap_w`` in watts, ``nic_gbit_per_gpu`` in Gb/s (as NICs are sold), ``fabric``
    ib or roce; None where the text does not say.
    """

    accelerator: Accelerator
    power_cap_w: float | None = None
    nic_gbit_per_gpu: float | None = None
    fabric: str | None = None
    gpus_per_node: int | None = None


def _family_entry(text: str, cat: dict[str, Accelerator]) -> Accelerator | None:
    """Return the catalog entry a description names by family, variant word and memory size."""
    import re

    low = text.lower()
    found = [f for f in {a.family for a in cat.values() if a.family}
             if re.search(rf"(?<![a-z0-9]){re.escape(f)}(?![0-9])", low)]
    if not found:
        return None
    fam = max(found, key=len)
    cands = [a for a in cat.values() if a.family == fam]
    variant = next((v for v in _VARIANTS if re.search(rf"(?<![a-z]){v}(?![a-z])", low)), None)  # "nvl", not "NVLink"
    if variant:
        narrowed = [a for a in cands if any(variant in n for n in (a.name, *a.aliases))]
        cands = narrowed or cands
    mem = re.search(r"(\d+)\s*gb(?![a-z/])", low)
    if mem:
        gb = float(mem.group(1))
        best = min(abs(a.hbm_gb - gb) for a in cands)
        if best <= 2.0:  # "94GB" H100 NVL, "96GB" H100: the nearest size within 2 GB
            cands = [a for a in cands if abs(a.hbm_gb - gb) == best]
    return next((a for a in cands if fam in a.aliases or a.name == fam), cands[0])


def parse_gpu_description(text: str) -> GpuDescription:
    """Return the accelerator and options a description states, e.g.
    ``"H100-SXM 80GB HBM3, 700W (Grand Teton), RoCE 400Gbps"`` or ``"NVIDIA Ampere (A100)"``.

    A catalog name or alias is taken as is; otherwise the part is found by family (h100,
    a100, mi300x, ...), narrowed by a variant word (SXM, PCIe, NVL) and the memory size. Also
    read: a power limit (``500W``), a NIC rate per GPU (``400Gbps``, ``400 Gb/s``), the fabric
    (RoCE/Ethernet, InfiniBand/NDR/HDR) and ``N GPUs per node``. Raises TrainperfError (one
    line, with the known names) when no catalog part is named.
    """
    import re

    cat = catalog()
    try:
        acc = get_accelerator(text)
    except TrainperfError:
        acc = _family_entry(text, cat)
        if acc is None:
            raise TrainperfError(f"unknown GPU {text!r} (known: {', '.join(cat)})") from None
    low = text.lower()
    watts = re.search(r"(\d{2,4}(?:\.\d+)?)\s*w(?![a-z])", low)
    nic = re.search(r"(\d+(?:\.\d+)?)\s*g(?:bps|b/s|bit/s|bit)(?![a-z])", low)
    fabric = next((_FABRIC_WORDS[w] for w in re.findall(r"[a-z0-9]+", low) if w in _FABRIC_WORDS), None)
    gpn = re.search(r"(\d+)\s*(?:x\s*)?gpus?\s*(?:per|/)\s*node", low)
    return GpuDescription(accelerator=acc, power_cap_w=float(watts.group(1)) if watts else None,
                          nic_gbit_per_gpu=float(nic.group(1)) if nic else None, fabric=fabric,
                          gpus_per_node=int(gpn.group(1)) if gpn else None)


def clock_scale(acc: Accelerator, power_cap_w: float | None) -> float:
    """Return the sustained tensor-core clock under a power cap as a fraction of the rated one.

    Dynamic power goes as f V^2 and V roughly with f in the DVFS range, so P ~ f^3 and
    f/f_max = (cap / TDP)^(1/3), never above 1 (a cap at or above TDP changes nothing).
    """
    if not power_cap_w or power_cap_w >= acc.tdp_w:
        return 1.0
    return float((power_cap_w / acc.tdp_w) ** (1.0 / 3.0))


# Board watts per dense bf16 TFLOP/s at which a boost-rated part still holds its rated clock
# through large GEMMs: the A100 SXM's 400 W / 312 TFLOP/s. A100s run bf16 GEMMs at their 1,410 MHz
# rating (~0.9 of peak in cuBLAS); every later NVIDIA part is rated with fewer watts per TFLOP/s.
WATTS_PER_TFLOPS_AT_RATED_CLOCK = 400.0 / 312.0


def sustained_clock_fraction(acc: Accelerator) -> float:
    """Return the tensor clock a part sustains through large GEMMs, as a fraction of its rated clock.

    Dynamic power goes as f^3 (clock_scale); a part needs ``WATTS_PER_TFLOPS_AT_RATED_CLOCK`` x its
    peak to hold the rated clock, so under its board power it runs at ``(tdp / (w x peak))^(1/3)``,
    never above 1. Fixed-clock parts (TPUs: the peak is quoted at the clock they hold) return 1.
    H100 SXM (700 W, 989 TFLOP/s): 0.82, as the ~790 TFLOP/s measured for a bf16 8192^3 GEMM on
    an H200 of the same power and peak (docs/benchmarks.md); GB200 (1,200 W, 2,500): 0.72.
    """
    if acc.fixed_clock or acc.tdp_w <= 0:
        return 1.0
    return float(min(1.0, (acc.tdp_w / (WATTS_PER_TFLOPS_AT_RATED_CLOCK * acc.bf16_tflops)) ** (1.0 / 3.0)))


def accelerator_for_device(device_name: str) -> Accelerator | None:
    """Return the catalog entry for a device name as the driver reports it, or None.

    Tries the name as given ("NVIDIA H100 PCIe"), without the vendor word ("h100 pcie"), each
    word as an SXM part ("h100-sxm"), each word alone ("h100"), then the part family named
    anywhere, as the model token before a board code ("A100-PG509-200": a100), narrowed by a
    variant word and a memory size when the name states them ("A100-PCIE-40GB").
    """
    words = device_name.lower().replace("nvidia", "").split()
    for cand in (device_name, " ".join(words), *[f"{w}-sxm" for w in words], *words):
        try:
            return get_accelerator(cand)
        except TrainperfError:
            continue
    return _family_entry(device_name, catalog())


# A device's memory as the driver reports it (totalGlobalMem: ECC and reserved pages taken off) against the catalog's
# size: an "80 GB" H100 reports 79.6 GiB, an MI250 GCD 63.98 of 64, an MI300X 191.98 of 192.
MEMORY_MATCH_TOLERANCE = 0.05


def _memory_fits(acc: Accelerator, memory_bytes: float | None) -> bool:
    """Whether a device's reported memory (bytes; None: not recorded) is the part's within MEMORY_MATCH_TOLERANCE."""
    return not memory_bytes or abs(acc.hbm_bytes - memory_bytes) <= MEMORY_MATCH_TOLERANCE * acc.hbm_bytes


# words of a device name that say its vendor (ROCm's generic "AMD Radeon Graphics", rocprofv3's gfx targets)
_VENDOR_WORDS = {"amd": ("amd", "radeon", "instinct", "gfx"), "nvidia": ("nvidia", "tesla", "quadro", "geforce")}


def _vendor(name: str) -> str | None:
    """The vendor a device name states ("amd", "nvidia"), or None."""
    low = name.lower()
    return next((v for v, words in _VENDOR_WORDS.items() if any(w in low for w in words)), None)


def accelerator_for_properties(name: str, compute_units: int | None = None,
                               memory_bytes: float | None = None) -> Accelerator | None:
    """Return the catalog entry of a device as a trace records it (Kineto deviceProperties: name, numSms,
    totalGlobalMem in bytes; rocprofv3's agents: product name, CU count, no memory size), or None.

    The name's part (accelerator_for_device), or the part of its family whose memory the device reports ("NVIDIA
    GH200 144G HBM3e" names no size the name lookup reads). Where that part's compute units or memory are not the
    device's, or the name names no part (ROCm 6.2 calls an MI250 GCD "AMD Radeon Graphics"; "AMD Instinct MI250X /
    MI250" is said of either), the parts whose compute units and memory are the device's name it: the first of them
    when they price work alike (an H800 and an H100 SXM), none when they do not (an MI350X and an MI355X differ in
    clock, an MI300X and an MI325X in memory), of the vendor the name states; failing that, the name's part (a MIG
    slice reports fewer SMs).
    """
    cat = catalog()
    by_name = accelerator_for_device(name) if name else None
    if by_name is not None and not _memory_fits(by_name, memory_bytes):
        family = [a for a in cat.values() if a.family == by_name.family and _memory_fits(a, memory_bytes)
                  and a.compute_units in (None, compute_units)]
        by_name = min(family, key=lambda a: abs(a.hbm_bytes - memory_bytes)) if family else by_name
    by_properties = None
    if compute_units:
        vendor = _vendor(name)
        found = [a for a in cat.values() if a.compute_units == compute_units and _memory_fits(a, memory_bytes)
                 and vendor in (None, a.vendor)]
        priced = {(a.bf16_tflops, a.fp16_tflops, a.fp32_tflops, a.hbm_tbps) for a in found}
        by_properties = found[0] if len(priced) == 1 else None
    name_fits = (by_name is not None and by_name.compute_units in (None, compute_units)
                 and _memory_fits(by_name, memory_bytes))
    return by_properties if by_properties is not None and not name_fits else by_name


def accelerator_for_torch_device(device=None) -> Accelerator | None:
    """Return the catalog entry of a visible CUDA/ROCm device (torch.cuda's name, SM/CU count and memory in bytes,
    as a trace's deviceProperties record them; accelerator_for_properties), or None."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return accelerator_for_properties(props.name, props.multi_processor_count, float(props.total_memory))
