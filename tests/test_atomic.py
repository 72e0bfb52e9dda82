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


def test_new_files_get_umask_mode_and_replacements_keep_theirs(tmp_path):
    # reference: the mode a plain open() gives a new file under the current umask
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    target = tmp_path / "atomic.txt"
    atomic_write_text(target, "x")
    assert target.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    target.chmod(0o640)
    atomic_write_text(target, "y")
    assert target.stat().st_mode & 0o777 == 0o640


def test_unusable_target_is_a_user_error_and_writes_nothing(tmp_path):
    """A directory, or a path under a regular file, cannot be written: one TrainperfError naming it."""
    from trainperf.errors import TrainperfError

    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    for target, reason, named in ((tmp_path, "is a directory", tmp_path),
                                  (a_file / "out.html", "is a file, not a folder", a_file)):
        with pytest.raises(TrainperfError, match=reason) as err:
            atomic_write_text(target, "x")
        assert str(named) in str(err.value) and "\n" not in str(err.value)
    assert a_file.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
