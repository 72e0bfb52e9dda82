"""Findings, the JSON schema, the CLI and parity with HTA 0.5.0 on the real traces."""

import json
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from chart_checks import assert_charts  # noqa: E402

from trainperf.cli import app  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.render import print_summary  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/traces/hta not present")
RANK_KEYS = {"rank", "window_us", "idle_pct", "compute_pct", "non_compute_pct", "overlap_pct", "idle_host_pct",
             "idle_kernel_pct", "idle_other_pct"}
FINDING_KEYS = {"kind", "severity", "ranks", "evidence", "gain_pct", "recommendation"}


def _healthy(path: Path) -> Path:
    # 3 steps; the host runs 2 ms ahead; GEMMs back to back on stream 7; all-reduce fully under compute
    b = TraceBuilder()
    t = 0.0
    for s in range(3):
        b.step(s, t, 1000)
        for i in range(10):
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 5 * i, 2000 + t + 100 * i, 100)
        b.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + 60, 2000 + t + 300, 200, stream=20)
        t += 1000
    return b.write(path)


def _data_stall(path: Path) -> Path:
    b = TraceBuilder()
    t = 0.0
    for s in range(4):
        b.step(s, t, 2000)
        b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, 1500, cat="user_annotation")
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", t + 1500 + 10 * i, t + 1510 + 100 * i, 100)
        t += 2000
    return b.write(path)


def test_healthy_trace_has_no_high_finding(tmp_path):
    d = diagnose(_healthy(tmp_path / "h.json.gz"))
    assert not [f for f in d.findings if f.severity == "high"], d.findings
    r = d.ranks[0]
    assert r.overlap_pct == pytest.approx(100) and r.idle_pct < 5


def test_data_loader_stall_found_with_gain(tmp_path):
    d = diagnose(_data_stall(tmp_path / "s.json.gz"))
    f = d.findings[0]
    assert f.kind == "data_loader_stall" and f.severity == "high"
    # steps 0-2 analysed (the last excluded), replayed from the start of step 0: each waits 1500 us of its
    # 2000 us on data -> removing it gains 3 * 1500 us (issue 9: the first step's wait, before its first
    # launch, now counts too; it was 2 * 1500 when the replay started at the first launch)
    assert f.gain_us == pytest.approx(4500, rel=0.02)
    assert f.evidence["events"] and "DataLoader" in f.evidence["events"][0]["name"]


def test_the_terminal_shows_each_findings_what_if_and_bracketed_text_as_written(tmp_path):
    # the what-if is printed in brackets after the gain: rich read "[the data-loader ... removed]" as a style tag
    # and printed nothing of it; a note or name with brackets in it must print as written too
    p = _data_stall(tmp_path / "s.json.gz")
    d = diagnose(p)
    f = d.findings[0]
    out = CliRunner().invoke(app, ["diagnose", str(p)], env={"COLUMNS": "400"}).output
    assert f.what_if and f"[{f.what_if}]" in out
    f.notes.append("[tokens, vocabulary] logits")
    buf = StringIO()
    print_summary(d, Console(file=buf, width=400))
    assert "note: [tokens, vocabulary] logits" in buf.getvalue()


