"""Every report type opened in headless Chromium: the charts render and no text is clipped.

Reports are made by the real commands (plan, diagnose, diff, fleet changes, fleet tree,
compare) or the real report writers (train, bench, the demo's index page) on small inputs,
then opened together in one Chromium run (no network): a checker in each page waits for the charts, then measures every text element
of every chart against its chart's box. A screenshot of all of them is taken too (kept where
$TRAINPERF_SCREENSHOTS points, e.g. a CI artifact folder). Chromium is Debian's `chromium`
package (.ci/services.sh installs it); without it the test is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chart_checks import assert_charts  # noqa: E402

from trainperf.cli import main  # noqa: E402
from trainperf.report.html import charts_backend  # noqa: E402

CHROMIUM = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")]

# Runs in each report: after the charts are drawn, measure every chart text against its chart.
CHECKER = """
window.addEventListener('load', function () { setTimeout(function () {
  var res = {page: location.pathname.split('/').pop(), charts: 0, rendered: 0, texts: 0, clipped: []};
  function inside(t, box) {
    var b = t.getBoundingClientRect();
    if (!t.textContent.trim() || b.width === 0) return;
    res.texts++;
    if (b.left < box.left - 1 || b.right > box.right + 1 || b.top < box.top - 1 || b.bottom > box.bottom + 1)
      res.clipped.push(t.textContent.slice(0, 60));
  }
  document.querySelectorAll('div.trainperf-chart').forEach(function (el) {
    res.charts++;
    if (el.querySelector('svg.main-svg') && el.querySelectorAll('g.trace').length > 0) res.rendered++;
    var box = el.getBoundingClientRect();
    el.querySelectorAll('svg.main-svg text').forEach(function (t) { inside(t, box); });
  });
  document.querySelectorAll('svg[role=img]').forEach(function (s) {
    res.charts++;
    if (s.querySelectorAll('rect, polyline').length > 0) res.rendered++;
    var box = s.getBoundingClientRect();
    s.querySelectorAll('text').forEach(function (t) { inside(t, box); });
  });
  window.parent.postMessage(JSON.stringify(res), '*');
}, 500); });
"""

HARNESS = """<!doctype html><html><head><meta charset='utf-8'><title>reports</title></head><body>
<pre id='result'></pre>
{frames}
<script>
var got = [];
window.addEventListener('message', function (e) {{
  got.push(JSON.parse(e.data));
  if (got.length === {n}) document.getElementById('result').textContent = JSON.stringify(got);
}});
</script></body></html>"""


def _trace(path: Path, rank: int, slow: float = 1.0) -> Path:
    b = TraceBuilder(rank=rank, world_size=2)
    t = 0.0
    for s in range(4):
        b.step(s, t, 1000)
        for i in range(6):
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 5 * i, 200 + t + 110 * i, 100 * slow)
        b.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + 40, 200 + t + 400, 150, stream=20)
        t += 1000
    return b.write(path)


def _run_folder(path: Path, step_time_s: float, rng) -> Path:
    path.mkdir()
    t, lines = 1000.0, []
    for i in range(1, 41):
        s = step_time_s * (1 + rng.normal(0, 0.01))
        t += s
        lines.append(json.dumps({"step": i, "attempt": 0, "loss": 4.0 / np.sqrt(i), "step_time_s": s, "tokens": 256,
                                 "tokens_per_s": 256 / s, "mfu": 0.3, "mem_peak_bytes": 1e9, "grad_norm": 1.0,
                                 "data_wait_s": 0.01 * s, "t_end": t}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "events.jsonl").write_text(json.dumps({"kind": "attempt_start", "attempt": 0, "t": 999.0}) + "\n")
    (path / "run.json").write_text(json.dumps({"world_size": 1, "comparable": {
        "model": {"n_layers": 4}, "data": "abc", "seed": 0, "seq_len": 128, "samples_per_step": 2}}))
    return path


def _cli(*argv: str) -> None:
    try:
        main(list(argv))
    except SystemExit as e:
        assert e.code in (0, None), f"{argv}: exit {e.code}"


def _make_reports(d: Path) -> dict[str, Path]:
    """Write one report of every type into ``d``; return {type: path}."""
    rng = np.random.default_rng(0)
    out = {k: d / f"{k}.html" for k in ("plan", "plan_compare", "plan_layout", "diagnose", "diff", "fleet",
                                        "fleet_tree", "compare", "train", "bench", "bars", "evaluate", "index")}
    _cli("plan", "--model", "llama3-70b", "--gpus", "512", "--top", "8", "--json", "--html", str(out["plan"]))
    _cli("plan", "--model", "llama3-70b", "--gpus", "512", "--compare-hardware", "h100,h200,b200,mi300x",
         "--tokens", "15T", "--json", "--html", str(out["plan_compare"]))
    _cli("plan", "--model", "llama3-8b", "--gpus", "8", "--layout", "tp=2,zero=1", "--json",
         "--html", str(out["plan_layout"]))
    for run in ("a", "b"):
        (d / run).mkdir()
        for rank in (0, 1):
            _trace(d / run / f"rank{rank}.json.gz", rank, slow=1.0 if run == "a" else 1.3)
    _cli("diagnose", str(d / "a"), "--html", str(out["diagnose"]))
    _cli("diff", str(d / "a"), str(d / "b"), "--html", str(out["diff"]))
    _cli("evaluate", str(Path(__file__).resolve().parents[1] / "corpus" / "data"), "--html", str(out["evaluate"]))
    series = d / "series.csv"
    series.write_text("step_time_s\n" + "\n".join(f"{(1.0 if i < 40 else 1.1) + rng.normal(0, 0.01):.4f}"
                                                  for i in range(80)))
    _cli("fleet", "changes", "--csv", str(series), "--column", "step_time_s", "--html", str(out["fleet"]))
    from trainperf.fleet.tree_synth import TreeFleet
    from trainperf.store import write_run

    for record in TreeFleet().records():
        write_run(record, str(d / "tree_store"))
    _cli("fleet", "tree", "--store", str(d / "tree_store"), "--explain", "--html", str(out["fleet_tree"]))
    _cli("compare", str(_run_folder(d / "ra", 0.10, rng)), str(_run_folder(d / "rb", 0.08, rng)),
         "--html", str(out["compare"]))

    from trainperf.train.report import write_report

    result = {"model": "tiny", "world_size": 1, "device": "cpu", "layout": "dp=1", "strategy": "single",
              "step_time_s": 0.1, "tokens_per_s": 2560.0, "mfu": 0.2, "hfu": 0.25, "mem_peak_bytes": 2**30,
              "final_loss": 0.63, "peak_flops": 1e11, "peak_source": "measured",
              "goodput": {"goodput": 0.8, "productive_s": 4.0, "startup_s": 0.6, "data_wait_s": 0.1,
                          "checkpoint_s": 0.2, "restart_s": 0.0, "lost_work_s": 0.0, "other_s": 0.1}}
    shutil.copytree(d / "ra", d / "train")
    shutil.move(write_report(d / "train", result), out["train"])

    from trainperf.bench.report import write_html
    from trainperf.bench.run import run_bench

    bench = run_bench("cpu", ["rms_norm", "softmax"], [(64, 256), (256, 1024)], "fp32", ("trainperf", "eager"),
                      ("fwd",), measure_memory=False)
    write_html(bench, out["bench"])

    # bars of both signs on one axis: the short increase at the end had its label cut (the demo's diff)
    from trainperf.report.html import Report, bar_chart

    Report("bars of both signs").add("where the change went", bar_chart(
        ["host: other", "host: optimizer", "host: dataloader", "host: sync"],
        [-2735063.0, -847894.0, 31190.0, 6803.0], "µs")).write(out["bars"])

    from trainperf.report.index import write_index

    shutil.move(write_index(d), out["index"])  # the demo's index page
    return out


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_every_report_renders_in_chromium_without_clipping(tmp_path):
    reports = _make_reports(tmp_path)
    checked = tmp_path / "checked"
    checked.mkdir()
    frames = []
    for kind, path in reports.items():
        page = path.read_text()
        assert page.startswith("<!doctype html>"), kind
        if kind != "index":  # each chart carries numbers and a titled axis before it is drawn
            assert_charts(page)
        (checked / path.name).write_text(page.replace("</body>", f"<script>{CHECKER}</script></body>"))
        frames.append(f"<iframe src='{path.name}' width='1200' height='900'></iframe>")
    harness = checked / "_all_reports.html"
    harness.write_text(HARNESS.format(frames="\n".join(frames), n=len(frames)))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             "--virtual-time-budget=30000", "--hide-scrollbars"]
    dom = subprocess.run([*flags, "--dump-dom", harness.as_uri()], capture_output=True, text=True, timeout=300)
    m = re.search(r"<pre id=\"result\">(.*?)</pre>", dom.stdout, re.S)
    assert m and m.group(1), f"the pages did not report back: {dom.stderr[-2000:]}"
    import html

    results = {r["page"]: r for r in json.loads(html.unescape(m.group(1)))}
    assert len(results) == len(reports), sorted(results)
    for page, r in results.items():
        if page != "index.html":  # the index has links, no chart
            assert r["charts"] > 0 and r["rendered"] == r["charts"] and r["texts"] > 0, (charts_backend(), r)
        assert r["clipped"] == [], (charts_backend(), r)

    shots = Path(os.environ.get("TRAINPERF_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    png = shots / f"reports-{charts_backend()}.png"
    subprocess.run([*flags, f"--window-size=1220,{920 * len(frames)}", f"--screenshot={png}", harness.as_uri()],
                   capture_output=True, timeout=300)
    assert png.is_file() and _png_size(png) == (1220, 920 * len(frames)) and png.stat().st_size > 50_000
