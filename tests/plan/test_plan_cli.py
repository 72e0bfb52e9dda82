"""`trainperf plan` / `trainperf calibrate` CLI: JSON schema, bad input, calibration round trip."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainperf.cli import app
from trainperf.plan.calibrate import fit_gemm_law
from trainperf.plan.efficiency import load_calibration
from trainperf.errors import TrainperfError

BIN = Path(sys.executable).parent / "trainperf"
runner = CliRunner()


def _json(args):
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_search_json_schema():
    d = _json(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--global-batch", "64", "--top", "3",
               "--tokens", "1T"])
    for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_gib_per_gpu", "fits", "breakdown", "layout"):
        assert k in d
    assert len(d["layouts"]) == 3 and d["layouts"][0]["usd"] > 0 and d["layouts"][0]["kwh"] > 0
    assert abs(sum(d["breakdown"].values()) - d["step_time_s"]) < 1e-9
    assert 0 < d["mfu"] < 1 and d["fits"] is True


def test_layout_json_and_compare():
    d = _json(["--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", "--layout",
               "tp=4,pp=4,cp=2,vpp=5,sp=1,zero=1"])
    assert d["layout"].startswith("tp=4,pp=4,dp=2,cp=2,vpp=5,sp=1") and d["step_time_s"] > 0
    c = _json(["--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--compare-hardware",
               "h100,h200,mi300x", "--tokens", "1e12"])
    opts = c["options"]
    assert [o["gpu"] for o in opts] and len(opts) == 3
    per_m = [o["usd_per_million_tokens"] for o in opts]
    assert per_m == sorted(per_m)
    # $ per million tokens = $/GPU-hour / 3600 / (tokens/s/GPU) * 1e6
    o = opts[0]
    assert o["usd_per_million_tokens"] == pytest.approx(
        o["usd_per_gpu_hour"] / 3600 / o["best"]["tokens_per_s_per_gpu"] * 1e6)


def test_lists():
    d = _json(["--list-gpus", "--list-models"])
    assert any(g["name"] == "b200" for g in d["gpus"]) and any(m["name"] == "llama3-405b" for m in d["models"])


@pytest.mark.parametrize("args,needle", [
    (["--model", "nope"], "unknown model"),
    (["--model", "llama3-8b", "--gpu", "v99"], "unknown GPU"),
    (["--model", "llama3-405b", "--gpus", "8"], "smallest needs"),
    (["--model", "llama3-8b", "--gpus", "8", "--layout", "tp=3"], "does not divide"),
    (["--model", "llama3-8b", "--gpus", "64", "--layout", "tp=64"], "tp=64 does not divide the model's 32 attention heads"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = subprocess.run([str(BIN), "plan", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_field_config(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"n_layers": 2, "hidden": 64, "n_heads": 4, "vocab": 100, "seq_len": 64}')
    r = subprocess.run([str(BIN), "plan", "--model", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "missing field 'ffn_hidden'" in r.stderr and "Traceback" not in r.stderr


def test_gemm_law_fit_recovers_parameters():
    # synthetic rates from the law itself: the fit must recover best rate and d0
    rows = [{"m": m, "n": n, "k": k, "tflops": 100.0 * (m / (m + 50)) * (n / (n + 50)) * (k / (k + 50))}
            for m, n, k in [(64, 64, 64), (128, 256, 512), (1024, 1024, 1024), (4096, 512, 2048), (32, 4096, 4096)]]
    best, d0 = fit_gemm_law(rows)
    assert best == pytest.approx(100.0, rel=0.03) and d0 == pytest.approx(50.0, rel=0.05)


def test_calibrate_cpu_round_trip(tmp_path):
    out = tmp_path / "cal.json"
    r = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    prof = json.loads(out.read_text())
    assert prof["efficiency"]["measured_gemm_tflops"] > 0 and prof["copy_tbps"] > 0 and len(prof["gemm"]) >= 3
    eff = load_calibration(out)
    assert eff.measured_gemm_tflops == prof["efficiency"]["measured_gemm_tflops"]
    default = _json(["--model", "tiny", "--gpus", "1", "--global-batch", "4"])
    cal = _json(["--model", "tiny", "--gpus", "1", "--global-batch", "4", "--calibration", str(out)])
    assert cal["efficiency_source"].startswith("trainperf calibrate")
    # a CPU is orders of magnitude slower than an H100's catalog figures
    assert cal["step_time_s"] > 10 * default["step_time_s"]


def test_bad_calibration_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text('{"efficiency": {"measured_gemm_tflops": "fast"}}')
    with pytest.raises(TrainperfError, match="must be a number"):
        load_calibration(p)
    p.write_text("[1, 2]")
    with pytest.raises(TrainperfError, match="not a calibration profile"):
        load_calibration(p)


def test_html_report_and_unknown_compare_gpu(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from chart_checks import assert_charts

    out = tmp_path / "plan.html"
    r = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--top", "3",
                            "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert_charts(page)
    assert "llama3-8b" in page
    r = subprocess.run([str(BIN), "plan", "--model", "llama3-8b", "--gpus", "16", "--compare-hardware", "h100,x9"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown GPU 'x9'" in r.stderr and "h200" in r.stderr


def test_calibrate_two_ranks_measures_allreduce(tmp_path):
    # torchrun + gloo on CPU: the collective path of calibrate (bus bandwidth across ranks)
    out = tmp_path / "cal2.json"
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "trainperf.cli", "calibrate", "--device", "cpu",
                        "--quick", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    prof = json.loads(out.read_text())
    assert prof["allreduce_busbw_gbps"] > 0 and prof["efficiency"]["measured_bus_gbps"] > 0
    assert load_calibration(out).measured_bus_gbps == prof["allreduce_busbw_gbps"]
