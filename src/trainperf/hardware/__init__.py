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


def accelerator_for_device(device_name: str) -> Accelerator | None:
    """Return the catalog entry for a device name as the driver reports it, or None.

    Tries the name as given ("NVIDIA H100 PCIe"), without the vendor word ("h100 pcie"), each
    word as an SXM part ("h100-sxm"), then each word alone ("h100").
    """
    words = device_name.lower().replace("nvidia", "").split()
    for cand in (device_name, " ".join(words), *[f"{w}-sxm" for w in words], *words):
        try:
            return get_accelerator(cand)
        except TrainperfError:
            continue
    return None
