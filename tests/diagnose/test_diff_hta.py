"""`trainperf diff` against HTA 0.5.0's TraceDiff, run side by side on the same pair.

HTA needs its own environment (pandas < 3): set TRAINPERF_HTA_PYTHON to a python with
holistictraceanalysis==0.5.0 installed (default /tmp/htavenv/bin/python); skipped without it.
The pair is rank 0 of ../shared/data/traces/hta/trace_filter and a copy with a GEMM kernel inserted
(test_diff._insert_gemm), compared over its two steps (551, 552), per operator or kernel name.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_diff as T  # noqa: E402

from trainperf.diagnose.diff import diff  # noqa: E402

HTA_PYTHON = Path(os.environ.get("TRAINPERF_HTA_PYTHON", "/tmp/htavenv/bin/python"))
_RUN_HTA = """
import json, sys
from hta.trace_diff import TraceDiff
it = [int(x) for x in sys.argv[3].split(",")]
df = TraceDiff.compare_traces(sys.argv[1], sys.argv[2], control_iteration=it, test_iteration=it).reset_index()
json.dump({r["name"]: [int(r["Control_counts"]), int(r["Test_counts"]), float(r["Control_total_duration"]),
                       float(r["Test_total_duration"])] for _, r in df.iterrows()}, sys.stdout)
"""


def test_counts_and_durations_match_hta_trace_diff(tmp_path):
    if not HTA_PYTHON.exists():
        pytest.skip(f"no HTA environment at {HTA_PYTHON} (set TRAINPERF_HTA_PYTHON)")
    src = T._need("trace_filter") / "sampled_rank-0.json.gz"
    doc = T._load(src)
    T._write(doc, tmp_path / "base" / "rank-0.json.gz")
    T._insert_gemm(doc, 5000.0, "sm80_xmma_gemm_injected_kernel")
    T._write(doc, tmp_path / "cand" / "rank-0.json.gz")
    out = subprocess.run([str(HTA_PYTHON), "-c", _RUN_HTA, str(tmp_path / "base"), str(tmp_path / "cand"), "551,552"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    hta = json.loads(out)
    d = diff(tmp_path / "base", tmp_path / "cand")
    ours = {c.name: c for c in d.kernels + d.operators}
    assert set(hta) - set(ours) == {"ProfilerStep#551", "ProfilerStep#552"}  # step spans left out on purpose
    assert set(ours) <= set(hta)
    for name, (cc, tc, cd, td) in hta.items():  # HTA: totals over the 2 steps; ours: per step
        if name in ours:
            c = ours[name]
            assert (2 * c.count_baseline_per_step, 2 * c.count_candidate_per_step) == (cc, tc), name
            assert (2 * c.baseline_us, 2 * c.candidate_us) == (pytest.approx(cd, abs=1), pytest.approx(td, abs=1)), name
    added = {n for n, v in hta.items() if v[0] == 0 and v[1] > 0}
    assert added == {c.name for c in d.new} and "sm80_xmma_gemm_injected_kernel" in added
