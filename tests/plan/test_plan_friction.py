"""Issue 14 (a newcomer's friction) in `trainperf plan` / `trainperf calibrate`: each answered in one line."""

import re
from unittest import mock

import pytest

from trainperf.cli import main
from trainperf.errors import TrainperfError


def _run(args, capsys) -> tuple[int, str]:
    """Run the CLI as the `trainperf` script does; return (exit code, stdout + stderr)."""
    with pytest.raises(SystemExit) as e:
        main(args)
    cap = capsys.readouterr()
    return e.value.code, cap.out + cap.err


def _measure_never(*a, **k):  # calibrate must refuse before it measures
    raise AssertionError("measured before checking the arguments")


@pytest.mark.parametrize("bad", ["folder", "file_parent"])
def test_calibrate_refuses_unusable_out_before_measuring(bad, capsys, unusable_outputs):
    folder, under_a_file = unusable_outputs("cal.json")
    out = folder if bad == "folder" else under_a_file
    with mock.patch("trainperf.plan.calibrate.calibrate", _measure_never):
        code, text = _run(["calibrate", "--quick", "--out", str(out)], capsys)
    assert code == 2, text
    assert "Traceback" not in text and f"--out {out}" in text


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:99"])
def test_calibrate_refuses_unknown_device_before_measuring(tmp_path, device, capsys):
    with mock.patch("trainperf.plan.calibrate.calibrate", _measure_never):
        code, text = _run(["calibrate", "--quick", "--device", device, "--out", str(tmp_path / "c.json")], capsys)
    assert code == 2, text
    assert "--device" in text and "Traceback" not in text


@pytest.mark.parametrize("gpu", ["a100", "v100", "mi250x"])
def test_fp8_on_accelerator_without_fp8_is_refused(gpu, capsys):
    from trainperf.hardware import catalog

    code, text = _run(["plan", "--model", "llama3-8b", "--gpu", gpu, "--precision", "fp8", "--top", "1"], capsys)
    if gpu == "v100" and "v100" not in {n.split("-")[0] for n in catalog()}:
        assert code == 2 and "v100" in text.lower()  # not in the catalog at all: the catalog error
        return
    assert code == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "fp8" in lines[0] and gpu in lines[0]
    with_fp8 = [n for n, a in catalog().items() if a.fp8_tflops]
    assert with_fp8 and all(n in lines[0] for n in with_fp8)
    named = set(re.findall(r"[\w.-]+", lines[0]))  # whole names: "a10" is not named by "a100-40gb"
    assert not any(n in named for n, a in catalog().items() if not a.fp8_tflops and n.split("-")[0] != gpu)


def test_fp8_on_accelerator_with_fp8_runs(capsys):
    code, text = _run(["plan", "--model", "llama3-8b", "--gpu", "h100", "--precision", "fp8", "--top", "1", "--json"],
                      capsys)
    assert code == 0, text


def test_objective_cost_shows_dollars(capsys):
    import json
    import re

    args = ["plan", "--model", "llama3-8b", "--gpus", "16", "--objective", "cost", "--top", "3", "--usd-per-hour", "2.5"]
    code, text = _run(args + ["--json"], capsys)
    assert code == 0, text
    lay = json.loads(text)["layouts"]
    code, table = _run(args, capsys)
    assert code == 0, table
    assert "$/step" in table and "$/M tok" in table
    rows = [ln for ln in table.splitlines() if re.match(r"^│ \d ", ln)]
    assert len(rows) == 3
    for row, d in zip(rows, lay):
        cells = [c.strip() for c in row.strip("│").split("│")]
        # hand-worked: GPU-seconds of one step times the price; price over the GPU's tokens per second
        usd_step = d["step_time_s"] * d["n_gpus"] * 2.5 / 3600
        usd_mtok = 2.5 / 3600 / d["tokens_per_s_per_gpu"] * 1e6
        assert float(cells[3]) == pytest.approx(usd_step, rel=1e-3)
        assert float(cells[4]) == pytest.approx(usd_mtok, rel=1e-3)
        assert d["usd_per_million_tokens"] == pytest.approx(usd_mtok, rel=1e-9)


def test_layout_that_does_not_fit_says_why(capsys):
    import json

    from trainperf.specs import MODEL_PRESETS, param_count

    args = ["plan", "--model", "llama3-70b", "--gpus", "8", "--layout", "tp=8,pp=1,zero=1"]
    code, text = _run(args + ["--json"], capsys)
    assert code == 0, text
    d = json.loads(text)
    assert d["fits"] is False
    terms = d["memory_terms_bytes"]
    # hand-worked: Adam keeps 12 bytes (fp32 master, m, v) per parameter; tp=8, dp=1 splits them 8 ways
    assert terms["optimizer state"] == pytest.approx(12 * param_count(MODEL_PRESETS["llama3-70b"]) / 8, rel=0.01)
    assert terms["weights"] == pytest.approx(terms["optimizer state"] / 6, rel=1e-9)
    assert all(v > 0 for v in terms.values())
    assert sum(terms.values()) / 2**30 == pytest.approx(d["memory_gib_per_gpu"], rel=1e-9)
    code, table = _run(args, capsys)
    line = " ".join(table.split())
    need = f"needs {d['memory_gib_per_gpu']:.1f} GiB of {d['hbm_gib_per_gpu']:.1f} GiB"
    assert need in line and line.index("optimizer state") < line.index("weights")


def test_plan_html_path_checked_before_planning(monkeypatch, unusable_outputs):
    """Issue 14 defect 1: an unusable --html path is one line before any planning."""
    from typer.testing import CliRunner

    from trainperf.cli import app
    from trainperf.plan import api

    def must_not_plan(*a, **k):
        raise AssertionError("planned before checking --html")

    monkeypatch.setattr(api, "run_search", must_not_plan)
    for bad in unusable_outputs("report.html"):
        res = CliRunner().invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "8", "--html", str(bad)])
        assert res.exit_code != 0 and isinstance(res.exception, TrainperfError), res.output
        assert str(res.exception).startswith("--html ") and "\n" not in str(res.exception)
