"""Presenting a BenchResult: a rich table and a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

from trainperf.bench.run import BenchResult


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def sig(value: float | None) -> str:
    """Return ``value`` with 3 significant digits, whole numbers from 100 up with thousands separators,
    '-' for None. Fixed decimals showed the interpreter's 0.0008 GB/s and 0.0012x as 0 and 0.00."""
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def table_rows(result: BenchResult) -> list[list[str]]:
    """Return display rows: kernel, shape, pass, impl, ms, GB/s, TFLOP/s, %copy, %peak, MiB, x eager, max err."""
    rows = []
    for r in result.rows:
        mem = None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20
        rows.append([r.kernel, r.shape, r.passname, r.impl, sig(r.median_ms), sig(r.gbps), sig(r.tflops),
                     sig(r.pct_copy_bw), sig(r.pct_catalog_peak), sig(mem), sig(r.speedup_vs_eager),
                     _fmt(r.max_rel_err, ".1e")])
    return rows


def ceilings(result: BenchResult) -> str:
    """Return the line naming what the rows are measured against: the measured copy bandwidth and the
    catalog peaks this device has (a CPU has none)."""
    parts = [f"measured device-to-device copy bandwidth {sig(result.copy_gbps)} GB/s"]
    if result.catalog_hbm_gbps:
        parts.append(f"catalog HBM peak {sig(result.catalog_hbm_gbps)} GB/s")
    if result.catalog_peak_tflops:
        parts.append(f"catalog dense peak {sig(result.catalog_peak_tflops)} TFLOP/s")
    if not (result.catalog_hbm_gbps or result.catalog_peak_tflops):
        parts.append("no catalog peak for this device (%peak: -)")
    return "; ".join(parts)


def _rate_unit(values: list[float | None], unit: str) -> tuple[float, str]:
    """Return (divisor, unit) that puts the largest of ``values`` at 1 or more: GB/s, MB/s or kB/s
    (TFLOP/s, GFLOP/s, MFLOP/s); a chart axis otherwise reads '800µ GB/s'."""
    top = max((abs(v) for v in values if v is not None), default=0.0)
    if top == 0:
        return 1.0, unit
    for div, prefix in ((1.0, ""), (1e-3, "m"), (1e-6, "µ")):
        if top >= div:
            break
    names = {"GB/s": {"": "GB/s", "m": "MB/s", "µ": "kB/s"}, "TFLOP/s": {"": "TFLOP/s", "m": "GFLOP/s", "µ": "MFLOP/s"}}
    return div, names[unit][prefix]


HEADER = ["kernel", "shape", "pass", "impl", "ms", "GB/s", "TFLOP/s", "%copy", "%peak", "MiB", "x eager", "err"]


def write_html(result: BenchResult, path: str | Path) -> Path:
    """Write a self-contained HTML report (a GB/s or TFLOP/s chart per kernel and pass, and the full table)."""
    from trainperf.report.html import Report, bar_chart, paragraph, table

    title = f"trainperf bench kernels — {result.device_name} ({result.dtype})"
    report = Report(title, ceilings(result)[0].upper() + ceilings(result)[1:])
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
        div, unit = _rate_unit(values, "TFLOP/s" if flop_bound else "GB/s")
        report.add(f"{kernel} {passname}",
                   bar_chart(labels, [None if v is None else v / div for v in values], unit=unit))
    report.add("All measurements", table(table_rows(result), HEADER))
    return report.write(path)
