"""H200 measurements of the fused kernels: every kernel vs eager, torch.compile and Liger.

    python3 benchmarks/gpu_kernels.py --out DIR            # on the GPU machine (under ~3.5 minutes)
    python3 benchmarks/gpu_kernels.py --device cpu --out DIR   # smoke run of the same path (interpreter)

Phases, in priority order, each written to DIR as soon as it finishes (a time budget skips what
does not fit): (1) device-to-device copy bandwidth; (2) trainperf / eager / Liger at large
shapes, fwd and fwd+bwd; (3) torch.compile at the same shapes (compiling costs most of the
time); (4) fused linear cross-entropy at vocab 128K: peak memory and time vs eager; (5) the tiny
trainer for 300 steps with and without the kernels (losses and step time). Outputs:
kernels.json (every row), kernels.md (tables + goal checks, ready for docs/benchmarks.md),
kernels.html (charts), store/ (one run record, when the store's dependencies import).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from trainperf.atomic import atomic_write_text  # noqa: E402
from trainperf.bench.run import BenchResult, fill_speedups, run_bench  # noqa: E402
from trainperf.bench.timing import copy_bandwidth_gbps  # noqa: E402

GPU_CASES = [  # (kernel, shape): LLM-sized rows; 65536-wide rows are where Liger's norms fall off
    ("rms_norm", (8192, 4096)), ("rms_norm", (4096, 8192)), ("rms_norm", (2048, 16384)), ("rms_norm", (1024, 65536)),
    ("layer_norm", (4096, 8192)), ("layer_norm", (1024, 65536)),
    ("swiglu", (8192, 14336)), ("geglu", (8192, 14336)),
    ("softmax", (4096, 8192)), ("softmax", (1024, 65536)),
    ("rope", (4, 4096, 32, 128)),
    ("cross_entropy", (8192, 32000)), ("cross_entropy", (4096, 128256)),
]
CPU_CASES = [("rms_norm", (16, 256)), ("layer_norm", (16, 256)), ("swiglu", (16, 256)), ("geglu", (16, 256)),
             ("softmax", (16, 256)), ("rope", (1, 8, 4, 16)), ("cross_entropy", (16, 500))]
FLCE = {"cuda": ("fused_linear_cross_entropy", (8192, 4096, 128256)),
        "cpu": ("fused_linear_cross_entropy", (64, 32, 1000))}


def _markdown(result: BenchResult, goals: list[str], e2e: dict | None, elapsed_s: float, command: str) -> str:
    from trainperf.bench.report import HEADER, table_rows

    lines = [f"# Kernel benchmarks — {result.device_name}, {result.dtype}", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: `{command}`",
             f"- torch {torch.__version__}, triton {__import__('triton').__version__}; run time {elapsed_s:.0f} s",
             f"- measured device-to-device copy bandwidth: {result.copy_gbps:.0f} GB/s (bytes read + written); "
             f"catalog HBM peak: {result.catalog_hbm_gbps or float('nan'):.0f} GB/s; catalog dense peak: "
             f"{result.catalog_peak_tflops or float('nan'):.0f} TFLOP/s",
             "- GB/s counts the minimum traffic of a fused kernel (trainperf.bench.roofline); median of "
             "triton.testing.do_bench (CUDA events, L2 flushed).", "", "## Goals", ""]
    lines += [f"- {g}" for g in goals] + ["", "## All rows", "", "| " + " | ".join(HEADER) + " |",
                                          "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(result)]
    if e2e:
        lines += ["", "## End to end (tiny trainer, fp32)", "", "```", json.dumps(e2e, indent=1), "```"]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def _goals(result: BenchResult) -> list[str]:
    rows = result.rows
    out = []
    by = {(r.kernel, r.shape, r.passname, r.impl): r for r in rows}
    for (kernel, shape, passname, impl), r in sorted(by.items()):
        if impl != "trainperf" or kernel == "fused_linear_cross_entropy":
            continue
        parts = [f"{kernel} {shape} {passname}: {r.gbps:.0f} GB/s = {r.pct_copy_bw or 0:.0f}% of copy BW "
                 f"({'PASS' if (r.pct_copy_bw or 0) >= 90 else 'below'} 90%)"]
        for other in ("liger", "compile"):
            o = by.get((kernel, shape, passname, other))
            if o:
                x = o.median_ms / r.median_ms
                parts.append(f"{x:.2f}x {other} ({'PASS' if x >= 1.0 else 'FAIL'})")
        out.append("; ".join(parts))
    k, shape = FLCE["cuda" if result.device == "cuda" else "cpu"]
    s = "x".join(map(str, shape))
    ours, eager = by.get((k, s, "fwd+bwd", "trainperf")), by.get((k, s, "fwd+bwd", "eager"))
    if ours and eager and ours.peak_mem_bytes and eager.peak_mem_bytes:
        mem, t = ours.peak_mem_bytes / eager.peak_mem_bytes, ours.median_ms / eager.median_ms
        out.append(f"FLCE {s} fwd+bwd: peak memory {ours.peak_mem_bytes / 2**30:.2f} GiB vs eager "
                   f"{eager.peak_mem_bytes / 2**30:.2f} GiB = {100 * mem:.0f}% ({'PASS' if mem <= 0.25 else 'FAIL'} "
                   f"<= 25%); time {t:.2f}x eager ({'PASS' if t <= 1.1 else 'FAIL'} <= 1.1x); "
                   f"{ours.tflops:.0f} TFLOP/s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default=None, help="bf16 (cuda default) or fp32 (cpu default)")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip phases that start after this many seconds")
    ap.add_argument("--e2e-steps", type=int, default=None, help="trainer steps (300 on cuda, 4 on cpu)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(args.device)
    dtype = args.dtype or ("bf16" if dev.type == "cuda" else "fp32")
    cases = GPU_CASES if dev.type == "cuda" else CPU_CASES
    command = "python3 benchmarks/gpu_kernels.py " + " ".join(sys.argv[1:])
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731

    copy = copy_bandwidth_gbps(dev)
    log(f"copy bandwidth {copy:.0f} GB/s")
    result: BenchResult | None = None
    e2e: dict | None = None

    def save():
        fill_speedups(result.rows)
        data = result.to_dict()
        data["e2e"] = e2e
        atomic_write_text(out / "kernels.json", json.dumps(data, indent=1))
        atomic_write_text(out / "kernels.md", _markdown(result, _goals(result), e2e, time.perf_counter() - t0,
                                                          command))

    def phase(name, impls, todo, measure_memory=False):
        nonlocal result
        if time.perf_counter() - t0 > args.budget_s:
            (result.notes if result else []).append(f"skipped {name}: over the {args.budget_s:.0f} s budget")
            log(f"skip {name}")
            return
        for kernel, shape in todo:
            if time.perf_counter() - t0 > args.budget_s:
                result.notes.append(f"{name}: skipped {kernel} {shape} (over budget)")
                continue
            r = run_bench(args.device, dtype=dtype, impls=impls, cases=[(kernel, shape)], copy_gbps=copy,
                          measure_memory=measure_memory)
            if result is None:
                result = r
            else:
                result.rows += r.rows
                result.notes = list(dict.fromkeys(result.notes + r.notes))
            for row in r.rows:
                log(f"{row.kernel} {row.shape} {row.impl} {row.passname}: {row.median_ms:.3f} ms "
                    f"{row.gbps:.0f} GB/s {row.tflops:.1f} TFLOP/s")
            save()

    phase("eager/trainperf/liger", ("trainperf", "eager", "liger"), cases, measure_memory=True)
    phase("flce", ("trainperf", "eager", "liger"), [FLCE[dev.type]], measure_memory=True)
    if dev.type == "cuda":  # inductor on the interpreter-only CPU box takes minutes per graph
        phase("torch.compile", ("compile",), cases)
    if time.perf_counter() - t0 < args.budget_s + 20:
        from trainperf.bench.e2e import compare_training

        steps = args.e2e_steps or (300 if dev.type == "cuda" else 4)
        r = compare_training(steps=steps, n_layers=2, batch=8, seq=64, device=args.device)
        e2e = {"steps": steps, "max_abs_diff_first_20": r.early_max_abs_diff(min(20, steps)),
               "late_mean_diff_kernels": r.late_mean_diff(min(50, steps)),
               "late_mean_diff_rounding_variant": r.late_mean_diff(min(50, steps), "eager-div"),
               "loss_first": float(r.eager[0]), "loss_last50_eager": float(r.eager[-min(50, steps):].mean()),
               "median_step_s": r.step_s, "applied": r.applied}
        log(f"e2e {e2e}")
    save()
    try:
        from trainperf.bench.report import write_html

        write_html(result, out / "kernels.html")
    except Exception as e:  # noqa: BLE001 - the report is a convenience; the JSON/markdown are the record
        log(f"html report failed: {e}")
    try:
        from trainperf.bench.run import to_record
        from trainperf.store import write_run

        log(f"run record: {write_run(to_record(result, job='gpu-kernels'), str(out / 'store'))}")
    except Exception as e:  # noqa: BLE001 - the store's dependencies may be absent on the GPU machine
        log(f"run record not written: {type(e).__name__}: {e}")
    print(open(out / "kernels.md").read())
    log("done")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
