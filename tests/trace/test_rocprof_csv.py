"""rocprofv3 CSV output (a folder of `<pid>_<kind>.csv` files) into the event table.

Two kinds of input. Real rocprofv3 CSV files, copied byte for byte from rocprofiler-sdk's documentation and
AMD's HPCTrainingExamples (tests/data/rocprofv3_csv/README.md: sources, commits, sha256), checked against
the same files parsed with Python's csv module and against busy times and shares worked by hand. And, for
what no published file shows (one profile in both CSV and JSON, several ranks, bad input), files written by
hand to the columns of rocprofiler-sdk's CSV writer (source/lib/output/generateCSV.cpp), checked against the
JSON reader on the same profile in rocprofv3's JSON schema (tests/trace/test_rocprof.py).
"""

import csv
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rocprof import _doc  # noqa: E402  (the same profile in rocprofv3's JSON schema)

from trainperf.errors import TrainperfError  # noqa: E402
from trainperf.trace.events import COLUMNS, CPU_OP, KERNEL, MEMCPY, RUNTIME, USER_ANNOTATION  # noqa: E402
from trainperf.trace.load import load_trace, ranks_in_file_order_note, trace_files  # noqa: E402
from trainperf.trace.producers import producer_of  # noqa: E402

KERNEL_HEADER = ('"Kind","Agent_Id","Queue_Id","Stream_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name",'
                 '"Correlation_Id","Start_Timestamp","End_Timestamp","LDS_Block_Size","Scratch_Size","VGPR_Count",'
                 '"Accum_VGPR_Count","SGPR_Count","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
                 '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n')
API_HEADER = '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
COPY_HEADER = ('"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id",'
               '"Start_Timestamp","End_Timestamp"\n')


