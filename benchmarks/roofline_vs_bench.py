"""The per-operator roofline (trainperf.diagnose.roofline, `trainperf roofline`) against `trainperf bench
kernels` on the same kernels and shapes: two traffic/FLOP models and two timers side by side.

For every eager implementation the kernel bench offers (norms, activations, softmax, cross-entropy, the
linear + cross-entropy GEMM, RoPE) at each shape and pass (fwd, fwd+bwd):
  (a) `trainperf bench kernels --impls eager --json` runs it: its bytes and FLOPs come from its own model
      (trainperf.bench.roofline: the minimum traffic of one ideal fused kernel), its time from its own
      timer (CUDA: triton do_bench, median; CPU: wall-clock median);
  (b) the same eager call (the bench's own case and runner) runs under torch.profiler(record_shapes=True)
      and the trace goes through diagnose's roofline: bytes and FLOPs summed over the ATen operators the
      eager code really runs (each priced from its recorded shapes), time = their kernels' device time
      (CUDA) or their host spans (CPU);
  (c) prints per kernel, shape and pass: bytes, FLOPs, time per call and achieved GB/s of both, and the
      ratios diagnose / bench. With --ops, each case's operators as diagnose priced them.
Where one ATen operator is the whole eager kernel (softmax, layer norm in fp32) the two models count the
same traffic and their bytes must agree; where eager runs several operators, diagnose counts what eager
moves (casts, intermediates, logits) and bench what a fused kernel must move: the ratio is eager's excess.

    .venv/bin/python benchmarks/roofline_vs_bench.py --device cpu --dtype fp32 [--ops] [--json FILE]
    python3 benchmarks/roofline_vs_bench.py --device cuda --dtype bf16   # on a GPU (benchmarks/gpu_check.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from trainperf.bench.cases import KERNELS, build_case, parse_shapes, shapes_for  # noqa: E402
from trainperf.bench.run import DTYPES, _fwd_bwd_fn, _fwd_fn  # noqa: E402
from trainperf.diagnose.roofline import roofline  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

PASSES = ("fwd", "fwd+bwd")
# CUDA shapes: one mid-size shape per rank (the bench's defaults are sized for minutes, this check for well under
# a minute: 8 kernels x 2 passes, each timed by bench and profiled for 10 calls)
CUDA_SHAPES = "4096x8192,4096x1024x32000,4x2048x32x128"
FLUSH_INT32 = 64 << 20  # 256 MiB of int32: more than any GPU's L2 (H200: 50 MB), as triton do_bench flushes


def bench_kernels(device: str, dtype: str, kernels: list[str], shapes: str | None) -> tuple[dict, dict]:
    """(a) `trainperf bench kernels` as a user runs it, eager only, JSON, no run record:
    {(kernel, shape, pass): bench row}."""
    cmd = [sys.executable, "-m", "trainperf.cli", "bench", "kernels", "--device", device, "--impls", "eager",
           "--dtype", dtype, "--kernels", ",".join(kernels), "--json", "--no-record"]
    if shapes:
        cmd += ["--shapes", shapes]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if device == "cpu":  # the same intra-op threads as the profiled calls (main sets them)
        env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"bench kernels failed:\n{out.stderr[-2000:]}")
    doc = json.loads(out.stdout)
    return {(r["kernel"], r["shape"], r["passname"]): r for r in doc["rows"]}, doc


def profile_case(kernel: str, shape: tuple[int, ...], dtype: str, device: str, passname: str, calls: int,
                 tmp: Path) -> tuple[dict, list]:
    """(b) The bench's eager case under torch.profiler(record_shapes=True), through diagnose's roofline:
    per call bytes, FLOPs and time (µs) of the operators it priced, and the rows."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device(device)
    case = build_case(kernel, shape, DTYPES[dtype], dev, ("eager",))
    fn = case.impls["eager"]
    with torch.no_grad():
        ref = fn(*case.inputs)
    grads = [torch.randn_like(t) for t in (ref if isinstance(ref, tuple) else (ref,))]
    run = _fwd_fn(fn, case) if passname == "fwd" else _fwd_bwd_fn(fn, case, grads)
    for _ in range(3):  # warm-up: first-call allocations and dispatch caches out of the profile
        run()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    # CUDA: flush L2 before every call as the bench's timer (triton do_bench) does, so both read from HBM;
    # the flush's own operator (a zero_ of this many int32) is left out of the rows below
    flush = torch.empty(FLUSH_INT32, dtype=torch.int32, device=dev) if dev.type == "cuda" else None
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts, record_shapes=True) as prof:
        for _ in range(calls):
            if flush is not None:
                flush.zero_()
            run()
        sync()
    path = tmp / f"{kernel}_{'x'.join(map(str, shape))}_{passname.replace('+', '_')}.json"
    prof.export_chrome_trace(str(path))
    tables = load_trace(path)
    rows = [r for r in roofline(next(iter(tables.values())))
            if not (r.op in ("aten::zero_", "aten::fill_") and r.shapes.startswith(f"[{FLUSH_INT32}]"))]
    per_call = {"bytes": sum(r.bytes * r.count for r in rows) / calls,
                "flops": sum(r.flops * r.count for r in rows) / calls,
                "time_us": sum(r.time_us for r in rows) / calls}
    return per_call, rows


