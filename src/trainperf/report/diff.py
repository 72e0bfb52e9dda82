"""HTML report of `trainperf diff`: step times, where the change went, the names that moved."""

from __future__ import annotations

from pathlib import Path

from trainperf.diagnose.diff import memory_change_text, work_change_text
from trainperf.diagnose.units import fmt_us
from trainperf.report.html import Report, bar_chart, paragraph, stacked_bar_chart, table


def write_report(d, path: str | Path, top: int = 25) -> Path:
    """Write a self-contained HTML report of a diagnose.diff.TraceDiff to path; return the path."""
    j = d.to_json(top=top)
    a, b = j["baseline"], j["candidate"]
    memory = memory_change_text(d.baseline.memory, d.candidate.memory)
    work = work_change_text(d.baseline, d.candidate)
    rep = Report("trainperf diff", f"{a['source']} → {b['source']}")
    rep.add("Step time (per step, per rank)", paragraph(j["headline"]), table([
        [side, fmt_us(s["step_time_us"]), f"{fmt_us(s['step_time_interval_us'][0])} – "
         f"{fmt_us(s['step_time_interval_us'][1])}", fmt_us(s["step_time_mean_us"]), len(s["step_times_us"]),
         len(s["ranks"])] for side, s in (("baseline", a), ("candidate", b))],
        ["side", "median", "95% interval of the median", "mean", "steps", "ranks"]),
        paragraph(f"change of the median {j['step_time_delta_pct']:+.2f}%; Hodges-Lehmann shift "
                  f"{fmt_us(j['step_time_delta_hl_us'], True)} (95% interval "
                  f"{fmt_us(j['step_time_delta_interval_us'][0], True)} to "
                  f"{fmt_us(j['step_time_delta_interval_us'][1], True)}); the decomposition explains "
                  f"{j['explained_pct']:.1f}% of the change of the mean ({fmt_us(j['step_time_mean_delta_us'], True)})."),
        *([paragraph(f"device memory: {memory}")] if memory else []),
        *([paragraph(f"work: {work}")] if work else []),
        *[paragraph(n, "note") for n in j["notes"]])
    dec = j["decomposition"]
    rep.add("Where the change went (per step)",
            bar_chart([x["category"] for x in dec], [x["delta_us"] / 1e3 for x in dec], "ms"),
            stacked_bar_chart(["baseline", "candidate"], {x["category"]: [x["baseline_us"] / 1e3, x["candidate_us"] / 1e3]
                                                          for x in dec}, "ms"),
            table([[x["category"], fmt_us(x["baseline_us"]), fmt_us(x["candidate_us"]), fmt_us(x["delta_us"], True)]
                   for x in dec], ["bucket", "baseline", "candidate", "delta"]))
    rows = lambda cs: [[c["name"][:110], c["category"], fmt_us(c["delta_us_per_step"], True),  # noqa: E731
                        c["count_baseline_per_step"], c["count_candidate_per_step"]] for c in cs]
    head = ["name", "category", "delta/step", "count/step baseline", "count/step candidate"]
    rep.add("Kernels and operators by change of time per step", table(rows(j["contributions"]), head),
            paragraph("Operators are host events (inclusive time: nested operators count again in their "
                      "parents); kernels are device time.", "note"))
    if j["findings"]:
        rep.add("Findings of `trainperf diagnose` that changed", table(
            [[f["kind"], f["change"], f["baseline_severity"] or "-", f["candidate_severity"] or "-",
              f["baseline_gain_pct"], f["candidate_gain_pct"]] for f in j["findings"]],
            ["finding", "change", "baseline severity", "candidate severity", "baseline gain %", "candidate gain %"]))
    rep.add("New in the candidate", table(rows(j["new"][:top]), head) if j["new"] else paragraph("none"))
    rep.add("Gone from the candidate", table(rows(j["gone"][:top]), head) if j["gone"] else paragraph("none"))
    return rep.write(path)
