"""The fleet change-point HTML report says how many changes it found in plain words."""

import numpy as np

from trainperf.fleet.changepoints import detect_changes
from trainperf.report.fleet import change_count_text, changes_report


def test_change_count_text_singular_and_plural():
    assert change_count_text(1, 150) == "1 change point in 150 points"
    assert change_count_text(2, 150) == "2 change points in 150 points"
    assert change_count_text(0, 40) == "no change points in 40 points"


def test_html_subtitle_uses_the_count_wording(tmp_path):
    rng = np.random.default_rng(0)
    y = np.r_[rng.normal(1.0, 0.01, 75), rng.normal(1.2, 0.01, 75)]  # one 20% step at index 75
    res = detect_changes(y)
    assert res.change_points == [75]
    page = changes_report(y, res, tmp_path / "fleet.html").read_text()
    assert "1 change point in 150 points" in page and "change point(s)" not in page
