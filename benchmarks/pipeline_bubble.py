"""The pipeline bubble diagnose measures and prices, against the schedule's formula, on simulated GPipe or 1F1B jobs.

For p balanced stages and m micro-batches a GPipe (or 1F1B) step is (m + p - 1) micro-batch times, of which p - 1 are
the bubble: (p - 1) / (m + p - 1) of the step (Narayanan et al. 2021). Halving it (twice the micro-batches of half
the size) makes the step (2m + p - 1) half-times: a gain of 1 - (2m + p - 1) / (2 (m + p - 1)). Each job
(tests/trace/pipeline_builder.pipeline_job: 1-ms forwards, 2-ms backwards, 50-us transfers) is diagnosed with every
rank's trace and with only the first stage's (which cannot tell its waits are a pipeline's unless the schedule names
itself: --schedule-names writes torch.distributed.pipelining's "PP:" annotations). --schedule 1f1b: Megatron's
default schedule, whose bubble is GPipe's (each stage warms up with fewer forwards in flight, not less idle).

    python benchmarks/pipeline_bubble.py [--schedule-names] [--schedule gpipe|1f1b]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trace"))
from pipeline_builder import pipeline_job  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule-names", action="store_true", help="annotate each micro-batch as PP:<stage>F<m>")
    ap.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b"))
    a = ap.parse_args()
    print("| stages | micro-batches | bubble by the schedule % | measured % | gain halved, schedule % | replayed % "
          "| findings, all ranks | top finding, first stage alone |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for p in (2, 4, 8):
        for m in (2, 4, 8, 16, 32):
            with tempfile.TemporaryDirectory() as tmp:
                job = pipeline_job(Path(tmp) / "job", [1000.0] * p, micro=m, schedule_names=a.schedule_names,
                                   schedule=a.schedule)
                found = diagnose(job).findings
                top = next((f for f in found if f.kind == "pipeline_bubble"), found[0])
                alone = Path(tmp) / "first"
                alone.mkdir()
                shutil.copy(job / "rank0.json.gz", alone / "rank0.json.gz")
                first = diagnose(alone).findings[0]
            bubble, gain = 100 * (p - 1) / (m + p - 1), 100 * (1 - (2 * m + p - 1) / (2 * (m + p - 1)))
            share = top.evidence["metrics"].get("exposed_send_recv_share", {}).get("value", float("nan"))
            if top.kind == "pipeline_bubble":
                errors.append(abs(top.gain_pct - gain))
            kinds = ", ".join(f"{f.kind} {f.gain_pct:.1f}" for f in found[:2])
            print(f"| {p} | {m} | {bubble:.1f} | {share:.1f} | {gain:.1f} | {top.gain_pct:.1f} | {kinds} | "
                  f"{first.kind} |")
    errors.sort()
    print(f"\npipeline_bubble found in {len(errors)} of 15 jobs; |replayed - schedule| gain: median "
          f"{errors[len(errors) // 2]:.2f} pp, max {errors[-1]:.2f} pp" if errors else "\nno pipeline_bubble found")


if __name__ == "__main__":
    main()
