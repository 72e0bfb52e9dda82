"""Where the kernels run, and launch shapes that suit that place.

On a machine without a CUDA device, Triton kernels can only run in the Triton interpreter
(`TRITON_INTERPRET=1`), which Triton reads when a kernel is decorated: this module sets it
before any kernel module is imported, so the CPU path works out of the box (tests, the
`--device cpu` smoke run of `trainperf bench`). The interpreter pays per program launched,
so on CPU each program takes many rows; on a GPU, tiles are sized for registers.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (must come after TRITON_INTERPRET is settled)

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# fp32 values one program may hold in registers: 16 warps x 32 threads x 128 registers. A kernel
# holding `live` row-sized arrays (x and weight: 2; x, dy, weight, dweight partial: 4) keeps a
# row in registers (one pass) up to REGISTER_BUDGET_ELEMS // live columns; wider rows loop.
REGISTER_BUDGET_ELEMS = 65536
# The interpreter caps a block at 2**20 elements; GPU tiles stay far below.
INTERPRETER_BLOCK_ELEMS = 1 << 16


def next_pow2(n: int) -> int:
    """Return the smallest power of two >= n (and >= 1)."""
    return triton.next_power_of_2(max(1, int(n)))


def row_tile(n_rows: int, n_cols: int, live: int = 2) -> tuple[int, int, bool]:
    """Return (block_rows, block_cols, one_pass) for a row-wise kernel over an (n_rows, n_cols) matrix.

    one_pass: the whole row fits the block (held in registers, `live` row-sized arrays at once);
    otherwise the kernel loops over column chunks of block_cols. block_rows: rows per program (many in the interpreter,
    a few for narrow rows on a GPU so each program moves at least ~16 KB).
    """
    cap = max(16, REGISTER_BUDGET_ELEMS // live)
    block_cols = min(next_pow2(n_cols), 1 << (cap.bit_length() - 1))
    one_pass = block_cols >= n_cols
    if INTERPRETED:
        block_rows = max(1, min(next_pow2(n_rows), INTERPRETER_BLOCK_ELEMS // block_cols))
    else:
        block_rows = max(1, min(16, 4096 // block_cols, next_pow2(n_rows)))
    return block_rows, block_cols, one_pass


def num_warps_for(block_elems: int) -> int:
    """Return a warp count for a tile of block_elems elements (GPU only; ignored when interpreted)."""
    if block_elems >= 32768:
        return 16
    if block_elems >= 8192:
        return 8
    if block_elems >= 2048:
        return 4
    return 2


def n_persistent_programs(device: torch.device, n_tiles: int) -> int:
    """Return how many programs a persistent kernel (e.g. a weight-gradient reduction) launches."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_tiles, 2 * sms))
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
