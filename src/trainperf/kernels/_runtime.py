"""Where the kernels run, and launch shapes that suit that place.

On a machine without a CUDA device, Triton kernels can only run in the Triton interpreter
(`TRITON_INTERPRET=1`), which Triton reads when a kernel is decorated: this module sets it
before any kernel module is imported, so the CPU path works out of the box (tests, the
`--device cpu` smoke run of `trainperf bench`). The interpreter pays per program launched,
so on CPU each program takes many rows; on a GPU, tiles are sized for registers.
"""

from __future__ import annotations

import os
import sys

import torch

_LATE = "triton.language" in sys.modules  # someone imported Triton before us
if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
    if _LATE:
        # Triton's own @jit library functions (tl.sum, tl.max, ...) were decorated for a GPU when
        # triton.language was imported; re-wrap them for the interpreter, or every kernel launch
        # fails with "Cannot call @triton.jit'd outside of the scope of a kernel".
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        for _name, _mod in list(sys.modules.items()):
            if _name.startswith("triton.language") and _mod is not None:
                for _attr, _obj in list(vars(_mod).items()):
                    if isinstance(_obj, JITFunction) and not isinstance(_obj, InterpretedFunction):
                        setattr(_mod, _attr, InterpretedFunction(_obj.fn))

import triton  # noqa: E402  (must come after TRITON_INTERPRET is settled)

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# fp32 values one program may hold in registers: 16 warps x 32 threads x 128 registers. A kernel
# holding `live` row-sized arrays (counting temporaries: a norm forward ~3, its backward ~8)
# keeps a row in registers (one pass) up to REGISTER_BUDGET_ELEMS // live columns; wider rows
# loop. The live counts were set from ptxas register/spill reports of every kernel compiled
# for sm_90 (benchmarks/kernels_sm90_compile.py): no spills at the benchmark shapes.
REGISTER_BUDGET_ELEMS = 65536
LOOP_CHUNK_COLS = 8192
# The interpreter caps a block at 2**20 elements; GPU tiles stay far below.
INTERPRETER_BLOCK_ELEMS = 1 << 16


def next_pow2(n: int) -> int:
    """Return the smallest power of two >= n (and >= 1)."""
    return triton.next_power_of_2(max(1, int(n)))


def row_tile(n_rows: int, n_cols: int, live: int = 2) -> tuple[int, int, bool]:
    """Return (block_rows, block_cols, one_pass) for a row-wise kernel over an (n_rows, n_cols) matrix.

    one_pass: the whole row fits the block (held in registers, `live` row-sized fp32 arrays at
    once, REGISTER_BUDGET_ELEMS in all); otherwise the kernel loops over column chunks of
    block_cols (LOOP_CHUNK_COLS on a GPU: small enough that the chunk loop never spills).
    block_rows: rows per program (many in the interpreter; on a GPU enough narrow rows that a
    tile holds ~8K elements).
    """
    cap = max(16, REGISTER_BUDGET_ELEMS // live)
    cap = 1 << (cap.bit_length() - 1)
    one_pass = next_pow2(n_cols) <= cap
    if INTERPRETED:
        block_cols = min(next_pow2(n_cols), cap)
        block_rows = max(1, min(next_pow2(n_rows), INTERPRETER_BLOCK_ELEMS // block_cols))
    else:
        block_cols = next_pow2(n_cols) if one_pass else min(cap, LOOP_CHUNK_COLS)
        block_rows = max(1, min(16, 8192 // block_cols, next_pow2(n_rows)))
    return block_rows, block_cols, one_pass


def num_warps_for(block_elems: int, live: int = 2) -> int:
    """Return a warp count giving ~64 fp32 registers per thread for `live` tile-sized arrays (2..16 warps)."""
    want = next_pow2(max(1, block_elems * live // (32 * 64)))
    return max(2, min(16, want))


def n_persistent_programs(device: torch.device, n_tiles: int) -> int:
    """Return how many programs a persistent kernel (e.g. a weight-gradient reduction) launches."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_tiles, 4 * sms))
    return max(1, min(n_tiles, 4))


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """Return x viewed as a 2-D (rows, last dim) matrix with unit column stride, copying only when needed.

    Strided rows (e.g. a slice of a wider projection) are kept as a view: the kernels take
    the row stride. Only a non-unit stride on the last dim, or leading dims that cannot be
    merged, force a copy.
    """
    if x.dim() == 0:
        raise ValueError("expected at least one dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.view(1, -1)
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return x.reshape(-1, x.shape[-1]) if x.is_contiguous() else x.contiguous().view(-1, x.shape[-1])
