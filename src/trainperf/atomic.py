"""Atomic file writes: a temp file in the same folder, fsync, then rename (never half-written)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from trainperf.errors import TrainperfError


def _read_umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files:
    # read it once, at import, while a process is still single-threaded.
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_UMASK = _read_umask()


def _target_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_UMASK


def ensure_dir(path: str | Path) -> Path:
    """Create the folder ``path`` (and its parents) if needed; return it.

    An unusable path (a file on the way, a read-only parent) is a user error: one
    TrainperfError naming it, raised before any work starts.
    """
    path = Path(path)
    blocking_file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking_file is not None:
        raise TrainperfError(f"{path}: cannot write here ({blocking_file} is a file, not a folder)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainperfError(f"{path}: cannot create this folder ({e.strerror or e})") from None
    return path


def check_output_file(path: str | Path, option: str) -> Path:
    """Return ``path`` once a file can be written there (its folder is created); else raise one
    TrainperfError naming ``option`` (e.g. "--out"), before any work starts."""
    p = Path(path)
    if p.is_dir():
        raise TrainperfError(f"{option} {p}: is a folder; it needs a file name")
    try:
        ensure_dir(p.parent)
    except TrainperfError as e:
        raise TrainperfError(f"{option} {p}: {e}") from None
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise TrainperfError(f"{option} {p}: cannot write here (permission denied)")
    return p


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is renamed onto ``path``, else removed."""
    path = Path(path)
    if path.is_dir():
        raise TrainperfError(f"{path}: is a directory, expected a file path to write")
    ensure_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        # Checked before any content is written: the user's path is unusable (a parent is a
        # file, the folder is read-only, ...), which is an input error, not a bug.
        raise TrainperfError(f"{path}: cannot write here ({e.strerror or e})") from None
    os.close(fd)
    # mkstemp creates 0600; give the file the mode a plain open() would (or the old file's), so
    # a team's shared store or report folder stays readable by the team.
    os.chmod(tmp, _target_mode(path))
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
