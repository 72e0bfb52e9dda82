"""The formatters for the durations and names the diagnose/diff terminal and HTML reports show."""

from __future__ import annotations


def fmt_us(us: float, signed: bool = False) -> str:
    """A duration given in µs as text scaled to µs, ms or s with its unit ("9.35 s", "+812 µs"):
    about 3 significant digits, so 7-digit µs figures read at a glance."""
    a = abs(us)
    value, unit = (us / 1e6, "s") if a >= 1e6 else (us / 1e3, "ms") if a >= 1e3 else (us, "µs")
    decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:{'+' if signed else ''}.{decimals}f} {unit}"


def short_name(name: str, n: int = 60) -> str:
    """name cut to n characters, "…" marking the cut."""
    return name if len(name) <= n else name[:n - 1] + "…"
