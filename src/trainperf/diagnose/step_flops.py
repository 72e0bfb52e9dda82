"""The FLOPs a rank's steps do and the share of its device's peak they reach, read from the trace's own operators.

A training-performance engineer's first figure of a job is its FLOPs utilisation. The trace holds what it needs
where it was profiled with record_shapes=True: each matrix product's, convolution's and attention's FLOPs follow
from its operator's recorded input shapes (roofline.op_cost: 2mnk a product, torch.utils.flop_counter's count of a
convolution, the score and value products of attention halved where causal, as the planner and the trainer count
them), each over the device time of the kernels it launched. Summed over the analysis window's work (a CPU run: its
operators' own spans), they give the FLOPs of a step and the rate; the same FLOPs at the peak of their precision
(the catalog entry of the trace's device) over the window's time give the utilisation. What ran is counted,
recomputation included: this is the hardware FLOPs utilisation, equal to the model FLOPs utilisation (MFU) where
no activation is recomputed. Only these count, as the model FLOPs of MFU do; elementwise and normalisation FLOPs
are a rounding error of them.

Products whose operator's shapes are not recorded (a torch.compile'd region's Triton kernels, a CUDA graph's
replay, a library's own kernels) are not counted: `covered_pct` is the share of the window's GEMM-class kernel
time (cuDNN's convolutions are GEMMs, implicit ones) and attention kernel time the counted operators' kernels take,
and under COVERED_MIN_PCT the figures are a lower bound and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.evidence import is_sampled
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.roofline import RooflineRow, roofline
from trainperf.trace.events import ATTENTION, GEMM

MODEL_FLOP_KINDS = ("gemm", "attention", "conv")  # roofline.OpCost kinds whose FLOPs make a model's FLOPs
# the share of the GEMM and attention kernel time the counted operators must cover for the figures to stand as the
# step's (stated, not fitted: a tenth left uncounted moves a utilisation of 40 % by at most 4 points)
COVERED_MIN_PCT = 90.0


@dataclass(kw_only=True, frozen=True)
class StepFlops:
    """The window's matrix-product, convolution and attention FLOPs (from recorded shapes) and what they reach."""

    flops: float                      # in the window (FLOP)
    window_us: float                  # the window they ran in (µs)
    steps: int                        # analysed steps in it (0: none found)
    at_peak_us: float | None          # their time at their precision's peak (µs); None: a peak unknown
    covered_pct: float | None         # % of the window's GEMM and attention kernel time counted; None on a CPU run
    precision: str                    # the precision of most of the FLOPs ("" when not recorded)
    sampled: bool = False             # the trace lost most of its events (evidence.is_sampled): so did the count

    @property
    def flops_per_step(self) -> float | None:
        """FLOP a step, None without steps."""
        return self.flops / self.steps if self.steps else None

    @property
    def achieved_tflops(self) -> float:
        """Their rate over the window (TFLOP/s)."""
        return self.flops / (self.window_us * 1e6) if self.window_us > 0 else 0.0

    @property
    def lower_bound_note(self) -> str:
        """Why the figures are a lower bound: operators without shapes, or a sampled trace; "" where they stand."""
        if self.sampled:
            return "a lower bound: the trace is sampled or filtered, and the operators it lost did work too"
        if self.covered_pct is not None and self.covered_pct < COVERED_MIN_PCT:
            return (f"a lower bound: the operators whose shapes are recorded launched {self.covered_pct:.0f} % of the "
                    "GEMM and attention kernel time (compiled or graphed kernels carry no shapes)")
        return ""

    @property
    def utilisation_pct(self) -> float | None:
        """Their time at the peak as % of the window: the hardware FLOPs utilisation; None without the peaks."""
        return 100.0 * self.at_peak_us / self.window_us if self.at_peak_us is not None and self.window_us > 0 else None


def model_flop_rows(rows: list[RooflineRow]) -> list[RooflineRow]:
    """The roofline rows of matrix products, convolutions and attention that carry FLOPs."""
    return [r for r in rows if r.kind in MODEL_FLOP_KINDS and r.flops > 0]


def step_flops(f: RankFacts) -> StepFlops | None:
    """The rank's StepFlops over its analysis window; None where no product or attention was priced (a
    trace recorded without record_shapes, or with none of them). Once per rank."""
    return f.once("step_flops", lambda: _step_flops(f))


def _step_flops(f: RankFacts) -> StepFlops | None:
    t, w = f.table, f.window
    rows = model_flop_rows(roofline(t, keep=w.keep, op=f.launching_op() if f.has_gpu else None))
    if not rows:
        return None
    flops = np.array([r.total_flops for r in rows])
    peaks = [r.peak_tflops for r in rows]
    at_peak = float(sum(x / (p * 1e6) for x, p in zip(flops, peaks))) if all(peaks) else None
    by_precision: dict[str, float] = {}
    for r, x in zip(rows, flops):
        by_precision[r.precision] = by_precision.get(r.precision, 0.0) + float(x)
    covered = None
    if f.has_gpu:
        dev = w.device[np.isin(t.category[w.device], (GEMM, ATTENTION))]
        kernel_us = float(t.dur_ns[dev].sum()) / 1e3
        covered = min(100.0, 100.0 * sum(r.time_us for r in rows) / kernel_us) if kernel_us > 0 else None
    return StepFlops(flops=float(flops.sum()), window_us=f.breakdown.window_us if f.has_gpu else f.host_window_us,
                     steps=len(f.steps), at_peak_us=at_peak, covered_pct=covered,
                     precision=max(by_precision, key=by_precision.get), sampled=f.has_gpu and is_sampled(f))
