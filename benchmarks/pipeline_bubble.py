"""The pipeline bubble diagnose measures and prices, against the schedule's formula, on simulated GPipe or 1F1B jobs.

For p balanced stages and m micro-batches a GPipe (or 1F1B) step is (m + p - 1) micro-batch times, of which p - 1 are
the bubble: (p - 1) / (m + p - 1) of the step (Narayanan et al. 2021). Halving it (twice the micro-batches of half
the size) makes the step (2m + p - 1) half-times: a gain of 1 - (2m + p - 1) / (2 (m + p - 1)). Each job
(tests/trace/pipeline_builder.pipeline_job: 1-ms forwards, 2-ms backwards, 50-us transfers) is diagnosed with every
rank's trace and with only the first stage's (which cannot tell its waits are a pipeline's unless the schedule names
itself: --schedule-names writes torch.distributed.pipelining's "PP:" annotations). --schedule 1f1b: Megatron's
default schedule, whose bubble is GPipe's (each stage warms up with fewer forwards in flight, not less idle).
--schedule interleaved: Megatron's interleaved 1F1B with --chunks v model chunks per stage (micro-batches a multiple
of the stages): the bubble is v times shorter, (p - 1) / (v m + p - 1), and the last stage sends each chunk's
activations on to the first (a ring of send/recv that is still a pipeline, not context parallelism's ring).

    python benchmarks/pipeline_bubble.py [--schedule-names] [--schedule gpipe|1f1b|interleaved] [--chunks 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trace"))
from pipeline_builder import TRANSFER_US, pipeline_job  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule-names", action="store_true", help="annotate each micro-batch as PP:<stage>F<m>")
    ap.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b", "interleaved"))
    ap.add_argument("--chunks", type=int, default=2, help="model chunks per stage of the interleaved schedule")
    a = ap.parse_args()
    v = a.chunks if a.schedule == "interleaved" else 1
    print("| stages | micro-batches | bubble by the schedule % | measured % | gain halved, schedule % "
          "| fix simulated, transfers halved % | transfers as long % | replayed % | findings, all ranks "
          "| top finding, first stage alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    errors, sim_errors, jobs = [], [], 0
    for p in (2, 4, 8):
        for m in (2, 4, 8, 16, 32):
            if v > 1 and m % p:  # Megatron's interleaved schedule takes the micro-batches in groups of the stages
                continue
            jobs += 1
            with tempfile.TemporaryDirectory() as tmp:
                job = pipeline_job(Path(tmp) / "job", [1000.0] * p, micro=m, schedule_names=a.schedule_names,
                                   schedule=a.schedule, chunks=v)
                diagnosed = diagnose(job)
                found = diagnosed.findings
                top = next((f for f in found if f.kind == "pipeline_bubble"), found[0] if found else None)
                # the fix itself, simulated: twice the micro-batches, each half the work, step against step (the
                # median of every rank's); each transfer half as long (half the bytes at the link's bandwidth: a
                # micro-batch's activations are megabytes) or as long (latency-bound: small messages)
                step_us = _step_us(diagnosed)
                simulated = [100 * (1 - _step_us(diagnose(pipeline_job(
                    Path(tmp) / f"halved{us}", [500.0] * p, micro=2 * m, schedule=a.schedule, chunks=v,
                    transfer_us=us))) / step_us) for us in (TRANSFER_US / 2, TRANSFER_US)]
                alone = Path(tmp) / "first"
                alone.mkdir()
                shutil.copy(job / "rank0.json.gz", alone / "rank0.json.gz")
                first = next(iter(diagnose(alone).findings), None)
            # in chunk-times (a micro-batch's forward and backward on one chunk): the step is v m + p - 1 of them
            bubble, gain = 100 * (p - 1) / (v * m + p - 1), 100 * (1 - (2 * v * m + p - 1) / (2 * (v * m + p - 1)))
            bubble_found = top is not None and top.kind == "pipeline_bubble"
            share = top.evidence["metrics"]["exposed_send_recv_share"]["value"] if bubble_found else float("nan")
            if bubble_found:
                errors.append(abs(top.gain_pct - gain))
                sim_errors.append([abs(top.gain_pct - x) for x in simulated])
            kinds = ", ".join(f"{f.kind} {f.gain_pct:.1f}" for f in found[:2]) or "-"
            print(f"| {p} | {m} | {bubble:.1f} | {share:.1f} | {gain:.1f} | {simulated[0]:.1f} | {simulated[1]:.1f} | "
                  f"{top.gain_pct if bubble_found else float('nan'):.1f} | {kinds} | {first.kind if first else '-'} |")
    if not errors:
        print("\nno pipeline_bubble found")
        return
    print(f"\npipeline_bubble found in {len(errors)} of {jobs} jobs; |replayed - schedule| gain: median "
          f"{statistics.median(errors):.2f} pp, max {max(errors):.2f} pp; |replayed - simulated fix|, transfers "
          + "; ".join(f"{how}: median {statistics.median(e):.2f} pp, max {max(e):.2f} pp"
                      for how, e in zip(("halved", "as long"), zip(*sim_errors))))


def _step_us(diagnosed) -> float:
    """The median step time of a diagnosed job's ranks (µs), from their ProfilerStep spans."""
    return statistics.median(r.step_time_median_us for r in diagnosed.ranks)


if __name__ == "__main__":
    main()
