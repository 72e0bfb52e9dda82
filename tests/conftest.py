"""Kernel and bench tests run the Triton interpreter when no CUDA device is present.

TRITON_INTERPRET must be set before triton is imported (Triton reads it when a kernel is
decorated); trainperf.kernels also sets it on import, this makes the tests independent of
import order.
"""

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # The interpreter evaluates masked-off lanes too (e.g. exp overflow in a tanh tail, 0/0 in
    # padding rows); numpy warns about values that are never stored.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture
def unusable_outputs(tmp_path):
    """Return a function ``leaf -> (folder, path under a regular file)``: the two output paths no
    verb can write (issue 14 defect 1), made in ``tmp_path``; the regular file holds "x"."""

    def make(leaf: str) -> tuple[Path, Path]:
        blocker = tmp_path / "a_file"
        blocker.write_text("x")
        return tmp_path, blocker / leaf

    return make
