"""File output: atomic writes (a file appears under its final name only when complete) and
checks that an output path can be written before work starts."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from lmckit.errors import OutputPathError

F = TypeVar("F", bound=Callable[..., Any])


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


_HELD: dict[Path, int] = {}  # locks this process holds: folder -> nesting depth


@contextlib.contextmanager
def locked_output(folder: str | os.PathLike, what: str = "output folder") -> Iterator[Path]:
    """Create ``folder`` (see :func:`prepare_output_dir`) and hold an exclusive lock on it
    for the ``with`` block, so two runs never write one folder at once. The lock is an
    ``flock`` on ``<folder>/.lmckit.lock``: the system releases it when the process ends,
    even on SIGKILL. Re-entrant within one process. A folder this call created is removed
    again if the block fails before writing anything into it.

    Raises:
        OutputPathError: another process holds the folder (the message names its pid).
    """
    created = not Path(folder).exists()
    path = prepare_output_dir(folder, what).resolve()
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield path
        finally:
            _HELD[path] -= 1
        return
    fd = os.open(path / ".lmckit.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise OutputPathError(
            f"{what} {folder} is being written by another lmckit run (pid {holder}); wait for "
            "it to finish or choose another folder"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[path] = 1
    failed = True
    try:
        yield path
        failed = False
    finally:
        del _HELD[path]
        if failed and created and [p.name for p in path.iterdir()] == [".lmckit.lock"]:
            # a run that failed before writing anything leaves no empty folder behind
            (path / ".lmckit.lock").unlink()
            path.rmdir()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_not_inputs(
    outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike], what: str = "--out"
) -> None:
    """Raise :class:`OutputPathError` if a file a command will write is one of its inputs."""
    taken = {Path(p).resolve(): Path(p) for p in inputs}
    for out in outputs:
        if Path(out).resolve() in taken:
            raise OutputPathError(
                f"{what} would write {out}, which is one of the inputs "
                f"({taken[Path(out).resolve()]}); choose another output"
            )


def writes_folder(argument: str = "out") -> Callable[[F], F]:
    """Decorate a function that writes into the folder passed as ``argument``: the folder
    is locked (:func:`locked_output`) for the whole call."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            folder = signature.bind(*args, **kwargs).arguments[argument]
            with locked_output(folder, "--out"):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
