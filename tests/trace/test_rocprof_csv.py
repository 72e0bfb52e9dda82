"""rocprofv3 CSV output (a folder of `<pid>_<kind>.csv` files) into the event table.

No real rocprofv3 output could be made here (it needs ROCm and an AMD GPU), so the files below are
written by hand following the columns rocprofiler-sdk's CSV writer emits (source/lib/output/generateCSV.cpp)
and its documented examples (source/docs/data/kernel_trace.csv, hip_trace.csv, memory_copy_trace.csv,
marker_api_trace.csv; docs "Using rocprofv3", --agent-index). References: the JSON reader on the same
profile written in rocprofv3's JSON schema (tests/trace/test_rocprof.py), and times summed by hand.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rocprof import _doc  # noqa: E402  (the same profile in rocprofv3's JSON schema)

from trainperf.errors import TrainperfError  # noqa: E402
from trainperf.trace.events import COLUMNS, KERNEL, MEMCPY  # noqa: E402
from trainperf.trace.load import load_trace, trace_files  # noqa: E402
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
    _write_process(tmp_path / "pids", prefix="111")
    _write_process(tmp_path / "pids", prefix="222")
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
