"""Atomic file writes: a file appears under its final name only when complete."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
