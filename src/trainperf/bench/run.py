"""The A/B kernel benchmark: every kernel x shape x implementation x pass, timed, counted, recorded.

run_bench() returns plain results; to_record() turns them into the one run-record schema
(kind='bench') for trainperf.store.write_run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from trainperf.bench import roofline
from trainperf.bench.cases import KERNELS, Case, build_case, shapes_for
from trainperf.bench.timing import copy_bandwidth_gbps, median_ms, peak_memory_bytes
from trainperf.errors import TrainperfError
from trainperf.hardware import accelerator_for_torch_device
from trainperf.store.record import KernelResult, RunRecord, collect_environment, new_run_id

CPU_WARNING = ("CPU run: Triton kernels execute in the Triton interpreter (TRITON_INTERPRET=1), so these "
               "timings prove the harness works and mean nothing about kernel speed.")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Row:
    """One measurement: kernel, impl, shape, dtype, pass; time (ms), rates, roofline shares, memory."""

    kernel: str
    impl: str
    shape: str
    dtype: str
    passname: str
    median_ms: float
    gbps: float
    tflops: float
    pct_copy_bw: float | None  # % of the measured device-to-device copy bandwidth
    pct_catalog_peak: float | None  # % of the catalog HBM peak (memory-bound) or FLOP peak (FLCE)
    peak_mem_bytes: float | None
    max_rel_err: float | None  # forward output vs eager: max |out - eager| / max |eager|
    speedup_vs_eager: float | None = None


@dataclass
class BenchResult:
    """All rows of a run plus the device's ceilings and notes."""

    device: str
    device_name: str
    dtype: str
    copy_gbps: float
    catalog_hbm_gbps: float | None
    catalog_peak_tflops: float | None
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return asdict(self)


def _diff_inputs(case: Case) -> list[torch.Tensor]:
    return [t for t in case.inputs if t.requires_grad]


def _fwd_fn(fn: Callable, case: Case) -> Callable[[], object]:
    def run():
        with torch.no_grad():
            return fn(*case.inputs)
    return run


def _fwd_bwd_fn(fn: Callable, case: Case, grads: list[torch.Tensor]) -> Callable[[], object]:
    inputs = _diff_inputs(case)

    def run():
        out = fn(*case.inputs)
        outs = list(out) if isinstance(out, tuple) else [out]
        return torch.autograd.grad(outs, inputs, grad_outputs=grads[:len(outs)], allow_unused=True)
    return run


def _max_err(out, ref) -> float:
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    errs = []
    for a, b in zip(outs, refs):
        a, b = a.detach().float(), b.detach().float()
        errs.append(float((a - b).abs().max() / b.abs().max().clamp(min=1e-30)) if a.numel() else 0.0)
    return max(errs)


def run_bench(device: str = "cuda", kernels: list[str] | None = None, shapes: list[tuple[int, ...]] | None = None,
              dtype: str = "bf16", impls: tuple[str, ...] = ("trainperf", "eager", "compile", "liger"),
              passes: tuple[str, ...] = ("fwd", "fwd+bwd"), measure_memory: bool = True,
              progress: Callable[[str], None] | None = None,
              cases: list[tuple[str, tuple[int, ...]]] | None = None, copy_gbps: float | None = None) -> BenchResult:
    """Return the benchmark of kernels x shapes x impls x passes on device (times in ms, rates in GB/s, TFLOP/s).

    cases: explicit (kernel, shape) pairs instead of kernels x shapes; copy_gbps: a copy
    bandwidth measured earlier (else measured now).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainperfError("--device cuda: no CUDA device is visible (use --device cpu for the smoke run)")
    if dtype not in DTYPES:
        raise TrainperfError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kernels = list(kernels or KERNELS)
    for k in kernels:
        if k not in KERNELS:
            raise TrainperfError(f"unknown kernel {k!r} (known: {', '.join(KERNELS)})")
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    acc = accelerator_for_torch_device(dev) if dev.type == "cuda" else None
    result = BenchResult(device=dev.type, device_name=device_name, dtype=dtype,
                         copy_gbps=copy_gbps or copy_bandwidth_gbps(dev),
                         catalog_hbm_gbps=acc.hbm_tbps * 1e3 if acc else None,
                         catalog_peak_tflops=acc.peak_flops(dtype) / 1e12 if acc else None)
    if dev.type == "cpu":
        result.notes.append(CPU_WARNING)
    todo = cases or [(k, s) for k in kernels for s in shapes_for(k, dev.type, shapes)]
    for kernel, shape in todo:
        case = build_case(kernel, tuple(shape), DTYPES[dtype], dev, impls)
        result.notes += [f"{kernel}: {n}" for n in case.notes]
        _bench_case(case, result, passes, measure_memory, progress)
        del case
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    result.notes = list(dict.fromkeys(result.notes))
    fill_speedups(result.rows)
    return result


def fill_speedups(rows: list[Row]) -> None:
    """Set each row's speedup_vs_eager = eager time / its time for the same kernel, shape, dtype and pass."""
    eager = {(r.kernel, r.shape, r.dtype, r.passname): r.median_ms for r in rows if r.impl == "eager"}
    for r in rows:
        ref = eager.get((r.kernel, r.shape, r.dtype, r.passname))
        r.speedup_vs_eager = ref / r.median_ms if ref and r.median_ms > 0 else None


