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


def _trace(path: Path, gpu: bool, rank: int = 0, world_size: int = 1) -> Path:
    b = TraceBuilder(rank=rank, world_size=world_size)
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


def _cpu_job(path: Path) -> Path:
    # 4 steps of 1000 us on the loop thread: DataLoader 100 us, forward 300, c10d::allreduce_ 250 (its wait for the
    # other rank inside), optimizer 150; the analysed steps are the first 3 (the last, which the profiler may cut,
    # is left out): window 3000 us, collectives 750 (25.0 %), data 300 (10.0 %), optimizer 450 (15.0 %)
    b = TraceBuilder()
    for s in range(4):
        t = 1000.0 * s
        b.step(s, t, 1000)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 10, 100, cat="user_annotation")
        b.cpu("aten::mm", t + 120, 300)
        b.cpu("c10d::allreduce_", t + 430, 250)
        b.cpu("Optimizer.step#AdamW.step", t + 700, 150, cat="user_annotation")
    return b.write(path)


def test_cpu_only_job_shows_its_host_time_in_terminal_and_html_alike(tmp_path):
    d = diagnose(_cpu_job(tmp_path / "cpu.json.gz"))
    assert d.ranks[0].gpu_analyses != "ok"
    text = _terminal(d)
    header = text[:text.index("┡")]
    for word in ("window", "step", "collectives", "data", "optimizer"):
        assert word in header, header
    assert "idle" not in header and "critical" not in header, header
    row = next(ln for ln in text.splitlines() if re.match(r"│\s+0 │", ln))
    term_cells = [c.strip() for c in row.strip("│").split("│")]
    html_cells = _html_rank_row(write_report(d, tmp_path / "r.html").read_text())
    assert term_cells == ["0", "3.0", "1.0", "25.0", "10.0", "15.0"], term_cells
    assert html_cells[:6] == term_cells, html_cells


def test_a_cpu_rank_beside_gpu_ranks_reads_not_applicable(tmp_path):
    (tmp_path / "job").mkdir()
    _trace(tmp_path / "job" / "rank0.json.gz", gpu=True, rank=0, world_size=2)
    _trace(tmp_path / "job" / "rank1.json.gz", gpu=False, rank=1, world_size=2)
    d = diagnose(tmp_path / "job")
    text = _terminal(d, 100)
    row = next(ln for ln in text.splitlines() if re.match(r"│\s+1 │", ln))
    term_cells = [c.strip() for c in row.strip("│").split("│")]
    assert term_cells[2:7] == ["-"] * 5, term_cells


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


def test_a_note_every_rank_shares_is_said_once():
    from trainperf.diagnose.render import notes_by_rank

    notes = ["1 of the job's 16 ranks traced",
             *[f"rank {r}: 17 % of the GPU events ran earlier work" for r in range(4)],
             "rank 0: 1 complete profiler step", "rank 5: 2.5 ms of work", "rank 6: 3.1 ms of work",
             "rank 8: 4.0 ms of work"]
    assert notes_by_rank(notes) == [
        "1 of the job's 16 ranks traced",
        "ranks 0-3: 17 % of the GPU events ran earlier work",
        "rank 0: 1 complete profiler step",
        "ranks 5-6, 8: 2.5 ms of work (rank 5's figures; the others' alike, each in the JSON)"]


def test_sixteen_ranks_print_one_line_of_a_shared_note(tmp_path):
    # the same trace as 16 ranks: each rank's one-step note said once, and the finding's ranks as a range
    for r in range(16):
        b = TraceBuilder(rank=r, world_size=16)
        b.step(0, 0.0, 1000)
        b.step(1, 1000.0, 1000)
        b.cpu("aten::mm", 10, 400)
        b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 20, 30, 600)
        b.write(tmp_path / f"rank{r}.json.gz")
    console = Console(record=True, width=200)
    print_summary(diagnose(tmp_path), console)
    text = console.export_text()
    top_notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert sum("complete profiler step" in line for line in top_notes) == 1
    assert re.search(r"^note: ranks 0-15: 1 complete profiler step", text, re.M)
    assert "ranks [0-15]" in text
