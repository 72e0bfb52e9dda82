"""Loader tests: formats, ranks, schema variants, bad input, and a torch.profiler CPU trace.

References: the events counted/summed by an independent `json.load` of the same file, and
hand-written expectations.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kineto_builder import TraceBuilder
from trainperf.errors import TrainperfError
from trainperf.trace import kineto, load_trace, read_kineto
from trainperf.trace.events import (ATTENTION, CAT_OTHER, COMMUNICATION, CPU_OP, ELEMENTWISE, GEMM, KERNEL, MEMCPY,
                                    OPTIMIZER, REDUCTION, RUNTIME)
from trainperf.trace.categories import collective_type, copy_direction, from_pageable_to_device, kernel_category

DATA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/traces/hta not present")


def _small(tmp_path, **kw) -> Path:
    b = TraceBuilder(**kw)
    b.step(1, 0, 500).step(2, 500, 500)
    b.cpu("aten::mm", 10, 30)
    b.launch("ampere_sgemm_128x64_tn", 12, 20, 100)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 130, 50, stream=20)
    b.launch("Memcpy HtoD (Pageable -> Device)", 60, 200, 10, cat="gpu_memcpy", runtime="cudaMemcpyAsync", bytes=4096)
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 520, 530, 10)
    return b.write(tmp_path / "t.json.gz")


def test_columns_match_json_reference(tmp_path, monkeypatch):
    p = _small(tmp_path)
    ref = [e for e in json.loads(gzip.decompress(p.read_bytes()))["traceEvents"] if e["ph"] == "X"]
    for chunk in (1 << 20, 64, 7):  # tiny chunks force many cuts inside events and strings
        monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
        t = read_kineto(p)
        assert len(t) == len(ref)
        assert t.dur_ns.sum() == sum(int(e["dur"] * 1000) for e in ref)
        assert sorted(t.names[i] for i in t.name) == sorted(e["name"] for e in ref)
    assert t.rank == 0
    k = t.kind
    assert (k == KERNEL).sum() == 3 and (k == MEMCPY).sum() == 1 and (k == RUNTIME).sum() == 4 and (k == CPU_OP).sum() == 1
    m = np.flatnonzero(k == MEMCPY)[0]
    assert t.nbytes[m] == 4096 and t.stream[m] == 7
    # steps: host events by enclosing ProfilerStep, kernels by their launch (launched at 520 -> step 2)
    gemm = np.flatnonzero(t.category == GEMM)[0]
    ew = np.flatnonzero(t.category == ELEMENTWISE)[0]
    assert t.step[gemm] == 1 and t.step[ew] == 2
    assert t.category[np.flatnonzero(k == CPU_OP)[0]] == -1


def test_one_line_json_and_array_format(tmp_path):
    b = TraceBuilder()
    b.launch("k", 0, 5, 10)
    (tmp_path / "a.json").write_text(json.dumps(b.doc()))  # minified
    assert len(read_kineto(tmp_path / "a.json")) == 2
    (tmp_path / "b.json").write_text(json.dumps(b.events))  # Chrome JSON array format
    assert len(read_kineto(tmp_path / "b.json")) == 2


def test_ns_timestamps_and_2021_schema(tmp_path):
    b = TraceBuilder(ns=True)
    b.launch("k", 1.25, 5.5, 10.125)
    t = read_kineto(b.write(tmp_path / "ns.json.gz"))
    assert t.ts_was_float and sorted(t.dur_ns) == [4000, 10125]
    old = {"traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "Kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 4, "dur": 3,
         "args": {"correlation": 7, "stream": 7}}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    t = read_kineto(tmp_path / "old.json")
    assert list(t.kind) == [CPU_OP, RUNTIME, KERNEL]


def test_float_timestamps_round_as_hta_but_never_to_a_negative_duration(tmp_path):
    from trainperf.diagnose.window import times_us

    b = TraceBuilder(ns=True)
    b.launch("k", 1.25, 5.5, 10.125)         # [5.5, 15.625] -> [6, 15]: start up, end down, as HTA
    b.launch("tiny", 20.0, 30.1, 0.8)        # [30.1, 30.9] -> start 31, end 30: an instant at 31, not -1 us
    t = read_kineto(b.write(tmp_path / "ns.json.gz"))
    ts, end = times_us(t)
    kernels = np.flatnonzero(t.kind == KERNEL)
    assert sorted(zip(ts[kernels], end[kernels])) == [(6.0, 15.0), (31.0, 31.0)]
    assert (end >= ts).all()


def test_large_ids_missing_fields_negative_durations(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": -3, "args": {"correlation": 2 ** 62, "stream": "7"}},
          {"ph": "X", "cat": "kernel", "name": "k2", "ts": 10},  # no dur: dropped (as HTA)
          {"ph": "X", "name": "nocat", "ts": 1, "dur": 1},  # no cat: dropped
          {"ph": "X", "cat": "kernel", "ts": 5, "dur": 0, "args": {"correlation": 2 ** 70}},  # id beyond int64
          {"ph": "i", "name": "instant", "ts": 3}, 5, "junk"]
    (tmp_path / "x.json").write_text(json.dumps({"traceEvents": ev}))
    t = read_kineto(tmp_path / "x.json")
    assert len(t) == 2 and t.n_skipped == 4
    assert sorted(t.correlation) == [-1, 2 ** 62] and sorted(t.dur_ns) == [-3000, 0] and 7 in t.stream


@pytest.mark.parametrize("content, message", [
    (b"", "empty file"),
    (b"   \n ", "empty file"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel"', "invalid JSON"),
    (b"not json at all", "not JSON"),
    (b'{"traceEvents": [{"ph": "X"}, ]}', "invalid JSON"),
    (b'[[-1, 1, 37888, 7], [-1, 1, 512, 7]]', "not of events: not a trace"),  # a memory timeline
    (b'{"traceEvents": []}', "no complete"),
])
def test_bad_input_is_one_clear_line(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TrainperfError, match=message) as e:
        read_kineto(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_truncated_gzip(tmp_path):
    # cut before any whole event: an error; cut later: the events before the cut, marked as cut
    # (tests/trace/test_trace_json_variants.py)
    p = _small(tmp_path)
    data = p.read_bytes()
    (tmp_path / "trunc.json.gz").write_bytes(data[:12])
    with pytest.raises(TrainperfError, match="truncated or corrupt gzip"):
        read_kineto(tmp_path / "trunc.json.gz")
    (tmp_path / "half.json.gz").write_bytes(data[: len(data) // 2])
    half, whole = read_kineto(tmp_path / "half.json.gz"), read_kineto(p)
    assert 0 < len(half) < len(whole) and half.metadata["truncated"]["events_read"] == len(half)


def _tb(**kw) -> TraceBuilder:
    return TraceBuilder(**kw).cpu("aten::add", 0, 5)


def test_a_folder_whose_files_carry_no_rank_is_ranked_in_file_order_and_says_so(tmp_path):
    # JAX writes <host>.xplane.pb per host, with no rank anywhere: host2 before host10 (numbers compared as
    # numbers), and the diagnosis says which file each rank is
    from trainperf.diagnose.api import diagnose

    d = tmp_path / "job"
    d.mkdir()
    _tb(rank=None).write(d / "host10.json.gz")
    TraceBuilder(rank=None).cpu("aten::add", 1, 5).write(d / "host2.json.gz")  # another host: other events
    tables = load_trace(d)
    assert [Path(tables[r].source).name for r in sorted(tables)] == ["host2.json.gz", "host10.json.gz"]
    assert any("0 = host2.json.gz, 1 = host10.json.gz" in n for n in diagnose(d).notes)
    # two profiles of different processes that never ran at the same time: not two ranks of one job
    apart = tmp_path / "apart"
    apart.mkdir()
    TraceBuilder(rank=None).cpu("aten::add", 0, 5).write(apart / "host_7.100.pt.trace.json.gz")
    other = TraceBuilder(rank=None).cpu("aten::add", 2e6, 5)
    other.events[0]["pid"] = 11
    other.write(apart / "host_8.200.pt.trace.json.gz")
    with pytest.raises(TrainperfError, match="do not overlap.*different moments"):
        load_trace(apart)


def test_one_process_profiled_in_several_cycles_is_read_at_its_latest(tmp_path):
    # tensorboard_trace_handler writes a file per cycle of a schedule with repeat: one process (one host pid), files
    # one after the other; the latest is analysed and the others named in a warning. Before, an error
    from trainperf.trace.load import EarlierCyclesWarning

    cycles = tmp_path / "cycles"
    cycles.mkdir()
    TraceBuilder(rank=None).cpu("aten::add", 0, 5).write(cycles / "host_7.100.pt.trace.json.gz")
    TraceBuilder(rank=None).cpu("aten::add", 2e6, 5).write(cycles / "host_7.200.pt.trace.json.gz")
    with pytest.warns(EarlierCyclesWarning, match=r"1 earlier profiling cycle\(s\) skipped \(host_7.100"):
        tables = load_trace(cycles)
    assert list(tables) == [0] and Path(tables[0].source).name == "host_7.200.pt.trace.json.gz"
    # two ranks, two cycles each: each rank's latest, the same cycle
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        for c, t0 in ((1, 0.0), (2, 2e6)):
            b = TraceBuilder(rank=r, world_size=2).cpu("aten::add", t0, 5)
            b.events[0]["pid"] = 10 + r
            b.write(job / f"host{r}_{10 + r}.{c}.pt.trace.json.gz")
    with pytest.warns(EarlierCyclesWarning, match="2 earlier"):
        tables = load_trace(job)
    assert {r: Path(t.source).name for r, t in tables.items()} == {0: "host0_10.2.pt.trace.json.gz",
                                                                   1: "host1_11.2.pt.trace.json.gz"}
    # a rank with one cycle fewer: the latest files would be of different moments
    (job / "host1_11.2.pt.trace.json.gz").unlink()
    with pytest.raises(TrainperfError, match=r"different numbers of cycles \(rank 0: 2, rank 1: 1\)"):
        load_trace(job)


def test_folder_ranks_duplicates_and_mixed_jobs(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    _tb(rank=None).write(d / "worker_rank3.json.gz")
    _tb(rank=1, world_size=4).write(d / "a.json.gz")
    tables = load_trace(d)
    assert sorted(tables) == [1, 3]  # rank 3 from the file name
    TraceBuilder(rank=1, world_size=4).cpu("aten::add", 1, 5).write(d / "b.json.gz")  # at the same time
    with pytest.raises(TrainperfError, match="duplicate rank 1"):
        load_trace(d)
    (d / "b.json.gz").unlink()
    # the same trace saved twice (a .json beside its .json.gz): one kept, the copy named
    from trainperf.trace.load import CopiesWarning

    _tb(rank=1, world_size=4).write(d / "a.json", gz=False)
    with pytest.warns(CopiesWarning, match=r"a.json.gz: the same trace as the file of its name without .gz"):
        tables = load_trace(d)
    assert sorted(tables) == [1, 3] and Path(tables[1].source).name == "a.json"
    (d / "a.json").unlink()
    _tb(rank=2, world_size=8).write(d / "c.json.gz")
    with pytest.raises(TrainperfError, match="different jobs"):
        load_trace(d)
    (d / "c.json.gz").unlink()
    _tb(rank=None).write(d / "noname.json.gz")
    with pytest.raises(TrainperfError, match="cannot tell its rank"):
        load_trace(d)


def test_kernel_categories_old_and_new_nccl_names():
    # reference: NCCL kernel naming across versions (2.4-2.7 ncclAllReduceRingLLKernel_*, <2.19 ncclKernel_*,
    # >=2.19 ncclDevKernel_*), RCCL's rcclGenericKernel; cuBLAS/CUTLASS/Triton/ATen kernel names
    cases = {
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": (COMMUNICATION, "all_reduce"),
        "ncclKernel_AllGather_RING_LL_Sum_int8_t": (COMMUNICATION, "all_gather"),
        "ncclAllReduceRingLLKernel_sum_f32": (COMMUNICATION, "all_reduce"),
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": (COMMUNICATION, "reduce_scatter"),
        "ncclDevKernel_SendRecv": (COMMUNICATION, "send_recv"),
        "rcclGenericKernel<1, false>": (COMMUNICATION, "unknown"),
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": (GEMM, None),
        "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32": (GEMM, None),
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>": (ATTENTION, None),
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80": (ATTENTION, None),
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": (ELEMENTWISE, None),
        "triton_poi_fused_add_mul_0": (ELEMENTWISE, None),
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>": (REDUCTION, None),
        "triton_red_fused_sum_1": (REDUCTION, None),
        "multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>": (OPTIMIZER, None),
        # the kernel's own name decides, not namespaces or template arguments ("fbgemm_gpu", "{lambda")
        "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8(float)>(int)": (ELEMENTWISE, None),
        "void at::native::vectorized_elementwise_kernel<4, at::native::launch_clamp_scalar::{lambda(float)#1}>(int)":
            (ELEMENTWISE, None),
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align4>(Params)": (GEMM, None),
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row<float>": (ELEMENTWISE, None),
        "cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1": (GEMM, None),
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long)": (REDUCTION, None),
        # products under other names: vLLM/SGLang's Triton MoE GEMM, AITER's, vLLM's ROCm skinny GEMMs, MIOpen's
        # convolutions (their sources: trace.categories.GEMM_RE), not their neighbours' routing or sums
        "fused_moe_kernel": (GEMM, None),
        "_ZN5aiter23fmoe_bf16_g1u1_subGU_256E": (GEMM, None),
        "void wvSplitK_hf_sml_<__hip_bfloat16, 64, 2, 16, 8, 2, 1>(int, int)": (GEMM, None),
        "void LLGemm1_kernel<__hip_bfloat16, 4>(int, int)": (GEMM, None),
        "MIOpenConv1x1": (GEMM, None),
        "miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1": (GEMM, None),
        "void vllm::moe::moe_align_block_size_kernel<int>(int)": (CAT_OTHER, None),
        "void vllm::moe::moe_sum_kernel<float, 2>(float*)": (REDUCTION, None),
    }
    for name, (cat, coll) in cases.items():
        assert kernel_category(name, KERNEL) == cat, name
        if coll:
            assert collective_type(name) == coll, name


def test_copy_directions_as_each_tracer_names_them():
    # CUPTI (Kineto on NVIDIA), roctracer (Kineto on ROCm: HTA's MI250 trace) and rocprofv3 names of copies; a peer
    # copy between two devices is PtoP although its memory kinds read "Device -> Device"
    cases = {
        "Memcpy HtoD (Pinned -> Device)": ("HtoD", False),
        "Memcpy HtoD (Pageable -> Device)": ("HtoD", True),
        "Memcpy HtoD (Host -> Device)": ("HtoD", True),     # roctracer does not name the host memory's kind
        "CopyHostToDevice": ("HtoD", True),
        "Memcpy DtoH (Device -> Pageable)": ("DtoH", False),
        "CopyDeviceToHost": ("DtoH", False),
        "Memcpy PtoP (Device -> Device)": ("PtoP", False),
        "Memcpy DtoD (Device -> Device)": ("DtoD", False),
        "Memcpy HtoH (Pinned -> Pinned)": ("HtoH", False),
        "Memset (Device)": ("", False),
    }
    for name, (direction, pageable) in cases.items():
        assert (copy_direction(name), from_pageable_to_device(name)) == (direction, pageable), name


def test_torch_profiler_cpu_trace_loads(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    model = torch.nn.Linear(16, 16)
    p = tmp_path / "cpu_trace.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with record_function(f"ProfilerStep#{i}"):  # what the trainer's prof.step() schedule writes
                model(torch.randn(4, 16)).sum().backward()
    prof.export_chrome_trace(str(p))
    t = read_kineto(p)
    names = {t.names[i] for i in t.name}
    assert "aten::linear" in names or "aten::addmm" in names
    assert not t.has_gpu and (t.step >= 0).any()


@needs_data
def test_real_traces_load_with_ranks():
    tables = load_trace(DATA / "trace_filter")
    assert sorted(tables) == [0, 1]
    t = load_trace(DATA / "large_integer_trace")
    assert list(t) == [70]
    ns = load_trace(DATA / "ns_resolution_trace")[0]
    assert ns.ts_was_float and ns.has_gpu


def test_stdlib_json_fallback_reads_the_same(tmp_path, monkeypatch):
    # without orjson (e.g. a machine with no package registry) the loader uses the json module
    p = _small(tmp_path)
    ref = read_kineto(p)
    monkeypatch.setattr(kineto, "_loads", json.loads)
    monkeypatch.setattr(kineto, "_DecodeError", (ValueError,))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 50)
    t = read_kineto(p)
    assert len(t) == len(ref) and (t.ts_ns == ref.ts_ns).all() and (t.name == ref.name).all()
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X",')
    with pytest.raises(TrainperfError, match="invalid JSON"):
        read_kineto(bad)


def test_a_byte_order_mark_before_the_json_is_read_past(tmp_path):
    # some Windows editors and PowerShell's redirection write a UTF-8 byte-order mark first; Python's utf-8-sig and
    # Chrome's trace viewer read past it (before: "not JSON (starts with b'\xef\xbb\xbf{...')")
    b = TraceBuilder().cpu("aten::add", 0, 5)
    b.launch("ampere_sgemm_128x64_tn", 1, 6, 20)
    plain = b.write(tmp_path / "plain.json", gz=False)
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, m = read_kineto(plain), read_kineto(marked)
    assert len(m) == len(a) == 3 and list(m.names) == list(a.names) and (m.ts_ns == a.ts_ns).all()


def test_a_folder_of_trace_folders_names_them(tmp_path):
    # torchtitan writes profile_trace/iteration_N/rank<r>_trace.json: pointed at profile_trace/, the error names the
    # folders that hold traces, the latest iterations last (numbers compared as numbers)
    for it in (2, 10, 4):
        (tmp_path / f"iteration_{it}").mkdir()
        _tb().write(tmp_path / f"iteration_{it}" / "rank0_trace.json.gz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainperfError, match=r"its subfolders hold some \(iteration_2/, iteration_4/, iteration_10/\)"):
        load_trace(tmp_path)


def test_a_folder_whose_traces_are_deeper_names_where(tmp_path):
    # HTA's critical-path example keeps its traces at end_to_end/simple_add/input/ and .../output/: pointed at
    # end_to_end/, the error names those folders (up to 3 levels down; run10 after run9), not one found deeper
    for sub in ("simple_add/input", "simple_add/output", "run10/x", "run9/x", "a/b/c/too_deep"):
        (tmp_path / sub).mkdir(parents=True)
        _tb().write(tmp_path / sub / "trace.json.gz")
    with pytest.raises(TrainperfError, match=r"its subfolders hold some \(run10/x/, simple_add/input/, "
                                             r"simple_add/output/, \.\.\.\): diagnose one of them"):
        load_trace(tmp_path)


def test_a_folder_per_node_or_per_rank_is_the_job(tmp_path):
    # a multi-node job's traces gathered a folder per node (node0/rank0.json, node1/rank2.json ...), or a folder per
    # rank whose file names carry none (rank3/trace.json): read together, as one folder of the job's files would be
    for node, ranks in (("node0", (0, 1)), ("node1", (2, 3))):
        (tmp_path / "nodes" / node).mkdir(parents=True)
        for r in ranks:
            b = TraceBuilder(rank=r, world_size=4).cpu("aten::add", 0, 5)
            b.write(tmp_path / "nodes" / node / f"rank{r}.json.gz")
    assert sorted(load_trace(tmp_path / "nodes")) == [0, 1, 2, 3]
    for r in (0, 1):
        (tmp_path / "ranks" / f"rank_{r}").mkdir(parents=True)
        TraceBuilder(rank=None).cpu("aten::add", 0, 5).write(tmp_path / "ranks" / f"rank_{r}" / "trace.json.gz")
    assert sorted(load_trace(tmp_path / "ranks")) == [0, 1]


@pytest.mark.parametrize("runtime_cat", ["xpu_runtime", "xpu_driver", "privateuse1_driver", "mlu_runtime"])
def test_other_vendors_runtime_calls_are_runtime_calls(tmp_path, runtime_cat):
    # Kineto's categories of Intel's XPU, Cambricon's MLU and out-of-tree backends (libkineto ActivityType.cpp): their
    # launches link to their kernels as CUDA's do
    from trainperf.trace.events import KERNEL, RUNTIME

    b = TraceBuilder()
    b.launch("gemm_kernel", 10, 20, 50, runtime="urEnqueueKernelLaunch")
    doc = b.doc()
    for e in doc["traceEvents"]:
        if e["cat"] == "cuda_runtime":
            e["cat"] = runtime_cat
    (tmp_path / "t.json").write_text(json.dumps(doc))
    t = read_kineto(tmp_path / "t.json")
    assert sorted(t.kind.tolist()) == sorted([RUNTIME, KERNEL])
    assert len(set(t.correlation.tolist())) == 1
