"""Atomic writes: the target is either the old content or the new, never half-written."""

import os

import pytest

from trainperf.atomic import atomic_path, atomic_write_text


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert os.listdir(target.parent) == ["out.txt"]


def test_failed_write_keeps_old_content(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("precious")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "precious"
    assert os.listdir(tmp_path) == ["out.txt"]