def test_cli_json_schema_and_steps(tmp_path):
    p = _data_stall(tmp_path / "s.json.gz")
    out = tmp_path / "out.json"
    r = CliRunner().invoke(app, ["diagnose", str(p), "--json", str(out), "--top", "3", "--steps", "1:2",
                                 "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert RANK_KEYS <= set(doc["ranks"][0]) and doc["findings"]
    assert all(FINDING_KEYS <= set(f) for f in doc["findings"])
    assert doc["ranks"][0]["steps"] == [1, 2]
    assert_charts((tmp_path / "r.html").read_text(), at_least=3)


@pytest.mark.parametrize("content", [b"", b"{not json", b"\x1f\x8b\x08\x00garbage"])
def test_cli_bad_input_one_line_exit_2(tmp_path, content):
    import subprocess

    p = tmp_path / "bad.json.gz"
    p.write_bytes(content)
    exe = Path(sys.executable).parent / "trainperf"
    r = subprocess.run([str(exe), "diagnose", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.json.gz" in r.stderr


def test_no_gpu_trace_says_gpu_analyses_skipped(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 100).step(2, 100, 100).cpu("aten::mm", 10, 50)
    d = diagnose(b.write(tmp_path / "cpu.json.gz"))
    assert d.ranks[0].gpu_analyses.startswith("skipped")
    assert any("GPU analyses" in n and "skipped" in n for n in d.notes)
    # the GPU's shares do not apply: null in the JSON, not a 0 % idle a reader would take for a busy GPU
    rank = d.to_json()["ranks"][0]
    assert all(rank[k] is None for k in ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct",
                                         "idle_host_pct", "idle_kernel_pct", "idle_other_pct")), rank


# HTA 0.5.0 (pandas 2.3.3) on these traces: ../shared/data/README.md; benchmarks/compare_hta.py reruns HTA
HTA_REFERENCE = {
    ("trace_filter", 0): (600058, 53.56, 17.71, 28.74, 11.81, 75.5, 0.2, 24.4),
    ("trace_filter", 1): (600674, 54.72, 22.57, 22.72, 20.05, 73.7, 0.1, 26.2),
    ("nccl_parser_config", 0): (435586, 77.78, 17.26, 4.97, 14.31, 99.7, 0.3, 0.0),
    ("negative_queue_length_values_check", 0): (1016554, 69.44, 14.15, 16.41, 1.37, 35.2, 0.4, 64.4),
    ("df_index_resolver", 1): (1396669, 46.08, 35.55, 18.37, 0.0, 94.5, 1.2, 4.3),
}


@needs_data
@pytest.mark.parametrize("folder", sorted({k[0] for k in HTA_REFERENCE}))
def test_parity_with_hta(folder):
    d = diagnose(DATA / folder)
    for r in d.ranks:
        ref = HTA_REFERENCE[(folder, r.rank)]
        assert r.window_us == pytest.approx(ref[0], abs=1)
        got = (r.idle_pct, r.compute_pct, r.non_compute_pct, r.overlap_pct, r.idle_host_pct, r.idle_kernel_pct,
               r.idle_other_pct)
        for g, e in zip(got, ref[1:]):
            assert g == pytest.approx(e, abs=0.5)


def test_exposed_comm_gain_by_hand(tmp_path):
    # GEMM A [0,100) on stream 7; all-reduce [100,300) on stream 20 waits for A; GEMM B (launched at 0)
    # starts only at 300, right after the all-reduce: compute waits for communication.
    # Replay with the all-reduce not blocking compute: B runs [100,200), the all-reduce still ends at 300,
    # so the span (first launch call at -10 .. last end) shrinks from 410 to 310 us: gain 100 us = 24.4 %.
    b = TraceBuilder()
    b.launch("ampere_sgemm_128x64_tn", -10, 0, 100)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", -5, 100, 200, stream=20)
    b.launch("ampere_sgemm_128x64_tn", 0, 300, 100)
    d = diagnose(b.write(tmp_path / "c.json.gz"))
    f = next(f for f in d.findings if f.kind == "exposed_comm")
    assert f.gain_us == pytest.approx(100) and f.gain_pct == pytest.approx(100 * 100 / 410, abs=0.01)
    # only GEMM B (device work) waits for the all-reduce, no host sync: the gain is an upper bound (B may consume
    # its output), rated one level below its 24.4 % (rules.exposed_comm)
    assert f.severity == "medium" and f.gain_is_upper_bound and d.ranks[0].overlap_pct == 0


@pytest.mark.parametrize("option", ["--json-out", "--html", "--perfetto"])
def test_unusable_output_paths_refused_before_reading_traces(tmp_path, monkeypatch, option, unusable_outputs):
    """Issue 14 defect 1: an output path that cannot be written is one line, before any trace is read."""
    from trainperf.diagnose import api
    from trainperf.errors import TrainperfError

    def must_not_run(*a, **k):
        raise AssertionError("read the traces before checking the output path")

    monkeypatch.setattr(api, "diagnose", must_not_run)
    for bad in unusable_outputs("out.json"):
        res = CliRunner().invoke(app, ["diagnose", str(tmp_path), option, str(bad)])
        assert isinstance(res.exception, TrainperfError), res.output
        assert str(res.exception).startswith(f"{option} ") and "\n" not in str(res.exception)
