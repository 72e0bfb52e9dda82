"""How `trainperf plan` shows its figures: one energy unit for terminal and HTML, readable titles."""

import json
import re

from typer.testing import CliRunner

from trainperf.cli import app
from trainperf.plan.render import energy_unit, format_energy

runner = CliRunner()
ARGS = ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
        "--compare-hardware", "h100,h200", "--tokens", "1e12"]


def test_energy_unit_scales_to_the_largest_value():
    assert energy_unit([512.0]) == ("kWh", 1.0)
    assert energy_unit([900.0, 25_296.6]) == ("MWh", 1e3)
    assert energy_unit([2_856_257.0, float("inf")]) == ("GWh", 1e6)
    assert format_energy(25_296.6) == "25.3 MWh"


def test_compare_hardware_terminal_and_html_show_the_same_energy(tmp_path):
    out = tmp_path / "plan_hardware.html"
    r = runner.invoke(app, [*ARGS, "--html", str(out)], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    kwh = [o["kwh"] for o in json.loads(runner.invoke(app, [*ARGS, "--json"]).output)["options"]]
    unit, size = energy_unit(kwh)  # 16 GPUs x ~700 W x ~1900 h x 1.2: tens of MWh
    assert unit == "MWh"
    title = re.search(r"training 1e\+12 tokens \((\w+) = TDP", r.output)
    assert title and title.group(1) == unit
    header = next(line for line in r.output.splitlines() if "best layout" in line)
    assert f" {unit} " in header and "kWh" not in header
    page = out.read_text()
    assert f"<th>{unit}</th>" in page and "<th>kWh</th>" not in page
    for v in kwh:
        shown = f"{v / size:,.1f}"
        assert shown in r.output and f"<td>{shown}</td>" in page


def test_layout_tokens_line_uses_the_same_energy_formatter():
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                            "--layout", "tp=1,pp=1,zero=1", "--tokens", "1e12"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    d = json.loads(runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                                       "--layout", "tp=1,pp=1,zero=1", "--tokens", "1e12", "--json"]).output)
    assert format_energy(d["kwh"]) in r.output


def test_layout_breakdown_title_is_one_line_at_terminal_width():
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64",
                            "--layout", "tp=1,pp=1,zero=1"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0].strip()
    # the whole layout string on the first line, not folded to the 39-column table width
    assert first.startswith("breakdown of tp=1,pp=1,dp=16") and first.endswith("precision=bf16")


def test_plan_html_chart_has_a_title_naming_quantity_and_unit(tmp_path):
    out = tmp_path / "plan.html"
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--top", "3",
                            "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "Chart: predicted time per step (s) of layouts #1-#3, split by term." in page
    # the value axis names the quantity, not only its unit (the bar labels keep "0.5 s")
    assert "&quot;xaxis&quot;: {&quot;title&quot;: {&quot;text&quot;: &quot;time per step (s)&quot;}" in page
