"""The demo's index page links every report (title and subtitle from its head) and the data files."""

import re

import pytest

from trainperf.errors import TrainperfError
from trainperf.report.html import Report, bar_chart
from trainperf.report.index import page_summary, write_index


def test_index_links_every_report_with_its_title_and_subtitle(tmp_path):
    Report("trainperf plan", "llama3-70b on 512 GPUs").add("x", bar_chart(["a"], [1.0], "s")).write(tmp_path / "plan.html")
    (tmp_path / "train").mkdir()
    Report("trainperf train <tiny>", "30 steps").write(tmp_path / "train" / "report.html")
    (tmp_path / "diagnose.json").write_text("{}")
    (tmp_path / "store" / "runs").mkdir(parents=True)
    (tmp_path / "store" / "runs" / "r.json").write_text("{}")  # store internals are not listed
    page = write_index(tmp_path).read_text()
    links = re.findall(r"<a href='([^']+)'>", page)
    assert links == ["plan.html", "train/report.html", "diagnose.json"]
    assert "trainperf train &lt;tiny&gt;" in page and "llama3-70b on 512 GPUs" in page
    assert page_summary(tmp_path / "plan.html") == ("trainperf plan", "llama3-70b on 512 GPUs")
    assert "<script" not in page  # no chart: no library inlined, the index stays small
    write_index(tmp_path)  # rerun: the index does not list itself
    assert "index.html" not in re.findall(r"<a href='([^']+)'>", (tmp_path / "index.html").read_text())


def test_index_of_a_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(TrainperfError, match="not a folder"):
        write_index(tmp_path / "nope")
