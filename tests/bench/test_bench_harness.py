"""The kernel benchmark harness: byte/FLOP counts (hand-worked), CLI on CPU, JSON, run records, errors."""

import json

import pytest
import torch
from typer.testing import CliRunner

from trainperf.bench import roofline
from trainperf.bench.cases import parse_shapes
from trainperf.bench.run import run_bench, to_record
from trainperf.cli import app
from trainperf.errors import TrainperfError


def test_row_kernel_bytes_hand_worked():
    # RMSNorm fwd, 4096 x 8192 bf16: read x + write y = 2 * 4096 * 8192 * 2 B, + weight 8192 * 2 B
    # + rstd 4096 * 4 B = 134,250,496 B. At 0.0312 ms that is 4302.9 GB/s (about the H200 copy figure).
    w = roofline.row_kernel_work("rms_norm", 4096, 8192, 2, "fwd")
    assert w.bytes == 2 * 4096 * 8192 * 2 + 8192 * 2 + 4096 * 4 == 134_250_496
    assert roofline.gbps(w, 0.0312) == pytest.approx(4302.9, abs=0.05)
    # SwiGLU fwd+bwd: fwd reads gate, up, writes out (3); bwd reads dy, gate, up, writes dgate, dup (5).
    assert roofline.row_kernel_work("swiglu", 10, 100, 4, "fwd+bwd").bytes == 8 * 10 * 100 * 4


def test_cross_entropy_and_flce_work_hand_worked():
    # CE fwd+bwd over 4096 x 128256 bf16 logits: read, read again, write the gradient = 3 passes.
    ce = roofline.cross_entropy_work(4096, 128256, 2, "fwd+bwd")
    assert ce.bytes == 3 * 4096 * 128256 * 2 + 4096 * 8
    # Linear + CE fwd+bwd: 3 GEMMs of 2 * rows * hidden * vocab FLOPs.
    flce = roofline.linear_cross_entropy_work(8192, 4096, 128256, 2, "fwd+bwd")
    assert flce.flops == 3 * 2 * 8192 * 4096 * 128256
    assert roofline.tflops(flce, 1000.0) == pytest.approx(flce.flops / 1e12)


def test_parse_shapes_and_errors():
    assert parse_shapes("4096x8192, 8x4096x32x128") == [(4096, 8192), (8, 4096, 32, 128)]
    with pytest.raises(TrainperfError, match="not like"):
        parse_shapes("4096*8192")
    with pytest.raises(TrainperfError, match="non-positive"):
        parse_shapes("0x5")


def test_run_bench_cpu_rows_records_and_correctness():
    result = run_bench("cpu", kernels=["rms_norm", "cross_entropy"], shapes=[(8, 96)], dtype="fp32",
                       impls=("trainperf", "eager"), measure_memory=False)
    assert {(r.kernel, r.impl, r.passname) for r in result.rows} == {
        (k, i, p) for k in ("rms_norm", "cross_entropy") for i in ("trainperf", "eager") for p in ("fwd", "fwd+bwd")}
    assert any("mean nothing" in n for n in result.notes)
    for r in result.rows:
        assert r.median_ms > 0 and r.gbps > 0 and r.max_rel_err < 1e-5
        work = roofline.row_kernel_work("rms_norm", 8, 96, 4, r.passname) if r.kernel == "rms_norm" \
            else roofline.cross_entropy_work(8, 96, 4, r.passname)
        assert r.gbps == pytest.approx(work.bytes / (r.median_ms * 1e-3) / 1e9)
        assert r.pct_copy_bw == pytest.approx(100 * r.gbps / result.copy_gbps)
    record = to_record(result)
    assert record.kind == "bench" and len(record.kernels) == len(result.rows)
    assert record.config["copy_gbps"] == result.copy_gbps


def test_cli_json_and_store(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "kernels", "--device", "cpu", "--kernels", "swiglu,rope",
                              "--shapes", "4x40,1x4x2x8", "--dtype", "fp32", "--json", "--store", str(tmp_path),
                              "--html", str(tmp_path / "bench.html")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert {r["kernel"] for r in data["rows"]} == {"swiglu", "rope"}
    assert {r["shape"] for r in data["rows"]} == {"4x40", "1x4x2x8"}
    assert (tmp_path / "bench.html").read_text().startswith("<!")
    from trainperf.store import read_runs

    runs = read_runs(str(tmp_path))
    assert len(runs) == 1 and runs[0].kind == "bench" and len(runs[0].kernels) == len(data["rows"])


def test_cli_user_errors_are_one_line_exit_2():
    import subprocess
    import sys

    for args, msg in ((["--kernels", "nope"], "unknown kernel"), (["--shapes", "4096*8192"], "not like"),
                      (["--device", "tpu"], "--device")):
        out = subprocess.run([sys.executable, "-m", "trainperf.cli", "bench", "kernels", "--no-record", *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert msg in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_has_memory_and_roofline():
    result = run_bench("cuda", kernels=["rms_norm"], shapes=[(1024, 4096)], impls=("trainperf", "eager"))
    assert all(r.peak_mem_bytes is not None and r.pct_copy_bw is not None for r in result.rows)


def _interpreter_result():
    """The demo's CPU rows (interpreted Triton kernel vs eager), measured numbers as the demo printed them."""
    from trainperf.bench.run import BenchResult, Row

    rows = [Row("rms_norm", "trainperf", "32x512", "bf16", "fwd", 87.47, 0.000762, 1.2e-6, 0.0381, None, None,
                3.6e-3, 0.00123),
            Row("rms_norm", "eager", "32x512", "bf16", "fwd", 0.108, 0.618, 1.0e-3, 30.9, None, None, 0.0, 1.0)]
    return BenchResult("cpu", "cpu", "bf16", 2.0, None, None, rows, [])


def test_tiny_rates_are_shown_not_rounded_to_zero(tmp_path):
    """The demo's bench table read GB/s 0, %copy 0, x eager 0.00 and the chart's axis '800µ GB/s'."""
    from trainperf.bench.report import ceilings, sig, table_rows, write_html

    assert [sig(v) for v in (0.000762, 0.00123, 0.618, 87.47, 123.4, 3350.0, 0.0, None)] == \
        ["0.000762", "0.00123", "0.618", "87.5", "123", "3,350", "0", "-"]
    res = _interpreter_result()
    ours, eager = table_rows(res)
    assert ours[5:8] == ["0.000762", "1.2e-06", "0.0381"] and ours[10] == "0.00123" and eager[10] == "1"
    assert ceilings(res) == ("measured device-to-device copy bandwidth 2 GB/s; "
                             "no catalog peak for this device (%peak: -)")
    page = write_html(res, tmp_path / "b.html").read_text()
    assert "- GB/s" not in page and "- TFLOP/s" not in page
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from chart_checks import plotly_figures

    from trainperf.report.html import charts_backend

    if charts_backend() == "plotly":  # the largest bar 0.618 GB/s is drawn as 618 MB/s
        (fig,) = plotly_figures(page)
        assert fig["layout"]["xaxis"]["title"]["text"] == "MB/s"
        assert fig["data"][0]["x"] == pytest.approx([0.762, 618.0])
