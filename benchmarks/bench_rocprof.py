"""Load speed of rocprofv3 output (issue 10): the CSV folder reader beside the JSON reader and the
Kineto reader, on one synthetic profile written in all three formats (no real rocprofv3 file can be
made here: it needs ROCm and an AMD GPU).

The profile: N kernel dispatches, each launched by a hipLaunchKernel on one host thread, a
host-to-device copy (and its hipMemcpyAsync) every 50 kernels, a roctx "ProfilerStep#k" range every
1,000 kernels. Columns and fields as rocprofiler-sdk writes them (trace/rocprof_csv.py,
trace/rocprof.py); the Kineto file holds the same events in Kineto's vocabulary. Each load runs in a
fresh process (imports excluded), the formats interleaved run by run; CPU seconds by
`time.process_time`, median of --repeat runs.

    .venv/bin/python benchmarks/bench_rocprof.py [--kernels 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "trace"))
from test_rocprof_csv import API_HEADER, COPY_HEADER, KERNEL_HEADER  # noqa: E402  (the documented columns)

LOAD = r'''
import sys, time
from trainperf.trace.load import load_trace
c0 = time.process_time(); t = load_trace(sys.argv[1], workers=1)[0]; c1 = time.process_time()
print(c1 - c0, len(t))
'''
NAMES = ("Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1", "void at::native::vectorized_elementwise_kernel<4>",
         "void at::native::reduce_kernel<512, 1>", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
T0 = 1_000_000_000
PID, TID = 4321, 4321


def profile(n: int):
    """Yield (kind, name, corr, start ns, end ns) of the synthetic profile."""
    corr = 0
    for k in range(n):
        t = T0 + 10_000 * k
        if k % 1000 == 0:
            corr += 1
            yield "marker", f"ProfilerStep#{k // 1000}", corr, t, t + 10_000 * 1000 - 10
        corr += 1
        yield "hip", "hipLaunchKernel", corr, t + 100, t + 2_100
        yield "kernel", NAMES[k % len(NAMES)], corr, t + 3_000, t + 9_000
        if k % 50 == 0:
            corr += 1
            yield "hip", "hipMemcpyAsync", corr, t + 2_200, t + 2_900
            yield "copy", "", corr, t + 9_100, t + 9_900


def write_csv(n: int, d: Path) -> Path:
    """Write the synthetic profile of ``n`` kernels as rocprofv3 CSV files in the new folder ``d``; return ``d``."""
    d.mkdir()
    files = {k: open(d / f"{PID}_{k}.csv", "w") for k in ("kernel_trace", "hip_api_trace", "memory_copy_trace",
                                                          "marker_api_trace")}
    files["kernel_trace"].write(KERNEL_HEADER)
    files["memory_copy_trace"].write(COPY_HEADER)
    files["hip_api_trace"].write(API_HEADER)
    files["marker_api_trace"].write(API_HEADER)
    for i, (kind, name, corr, s, e) in enumerate(profile(n)):
        if kind == "kernel":
            files["kernel_trace"].write(f'"KERNEL_DISPATCH","Agent 1",1,1,{TID},{i},{i % 4},"{name}",{corr},{s},{e},'
                                        '0,0,128,0,48,256,1,1,4096,1,1\n')
        elif kind == "copy":
            files["memory_copy_trace"].write(f'"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",1,"Agent 0","Agent 1",'
                                             f'{corr},{s},{e}\n')
        elif kind == "hip":
            files["hip_api_trace"].write(f'"HIP_RUNTIME_API_EXT","{name}",{PID},{TID},{corr},{s},{e}\n')
        else:
            files["marker_api_trace"].write(f'"MARKER_CORE_API","{name}",{PID},{TID},{corr},{s},{e}\n')
    for f in files.values():
        f.close()
    return d


def write_json(n: int, path: Path) -> Path:
    """Write the same profile as rocprofv3's JSON (rocprofiler-sdk-tool buffer records) at ``path``; return it."""
    ops = {"hip": ["hipLaunchKernel", "hipMemcpyAsync"], "marker": ["roctxRangePushA"]}
    recs = {"kernel_dispatch": [], "hip_api": [], "memory_copy": [], "marker_api": []}
    markers = []
    for i, (kind, name, corr, s, e) in enumerate(profile(n)):
        base = {"correlation_id": {"internal": corr, "external": 0}, "start_timestamp": s, "end_timestamp": e,
                "thread_id": TID}
        if kind == "kernel":
            recs["kernel_dispatch"].append({**base, "kind": 1, "operation": 0, "stream_id": {"handle": 1},
                                            "dispatch_info": {"agent_id": {"handle": 2}, "queue_id": {"handle": 1},
                                                              "kernel_id": NAMES.index(name), "dispatch_id": i}})
        elif kind == "copy":
            recs["memory_copy"].append({**base, "kind": 2, "operation": 1, "src_agent_id": {"handle": 1},
                                        "dst_agent_id": {"handle": 2}})
        elif kind == "hip":
            recs["hip_api"].append({**base, "kind": 0, "operation": ops["hip"].index(name)})
        else:
            recs["marker_api"].append({**base, "kind": 3, "operation": 0})
            markers.append({"key": corr, "value": name})
    doc = {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": PID},
        "agents": [{"id": {"handle": 1}, "type": 1}, {"id": {"handle": 2}, "type": 2}],
        "kernel_symbols": [{"kernel_id": i, "formatted_kernel_name": s} for i, s in enumerate(NAMES)],
        "strings": {"buffer_records": [{"kind": "HIP_RUNTIME_API", "operations": ops["hip"]},
                                       {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_COMPLETE"]},
                                       {"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE",
                                                                              "MEMORY_COPY_HOST_TO_DEVICE"]},
                                       {"kind": "MARKER_CORE_API", "operations": ops["marker"]}],
                    "marker_api": markers},
        "buffer_records": recs}]}
    path.write_text(json.dumps(doc))
    return path