def _failed(e: Exception) -> str:
    """Return the note text for a failed implementation: exception type and its first line (160 chars)."""
    return f"failed ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"


def _bench_case(case: Case, result: BenchResult, passes, measure_memory: bool, progress) -> None:
    dev = case.inputs[0].device
    flop_bound = case.kernel == "fused_linear_cross_entropy"
    with torch.no_grad():
        ref_out = case.impls["eager"](*case.inputs) if "eager" in case.impls else None
    grads = [torch.randn_like(t) for t in (ref_out if isinstance(ref_out, tuple) else (ref_out,))] \
        if ref_out is not None else None
    # Liger last: its cross-entropy overwrites the shared input logits (see cases._liger_impl).
    for impl, fn in sorted(case.impls.items(), key=lambda kv: kv[0] == "liger"):
        try:
            with torch.no_grad():
                out = fn(*case.inputs)
            err = _max_err(out, ref_out) if ref_out is not None else None
            del out
        except Exception as e:  # noqa: BLE001 - a failing comparison impl becomes a note, not a crash
            result.notes.append(f"{case.kernel} {case.shape_str} {impl}: {_failed(e)}")
            continue
        if grads is None:
            with torch.no_grad():
                o = fn(*case.inputs)
            grads = [torch.randn_like(t) for t in (o if isinstance(o, tuple) else (o,))]
        for passname in passes:
            if progress:
                progress(f"{case.kernel} {case.shape_str} {impl} {passname}")
            run = _fwd_fn(fn, case) if passname == "fwd" else _fwd_bwd_fn(fn, case, grads)
            try:
                ms = median_ms(run, dev)
                mem = peak_memory_bytes(run, dev) if measure_memory else None
            except Exception as e:  # noqa: BLE001
                result.notes.append(f"{case.kernel} {case.shape_str} {impl} {passname}: {_failed(e)}")
                continue
            work = case.work[passname]
            gb, tf = roofline.gbps(work, ms), roofline.tflops(work, ms)
            if flop_bound:
                pct_peak = 100 * tf / result.catalog_peak_tflops if result.catalog_peak_tflops else None
            else:
                pct_peak = 100 * gb / result.catalog_hbm_gbps if result.catalog_hbm_gbps else None
            row = Row(case.kernel, impl, case.shape_str, result.dtype, passname, ms, gb, tf,
                      100 * gb / result.copy_gbps if result.copy_gbps and not flop_bound else None,
                      pct_peak, mem, err)
            result.rows.append(row)


def to_record(result: BenchResult, job: str = "bench-kernels") -> RunRecord:
    """Return the run record (kind='bench') holding every row as a KernelResult; ceilings go in config."""
    env = collect_environment()
    record = RunRecord(run_id=new_run_id(), job=job, kind="bench", **env)
    record.gpu_model = result.device_name if result.device == "cuda" else env.get("gpu_model", "cpu")
    record.config = {"device": result.device, "dtype": result.dtype, "copy_gbps": result.copy_gbps,
                     "catalog_hbm_gbps": result.catalog_hbm_gbps, "catalog_peak_tflops": result.catalog_peak_tflops,
                     "pct_roofline": "percent of the measured copy bandwidth (memory-bound kernels); "
                                     "percent of catalog peak FLOP/s for fused_linear_cross_entropy",
                     "notes": result.notes}
    for r in result.rows:
        pct = r.pct_copy_bw if r.pct_copy_bw is not None else r.pct_catalog_peak
        record.kernels.append(KernelResult(kernel=r.kernel, impl=r.impl, shape=r.shape, dtype=r.dtype,
                                           passname=r.passname, median_ms=r.median_ms, gbps=r.gbps, tflops=r.tflops,
                                           pct_roofline=pct, peak_mem_bytes=r.peak_mem_bytes))
    return record