def _write_process(folder: Path, prefix: str = "1234", gpu: str = '"Agent 1"', cpu: str = '"Agent 0"') -> Path:
    """The profile of test_rocprof._doc as rocprofv3 writes it in CSV: thread 77 of pid 1234 launches two kernels
    (correlation 5, 6) and a host-to-device copy (7) inside a roctx range "ProfilerStep#1"; times in ns."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}_kernel_trace.csv").write_text(
        KERNEL_HEADER
        + f'"KERNEL_DISPATCH",{gpu},4242,0,77,1,1,"Cijk_Alik_Bljk_HHS_BH_MT128x128x64",5,8000,40000,0,0,128,0,48,'
          '256,1,1,4096,1,1\n'
        + f'"KERNEL_DISPATCH",{gpu},4242,0,77,2,2,"void at::native::vectorized_elementwise_kernel",6,40500,45500,'
          '0,0,16,0,16,256,1,1,4096,1,1\n')
    (folder / f"{prefix}_hip_api_trace.csv").write_text(
        API_HEADER + '"HIP_RUNTIME_API_EXT","hipLaunchKernel",1234,77,5,2000,6000\n'
        '"HIP_RUNTIME_API_EXT","hipLaunchKernel",1234,77,6,7000,9000\n'
        '"HIP_RUNTIME_API_EXT","hipMemcpyAsync",1234,77,7,10000,12000\n')
    (folder / f"{prefix}_memory_copy_trace.csv").write_text(
        COPY_HEADER + f'"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",0,{cpu},{gpu},7,46000,50000\n')
    (folder / f"{prefix}_marker_api_trace.csv").write_text(
        API_HEADER + '"MARKER_CORE_API","ProfilerStep#1",1234,77,4,1000,90000\n')
    return folder


def test_csv_folder_reads_as_the_json_of_the_same_profile(tmp_path):
    csv_dir = _write_process(tmp_path / "csv")
    (tmp_path / "json").mkdir()
    doc = _doc()
    records = doc["rocprofiler-sdk-tool"][0]["buffer_records"]
    records.pop("memory_allocation")  # not in the CSV files read
    records["memory_copy"][0].pop("bytes")  # rocprofv3's CSV writes no byte count for a copy
    (tmp_path / "json" / "1234_results.json").write_text(json.dumps(doc))
    assert trace_files(csv_dir) == [csv_dir / "1234_kernel_trace.csv"]
    assert producer_of(csv_dir / "1234_marker_api_trace.csv") == "rocprofv3-csv"
    c, j = load_trace(csv_dir)[0], load_trace(tmp_path / "json")[0]
    assert c.metadata["producer"] == "rocprofv3-csv" and c.n_skipped == 0
    assert [c.name_of(i) for i in range(len(c))] == [j.name_of(i) for i in range(len(j))]
    for col in COLUMNS:
        if col not in ("name", "cat"):  # ids into each table's own interned strings
            assert np.array_equal(getattr(c, col), getattr(j, col)), col


def test_agent_labels_and_copy_directions(tmp_path):
    # two GPUs labelled "GPU 1" / "GPU 0" (--agent-index=type-relative): GPU N is GPU N; a device-to-host copy sits
    # on its source GPU; bare numbers (older versions) are numbered among the agents that ran kernels
    d = tmp_path / "p"
    d.mkdir()
    (d / "9_kernel_trace.csv").write_text(
        KERNEL_HEADER + '"KERNEL_DISPATCH","GPU 1",3,0,5,1,1,"k1",1,100,200,0,0,0,0,0,1,1,1,1,1,1\n'
        '"KERNEL_DISPATCH","GPU 0",3,0,5,2,1,"k0",2,150,260,0,0,0,0,0,1,1,1,1,1,1\n')
    (d / "9_memory_copy_trace.csv").write_text(
        COPY_HEADER + '"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_HOST",2,"GPU 1","CPU 0",3,300,340\n')
    t = load_trace(d)[0]
    by = {t.name_of(i): (int(t.pid[i]), int(t.stream[i]), int(t.dur_ns[i])) for i in range(len(t))}
    assert by == {"k1": (1, 3, 100), "k0": (0, 3, 110), "Memcpy DtoH (rocprofv3)": (1, 2, 40)}
    assert t.kind.tolist().count(KERNEL) == 2 and t.kind.tolist().count(MEMCPY) == 1
    d2 = _write_process(tmp_path / "bare", gpu="4", cpu="0")
    t2 = load_trace(d2)[0]
    assert set(t2.pid[np.isin(t2.kind, (KERNEL, MEMCPY))].tolist()) == {0}


def test_rocpd_converted_csv_with_its_guid_column(tmp_path):
    # `rocpd convert --output-format csv` writes out_<kind>.csv with a leading "Guid" column (rocprofiler-sdk
    # source/docs/data/rocpd-to-csv.csv and the kernel trace of AMD's rocpd examples)
    guid = '"0000ddb5-8903-7903-b269-cd8d3745bb8a",'
    (tmp_path / "out_kernel_trace.csv").write_text(
        '"Guid",' + KERNEL_HEADER + guid + '"KERNEL_DISPATCH","Agent 4",1,0,714789,1,3,"norm_kernel",10,2000,3000,'
        '0,0,16,0,32,256,1,1,233472,1,1\n')
    (tmp_path / "out_hip_api_trace.csv").write_text(
        '"Guid",' + API_HEADER + guid + '"HIP_RUNTIME_API_EXT","hipLaunchKernel",137,137,10,1000,1500\n')
    t = load_trace(tmp_path)[0]
    assert [t.name_of(i) for i in range(len(t))] == ["hipLaunchKernel", "norm_kernel"]
    assert t.dur_ns.tolist() == [500, 1000] and t.pid.tolist() == [137, 0] and t.stream.tolist() == [-1, 1]


def test_one_folder_several_processes_each_a_rank(tmp_path):
    d = tmp_path / "run"
    _write_process(d, prefix="rank0")
    _write_process(d, prefix="rank1")
    (d / "rank1_results.json").write_text(json.dumps(_doc()))  # that process also wrote JSON: read once, from it
    tables = load_trace(d)
    assert sorted(tables) == [0, 1]
    assert tables[0].metadata["producer"] == "rocprofv3-csv" and tables[1].metadata["producer"] == "rocprofv3"
    # processes named by pid only: ranked in file order, and said so (ranks_in_file_order_note); beside a process
    # named by its rank, the others cannot be told apart from real ranks: an error
    _write_process(tmp_path / "pids", prefix="111")
    _write_process(tmp_path / "pids", prefix="222")
    tables = load_trace(tmp_path / "pids")
    assert sorted(tables) == [0, 1] and "ranks numbered in file-name order" in ranks_in_file_order_note(tables)
    _write_process(tmp_path / "pids", prefix="rank5")
    with pytest.raises(TrainperfError, match="cannot tell its rank.*rocprofv3 -o rank%rank%"):
        load_trace(tmp_path / "pids")


def test_diagnose_end_to_end_on_a_csv_folder(tmp_path):
    # by hand: the step is the roctx range [1, 90) µs; the device runs kernels [8, 40) and [40.5, 45.5) and the
    # copy [46, 50): busy 32 + 5 + 4 = 41 µs over a span of 42 µs from the first start to the last end
    from trainperf.cli import app

    res = CliRunner().invoke(app, ["diagnose", str(_write_process(tmp_path / "host")), "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)["ranks"][0]
    assert r["step_time_median_us"] == 89 and r["step_times"][0]["device_busy_us"] == 41
    assert r["window_us"] == 42 and r["compute_pct"] == pytest.approx(100 * 37 / 42, abs=1e-3)
    assert r["kernel_categories_pct"]["gemm"] == pytest.approx(100 * 32 / 41, abs=1e-3)


@pytest.mark.parametrize("text, why", [("", "not a readable CSV file"),
                                       ('"Kind","Agent_Id"\n"KERNEL_DISPATCH","Agent 1"\n', "no 'Queue_Id'")])
def test_bad_csv_is_one_line_naming_the_file(tmp_path, text, why):
    (tmp_path / "5_kernel_trace.csv").write_text(text)
    with pytest.raises(TrainperfError, match=f"5_kernel_trace.csv: {why}"):
        load_trace(tmp_path)


# ---- real rocprofv3 CSV output (tests/data/rocprofv3_csv/README.md) ----

REAL = Path(__file__).resolve().parents[1] / "data" / "rocprofv3_csv"
# the README's sha256 list, parsed: the files must stay the published bytes
SHA256 = {REAL / line.split()[1]: line.split()[0] for line in (REAL / "README.md").read_text().splitlines()
          if len(line.split()) == 2 and len(line.split()[0]) == 64}
# the event kind each rocprofv3 CSV kind becomes (the vocabulary of trace.events)
KIND_OF = {"kernel_trace": KERNEL, "memory_copy_trace": MEMCPY, "hip_api_trace": RUNTIME, "hsa_api_trace": RUNTIME,
           "marker_api_trace": USER_ANNOTATION, "rccl_api_trace": CPU_OP}


def _csv_rows(folder: Path) -> list[tuple[int, str, int, int, int]]:
    """(kind, name, start ns, duration ns, correlation id) of every row of a folder's trace files, by Python's csv
    module: the reference the reader's table must equal."""
    out = []
    for path in sorted(folder.glob("*.csv")):
        kind = next((k for k in KIND_OF if path.name.endswith(f"_{k}.csv")), None)
        if kind is None:
            continue
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                name = r.get("Kernel_Name") or r.get("Function")
                if kind == "memory_copy_trace":
                    name = {"MEMORY_COPY_HOST_TO_DEVICE": "Memcpy HtoD (rocprofv3)",
                            "MEMORY_COPY_DEVICE_TO_HOST": "Memcpy DtoH (rocprofv3)"}[r["Direction"]]
                start, end = int(r["Start_Timestamp"]), int(r["End_Timestamp"])
                out.append((KIND_OF[kind], name, start, end - start, int(r["Correlation_Id"])))
    return sorted(out)


