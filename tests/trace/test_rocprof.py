"""rocprofv3 JSON into the event table: schema conformance only.

No real rocprofv3 output could be made here (it needs ROCm and an AMD GPU) or found under a permissive
licence, so this test builds a document in the schema that rocprofiler-sdk's own output tests read
(tests/rocprofv3/tracing/validate.py: `rocprofiler-sdk-tool`, `buffer_records.kernel_dispatch`,
`correlation_id.internal`, `dispatch_info.kernel_id`, `strings.buffer_records[kind].operations`, agents
with `type` 2 for GPUs). The record fields are the ones rocprofiler-sdk's JSON serializer writes
(source/include/rocprofiler-sdk/cxx/serialization/save.hpp: API records size / kind / operation /
correlation_id{internal, external, ancestor} / start_timestamp / end_timestamp / thread_id; kernel
dispatches add dispatch_info{agent_id, queue_id, kernel_id, dispatch_id, ...}; memory copies add
dst_agent_id / src_agent_id / bytes). A real file remains to be added (docs/diagnose.md, "Trace formats").
"""

import json

import numpy as np
import pytest

from trainperf.errors import TrainperfError
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import CATEGORY_NAMES, KERNEL, MEMCPY, RUNTIME, USER_ANNOTATION
from trainperf.trace.load import load_trace
from trainperf.trace.producers import producer_of

HIP, DISPATCH, COPY, MARKER = 0, 1, 2, 3


def _doc() -> dict:
    """Host thread 77 launches two kernels (correlation 5, 6) and one host-to-device copy (7) inside a roctx
    range "ProfilerStep#1"; times in ns."""
    def rec(kind, op, corr, s, e, **kw):
        return {"size": 64, "kind": kind, "operation": op, "correlation_id": {"internal": corr, "external": 0},
                "start_timestamp": s, "end_timestamp": e, "thread_id": 77, **kw}

    def dispatch(corr, kid, s, e):
        return rec(DISPATCH, 0, corr, s, e, dispatch_info={
            "agent_id": {"handle": 9001}, "queue_id": {"handle": 4242}, "kernel_id": kid, "dispatch_id": corr,
            "workgroup_size": {"x": 256, "y": 1, "z": 1}, "grid_size": {"x": 4096, "y": 1, "z": 1}})
    return {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": 1234},
        "agents": [{"id": {"handle": 8000}, "type": 1, "logical_node_id": 0},
                   {"id": {"handle": 9001}, "type": 2, "logical_node_id": 1, "name": "gfx942"}],
        "kernel_symbols": [{"kernel_id": 0, "formatted_kernel_name": "unused"},
                           {"kernel_id": 1, "formatted_kernel_name": "Cijk_Alik_Bljk_HHS_BH_MT128x128x64"},
                           {"kernel_id": 2, "formatted_kernel_name": "void at::native::vectorized_elementwise_kernel"}],
        "strings": {"buffer_records": [
            {"kind": "HIP_RUNTIME_API", "operations": ["hipLaunchKernel", "hipMemcpyAsync"]},
            {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_COMPLETE"]},
            {"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST",
                                                   "MEMORY_COPY_HOST_TO_DEVICE"]},
            {"kind": "MARKER_CORE_API", "operations": ["roctxRangePushA"]}],
            "marker_api": [{"key": 4, "value": "ProfilerStep#1"}]},
        "buffer_records": {
            "marker_api": [rec(MARKER, 0, 4, 1_000, 90_000)],
            "hip_api": [rec(HIP, 0, 5, 2_000, 6_000), rec(HIP, 0, 6, 7_000, 9_000), rec(HIP, 1, 7, 10_000, 12_000)],
            "kernel_dispatch": [dispatch(5, 1, 8_000, 40_000), dispatch(6, 2, 40_500, 45_500)],
            "memory_copy": [rec(COPY, 2, 7, 46_000, 50_000, src_agent_id={"handle": 8000},
                                dst_agent_id={"handle": 9001}, bytes=1 << 20)],
            "memory_allocation": [rec(0, 0, 8, 1, 2)],
        }}]}


def test_records_map_onto_kineto_kinds(tmp_path):
    p = tmp_path / "1234_results.json"
    p.write_text(json.dumps(_doc()))
    assert producer_of(p) == "rocprofv3"
    t = load_trace(p)[0]
    name = [t.names[int(n)] for n in t.name]
    kern = np.flatnonzero(t.kind == KERNEL)
    assert [name[i] for i in kern] == ["Cijk_Alik_Bljk_HHS_BH_MT128x128x64",
                                       "void at::native::vectorized_elementwise_kernel"]
    assert [CATEGORY_NAMES[t.category[i]] for i in kern] == ["gemm", "elementwise"]
    assert set(t.pid[kern].tolist()) == {0} and set(t.stream[kern].tolist()) == {4242}  # GPU 0, its queue
    assert t.dur_ns[kern].tolist() == [32_000, 5_000]
    cp = np.flatnonzero(t.kind == MEMCPY)
    assert [name[i] for i in cp] == ["Memcpy HtoD (rocprofv3)"] and t.nbytes[cp].tolist() == [1 << 20]
    # every device event is linked to the HIP call that launched it, by the internal correlation id
    link = correlated_host_row(t)
    assert [name[link[i]] for i in np.r_[kern, cp]] == ["hipLaunchKernel", "hipLaunchKernel", "hipMemcpyAsync"]
    assert all(t.kind[link[i]] == RUNTIME for i in np.r_[kern, cp])
    # the roctx range named ProfilerStep#1 is a step, and the device events take its number through their launch
    assert name[int(np.flatnonzero(t.kind == USER_ANNOTATION)[0])] == "ProfilerStep#1"
    assert set(t.step[np.r_[kern, cp]].tolist()) == {1}
    assert t.n_skipped == 1  # the allocation record


def test_gpu_agents_name_the_device(tmp_path):
    # rocprofiler-sdk's agents carry the product name and the CU count (rocprofiler_agent_v0_t: product_name,
    # cu_count): the table's deviceProperties as Kineto writes them, so diagnose prices work on the catalog part
    from trainperf.diagnose.roofline import device_accelerator

    doc = _doc()
    doc["rocprofiler-sdk-tool"][0]["agents"][1].update(product_name="AMD Instinct MI300X", cu_count=304)
    p = tmp_path / "1234_results.json"
    p.write_text(json.dumps(doc))
    t = load_trace(p)[0]
    assert t.metadata["deviceProperties"] == [{"id": 0, "name": "AMD Instinct MI300X", "numSms": 304}]
    assert device_accelerator(t).name == "mi300x"
    # without a product name the gfx target is the name, and 304 CUs alone fit two parts priced apart
    # (MI300X 5.3 TB/s, MI325X 6.0): no part
    del doc["rocprofiler-sdk-tool"][0]["agents"][1]["product_name"]
    p.write_text(json.dumps(doc))
    t = load_trace(p)[0]
    assert t.metadata["deviceProperties"][0]["name"] == "gfx942" and device_accelerator(t) is None


def test_not_rocprof_json_is_one_line_error(tmp_path):
    p = tmp_path / "x_results.json"
    p.write_text('{"rocprofiler-sdk-tool": 3}')
    with pytest.raises(TrainperfError, match="x_results.json"):
        load_trace(p)
