"""The merged timeline parsed by Perfetto's own trace processor, where its binary can be had.

The `perfetto` package on PyPI (0.59) ships no trace_processor_shell: it downloads one from Google's
artifact storage on first use, which this project's machines cannot reach, and Debian has no package
for it. Point TRAINPERF_TRACE_PROCESSOR at a trace_processor_shell binary (or put one on PATH) to run
this test; elsewhere test_perfetto.py checks the trace-event format rules by hand.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_perfetto import two_rank_job  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.perfetto import FINDING_CAT, write_job_timeline  # noqa: E402


def _shell() -> str | None:
    cached = sorted(Path.home().glob(".local/share/perfetto/prebuilts/trace_processor_shell*"))
    for p in (os.environ.get("TRAINPERF_TRACE_PROCESSOR"), shutil.which("trace_processor_shell"),
              *(str(c) for c in cached if not c.name.endswith(".tmp"))):
        if p and os.access(p, os.X_OK):
            return p
    return None


SHELL = _shell()


def _query(trace: Path, sql: str, tmp: Path) -> str:
    q = tmp / "q.sql"
    q.write_text(sql)
    r = subprocess.run([SHELL, "--query-file", str(q), str(trace)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.skipif(SHELL is None, reason="no trace_processor_shell here (PyPI's perfetto downloads it from "
                                          "outside the package registries); set TRAINPERF_TRACE_PROCESSOR")
def test_trace_processor_reads_ranks_findings_and_flows(tmp_path):
    job = two_rank_job(tmp_path)
    res = diagnose(job)
    out = tmp_path / "job.json"
    s = write_job_timeline(out, res)
    text = _query(out, "select name from process order by name;", tmp_path)
    assert "rank 0" in text and "rank 1" in text
    text = _query(out, f"select count(*) as n from slice where category = '{FINDING_CAT}';", tmp_path)
    assert str(s.n_finding_slices) in text
    text = _query(out, "select count(*) as n from flow;", tmp_path)
    assert str(s.n_finding_flows + s.n_launch_flows) in text
    text = _query(out, "select name, severity from stats where severity in ('error', 'data_losses') and value > 0;",
                  tmp_path)
    assert "misplaced" not in text and "json" not in text.lower(), text