def write_kineto(n: int, path: Path) -> Path:
    """Write the same events as a Kineto (PyTorch profiler) JSON trace at ``path``; return it."""
    ev = []
    for kind, name, corr, s, e in profile(n):
        us, dur = s / 1e3, (e - s) / 1e3
        if kind == "kernel":
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 1, "ts": us, "dur": dur,
                       "args": {"correlation": corr, "stream": 1, "device": 0}})
        elif kind == "copy":
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 1,
                       "ts": us, "dur": dur, "args": {"correlation": corr, "stream": 1, "device": 0}})
        elif kind == "hip":
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": us, "dur": dur,
                       "args": {"correlation": corr}})
        else:
            ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": TID, "ts": us,
                       "dur": dur})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return path


def load_cpu_s(path: Path) -> tuple[float, int]:
    """Return (CPU seconds of load_trace on ``path`` in a fresh process, events read)."""
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True,
                         cwd=REPO)
    cpu, n = out.stdout.split()
    return float(cpu), int(n)


def size_mb(path: Path) -> float:
    """Return the size in MB (10^6 bytes) of a file, or of the files in a folder."""
    files = [path] if path.is_file() else list(path.iterdir())
    return sum(f.stat().st_size for f in files) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    cases = {"rocprofv3 CSV folder": write_csv(a.kernels, tmp / "csv"),
             "rocprofv3 JSON": write_json(a.kernels, tmp / f"{PID}_results.json"),
             "Kineto JSON (same events)": write_kineto(a.kernels, tmp / "kineto.json")}
    runs: dict[str, list[float]] = {k: [] for k in cases}
    events = {}
    for _ in range(a.repeat):
        for k, p in cases.items():
            cpu, events[k] = load_cpu_s(p)
            runs[k].append(cpu)
    print("| format | MB on disk | events | CPU s (median) | µs per event | runs |")
    print("|---|---|---|---|---|---|")
    for k, p in cases.items():
        med = statistics.median(runs[k])
        print(f"| {k} | {size_mb(p):.1f} | {events[k]:,} | {med:.2f} | {1e6 * med / events[k]:.2f} | "
              f"{', '.join(f'{r:.2f}' for r in runs[k])} |")


if __name__ == "__main__":
    main()
