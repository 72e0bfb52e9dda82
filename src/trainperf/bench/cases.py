"""Benchmark cases: for each kernel and shape, the inputs, the implementations to compare and the work.

Implementations: 'trainperf' (our Triton kernels), 'eager' (trainperf.kernels.reference),
'compile' (torch.compile of the eager reference) and 'liger' (Liger Kernel's functional API,
only when it imports). Shapes: rows x cols for row kernels (rms_norm, layer_norm, swiglu,
geglu, softmax), rows x vocab for cross_entropy, rows x hidden x vocab for
fused_linear_cross_entropy, batch x seq x heads x head_dim for rope (k has heads/4 heads, as
in grouped-query attention).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from trainperf.bench import roofline
from trainperf.errors import TrainperfError

KERNELS = ("rms_norm", "layer_norm", "swiglu", "geglu", "rope", "softmax", "cross_entropy",
           "fused_linear_cross_entropy")
IMPLS = ("trainperf", "eager", "compile", "liger")
SHAPE_RANK = {"rms_norm": 2, "layer_norm": 2, "swiglu": 2, "geglu": 2, "softmax": 2, "cross_entropy": 2,
              "fused_linear_cross_entropy": 3, "rope": 4}

DEFAULT_SHAPES = {
    "cpu": {2: [(32, 512), (8, 1000)], 3: [(64, 64, 1000)], 4: [(2, 16, 4, 32)]},
    "cuda": {2: [(4096, 4096), (4096, 8192), (4096, 16384), (4096, 32768), (4096, 65536), (1024, 131072)],
             3: [(8192, 4096, 128256)], 4: [(4, 4096, 32, 128)]},
}
CE_SHAPES = {"cpu": [(32, 1000)], "cuda": [(4096, 32000), (4096, 128256), (4096, 256000)]}


@dataclass
class Case:
    """One kernel at one shape: differentiable inputs, implementations, and work per pass."""

    kernel: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    inputs: list[torch.Tensor]
    impls: dict[str, Callable[..., object]]
    work: dict[str, roofline.Work]
    notes: list[str] = field(default_factory=list)

    @property
    def shape_str(self) -> str:
        """Return the shape as '4096x8192'."""
        return "x".join(map(str, self.shape))


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """Return shapes from '4096x8192,8x4096x32x128' (comma-separated, dims joined by 'x')."""
    shapes = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            dims = tuple(int(d) for d in part.split("x"))
        except ValueError:
            raise TrainperfError(f"--shapes: {part!r} is not like 4096x8192 (integers joined by 'x')") from None
        if not dims or any(d <= 0 for d in dims):
            raise TrainperfError(f"--shapes: {part!r} has a non-positive dimension")
        shapes.append(dims)
    return shapes


def liger_functional():
    """Return Liger Kernel's functional module, or None when liger_kernel does not import."""
    try:
        return importlib.import_module("liger_kernel.transformers.functional")
    except Exception:  # noqa: BLE001 - any import failure means 'no Liger column'
        return None


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _liger_impl(kernel: str, extra: dict) -> Callable | None:
    lf = liger_functional()
    if lf is None:
        return None
    fn = getattr(lf, "liger_" + kernel, None)
    if fn is None:
        return None
    if kernel == "rms_norm":
        return lambda x, w: fn(x, w, extra["eps"])
    if kernel == "layer_norm":
        return lambda x, w, b: fn(x, w, b, extra["eps"])
    if kernel in ("swiglu", "geglu", "softmax"):
        return fn
    if kernel == "rope":  # Liger takes (batch, heads, seq, dim) and cos (1, seq, dim)
        cos, sin = extra["cos"][None], extra["sin"][None]
        return lambda q, k: tuple(t.transpose(1, 2) for t in fn(q.transpose(1, 2), k.transpose(1, 2), cos, sin))
    if kernel == "cross_entropy":
        # Liger overwrites its input logits with the gradient. No defensive copy here (it would
        # add two passes to Liger's time): the harness runs Liger last on each case's inputs and
        # takes its forward error from the first call, before the logits change.
        return lambda logits: _first(fn(logits, extra["target"], ignore_index=-100))
    if kernel == "fused_linear_cross_entropy":
        return lambda h, w: _first(fn(h, w, extra["target"], ignore_index=-100))
    return None


