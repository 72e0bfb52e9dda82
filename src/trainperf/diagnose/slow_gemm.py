"""The `slow_gemm` finding: 16-bit GEMMs running far below the rate the planner's GEMM model expects for their shapes
on the trace's device.

The expected time of one GEMM is the planner's (plan/compute.py, one formula for planning and diagnosing): its
2mnk FLOPs at the device's dense peak x the catalog's training GEMM efficiency x sat(m) sat(n) sat(k) (small and
skinny shapes run below peak: tile quantisation, too few waves; fitted on published runs), never faster than its
bytes at the achieved HBM bandwidth; fp8 at the planner's fp8 speed-up. Each kernel also pays the trace's own fixed
device cost (Graph.kernel_floor_us, at most KERNEL_FIXED_COST_MAX_US: the start-up and tail every kernel has, which
the planner's model leaves out).
A shape whose kernels take more than SLOW_GEMM_RATIO x that is not running at what tuned libraries reach on the
part: throttled clocks or power (every shape slow), a library without kernels tuned for the shape (ROCm's
hipBLASLt / rocBLAS without TunableOp, an old cuBLAS), an operand layout the library handles badly, or many tiny
batched products. Misaligned shapes are `misaligned_gemm`'s (measured against the trace's aligned ones), fp32 ones
`fp32_matmul`'s. This is what TraceLens' agent calls a kernel-tuning opportunity (its roofline headroom); here the
bar is the shape's attainable rate, not the roofline, so that a shape's own limits are not called slowness.
Needs the shapes (record_shapes=True) and a catalog device (deviceProperties); else nothing is found.
"""

from __future__ import annotations

from trainperf.diagnose import findings as F
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


def expected_us(c: GemmCall, acc, kernel_floor_us: float) -> float:
    """The planner's time for this GEMM call on the catalog device `acc`, plus each of its kernels' fixed device
    cost (µs)."""
    eff = resolve(Efficiency(), acc)
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
    calls = [c for c in f.once("gemm_calls", lambda: gemm_calls(f)) if c.time_us > 0 and c.aligned]
    if not calls:
        return None
    floor = min(f.graph.kernel_floor_us, KERNEL_FIXED_COST_MAX_US)
    by_shape: dict[str, list[tuple[GemmCall, float]]] = {}
    for c in calls:
        by_shape.setdefault(c.shape, []).append((c, expected_us(c, acc, floor)))
    slow = {s: cs for s, cs in by_shape.items()
            if sum(c.time_us for c, _ in cs) > SLOW_GEMM_RATIO * sum(e for _, e in cs)}
    time_us = sum(c.time_us for cs in slow.values() for c, _ in cs)
    if not slow or f.pct(time_us) < SLOW_GEMM_MIN_PCT:
        return None
    model_us = sum(e for cs in slow.values() for _, e in cs)
    all_us = sum(c.time_us for c in calls)
    all_model_us = sum(e for cs in by_shape.values() for _, e in cs)
    top = sorted(slow.values(), key=lambda cs: -sum(c.time_us for c, _ in cs))
    events = [(f"{cs[0][0].shape}: {sum(c.time_us for c, _ in cs) / sum(e for _, e in cs):.2g}x the model's time "
               f"({len(cs)} calls, {sum(c.time_us for c, _ in cs) / 1e3:.1f} ms)",
               float(f.window.ts_us[cs[0][0].kernels[0]]), cs[0][0].time_us) for cs in top[:3]]
    metrics = {"slow_gemm_time": (time_us, "us"), "slow_gemm_share": (f.pct(time_us), "%"),
               "their_rate": (sum(c.flops for cs in slow.values() for c, _ in cs) / time_us / 1e6, "TFLOP/s"),
               "model_rate": (sum(c.flops for cs in slow.values() for c, _ in cs) / model_us / 1e6, "TFLOP/s"),
               "times_the_model": (time_us / model_us, "x"),
               "slow_shapes": (len(slow), "count"), "gemm_shapes": (len(by_shape), "count"),
               "all_gemms_times_the_model": (all_us / all_model_us, "x")}
    changes = tuple(Change("speedup_rows", factor=sum(c.time_us for c, _ in cs) / sum(e for _, e in cs),
                           rows=tuple(k for c, _ in cs for k in c.kernels)) for cs in top)
    x = F.make("slow_gemm", [f.rank], f.steps, metrics, events, changes=changes,
               what_if=f"the slow GEMM shapes at the planner's time for them on {acc.name} "
                       f"({time_us / model_us:.3g}x faster)",
               evidence_pct=f.pct(time_us - model_us))
    if len(slow) == len(by_shape) and len(by_shape) > 1:
        x.recommendation = EVERY_SHAPE_PREFIX + x.recommendation
    return x


# every GEMM shape of the trace slow alike: the device, not a shape, is what to look at first
EVERY_SHAPE_PREFIX = ("Every GEMM shape of the trace runs this slowly, so look at the device before the shapes: its "
                      "clocks and power (nvidia-smi -q -d PERFORMANCE or rocm-smi: a power cap, thermal throttling, "
                      "a low application clock), and whether it is the part deviceProperties names. ")
