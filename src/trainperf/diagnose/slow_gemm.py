"""The `slow_gemm` finding: 16-bit GEMMs running far below the rate the planner's GEMM model expects for their shapes
on the trace's device.

The expected time of one GEMM is the planner's (plan/compute.py, one formula for planning and diagnosing): its
2mnk FLOPs at the device's dense peak x the catalog's training GEMM efficiency x sat(m) sat(n) sat(k) (small and
skinny shapes run below peak: tile quantisation, too few waves; fitted on published runs), never faster than its
bytes at the achieved HBM bandwidth; fp8 at the planner's fp8 speed-up. Each kernel also pays the trace's own fixed
device cost (Graph.kernel_floor_us, at most KERNEL_FIXED_COST_MAX_US: the start-up and tail every kernel has, which
the planner's model leaves out). A shape whose kernels take more than SLOW_GEMM_RATIO x that is not running at
what tuned libraries reach on the part: throttled clocks or power (every shape slow), a library without kernels
tuned for the shape (ROCm's hipBLASLt / rocBLAS without TunableOp, an old cuBLAS), an operand layout the library
handles badly, or many tiny batched products. Misaligned shapes are `misaligned_gemm`'s (measured against the
trace's aligned ones), fp32 ones `fp32_matmul`'s, an unfused attention's products `unfused_attention`'s; a call that
shared the device with another stream's computation for most of its time is not judged. This is
what TraceLens' agent calls a kernel-tuning opportunity (its roofline headroom); here the bar is the shape's
attainable rate, not the roofline, so that a shape's own limits are not called slowness.
Needs the shapes (record_shapes=True) and a catalog device (deviceProperties); else nothing is found.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.diagnose import findings as F
from trainperf.diagnose.attention import window_region_work, window_regions
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gemm_shapes import GemmCall, gemm_calls
from trainperf.diagnose.replay import Change
from trainperf.diagnose.roofline import device_accelerator
from trainperf.plan.compute import fp8_speedup, gemm_rate_flops, hbm_rate_bytes
from trainperf.plan.efficiency import Efficiency, resolve

# a shape's kernels take more than this many times the model's time: a fault, not the model's error. The model's
# shape curve is fitted on whole training steps (published runs), not per shape: on an H200 (docs/benchmarks.md,
# "Calibration") single shapes from 2048^3 to 16384x1024x8192 ran at 0.75-1.17x its rate (calibrate's timing, which
# at 1024^3 times the launches, 22 us, not the kernel). Twice is outside that spread by a margin; stated, not fitted
# (no labeled trace of slow GEMMs is at hand).
SLOW_GEMM_RATIO = 2.0
SLOW_GEMM_MIN_PCT = 3.0  # the slow shapes' device time, % of the window: the medium level of findings, as misaligned's
# a kernel's fixed device cost is the trace's shortest kernels' time (Graph.kernel_floor_us, 2-3 us on the GPU traces
# at hand) but no more than this: in a window of long kernels only, the shortest is work, not the fixed cost
KERNEL_FIXED_COST_MAX_US = 5.0


def expected_us(c: GemmCall, acc, eff: Efficiency, kernel_floor_us: float) -> float:
    """The planner's time for this GEMM call on the catalog device `acc` with its efficiencies `eff` (plan.efficiency.
    resolve'd for it), plus each of its kernels' fixed device cost (µs)."""
    if c.precision == "fp8":
        rate = gemm_rate_flops(acc.peak_flops("bf16"), eff, c.m, c.n, c.k) * \
            fp8_speedup(acc.peak_flops("bf16"), acc.peak_flops("fp8"), eff)
    else:
        rate = gemm_rate_flops(acc.peak_flops(c.precision), eff, c.m, c.n, c.k)
    model_s = max(c.flops / rate, c.bytes / hbm_rate_bytes(acc.hbm_tbps, eff))
    return model_s * 1e6 + len(c.kernels) * kernel_floor_us


def slow_gemm(f: RankFacts) -> F.Finding | None:
    """Aligned 16-bit/fp8 GEMM shapes whose kernels take > SLOW_GEMM_RATIO x the planner's time for the shape on this
    device (expected_us) and >= SLOW_GEMM_MIN_PCT of the window. Priced by replay: each shape's kernels at the model's
    time (speedup_rows, one factor per shape), an estimate of what a tuned library reaches, ranked with the assumed
    speed-ups."""
    if not f.has_gpu:
        return None
    acc = device_accelerator(f.table)
    if acc is None or not acc.hbm_tbps:
        return None
    # an unfused attention's batched products are unfused_attention's to price (as the fused kernel's time)
    in_attention = set(window_region_work(f).kernels.tolist()) if window_regions(f) else set()
    calls = [c for c in gemm_calls(f)
             if c.time_us > 0 and c.aligned and c.timed_alone and not in_attention.intersection(c.kernels)]
    if not calls:
        return None
    floor = min(f.graph.kernel_floor_us, KERNEL_FIXED_COST_MAX_US)
    eff = resolve(Efficiency(), acc)
    by_shape: dict[str, list[GemmCall]] = {}
    for c in calls:
        by_shape.setdefault(c.shape, []).append(c)
    shapes = [ShapeTime(calls=cs, time_us=sum(c.time_us for c in cs),
                        model_us=sum(expected_us(c, acc, eff, floor) for c in cs)) for cs in by_shape.values()]
    # a shape is named when it is that slow and its time beyond the model is worth a fix on its own (F.MIN_GAIN_PCT,
    # the gain under which a fix is dismissed): a tiny product's few microseconds are its fixed cost's jitter
    slow = sorted((x for x in shapes if x.ratio > SLOW_GEMM_RATIO and f.pct(x.time_us - x.model_us) >= F.MIN_GAIN_PCT),
                  key=lambda x: -x.time_us)
    time_us, model_us = sum(x.time_us for x in slow), sum(x.model_us for x in slow)
    if not slow or f.pct(time_us) < SLOW_GEMM_MIN_PCT:
        return None
    flops = sum(c.flops for x in slow for c in x.calls)
    events = [(f"{x.calls[0].shape}: {x.ratio:.2g}x the model's time ({len(x.calls)} calls, {x.time_us / 1e3:.1f} ms)",
               float(f.window.ts_us[x.calls[0].kernels[0]]), x.calls[0].time_us) for x in slow[:3]]
    metrics = {"slow_gemm_time": (time_us, "us"), "slow_gemm_share": (f.pct(time_us), "%"),
               "their_rate": (flops / time_us / 1e6, "TFLOP/s"), "model_rate": (flops / model_us / 1e6, "TFLOP/s"),
               "times_the_model": (time_us / model_us, "x"),
               "slow_shapes": (len(slow), "count"), "gemm_shapes": (len(shapes), "count"),
               "all_gemms_times_the_model": (sum(x.time_us for x in shapes) / sum(x.model_us for x in shapes), "x")}
    changes = tuple(Change("speedup_rows", factor=x.ratio, rows=tuple(k for c in x.calls for k in c.kernels))
                    for x in slow)
    found = F.make("slow_gemm", [f.rank], f.steps, metrics, events, changes=changes,
                   what_if=f"the slow GEMM shapes at the planner's time for them on {acc.name} "
                           f"({time_us / model_us:.3g}x faster)",
                   evidence_pct=f.pct(time_us - model_us))
    if len(shapes) > 1 and all(x.ratio > SLOW_GEMM_RATIO for x in shapes):
        found.recommendation = EVERY_SHAPE_PREFIX + found.recommendation
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeTime:
    """One GEMM shape's calls, their kernels' device time and the planner's time for them (µs)."""

    calls: list
    time_us: float
    model_us: float

    @property
    def ratio(self) -> float:
        """Their time over the model's (x)."""
        return self.time_us / self.model_us


# every GEMM shape of the trace slow alike: the device, not a shape, is what to look at first
EVERY_SHAPE_PREFIX = ("Every GEMM shape of the trace runs this slowly, so look at the device before the shapes: its "
                      "clocks and power (nvidia-smi -q -d PERFORMANCE or rocm-smi: a power cap, thermal throttling, "
                      "a low application clock), and whether it is the part deviceProperties names. ")
