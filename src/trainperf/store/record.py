"""The one run-record schema: what a training run or benchmark leaves behind.

A record is run-level metadata (where, what software, which config) plus per-step samples
and per-kernel benchmark results. Writers: trainperf.monitor (training runs) and
trainperf.bench (kernel benchmarks). Readers: `trainperf runs`, `fleet`, `gate`.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field


@dataclass
class StepSample:
    """One optimizer step of a training run. Times in seconds, memory in bytes."""

    step: int
    step_time_s: float
    tokens_per_s: float | None = None
    mfu: float | None = None
    loss: float | None = None
    data_wait_s: float | None = None
    mem_peak_bytes: float | None = None


@dataclass
class KernelResult:
    """One (kernel, implementation, shape, pass) benchmark measurement."""

    kernel: str
    impl: str  # "trainperf", "eager", "compile", "liger"
    shape: str  # e.g. "4096x8192"
    dtype: str
    passname: str  # "fwd" or "fwd+bwd"
    median_ms: float
    gbps: float | None = None
    tflops: float | None = None
    pct_roofline: float | None = None
    peak_mem_bytes: float | None = None


# config keys the monitor fills with measured results (monitor/record.py): not part of a configuration
MEASURED_CONFIG_KEYS = ("summary",)


@dataclass
class RunRecord:
    """Run-level metadata, summary metrics, samples and kernel results of one run."""

    run_id: str
    job: str
    kind: str = "train"  # "train", "bench", "import"
    started_at: float = field(default_factory=time.time)  # unix seconds
    host: str = ""
    gpu_model: str = ""
    driver: str = ""
    cuda: str = ""
    nccl: str = ""
    torch: str = ""
    git_sha: str = ""
    user: str = ""
    world_size: int = 1
    model: str = ""
    layout: str = ""
    config: dict = field(default_factory=dict)
    # summary metrics (None where not measured)
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    # the peak FLOP/s per device the run's MFU is against, and where it came from (the trainer's
    # "catalog H100 SXM (bf16)", "measured: the best of 12 fp32 1024^3 matmuls ...", "--peak-tflops");
    # None / "" in records written before peaks were stored: their MFU cannot be re-expressed (PEAK_UNKNOWN)
    peak_flops: float | None = None
    peak_source: str = ""
    mem_peak_bytes: float | None = None
    goodput: float | None = None
    samples: list[StepSample] = field(default_factory=list)
    kernels: list[KernelResult] = field(default_factory=list)

    @property
    def config_hash(self) -> str:
        """Return a short stable hash (hex) of what was run: the config dict without its measured
        results (MEASURED_CONFIG_KEYS), the layout and the model; equal for runs of one configuration."""
        config = {k: v for k, v in self.config.items() if k not in MEASURED_CONFIG_KEYS}
        blob = json.dumps({"config": config, "layout": self.layout, "model": self.model}, sort_keys=True,
                          default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        """Return the record as plain JSON-able data."""
        d = asdict(self)
        d["config_hash"] = self.config_hash
        return d


PEAK_UNKNOWN = "peak unknown (the run's record has no peak_flops: written before peaks were stored, or without one)"


def mfu_against(mfu: float | None, peak_flops: float | None, against_flops: float | None) -> float | None:
    """Return an MFU measured against ``peak_flops`` re-expressed against ``against_flops`` (a fraction):
    the achieved FLOP/s, mfu x peak_flops, over the other peak; ``mfu`` unchanged when either peak is
    unknown (None or 0), None when ``mfu`` is."""
    if mfu is None or not peak_flops or not against_flops:
        return mfu
    return mfu * peak_flops / against_flops


def peak_text(peak_flops: float | None, peak_source: str = "") -> str | None:
    """Return what an MFU is relative to, e.g. '9.52 GFLOP/s, measured: ...', or None without a peak."""
    if not peak_flops:
        return None
    rate = f"{peak_flops / 1e12:.3g} TFLOP/s" if peak_flops >= 1e12 else f"{peak_flops / 1e9:.3g} GFLOP/s"
    return f"{rate}, {peak_source}"


def mfu_text(mfu: float | None, peak_flops: float | None, peak_source: str = "") -> str:
    """Return an MFU with what it is a fraction of, e.g. "31.0% of 9.52 GFLOP/s, measured: ...", or
    "31.0%, peak unknown (...)" when the peak is not recorded; "-" without an MFU. The one wording of a
    stored run's MFU (``trainperf runs show``, ``compare``'s note)."""
    if mfu is None:
        return "-"
    peak = peak_text(peak_flops, peak_source)
    return f"{mfu:.1%} of {peak}" if peak else f"{mfu:.1%}, {PEAK_UNKNOWN}"


def new_run_id() -> str:
    """Return a fresh unique run id (time-sortable hex)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def collect_environment() -> dict:
    """Return host, GPU model, driver, CUDA, NCCL, torch versions and git sha as strings."""
    env = {"host": socket.gethostname(), "git_sha": _git_sha(), "gpu_model": platform.processor() or "cpu",
           "driver": "", "cuda": "", "nccl": "", "torch": "", "user": ""}
    try:
        env["user"] = getpass.getuser()
    except (KeyError, OSError):
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda or ""
        if torch.cuda.is_available():
            env["gpu_model"] = torch.cuda.get_device_name(0)
            try:
                env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001 - NCCL absent on some builds
                pass
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10)
                env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else ""
            except (OSError, subprocess.SubprocessError, IndexError):
                pass
    except ImportError:
        pass
    env["host"] = os.environ.get("TRAINPERF_HOST", env["host"])
    return env