def _table_rows(t) -> list[tuple[int, str, int, int, int]]:
    return sorted((int(t.kind[i]), t.name_of(i), int(t.ts_ns[i]), int(t.dur_ns[i]), int(t.correlation[i]))
                  for i in range(len(t)))


def test_the_real_files_are_the_published_bytes():
    assert len(SHA256) == 11
    for path, digest in SHA256.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{path} differs from its source"


@pytest.mark.parametrize("folder", sorted(p.name for p in REAL.iterdir() if p.is_dir()))
def test_every_real_row_reads_as_pythons_csv_module_reads_it(folder):
    # every row of every kind, none skipped: names, start, duration and correlation id as the csv module parses
    # them; rows out of start order in the files (completion order, end order) come out in start order
    t = load_trace(REAL / folder)[0]
    assert t.metadata["producer"] == "rocprofv3-csv" and t.n_skipped == 0
    assert _table_rows(t) == _csv_rows(REAL / folder)
    assert np.all(np.diff(t.ts_ns) >= 0)


def _diagnose(folder: Path) -> dict:
    from trainperf.cli import app

    res = CliRunner().invoke(app, ["diagnose", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["ranks"][0]


def test_real_kernels_on_two_streams_busy_time_by_hand():
    # truncated_streams (ns from 1143263119800000): stream 2 runs [36160, 48360) and [66920, 78960), stream 3
    # [76240, 86120) and [86120, 96040); they overlap on [76240, 78960), so the GPU is busy 12200 + (96040 - 66920)
    # = 41320 ns of the 96040 - 36160 = 59880 ns window, not the 44040 ns the four durations sum to
    t = load_trace(REAL / "truncated_streams")[0]
    assert int(t.dur_ns.sum()) == 12200 + 12040 + 9880 + 9920 == 44040
    # the kernels sit on their HIP streams (Stream_Id 2, 3), not their HSA queues (Queue_Id 1, 2)
    assert sorted(set(zip(t.stream.tolist(), t.tid.tolist()))) == [(2, 2), (3, 3)]
    assert sorted(t.thread_names.values()) == ["GPU 0 stream 2", "GPU 0 stream 3"]
    r = _diagnose(REAL / "truncated_streams")
    assert r["window_us"] == pytest.approx(59.88) and r["compute_pct"] == pytest.approx(100 * 41320 / 59880, abs=1e-3)
    # vectorops_agent_labels ("Agent 4" = GPU 0, four streams, rows in completion order): busy per stream by hand,
    # back-to-back kernels merged: s1 [29637, 50677) + [52877, 75237) = 43400, s2 [82957, 103517) = 20560,
    # s3 [138477, 160837) = 22360, s4 [164197, 174037) = 9840 (ns from 1550151853000000); 96160 of 144400
    r = _diagnose(REAL / "vectorops_agent_labels")
    assert r["window_us"] == pytest.approx(144.4) and r["compute_pct"] == pytest.approx(100 * 96160 / 144400, abs=1e-3)


def test_real_copies_and_kernels_of_one_process_shares_by_hand():
    # vectorops_node_ids: the copies' durations 101594 + 99629 + 101673 + 99870 = 402766 ns, the kernels'
    # 16157 + 10464 + 10183 + 10103 + 12830 + 10905 + 11145 + 11547 = 93334 ns, none overlapping; window from the
    # first copy's start 2414192684609085 to the last kernel's end 2414192765784969 = 81175884 ns
    rows = _csv_rows(REAL / "vectorops_node_ids")
    assert sum(d for k, _, _, d, _ in rows if k == MEMCPY) == 402766
    assert sum(d for k, _, _, d, _ in rows if k == KERNEL) == 93334
    t = load_trace(REAL / "vectorops_node_ids")[0]
    # bare node ids: node 2 is the one agent that ran kernels and the device end of every copy, so GPU 0; the
    # host-to-device copies sit on their destination and share the tracks of the kernels' streams 1 and 2
    dev = np.isin(t.kind, (KERNEL, MEMCPY))
    assert set(t.pid[dev].tolist()) == {0}
    assert {(int(k), int(s)) for k, s in zip(t.kind[dev], t.tid[dev])} == {(KERNEL, 1), (KERNEL, 2), (MEMCPY, 1),
                                                                            (MEMCPY, 2)}
    r = _diagnose(REAL / "vectorops_node_ids")
    assert r["window_us"] == pytest.approx(81175.884)
    assert r["compute_pct"] == pytest.approx(100 * 93334 / 81175884, abs=1e-3)
    assert r["non_compute_pct"] == pytest.approx(100 * 402766 / 81175884, abs=1e-3)
    assert r["kernel_categories_pct"]["memcpy"] == pytest.approx(100 * 402766 / (402766 + 93334), abs=1e-3)
    assert r["memcpy_gbps"] == {"HtoD": None}  # rocprofv3's CSV has no byte count: no bandwidth, not a guess


def test_real_copy_directions_sit_on_their_device_end():
    # "Agent 0" -> "Agent 4" host-to-device and "Agent 4" -> "Agent 0" device-to-host: all four on GPU 0 (the
    # destination of the first two, the source of the last two), on the stream the file gives (0)
    t = load_trace(REAL / "copies_agent_labels")[0]
    assert [t.name_of(i) for i in range(len(t))] == ["Memcpy HtoD (rocprofv3)"] * 2 + ["Memcpy DtoH (rocprofv3)"] * 2
    assert t.pid.tolist() == [0] * 4 and t.stream.tolist() == [0] * 4 and t.kind.tolist() == [MEMCPY] * 4
    assert t.thread_names == {(0, 0): "GPU 0 stream 0"}


def test_real_markers_marks_ranges_and_process_ranges():
    # marker_api_trace: Function is the roctx message; two roctxMark (start == end: zero-length annotations), two
    # pushed ranges on thread 717, "hipLaunchKernel range" (roctxRangeStart) on Thread_Id 0: its own track
    t = load_trace(REAL / "markers")[0]
    by = {t.name_of(i): (int(t.tid[i]), int(t.dur_ns[i])) for i in range(len(t))}
    assert by == {"before hipLaunchKernel": (717, 0), "after hipLaunchKernel": (717, 0),
                  "hipLaunchKernel": (717, 1520113901491622 - 1520113899684965),
                  "hipMemcpy": (717, 1520113901483408 - 1520113900141100),
                  "hipLaunchKernel range": (0, 1520113901495882 - 1520113899682208)}
    assert set(t.kind.tolist()) == {USER_ANNOTATION} and set(t.pid.tolist()) == {717}


def test_real_api_traces_kinds_and_counts():
    # hip and hsa calls are runtime calls of their thread, RCCL calls host ops: counts by the csv module
    hip = load_trace(REAL / "hip_api")[0]
    assert set(hip.kind.tolist()) == {RUNTIME} and set(zip(hip.pid.tolist(), hip.tid.tolist())) == {(15, 15)}
    rccl = load_trace(REAL / "rccl_api")[0]
    names = [rccl.name_of(i) for i in range(len(rccl))]
    with open(REAL / "rccl_api" / "1834151_rccl_api_trace.csv", newline="") as f:
        assert names.count("ncclAllReduce") == [r["Function"] for r in csv.DictReader(f)].count("ncclAllReduce") == 5
    assert set(rccl.kind.tolist()) == {CPU_OP}


def _relabel(src: Path, dst: Path, label: str, agent_info: bool) -> Path:
    """A copy of the real omp_jacobi_mi300a folder with every kernel's Agent_Id set to label (and without its
    agent_info.csv when agent_info is False)."""
    dst.mkdir()
    with open(src / "omp_kernel_trace.csv", newline="") as f:
        rows = list(csv.reader(f))
    col = rows[0].index("Agent_Id")
    for r in rows[1:]:
        r[col] = label
    with open(dst / "omp_kernel_trace.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    if agent_info:
        shutil.copy(src / "omp_agent_info.csv", dst / "omp_agent_info.csv")
    return dst


@pytest.mark.parametrize("label, gpu", [("4", 0), ("6", 2), ("Agent 7", 3), ("GPU 3", 3)])
def test_agent_info_numbers_gpus_as_the_machine_does(tmp_path, label, gpu):
    # the real MI300A agent table (CPU nodes 0-3, GPU nodes 4-7): node N >= 4 is GPU N - 4, the place of the GPU
    # among the GPU agents (the JSON reader's numbering); the docs' --agent-index example prints the same GPU as
    # "Agent 7" (relative) and "GPU 3" (type-relative). The published run used node 4: GPU 0.
    real = load_trace(REAL / "omp_jacobi_mi300a")[0]
    assert set(real.pid.tolist()) == {0}
    t = load_trace(_relabel(REAL / "omp_jacobi_mi300a", tmp_path / "p", label, agent_info=True))[0]
    assert set(t.pid.tolist()) == {gpu} and t.n_skipped == 0
    # without the agent table only a type-relative label says which GPU; others are numbered among those used
    bare = load_trace(_relabel(REAL / "omp_jacobi_mi300a", tmp_path / "q", label, agent_info=False))[0]
    assert set(bare.pid.tolist()) == {gpu if label.startswith("GPU") else 0}


def test_agent_table_names_the_device():
    # the real MI300A agent table: 4 GPU agents (nodes 4-7), Product_Name "AMD Instinct MI300A", Cu_Count 228,
    # Local_Mem_Size 0 (an APU: its HBM is the node's memory), so no memory size
    from trainperf.diagnose.roofline import device_accelerator

    t = load_trace(REAL / "omp_jacobi_mi300a")[0]
    assert t.metadata["deviceProperties"] == [{"id": i, "name": "AMD Instinct MI300A", "numSms": 228}
                                              for i in range(4)]
    assert device_accelerator(t).name == "mi300a"


def test_a_kernel_on_a_cpu_agent_is_skipped_and_a_bad_agent_table_is_one_line(tmp_path):
    # node 0 is a CPU in the agent table: no GPU track for it (counted as skipped, not put on GPU 0)
    d = _relabel(REAL / "omp_jacobi_mi300a", tmp_path / "mixed", "6", agent_info=True)
    lines = (d / "omp_kernel_trace.csv").read_text().splitlines()
    (d / "omp_kernel_trace.csv").write_text("\n".join([lines[0], lines[1].replace(",6,", ",0,", 1)] + lines[2:]) + "\n")
    t = load_trace(d)[0]
    assert len(t) == 8 and t.n_skipped == 1 and set(t.pid.tolist()) == {2}
    # a table of another layout (no Logical_Node_Id) is not used: numbered as without it
    (d / "omp_agent_info.csv").write_text('"Node_Id","Agent_Type"\n0,"CPU"\n6,"GPU"\n')
    t = load_trace(d)[0]
    assert set(t.pid.tolist()) == {0, 1} and t.n_skipped == 0  # agents 0 and 6, in order among those used
    (d / "omp_agent_info.csv").write_text('"Node_Id","Logical_Node_Id","Agent_Type"\n0,zero,"CPU"\n')
    with pytest.raises(TrainperfError, match="omp_agent_info.csv: an agent row without an integer"):
        load_trace(d)
