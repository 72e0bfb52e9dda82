"""A hand-built host-bound Kineto trace shared by the launch-pricing and dispatch tests (answers worked by hand
in each test): STEPS steps of P us; each runs ``python_us`` of Python, then N ops (aten::add) of 50 us of CPU
dispatch and a 10-us cudaLaunchKernel whose kernel runs K_US, each after ``other_op_us`` of another op
(model_code) when given; ``calls``: each op also makes cudaGetDevice and cudaMalloc (2 us each, launching
nothing: the op lasts 64 us); then Python until the next step."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

P, STEPS, N, K_US = 3000.0, 5, 10, 20.0


def host_bound_trace(path: Path, *, calls: bool = False, other_op_us: float = 0.0, python_us: float = 2000.0) -> Path:
    """Write the trace to ``path`` (a file path) and return it."""
    op = 64.0 if calls else 60.0  # the two 2-us calls lengthen each op; later events move with them
    stride = other_op_us + op
    b = TraceBuilder()
    for s in range(STEPS):
        T = s * P
        b.step(s, T, P)
        b.cpu("python_work", T, python_us)
        for k in range(N):
            at = T + python_us + stride * k
            if other_op_us:
                b.cpu("model_code", at, other_op_us)  # an op of its own, not the launching one
            at += other_op_us
            b.cpu("aten::add", at, op)
            if calls:
                b.cpu("cudaGetDevice", at + 20.0, 2.0, cat="cuda_runtime")
                b.cpu("cudaMalloc", at + 37.0, 2.0, cat="cuda_runtime")
            b.launch("elementwise_add_kernel", at + op - 10.0, at + op - 5.0, K_US, launch_dur=10.0)
        b.cpu("python_work", T + python_us + stride * N, P - python_us - stride * N - 1.0)
    return b.write(path)
