"""The per-rank table: one formatter for terminal and HTML, headers whole at 80 columns (issue 14)."""

import re
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.render import print_summary  # noqa: E402
from trainperf.report.diagnose import write_report  # noqa: E402


def _trace(path: Path, gpu: bool) -> Path:
    b = TraceBuilder()
    for s in range(3):
        t = 1000.0 * s
        b.step(s, t, 1000)
        b.cpu("aten::mm", t + 10, 400)
        if gpu:
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 20, t + 30, 600)
    return b.write(path)


def _terminal(d, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    print_summary(d, console)
    return console.export_text()


def _html_rank_row(html: str) -> list[str]:
    table = re.search(r"<table>.*?</table>", html, re.S).group(0)
    return re.findall(r"<td>(.*?)</td>", re.findall(r"<tr>(.*?)</tr>", table)[1])


def test_cpu_only_rank_reads_not_applicable_in_terminal_and_html_alike(tmp_path):
    d = diagnose(_trace(tmp_path / "cpu.json.gz", gpu=False))
    assert d.ranks[0].gpu_analyses != "ok"
    text = _terminal(d)
    row = next(ln for ln in text.splitlines() if re.match(r"│\s+0 │", ln))
    term_cells = [c.strip() for c in row.strip("│").split("│")]
    html_cells = _html_rank_row(write_report(d, tmp_path / "r.html").read_text())
    assert term_cells[2:7] == ["-"] * 5 and html_cells[2:7] == ["-"] * 5, (term_cells, html_cells)
    assert term_cells[1] == html_cells[1]


def test_gpu_rank_cells_equal_in_terminal_and_html_and_headers_whole_at_80_columns(tmp_path):
    d = diagnose(_trace(tmp_path / "gpu.json.gz", gpu=True))
    text = _terminal(d, 80)
    header = text[:text.index("┡")]
    assert "…" not in header, header
    for word in ("non-comp", "overlap", "idle h/k/o", "window"):
        assert word in header, header
    row = next(ln for ln in text.splitlines() if re.match(r"│\s+0 │", ln))
    term_cells = [c.strip() for c in row.strip("│").split("│")][:7]
    html_cells = _html_rank_row(write_report(d, tmp_path / "r.html").read_text())[:7]
    assert term_cells == html_cells, (term_cells, html_cells)