def build_case(kernel: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
               impls: tuple[str, ...], seed: int = 0) -> Case:
    """Return the Case for kernel at shape (inputs on device, requires_grad set) with the requested impls."""
    import trainperf.kernels as K
    from trainperf.kernels import reference as R
    from trainperf.train.model import rope_tables

    if kernel not in SHAPE_RANK:
        raise TrainperfError(f"unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
    if len(shape) != SHAPE_RANK[kernel]:
        raise TrainperfError(f"{kernel} takes {SHAPE_RANK[kernel]}-D shapes, got {'x'.join(map(str, shape))}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    elem = torch.tensor([], dtype=dtype).element_size()

    def rand(*dims, scale=1.0, grad=True):
        t = (torch.randn(dims, generator=g) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    extra: dict = {"eps": 1e-6}
    if kernel in ("rms_norm", "layer_norm", "softmax", "swiglu", "geglu"):
        rows, cols = shape
        work = {p: roofline.row_kernel_work(kernel, rows, cols, elem, p) for p in ("fwd", "fwd+bwd")}
        if kernel == "rms_norm":
            inputs, ours, ref = [rand(rows, cols), rand(cols)], (lambda x, w: K.rms_norm(x, w, 1e-6)), \
                (lambda x, w: R.rms_norm(x, w, 1e-6))
        elif kernel == "layer_norm":
            extra["eps"] = 1e-5
            inputs = [rand(rows, cols), rand(cols), rand(cols)]
            ours, ref = (lambda x, w, b: K.layer_norm(x, w, b, 1e-5)), (lambda x, w, b: R.layer_norm(x, w, b, 1e-5))
        elif kernel == "softmax":
            inputs, ours, ref = [rand(rows, cols, scale=4.0)], K.softmax, R.softmax
        else:
            inputs = [rand(rows, cols), rand(rows, cols)]
            ours, ref = getattr(K, kernel), getattr(R, kernel)
    elif kernel == "rope":
        batch, seq, heads, dim = shape
        kv = max(1, heads // 4)
        cos, sin = rope_tables(seq, dim, theta=10000.0)  # built on the CPU: the same tables on every device
        extra["cos"], extra["sin"] = cos.to(device), sin.to(device)
        inputs = [rand(batch, seq, heads, dim), rand(batch, seq, kv, dim)]
        work = {p: roofline.rope_work(batch, seq, heads, kv, dim, elem, p) for p in ("fwd", "fwd+bwd")}
        ours = lambda q, k: K.rope(q, k, extra["cos"], extra["sin"])  # noqa: E731
        ref = lambda q, k: R.rope(q, k, extra["cos"], extra["sin"])  # noqa: E731
    elif kernel == "cross_entropy":
        rows, vocab = shape
        extra["target"] = torch.randint(0, vocab, (rows,), generator=g).to(device)
        inputs = [rand(rows, vocab, scale=2.0)]
        work = {p: roofline.cross_entropy_work(rows, vocab, elem, p) for p in ("fwd", "fwd+bwd")}
        ours = lambda x: K.cross_entropy(x, extra["target"])  # noqa: E731
        ref = lambda x: R.cross_entropy(x, extra["target"])  # noqa: E731
    else:
        rows, hidden, vocab = shape
        extra["target"] = torch.randint(0, vocab, (rows,), generator=g).to(device)
        inputs = [rand(rows, hidden), rand(vocab, hidden, scale=hidden ** -0.5)]
        work = {p: roofline.linear_cross_entropy_work(rows, hidden, vocab, elem, p) for p in ("fwd", "fwd+bwd")}
        ours = lambda h, w: K.fused_linear_cross_entropy(h, w, extra["target"])  # noqa: E731
        ref = lambda h, w: R.linear_cross_entropy(h, w, extra["target"])  # noqa: E731

    table: dict[str, Callable] = {}
    notes: list[str] = []
    for impl in impls:
        if impl == "trainperf":
            table[impl] = ours
        elif impl == "eager":
            table[impl] = ref
        elif impl == "compile":
            table[impl] = torch.compile(ref, dynamic=False)
        elif impl == "liger":
            fn = _liger_impl(kernel, extra)
            if fn is None:
                notes.append("liger: not installed or no such kernel")
            else:
                table[impl] = fn
        else:
            raise TrainperfError(f"unknown implementation {impl!r} (known: {', '.join(IMPLS)})")
    return Case(kernel, shape, dtype, inputs, table, work, notes)


def shapes_for(kernel: str, device_type: str, shapes: list[tuple[int, ...]] | None) -> list[tuple[int, ...]]:
    """Return the shapes to run kernel at: the user's shapes of the kernel's rank, else the defaults."""
    rank = SHAPE_RANK[kernel]
    if shapes:
        return [s for s in shapes if len(s) == rank]
    if kernel == "cross_entropy":
        return CE_SHAPES[device_type]
    return DEFAULT_SHAPES[device_type][rank]
