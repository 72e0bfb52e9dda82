"""HTML report of `trainperf diff`: step times, where the change went, the names that moved."""

from __future__ import annotations

from pathlib import Path

from trainperf.report.html import Report, bar_chart, paragraph, stacked_bar_chart, table


def write_report(d, path: str | Path, top: int = 25) -> Path:
    """Write a self-contained HTML report of a diagnose.diff.TraceDiff to path; return the path."""
    j = d.to_json(top=top)
    a, b = j["baseline"], j["candidate"]
    rep = Report("trainperf diff", f"{a['source']} → {b['source']}")
    rep.add("Step time (µs per step, per rank)", paragraph(j["headline"]), table([
        ["baseline", a["step_time_us"], f"{a['step_time_interval_us'][0]:.0f} – {a['step_time_interval_us'][1]:.0f}",
         a["step_time_mean_us"], len(a["step_times_us"]), len(a["ranks"])],
        ["candidate", b["step_time_us"], f"{b['step_time_interval_us'][0]:.0f} – {b['step_time_interval_us'][1]:.0f}",
         b["step_time_mean_us"], len(b["step_times_us"]), len(b["ranks"])]],
        ["side", "median µs", "95% interval of the median", "mean µs", "steps", "ranks"]),
        paragraph(f"change of the median {j['step_time_delta_pct']:+.2f}%; Hodges-Lehmann shift "
                  f"{j['step_time_delta_hl_us']:+.0f} µs (95% interval {j['step_time_delta_interval_us'][0]:+.0f} to "
                  f"{j['step_time_delta_interval_us'][1]:+.0f}); the decomposition explains {j['explained_pct']:.1f}% "
                  f"of the change of the mean ({j['step_time_mean_delta_us']:+.0f} µs)."),
        *[paragraph(n, "note") for n in j["notes"]])
    dec = j["decomposition"]
    rep.add("Where the change went (µs per step)",
            bar_chart([x["category"] for x in dec], [x["delta_us"] for x in dec], "µs"),
            stacked_bar_chart(["baseline", "candidate"], {x["category"]: [x["baseline_us"], x["candidate_us"]]
                                                          for x in dec}, "µs"),
            table([[x["category"], x["baseline_us"], x["candidate_us"], x["delta_us"]] for x in dec],
                  ["bucket", "baseline µs", "candidate µs", "delta µs"]))
    rows = lambda cs: [[c["name"][:110], c["category"], c["delta_us_per_step"], c["count_baseline_per_step"],  # noqa: E731
                        c["count_candidate_per_step"]] for c in cs]
    head = ["name", "category", "delta µs/step", "count/step baseline", "count/step candidate"]
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
