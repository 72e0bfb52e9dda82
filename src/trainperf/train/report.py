"""The run's HTML report: loss and step-time curves, goodput split, predicted vs measured."""

from __future__ import annotations

from pathlib import Path

from trainperf.monitor.monitor import read_jsonl
from trainperf.report.html import Report, bar_chart, line_chart, paragraph, table
from trainperf.store.record import peak_text


def pct(x: float | None) -> str:
    """Return a fraction as a percentage with one decimal ('-' for None)."""
    return f"{x * 100:.1f}%" if x is not None else "-"


def title_text(result: dict) -> str:
    """Return the run's one-line title: model, processes x device, parallelism."""
    strategy = result.get("strategy")
    return (f"{result.get('model')} · {result.get('world_size')} x {result.get('device')} · "
            f"{'no parallelism' if strategy in (None, 'none') else strategy}")


def write_report(run_dir: str | Path, result: dict) -> Path:
    """Write ``run_dir/report.html`` from metrics.jsonl and the run summary; return its path."""
    run_dir = Path(run_dir)
    latest = {}
    for s in read_jsonl(run_dir / "metrics.jsonl"):  # after a resume, the last attempt's record of each step counts
        latest[s["step"]] = s
    kept = [latest[k] for k in sorted(latest)]
    xs = [s["step"] for s in kept]
    gp = result.get("goodput", {})
    rep = Report(f"trainperf train: {title_text(result)}", f"layout {result.get('layout')}")
    peak = peak_text(result.get("peak_flops"), result.get("peak_source", ""))
    notes = [paragraph(f"MFU and HFU are relative to {peak}")] if peak else []
    if result.get("contention_note"):
        notes.append(paragraph(f"Note: {result['contention_note']}", "note"))
    rep.add("Summary", table([
        ["median step time (s)", result.get("step_time_s")],
        ["tokens/s (all ranks)", result.get("tokens_per_s")],
        ["MFU", pct(result.get("mfu"))], ["HFU", pct(result.get("hfu"))],
        ["peak memory per rank (GiB)", (result.get("mem_peak_bytes") or 0) / 2**30],
        ["Python GC pause a step, mean (ms)", None if result.get("gc_pause_s") is None else result["gc_pause_s"] * 1e3],
        ["goodput", pct(gp.get("goodput"))], ["final loss", result.get("final_loss")],
    ], ["metric", "value"]), *notes)
    if kept:
        rep.add("Loss", line_chart({"loss": [s["loss"] for s in kept]}, xs=xs, unit="loss (nats)", x_title="step"))
        evals = [s for s in kept if s.get("eval_loss") is not None]
        if evals:
            rep.add("Held-out loss (--eval-every)", line_chart({"held-out loss": [s["eval_loss"] for s in evals]},
                                                              xs=[s["step"] for s in evals], unit="loss (nats)",
                                                              x_title="step"))
        lines = {"step time": [s["step_time_s"] for s in kept], "data wait": [s["data_wait_s"] for s in kept]}
        if any(s.get("gc_collections") for s in kept):  # the collector's pauses, where it ran inside the steps
            lines["Python GC pauses"] = [s.get("gc_pause_s") for s in kept]
        rep.add("Step time", line_chart(lines, xs=xs, unit="s", x_title="step"))
    parts = ["productive_s", "startup_s", "data_wait_s", "checkpoint_s", "restart_s", "lost_work_s", "other_s"]
    rep.add("Goodput: where the wall time went", bar_chart([p[:-2] for p in parts], [gp.get(p, 0.0) for p in parts],
                                                           unit="s"))
    pred = result.get("predicted") or {}
    if "predicted" in pred:
        rows = [[k, pred["measured"].get(k), pred["predicted"].get(k), pred["measured_over_predicted"].get(k)]
                for k in pred["predicted"]]
        rep.add("Predicted (trainperf plan) vs measured", table(rows, ["metric", "measured", "predicted", "ratio"]))
    elif pred.get("note"):
        rep.add("Predicted vs measured", paragraph(pred["note"], "note"))
    return rep.write(run_dir / "report.html")
