"""Side by side with HTA 0.5.0: temporal breakdown, idle split and comm/comp overlap on every GPU trace.

HTA runs in its own venv (python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install
holistictraceanalysis==0.5.0 'pandas<3'); trainperf in this one. Prints one row per rank with both
tools' numbers and the largest difference in percentage points; exits 1 if any exceeds 0.5 pp.

    .venv/bin/python benchmarks/compare_hta.py [--data ../shared/data/traces/hta] [--hta-python PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# traces with GPU events (folders holding one file per rank)
GPU_TRACES = ["trace_filter", "nccl_parser_config", "negative_queue_length_values_check", "df_index_resolver",
              "ns_resolution_trace", "with_gpu_user_annotation", "amd_trace", "triton_example",
              "critical_path/alexnet", "critical_path/simple_add", "critical_path/cuda_event_sync",
              "critical_path/cuda_event_sync_multi_stream", "mtia_trace_single_rank", "mtia_inference_trace"]

HTA_SCRIPT = r'''
import json, logging, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
path, mode = sys.argv[1], sys.argv[2]
def hwm_mb():  # this process's peak RSS (VmHWM); ru_maxrss would carry the parent's peak across exec
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
base = hwm_mb()
c0 = time.process_time(); w0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=path)
load = {"cpu_s": time.process_time() - c0 + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime, "wall_s": time.perf_counter() - w0,
        "peak_rss_mb": max(hwm_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024), "base_rss_mb": base,
        "main_peak_rss_mb": hwm_mb(), "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
out = {"load": load, "ranks": {}}
if mode == "analyse":
    tb = ta.get_temporal_breakdown(visualize=False)
    ov = ta.get_comm_comp_overlap(visualize=False)
    for _, row in tb.iterrows():
        r = int(row["rank"])
        d = {"window_us": float(row["kernel_time(us)"]), "idle_pct": float(row["idle_time_pctg"]),
             "compute_pct": float(row["compute_time_pctg"]), "non_compute_pct": float(row["non_compute_time_pctg"])}
        o = ov[ov["rank"] == r]
        d["overlap_pct"] = float(o["comp_comm_overlap_pctg"].iloc[0]) if len(o) else float("nan")
        try:
            idle = ta.get_idle_time_breakdown(ranks=[r], visualize=False)[0]
            tot = idle["idle_time"].sum()
            for cat in ("host_wait", "kernel_wait", "other"):
                d["idle_" + cat.split("_")[0] + "_pct"] = float(100 * idle[idle["idle_category"] == cat]["idle_time"].sum() / tot) if tot else 0.0
        except Exception as e:
            d["idle_error"] = repr(e)[:120]
        out["ranks"][r] = d
print(json.dumps(out))
'''

KEYS = ["idle_pct", "compute_pct", "non_compute_pct", "overlap_pct", "idle_host_pct", "idle_kernel_pct",
        "idle_other_pct"]


def run_hta(path: Path, hta_python: str, mode: str = "analyse", timeout: int = 900) -> dict:
    """Run HTA 0.5.0 on a trace folder in its venv; return its numbers (and load cost)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(HTA_SCRIPT)
    r = subprocess.run([hta_python, f.name, str(path), mode], capture_output=True, text=True, timeout=timeout)
    Path(f.name).unlink()
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_ours(path: Path) -> dict:
    """trainperf's numbers for every rank of a trace folder."""
    from trainperf.diagnose.api import diagnose

    d = diagnose(path)
    return {r.rank: {k: getattr(r, k) for k in ["window_us"] + KEYS} for r in d.ranks if r.gpu_analyses == "ok"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / "../shared/data/traces/hta"))
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--tolerance-pp", type=float, default=0.5)
    args = ap.parse_args()
    data = Path(args.data)
    worst = 0.0
    print(f"{'trace':44s} rank  {'metric':16s} {'HTA':>9s} {'trainperf':>9s} {'diff pp':>8s}")
    for name in GPU_TRACES:
        path = data / name
        if not path.is_dir():
            continue
        hta = run_hta(path, args.hta_python)
        ours = run_ours(path)
        if "error" in hta:
            print(f"{name:44s}  HTA failed: {hta['error']}")
            continue
        for r, h in sorted(hta["ranks"].items(), key=lambda kv: int(kv[0])):
            o = ours.get(int(r))
            if o is None:
                print(f"{name:44s} {r:>4}  trainperf found no GPU events")
                continue
            for k in KEYS:
                if k not in h:
                    continue
                diff = abs(h[k] - o[k]) if h[k] == h[k] else 0.0
                worst = max(worst, diff)
                flag = "  <-- over tolerance" if diff > args.tolerance_pp else ""
                print(f"{name:44s} {r:>4}  {k:16s} {h[k]:9.2f} {o[k]:9.2f} {diff:8.2f}{flag}")
            if "idle_error" in h:
                print(f"{name:44s} {r:>4}  HTA idle breakdown failed: {h['idle_error']}")
    print(f"largest difference: {worst:.2f} percentage points (tolerance {args.tolerance_pp})")
    return 0 if worst <= args.tolerance_pp else 1


if __name__ == "__main__":
    sys.exit(main())
