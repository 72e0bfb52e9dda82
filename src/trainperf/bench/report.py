"""Presenting a BenchResult: a rich table and a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

from trainperf.bench.run import BenchResult


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(result: BenchResult) -> list[list[str]]:
    """Return display rows: kernel, shape, pass, impl, ms, GB/s, TFLOP/s, %copy, %peak, MiB, x eager, max err."""
    rows = []
    for r in result.rows:
        mem = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
        rows.append([r.kernel, r.shape, r.passname, r.impl, _fmt(r.median_ms, ".3f"), _fmt(r.gbps, ".0f"),
                     _fmt(r.tflops, ".1f"), _fmt(r.pct_copy_bw, ".0f"), _fmt(r.pct_catalog_peak, ".0f"),
                     _fmt(mem, ".0f"), _fmt(r.speedup_vs_eager, ".2f"), _fmt(r.max_rel_err, ".1e")])
    return rows


HEADER = ["kernel", "shape", "pass", "impl", "ms", "GB/s", "TFLOP/s", "%copy", "%peak", "MiB", "x eager", "err"]


def write_html(result: BenchResult, path: str | Path) -> Path:
    """Write a self-contained HTML report (a GB/s or TFLOP/s chart per kernel and pass, and the full table)."""
    from trainperf.report.html import Report, bar_chart, paragraph, table

    title = f"trainperf bench kernels — {result.device_name} ({result.dtype})"
    ceilings = (f"Measured device-to-device copy bandwidth: {result.copy_gbps:.0f} GB/s; catalog HBM peak: "
                f"{_fmt(result.catalog_hbm_gbps, '.0f')} GB/s; catalog dense peak: "
                f"{_fmt(result.catalog_peak_tflops, '.0f')} TFLOP/s.")
    report = Report(title, ceilings)
    for note in result.notes:
        report.add("Note", paragraph(note))
    seen = []
    for r in result.rows:
        if (r.kernel, r.passname) not in seen:
            seen.append((r.kernel, r.passname))
    for kernel, passname in seen:
        rows = [r for r in result.rows if r.kernel == kernel and r.passname == passname]
        flop_bound = kernel == "fused_linear_cross_entropy"
        labels = [f"{r.shape} {r.impl}" for r in rows]
        values = [r.tflops if flop_bound else r.gbps for r in rows]
        report.add(f"{kernel} {passname}", bar_chart(labels, values, unit="TFLOP/s" if flop_bound else "GB/s"))
    report.add("All measurements", table(table_rows(result), HEADER))
    return report.write(path)
