"""The fleet tree's waterfall is a Plotly chart (issue 14: charts drawn by a plotting library, not by
hand) whose bars are the tree's own GPU-hours: allocated, each loss stepping down, effective last."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chart_checks import assert_charts  # noqa: E402

from trainperf.fleet.tree import build_tree  # noqa: E402
from trainperf.fleet.tree_synth import TreeFleet  # noqa: E402
from trainperf.report.fleet_tree import tree_report  # noqa: E402


def test_waterfall_is_a_plotly_chart_of_the_trees_gpu_hours(tmp_path):
    pytest.importorskip("plotly")
    tree = build_tree(TreeFleet(n_steps=60).records())
    page = tree_report(tree, tmp_path / "t.html").read_text()
    (fig,) = assert_charts(page)
    bar = fig["data"][0]
    assert bar["type"] == "bar" and fig["layout"]["yaxis"]["title"]["text"] == "GPU-h"
    lows = bar["base"]
    highs = [lo + h for lo, h in zip(lows, bar["y"])]
    # reference: the tree itself, walked by hand
    losses = [n for n in tree.root.walk() if n.kind in ("loss", "unsplit")]
    assert len(bar["x"]) == len(losses) + 2 and bar["x"][0] == "allocated" and bar["x"][-1] == "effective"
    assert (lows[0], highs[0]) == pytest.approx((0.0, tree.root.gpu_h))
    assert (lows[-1], highs[-1]) == pytest.approx((0.0, tree.effective_gpu_h))
    level = tree.root.gpu_h
    for n, lo, hi in zip(losses, lows[1:-1], highs[1:-1]):  # each loss steps down from the level before
        assert (lo, hi) == pytest.approx(tuple(sorted((level, level - n.gpu_h))), abs=1e-9)
        level -= n.gpu_h
