"""A hand-built GPU-bound Kineto trace shared by the memory-pricing and precision tests (the what-if worked by hand
in each): STEPS steps of P us; each launches N ops (10 us apart, the launch 2 us into the 9-us op, its kernel queued
5 us after the launch), so the K_US-us kernels run back to back from +7 us and the last ends at +7 + N x K_US; then
cudaDeviceSynchronize from +100 us returns 5 us after it; then Python until the next step. Also the helpers that build
other GPU-bound steps (queued_steps, recorded_shapes)."""

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

P, STEPS, N, K_US = 2000.0, 5, 10, 80.0


def gpu_bound_trace(folder: Path, *, op: str, kernel: str, device: dict, op_args: dict | None = None,
                    every_other_kernel: str | None = None) -> Path:
    """Write the trace as folder/t.json.gz (deviceProperties [device]) and return its path; op_args (recorded
    shapes and types) go on every op beside its External id; every_other_kernel: the odd ops' kernel instead."""
    b = TraceBuilder()
    ext = 0
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        for k in range(N):
            at = T + 10.0 * k
            ext += 1
            b.cpu(op, at, 9.0, **{"External id": ext, **(op_args or {})})
            name = every_other_kernel if every_other_kernel and k % 2 else kernel
            b.launch(name, at + 2.0, T + 7.0 + K_US * k, K_US, launch_dur=5.0)
        end = T + 7.0 + K_US * N
        b.cpu("cudaDeviceSynchronize", T + 100.0, end + 5.0 - (T + 100.0), cat="cuda_runtime")
        b.cpu("python_work", end + 6.0, T + P - end - 7.0)
    doc = b.doc()
    doc["deviceProperties"] = [device]
    p = folder / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return p


def gemm_steps(b: TraceBuilder, steps: int, step_us: float, *, launch_at: float, start_at: float,
               gemm_us: float) -> None:
    """Add `steps` ProfilerSteps of step_us to b, each launching one GEMM at T+launch_at that runs
    [T+start_at, T+start_at+gemm_us) (µs from the step's start T)."""
    for s in range(steps):
        T = step_us * s
        b.step(s, T, step_us)
        b.launch("ampere_sgemm_128x64_tn", T + launch_at, T + start_at, gemm_us)


def queued_ops(b: TraceBuilder, T: float, ops: list[tuple], at: float) -> float:
    """Add each (op, its args, kernel, µs) of `ops` as an 8-us op at T + 10 i launching its kernel 2 us in, the kernels
    running back to back on the device from `at`; return the device's end (µs)."""
    for i, (name, args, kernel, us) in enumerate(ops):
        b.cpu(name, T + 10.0 * i, 8.0, **args)
        b.launch(kernel, T + 10.0 * i + 2.0, at, us)
        at += us
    return at


def end_gpu_bound_step(b: TraceBuilder, T: float, step_us: float, device_end: float, sync_at: float = 200.0) -> None:
    """Close a GPU-bound step that starts at T: a cudaDeviceSynchronize from T+sync_at returns 5 us after the device's
    last kernel ends (device_end, µs), then Python runs to 1 us before the next step (T+step_us)."""
    b.cpu("cudaDeviceSynchronize", T + sync_at, device_end + 5.0 - (T + sync_at), cat="cuda_runtime")
    b.cpu("python_work", device_end + 6.0, T + step_us - device_end - 7.0)


def write_trace(b: TraceBuilder, folder: Path, device: str | None = "NVIDIA H100 80GB HBM3") -> Path:
    """Write b's trace as folder/t.json.gz (deviceProperties naming `device`, none when None) and return its path."""
    doc = b.doc()
    if device:
        doc["deviceProperties"] = [{"id": 0, "name": device}]
    p = folder / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return p


def backward_node(b: TraceBuilder, node: str, t0: float, seq: int, kernels: list[tuple], at: float, *,
                  dur: float = 15.0, spacing: float = 5.0) -> float:
    """Add an autograd node `node` on thread 2 at t0 (µs; its Sequence number seq) launching each kernel of
    `kernels` ((name, µs) or (name, µs, formula op: a backward op with Fwd thread id 1 around the launch)) `spacing`
    µs apart from t0+2, the kernels running back to back on the device from `at`; return the device's end (µs)."""
    b.cpu(f"autograd::engine::evaluate_function: {node}", t0, dur, tid=2, **{"Sequence number": seq})
    for k, (kernel, us, *op) in enumerate(kernels):
        if op:
            b.cpu(op[0], t0 + 1.0 + spacing * k, spacing - 1.0, tid=2, **{"Fwd thread id": 1})
        b.launch(kernel, t0 + 2.0 + spacing * k, at, us, tid=2, launch_dur=3.0)
        at += us
    return at


def queued_steps(folder: Path, ops: list[tuple], *, steps: int, step_us: float, sync_at: float = 60.0,
                 device: str | None = "NVIDIA H100 80GB HBM3") -> Path:
    """`steps` GPU-bound steps of step_us, each launching `ops` ((op, args, kernel, µs): queued_ops, 10 us apart from
    the step's start, the kernels back to back from +10 us) and closed by end_gpu_bound_step (the synchronize from
    +sync_at); written by write_trace naming `device`. Returns the trace's path."""
    b = TraceBuilder()
    for s in range(steps):
        T = s * step_us
        b.step(s, T, step_us)
        end_gpu_bound_step(b, T, step_us, queued_ops(b, T, ops, T + 10.0), sync_at=sync_at)
    return write_trace(b, folder, device=device)


def recorded_shapes(dims: list, dtype: str, recorded: bool = True, strides: list | None = None) -> dict:
    """An operator's recorded-shape args (record_shapes=True): its inputs' dims, each typed `dtype` but the empty
    ones (scalars, None), and their "Input Strides" when given; {} when not recorded."""
    if not recorded:
        return {}
    args = {"Input Dims": dims, "Input type": [dtype if d else "" for d in dims]}
    return args | ({"Input Strides": strides} if strides is not None else {})
