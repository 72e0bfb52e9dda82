"""Fixtures shared by the planner tests."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def validate():
    """The published-run validation script (benchmarks/validate_planner.py), imported as a module."""
    spec = importlib.util.spec_from_file_location("validate_planner", ROOT / "benchmarks" / "validate_planner.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
