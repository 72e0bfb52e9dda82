"""Set-up noise (issue 14): installing trainperf printed setuptools' licence deprecation warning three
times. The reference is setuptools itself: it reads our pyproject.toml as a build does."""

import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_reads_without_warnings_and_names_its_licence_files():
    pytest.importorskip("setuptools", minversion="77")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    old = os.getcwd()
    os.chdir(ROOT)  # license-files and the readme are relative to the project root
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    finally:
        os.chdir(old)
    assert [str(w.message).splitlines()[0] for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"
    files = dist.metadata.license_files
    assert "LICENSE" in files and all((ROOT / f).is_file() for f in files), files
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
