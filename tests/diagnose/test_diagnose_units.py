"""Durations in diagnose/diff output are scaled to µs/ms/s with their unit, one helper (issue 14)."""

import pytest

from trainperf.diagnose.units import fmt_us


@pytest.mark.parametrize("us, signed, text", [
    (9352020, False, "9.35 s"), (5063908, False, "5.06 s"), (-4288112, True, "-4.29 s"),
    (812.4, True, "+812 µs"), (3.25, False, "3.25 µs"), (45_600, False, "45.6 ms"), (123_456, False, "123 ms"),
    (0, True, "+0.00 µs")])
def test_fmt_us_scales_to_three_significant_digits_with_the_unit(us, signed, text):
    assert fmt_us(us, signed) == text


def _long_steps(path, step_us: float):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
    from kineto_builder import TraceBuilder

    b = TraceBuilder()
    for s in range(4):
        t = s * step_us
        b.step(s, t, step_us)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 10, t + 20, step_us / 2)
    return b.write(path)


def test_diff_of_second_long_steps_shows_seconds_not_7_digit_microseconds(tmp_path):
    import re

    from typer.testing import CliRunner

    from trainperf.cli import app

    a, b = _long_steps(tmp_path / "a.json.gz", 9_352_020), _long_steps(tmp_path / "b.json.gz", 5_063_908)
    r = CliRunner().invoke(app, ["diff", str(a), str(b), "--no-findings", "--html", str(tmp_path / "d.html")],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "9.35 s -> 5.06 s" in r.output, r.output
    assert not re.search(r"\d{5,}", r.output.replace(str(tmp_path), "")), r.output
    html = (tmp_path / "d.html").read_text()
    tables = "".join(re.findall(r"<table>.*?</table>", html, re.S))
    assert "9.35 s" in tables and not re.search(r"\de[+-]\d", tables), tables
