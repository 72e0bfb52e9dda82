"""The few constants the time model needs, each with its physical meaning.

Two kinds, kept apart on purpose:

* ``Efficiency``: how close the hardware gets to its catalog peaks (GEMM, attention, HBM,
  links). These are what ``trainperf calibrate`` measures; ``--calibration FILE`` replaces
  them (and the peaks) with the measured values.
* ``Software`` (plan/stacks.py): what the training framework fuses, overlaps and launches
  (``--stack``). They are facts about the job, priced with the hardware's rates.

The fitted constants are fitted on the dev rows (benchmarks/validate_planner.py --loso, which
also judges them leave-one-source-out; results in docs/benchmarks.md); there are no per-row
factors anywhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.plan.stacks import Software  # noqa: F401  (re-exported: the stack half of the constants)


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the catalog peaks and link latencies (dimensionless unless named).

    GEMM time is ``flops / (peak * gemm_eff_max * sat(M) * sat(N) * sat(K))`` with
    ``sat(x) = x / (x + gemm_dim_half)``: a large square GEMM runs at ``gemm_eff_max`` of the
    dense peak, and a dimension of ``gemm_dim_half`` elements halves the rate (tile
    quantisation, too few waves, skinny tp-split shapes), bounded below by the HBM roofline.
    """

    gemm_eff_max: float = 0.0           # large bf16 GEMM in a training run / dense peak; 0: the
                                        # accelerator's catalog `gemm_eff` (fitted per generation)
    gemm_dim_half: float = 96.0         # elements; dimension at which sat() = 1/2 (fitted)
    attn_eff: float = 0.0               # flash attention fwd FLOP/s / dense peak; 0: catalog `attn_eff`, moved
                                        # with gemm_eff_max (resolve: same tensor cores, same clock)
    attn_seq_half: float = 1024.0       # tokens per rank at which flash attention runs at half its rate (fitted)
    attn_bwd_flops_ratio: float = 2.5   # flash backward FLOPs / forward (5 matmuls vs 2; physics)
    attn_bwd_rate_ratio: float = 0.75   # flash backward FLOP/s / forward FLOP/s: the FA3 paper's kernels show
                                        # 0.61-0.75 at 512-2K tokens, 0.82-0.87 at 4K-16K; 0.85 moves the published
                                        # rows the wrong way (docs/benchmarks.md, H4 evening), so 0.75 stays
    fp8_gemm_speedup: float = 1.60      # fp8 GEMM rate / bf16 GEMM rate incl. scaling (fitted; 2x on paper)
    hbm_eff: float = 0.70               # achieved / catalog HBM bandwidth for elementwise kernels
    scaleup_bus_eff: float = 0.80       # NCCL bus bandwidth / NVLink per-direction bandwidth
    scaleout_bus_eff: float = 0.80      # NCCL bus bandwidth / NIC bandwidth
    alpha_scaleup_s: float = 8e-6       # latency per collective step inside the scale-up domain (s)
    alpha_scaleout_s: float = 20e-6     # latency per collective step across the network (s)
    kernel_gap_s: float = 1e-6          # GPU idle between two queued kernels (launch latency, s)
    comm_sm_share: float = 0.3          # compute lost while a hidden collective runs (NCCL SMs + HBM), share (fitted)
    moe_imbalance: float = 1.15         # stated: max / mean routed tokens per expert rank in a micro batch
                                        # (balanced routing, aux loss or bias; paces expert GEMMs and all-to-all)
    # measured absolute rates from `trainperf calibrate` (0: use catalog peak x efficiency)
    measured_gemm_tflops: float = 0.0
    measured_hbm_tbps: float = 0.0
    measured_bus_gbps: float = 0.0
    source: str = "defaults (fitted on published runs)"


def resolve(eff: Efficiency, acc, attention: str = "best") -> Efficiency:
    """Return ``eff`` with the accelerator's catalog efficiencies filled in where it has 0.

    ``attention`` is the stack's kernel: ``fa2`` runs at the catalog's ``fa2_eff`` (never
    faster than the best kernel), the others at ``attn_eff``.

    The catalog's attention fractions hold at the catalog's GEMM efficiency. Flash attention
    runs on the same tensor cores at the same sustained clock as the GEMMs, so where ``eff``
    sets another GEMM efficiency (benchmarks/validate_planner.py's fits) the attention fraction moves with it:
    ``attn_eff x gemm_eff_max / acc.gemm_eff``, the ratio of the two kernels' rates kept (as
    compute.attention_fwd_s does for a measured GEMM rate). An attention fraction ``eff``
    states itself is taken as is.
    """
    kw = {}
    if eff.gemm_eff_max <= 0:
        kw["gemm_eff_max"] = acc.gemm_eff
    gemm = kw.get("gemm_eff_max", eff.gemm_eff_max)
    same_clock = gemm / acc.gemm_eff if acc.gemm_eff > 0 else 1.0
    attn = eff.attn_eff if eff.attn_eff > 0 else acc.attn_eff * same_clock
    if attention == "fa2":
        attn = min(attn, acc.fa2_eff * same_clock or attn)
    if attn != eff.attn_eff:
        kw["attn_eff"] = attn
    return replace(eff, **kw) if kw else eff


def load_calibration(path: str | Path) -> Efficiency:
    """Return an Efficiency built from a `trainperf calibrate` JSON profile.

    Raises TrainperfError naming the file and what is wrong with it.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise TrainperfError(f"{p}: calibration file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TrainperfError(f"{p}: not a readable calibration profile ({e})") from None
    if not isinstance(data, dict) or "efficiency" not in data or not isinstance(data["efficiency"], dict):
        raise TrainperfError(f"{p}: not a calibration profile (no 'efficiency' object; make one with `trainperf calibrate`)")
    known = {f.name for f in fields(Efficiency)}
    kw = {}
    for k, v in data["efficiency"].items():
        if k not in known:
            continue
        if k == "source":
            kw[k] = str(v)
            continue
        try:
            kw[k] = float(v)
        except (TypeError, ValueError):
            raise TrainperfError(f"{p}: efficiency.{k} must be a number, got {v!r}") from None
        if kw[k] < 0:
            raise TrainperfError(f"{p}: efficiency.{k} must be >= 0, got {v!r}")
    kw.setdefault("source", f"calibration {p.name} ({data.get('device', 'unknown device')})")
    return replace(Efficiency(), **kw)


def efficiency_dict(eff: Efficiency) -> dict:
    """Return the efficiency constants as a JSON-able dict."""
    return asdict(eff)