def _fmt(v: float, unit: str = "") -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3f}{suf}{unit}"
    return f"{v:.0f}{unit}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: fp32 on cpu, bf16 on cuda)")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--shapes", default=None, help="as bench's --shapes (default: bench's CPU shapes on cpu, "
                                                   f"{CUDA_SHAPES} on cuda)")
    ap.add_argument("--calls", type=int, default=None, help="profiled calls per case (default 5 cpu, 10 cuda)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU intra-op threads for both runs (default 1: on shared cores, a kernel split over "
                         "threads waits for the slowest one's time slice, ms of noise on µs kernels)")
    ap.add_argument("--ops", action="store_true", help="print each case's operators as diagnose priced them")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    a = ap.parse_args(argv)
    dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    kernels = [k.strip() for k in a.kernels.split(",") if k.strip()]
    shapes = a.shapes or (CUDA_SHAPES if a.device == "cuda" else None)
    calls = a.calls or (10 if a.device == "cuda" else 5)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)

    bench, doc = bench_kernels(a.device, dtype, kernels, shapes)
    print(f"device {doc['device_name']} dtype {dtype} threads {torch.get_num_threads()}; "
          f"bench: `trainperf bench kernels --device {a.device} "
          f"--impls eager --dtype {dtype} --kernels {','.join(kernels)}{' --shapes ' + shapes if shapes else ''} "
          f"--json`; diagnose: {calls} profiled calls per case")
    head = ("kernel", "shape", "pass", "bytes bench", "bytes diag", "ratio", "FLOPs bench", "FLOPs diag", "ratio",
            "µs bench", "µs diag", "GB/s bench", "GB/s diag", "ratio")
    print(" | ".join(head))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in kernels:
            for shape in shapes_for(kernel, a.device, parse_shapes(shapes) if shapes else None):
                for passname in PASSES:
                    b = bench.get((kernel, "x".join(map(str, shape)), passname))
                    if b is None:
                        continue
                    case = build_case(kernel, shape, DTYPES[dtype], torch.device("cpu"), ())
                    work = case.work[passname]
                    d, rows = profile_case(kernel, shape, dtype, a.device, passname, calls, Path(tmp))
                    b_us = b["median_ms"] * 1e3
                    d_gbps = d["bytes"] / (d["time_us"] * 1e3) if d["time_us"] > 0 else 0.0
                    rec = {"kernel": kernel, "shape": "x".join(map(str, shape)), "pass": passname,
                           "bench": {"bytes": work.bytes, "flops": work.flops, "time_us": b_us, "gbps": b["gbps"]},
                           "diagnose": {"bytes": d["bytes"], "flops": d["flops"], "time_us": d["time_us"],
                                        "gbps": d_gbps},
                           "bytes_ratio": d["bytes"] / work.bytes, "flops_ratio": d["flops"] / work.flops,
                           "gbps_ratio": d_gbps / b["gbps"] if b["gbps"] else None,
                           "ops": [{"op": r.op, "shapes": r.shapes, "calls_per_call": r.count / calls,
                                    "bytes": r.bytes, "flops": r.flops, "time_us_per_call": r.time_us / calls}
                                   for r in rows]}
                    out.append(rec)
                    print(" | ".join([kernel, rec["shape"], passname, _fmt(work.bytes, "B"), _fmt(d["bytes"], "B"),
                                      f"{rec['bytes_ratio']:.3f}", _fmt(work.flops), _fmt(d["flops"]),
                                      f"{rec['flops_ratio']:.3f}", f"{b_us:.1f}", f"{d['time_us']:.1f}",
                                      f"{b['gbps']:.2f}", f"{d_gbps:.2f}",
                                      f"{rec['gbps_ratio']:.3f}" if rec["gbps_ratio"] else "-"]), flush=True)
                    if a.ops:
                        for r in sorted(rows, key=lambda r: -r.bytes * r.count):
                            print(f"    {r.op} {r.shapes} x{r.count / calls:g}: {_fmt(r.bytes, 'B')} "
                                  f"{_fmt(r.flops)}FLOP {r.time_us / calls:.1f} µs")
    if a.json:
        a.json.write_text(json.dumps({"device": doc["device_name"], "dtype": dtype, "calls": calls,
                                      "cases": out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
