"""File output: atomic writes (a file appears under its final name only when complete) and
checks that an output path can be written before work starts."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmckit.errors import OutputPathError


def _default_mode() -> int:
    """0o666 minus the umask: what ``open()`` would give (mkstemp's files are 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success it is renamed to ``dest``, on any
    exception (including KeyboardInterrupt) it is removed and ``dest`` is left as it was."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _default_mode())
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``dest`` atomically (flushed and fsynced before the rename)."""
    with atomic_path(dest) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_json(dest: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``dest`` atomically."""
    atomic_write_bytes(dest, (json.dumps(obj, indent=2) + "\n").encode())


def _probe_writable(directory: Path, what: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".lmckit-write-test.")
    except OSError as exc:
        raise OutputPathError(
            f"{what} {directory}: cannot write there ({exc.strerror or exc})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def _first_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(".")


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Check, without creating anything, that ``path`` is or can become a writable folder:
    it and its existing parents are folders, and the nearest existing one is writable.

    Raises:
        OutputPathError: naming ``what`` and the path.
    """
    path = Path(path)
    existing = _first_existing(path)
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under a file ({existing})"
        raise OutputPathError(f"{what} {path} {where}; a folder is needed")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {path}: no permission to write in {existing}")
    return path


def prepare_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Create ``path`` as a folder (with its parents) and check that files can be written in
    it — before any expensive work, so a bad ``--out`` fails in a second, not after hours.

    Raises:
        OutputPathError: ``path`` or one of its parents is a file, or it cannot be created
            or written to; the message names ``what`` and the path.
    """
    path = check_output_dir(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{what} {path}: cannot create it ({exc.strerror or exc})") from None
    _probe_writable(path, what)
    return path


def prepare_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """Check that a file can be written at ``path`` (creating its folder): not an existing
    folder, not under a file, in a writable folder.

    Raises:
        OutputPathError: naming ``what`` and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{what} {path} is a folder; a file name is needed")
    parent = path.parent
    existing = _first_existing(parent)
    if not existing.is_dir():
        raise OutputPathError(f"{what} {path} is under a file ({existing})")
    prepare_output_dir(parent, what=f"folder of {what}")
    return path
