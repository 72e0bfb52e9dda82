"""rocpd databases (rocprofv3's default output since ROCm 7) reach trainperf through rocpd's own converter
(`rocpd convert --output-format csv`), read by the rocprofv3 CSV reader. Tested here on real converted output
(tests/data/rocpd/README.md: sources, licences, checksums), not on rows written to the schema by hand.

References, independent of the reader: the files parsed with Python's csv module (times, names, ids), the
figures rocpd itself printed for the full profiles in the same sources (time bounds, per-kernel min..max
durations from `rocpd summary`), and sums worked by hand below.
"""

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainperf.trace.events import KERNEL, RUNTIME
from trainperf.trace.load import load_trace
from trainperf.trace.producers import producer_of

DATA = Path(__file__).resolve().parent / "data" / "rocpd"
JACOBI = DATA / "omp_jacobi_mi300a"
HIP_API = DATA / "hip_api_docs"
SHA256 = {JACOBI / "out_kernel_trace.csv": "fca6b3267329cd5ab04bebc645764e807ebbca37796322e64d146672ae13b069",
          HIP_API / "out_hip_api_trace.csv": "4b10081d7bcaa3e742c453120f795ab0c4ff660f7f50852dd0204d30cfcc870c"}
# `rocpd summary` of the full Jacobi database (HPCTrainingExamples Rocprofv3/rocpd/README.md): min..max ns per kernel
SUMMARY_MIN_MAX_NS = {"QMnorm": (85520, 105080), "QMlaplacian": (26440, 58200), "QMupdate": (31920, 57200),
                      "QMboundary": (14560, 34921)}
DB_START_NS = 1678314002982197  # `rocpd2csv --start 25%` printed the database's initial time bound


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_real_files_are_the_published_bytes():
    for path, digest in SHA256.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{path} differs from its source"


def test_real_rocpd_kernel_trace_reads_as_its_rows():
    rows = _rows(JACOBI / "out_kernel_trace.csv")
    assert producer_of(JACOBI / "out_kernel_trace.csv") == "rocprofv3-csv"
    t = load_trace(JACOBI)[0]
    assert t.rank == 0 and t.n_skipped == 0 and len(t) == len(rows) == 9
    order = np.argsort(t.ts_ns, kind="stable")
    assert [t.name_of(i) for i in order] == [r["Kernel_Name"] for r in rows]
    assert t.ts_ns[order].tolist() == [int(r["Start_Timestamp"]) for r in rows]
    assert t.dur_ns[order].tolist() == [int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows]
    assert t.correlation[order].tolist() == [int(r["Correlation_Id"]) for r in rows]
    assert set(t.kind.tolist()) == {KERNEL}
    # "Agent 4" is the only agent that ran a kernel: GPU 0; Stream_Id 0 (no HIP stream: OpenMP offload), so the
    # kernels' stream is their HSA queue, Queue_Id 1
    assert set(t.pid.tolist()) == {0} and set(t.stream.tolist()) == {1}


def test_real_rocpd_kernel_times_agree_with_rocpds_own_figures():
    t = load_trace(JACOBI)[0]
    assert int(t.ts_ns.min()) == DB_START_NS  # the slice is the head of the database's kernel table
    for i in range(len(t)):
        key = next(k for k in SUMMARY_MIN_MAX_NS if k in t.name_of(i))
        lo, hi = SUMMARY_MIN_MAX_NS[key]
        assert lo <= t.dur_ns[i] <= hi, (t.name_of(i), int(t.dur_ns[i]))  # ns read as ns, start/end not swapped


def test_diagnose_on_the_real_rocpd_slice():
    # by hand from the file: the kernels run 100080 + 51320 + 29840 + 51520 + 90680 + 52400 + 29000 + 51440
    # + 95000 = 551280 ns over the window 1678314017498787 - 1678314002982197 = 14516590 ns; the three
    # QMnorm kernels (a residual-norm reduction) 100080 + 90680 + 95000 = 285760 ns of them
    from trainperf.cli import app

    res = CliRunner().invoke(app, ["diagnose", str(JACOBI), "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)["ranks"][0]
    assert r["n_events"] == 9 and r["window_us"] == pytest.approx(14516.590, abs=1e-3)
    assert r["compute_pct"] == pytest.approx(100 * 551280 / 14516590, abs=1e-3)
    assert r["idle_pct"] == pytest.approx(100 * (14516590 - 551280) / 14516590, abs=1e-3)
    assert r["kernel_categories_pct"]["reduction_norm"] == pytest.approx(100 * 285760 / 551280, abs=1e-3)
    assert r["steps"] == []  # kernel trace only: no roctx range, no step


def test_real_rocpd_hip_api_trace_reads_as_its_rows():
    rows = _rows(HIP_API / "out_hip_api_trace.csv")
    t = load_trace(HIP_API)[0]
    assert len(t) == len(rows) == 13 and t.n_skipped == 0
    order = np.argsort(t.ts_ns, kind="stable")
    assert [t.name_of(i) for i in order] == [r["Function"] for r in rows]
    assert t.dur_ns[order].tolist() == [int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows]
    assert set(t.kind.tolist()) == {RUNTIME}  # HIP runtime and compiler API calls alike
    assert set(zip(t.pid.tolist(), t.tid.tolist())) == {(137, 137)}
    # by hand: hipMemcpy 3719662416709451 - 3719662301228614 = 115480837, 3719662416728291 - 3719662416720791
    # = 7500, 3719662418667169 - 3719662417327973 = 1339196 ns
    memcpy = np.array([t.name_of(i) == "hipMemcpy" for i in range(len(t))])
    assert int(t.dur_ns[memcpy].sum()) == 115480837 + 7500 + 1339196


def test_a_folder_of_rocpd_databases_says_how_to_convert_them(tmp_path):
    """A folder holding only rocprofv3's default output (ROCm >= 7: <pid>_results.db) names the databases and the
    converter, in one line, as a database given alone does."""
    import sqlite3

    from trainperf.errors import TrainperfError
    from trainperf.trace.load import load_trace

    db = sqlite3.connect(tmp_path / "714789_results.db")
    db.execute("CREATE TABLE rocpd_info_node (id INTEGER)")  # rocpd's schema opens with its rocpd_* tables
    db.commit()
    db.close()
    for path, named in ((tmp_path, "rocpd databases (714789_results.db)"), (tmp_path / "714789_results.db",
                                                                           "a rocpd database")):
        with pytest.raises(TrainperfError) as e:
            load_trace(path)
        assert named in str(e.value) and "rocpd convert --output-format csv" in str(e.value)
        assert "\n" not in str(e.value)
