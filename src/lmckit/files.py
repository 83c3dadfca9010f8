"""File output: atomic writes (a file appears under its final name only when complete) and
checks that an output path can be written before work starts."""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import functools
import inspect
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from lmckit.errors import OutputPathError

F = TypeVar("F", bound=Callable[..., Any])


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

HEAD_BYTES = 4096
"""How much of an existing output file is read to tell whether lmckit wrote it."""


def special_kind(path: str | os.PathLike) -> str | None:
    """``"a FIFO (named pipe)"``, ``"a character device"``, ``"a block device"`` or ``"a
    socket"`` when ``path`` (its links followed) is one — something that is neither a
    regular file nor a folder, where reading may never end (``/dev/zero``) or block (a FIFO
    with no writer) and writing goes somewhere else than a file; ``None`` otherwise
    (regular file, folder, or nothing there)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in _SPECIAL if test(mode)), None)


def describe_path(path: str | os.PathLike) -> str:
    """What is at ``path``, for a message: ``"a file"``, ``"a folder"``, a special kind
    (:func:`special_kind`), ``"a broken symbolic link"`` or ``"nothing"``."""
    path = Path(path)
    special = special_kind(path)
    if special is not None:
        return special
    if path.is_dir():
        return "a folder"
    if path.is_file():
        return "a file"
    return "a broken symbolic link" if path.is_symlink() else "nothing"


def require_regular_file(
    path: str | os.PathLike, what: str, error: type[Exception] = OutputPathError
) -> Path:
    """``path`` if it is a regular file (links followed); else ``error`` naming ``what``, the
    path and what is there instead — before anything opens it, so a FIFO is never waited
    on and a device never read."""
    path = Path(path)
    if path.is_file():
        return path
    found = describe_path(path)
    if found == "nothing":
        raise error(f"{what} {path} not found")
    raise error(f"{what} {path} is {found}, not a regular file")


def refuse_special(
    path: str | os.PathLike, what: str, error: type[Exception] = OutputPathError
) -> None:
    """``error`` naming ``what`` if ``path`` is a FIFO, a device or a socket
    (:func:`special_kind`) — called before a file is opened to read, so that a FIFO is
    never waited on and a device never read; anything else is the caller's to open."""
    special = special_kind(path)
    if special is not None:
        raise error(f"{what} {path} is {special}, not a regular file")


def read_head(path: str | os.PathLike, limit: int = HEAD_BYTES) -> bytes:
    """At most the first ``limit`` bytes of the regular file ``path`` (``b""`` for anything
    that is not a regular file): what an output's check reads of what is there, never the
    whole of a large file."""
    path = Path(path)
    if not path.is_file():
        return b""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return b""


_LEADING_FORMAT = re.compile(rb'^\s*\{\s*"format"\s*:\s*"([^"\\]*)"')


def leading_format(path: str | os.PathLike) -> str | None:
    """The ``"format"`` an lmckit JSON file names first (every one of lmckit's starts with
    it), read from the file's first bytes only; ``None`` when the file does not start so."""
    found = _LEADING_FORMAT.match(read_head(path))
    return found.group(1).decode(errors="replace") if found else None


def _default_mode() -> int:
    """0o666 minus the umask: what ``open()`` would give (mkstemp's files are 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def scratch_prefix(name: str) -> str:
    """The start of a scratch file's or folder's name for ``name``: ``.<name>.<host>.<pid>.``
    — so that :func:`clean_stale` can tell the scratch of a process that has died (killed
    mid-write) from that of one still writing."""
    return f".{name}.{_host()}.{os.getpid()}."


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "host"


_SCRATCH = re.compile(r"^\..+\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[^.]+\.(part|scratch)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_stale(folder: str | os.PathLike) -> list[Path]:
    """Remove the scratch files (``*.part``) and folders (``*.scratch``) under ``folder``
    that a process on this machine left when it was killed mid-write (its pid no longer
    runs); those of live processes and of other hosts are kept. Returns what was removed."""
    folder = Path(folder)
    removed = []
    host = _host()
    for path in folder.rglob(".*"):
        match = _SCRATCH.match(path.name)
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success it is renamed to ``dest``, on any
    exception (including KeyboardInterrupt) it is removed and ``dest`` is left as it was."""
    dest = Path(dest)
    special = special_kind(dest)
    if special is not None:
        raise OutputPathError(f"{dest} is {special}, not a regular file; refusing to replace it")
    claim(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=scratch_prefix(dest.name), suffix=".part")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _default_mode())
        os.replace(tmp, dest)
        _wrote(dest)
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


def run_of_store(path: str | os.PathLike) -> Path | None:
    """The folder of the experiment run (``<run>/ledger.sqlite`` beside ``<run>/store``)
    whose result store is ``path`` or holds it, or ``None``."""
    resolved = Path(path).resolve()  # a symbolic link into a store is inside it too
    for folder in [resolved, *resolved.parents]:
        if folder.name == "store" and (folder.parent / "ledger.sqlite").is_file():
            return folder.parent
    return None


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Check, without creating anything, that ``path`` is or can become a writable folder:
    it and its existing parents are folders, the nearest existing one is writable, and it
    is not inside an experiment run's result store (:func:`run_of_store`: that store holds
    only artifacts under their content keys, which a run verifies and reuses).

    Raises:
        OutputPathError: naming ``what`` and the path.
    """
    path = Path(path)
    run = run_of_store(path)
    if run is not None:
        raise OutputPathError(
            f"{what} {path} is inside the result store of the run in {run}; choose a folder "
            "outside it"
        )
    existing = _first_existing(path)
    if not existing.is_dir():
        found = describe_path(existing)
        where = f"is {found}" if existing == path else f"is under {found} ({existing})"
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


def prepare_output_file(
    path: str | os.PathLike, what: str = "output file", *, create: bool = True
) -> Path:
    """Check that a file can be written at ``path`` (creating its folder; with
    ``create=False`` only checking that it could be created, for a command that may still
    refuse its work and must then leave nothing behind): not an existing folder, not under
    a file, in a writable folder.

    Raises:
        OutputPathError: naming ``what`` and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{what} {path} is a folder; a file name is needed")
    special = special_kind(path)
    if special is not None:
        raise OutputPathError(
            f"{what} {path} is {special}, not a regular file; lmckit writes its outputs as "
            "regular files (choose a file name)"
        )
    parent = path.parent
    existing = _first_existing(parent)
    if not existing.is_dir():
        raise OutputPathError(f"{what} {path} is under {describe_path(existing)} ({existing})")
    if create:
        prepare_output_dir(parent, what=f"folder of {what}")
    else:
        check_output_dir(parent, what=f"folder of {what}")
    return path


MANIFEST = ".lmckit-files.json"
LOCK = ".lmckit.lock"  # the flock target; its presence marks a folder lmckit wrote
"""The list, in an output folder, of the entries lmckit wrote there (see :func:`claim`)."""


class _Manifest:
    """The top-level entries of an output folder that lmckit created: only those may be
    written again. Anything else already in the folder — a user's file that happens to bear
    an output's name, an experiment file, the inputs — is never overwritten."""

    def __init__(self, folder: Path, adopt: bool) -> None:
        self.folder = folder
        self.path = folder / MANIFEST
        self.entries: set[str] = set()
        # the outputs that describe only their writer's last call (writes_folder's
        # ``replaces``): relative path -> the functions whose last call wrote it
        self.owners: dict[str, list[str]] = {}
        self.written: set[str] = set()  # relative paths written while this process holds it
        self.inputs: list[Path] = []  # the inputs of the command writing it (never removed)
        self.writer: tuple[str, tuple[str, ...]] | None = None  # (function, its patterns)
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
                self.entries = {str(e) for e in data["entries"]}
                self.owners = {
                    str(k): [str(w) for w in v] for k, v in data.get("written_by", {}).items()
                }
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise OutputPathError(
                    f"{self.path} (lmckit's list of the files it wrote there) is unreadable: "
                    f"{exc}; delete it only if everything in {folder} is lmckit's output"
                ) from None
        elif adopt:  # a folder an older lmckit wrote (locked, no list yet): all of it is ours
            self.entries = {p.name for p in folder.iterdir() if not _internal(p.name)}
            self._save()

    def conflict(self, path: Path) -> str | None:
        """Why ``path`` may not be written (``None``: it may)."""
        top = path.relative_to(self.folder).parts[0]
        if _internal(top) or top in self.entries:
            return None
        existing = self.folder / top
        if existing.exists() or existing.is_symlink():
            return (
                f"refusing to write {path}: {existing} already exists and was not written by "
                f"lmckit in {self.folder}; move it away or choose another output folder"
            )
        return None

    def claim(self, path: Path) -> None:
        why = self.conflict(path)
        if why is not None:
            raise OutputPathError(why)
        top = path.relative_to(self.folder).parts[0]
        if _internal(top) or top in self.entries:
            return
        self.entries.add(top)
        self._save()  # before the write: an interrupted write leaves its entry claimed

    def wrote(self, path: Path) -> None:
        """Note that ``path`` (in this folder) was written, and by whom if it is one of the
        writing function's replaceable outputs."""
        rel = path.relative_to(self.folder).as_posix()
        self.written.add(rel)
        if self.writer is not None and _matches(rel, self.writer[1]):
            owners = self.owners.setdefault(rel, [])
            if self.writer[0] not in owners:
                owners.append(self.writer[0])
                self._save()

    def _save(self) -> None:
        state: dict[str, Any] = {"entries": sorted(self.entries)}
        if self.owners:
            state["written_by"] = {k: sorted(v) for k, v in sorted(self.owners.items())}
        data = (json.dumps(state, indent=1) + "\n").encode()
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=scratch_prefix(MANIFEST), suffix=".part")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _default_mode())  # readable like the files it lists, not mkstemp's 0o600
        os.replace(tmp, self.path)


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    """Whether the relative path ``rel`` matches one of the glob ``patterns`` part by part
    (``*`` never crosses a ``/``)."""
    parts = rel.split("/")
    for pattern in patterns:
        pieces = pattern.split("/")
        if len(pieces) == len(parts) and all(map(fnmatch.fnmatchcase, parts, pieces)):
            return True
    return False


def _internal(name: str) -> bool:
    """lmckit's own bookkeeping in a folder (lock, file list, scratch files)."""
    return name.startswith(".lmckit") or _SCRATCH.match(name) is not None


_GUARDS: dict[Path, _Manifest] = {}  # guarded output folders this process holds


def _absolute(path: str | os.PathLike) -> Path:
    """``path`` absolute with its folder's symbolic links resolved (as the held folders
    are), the last component as named."""
    path = Path(os.path.abspath(path))
    return path.parent.resolve() / path.name


def _guard_of(path: Path) -> _Manifest | None:
    """The guarded output folder (innermost) that ``path`` lies in, if any."""
    for folder in sorted(_GUARDS, key=lambda f: len(f.parts), reverse=True):
        if path != folder and path.is_relative_to(folder):
            return _GUARDS[folder]
    return None


def claim(path: str | os.PathLike) -> None:
    """Check that ``path`` may be written: if it lies in an output folder this process
    holds (:func:`locked_output`), it must be new there or written there by lmckit before.

    Raises:
        OutputPathError: ``path`` (or the top-level entry of the folder it is in) exists and
            lmckit did not create it.
    """
    held = _held(path)
    if held is not None:
        held[0].claim(held[1])


def _wrote(path: Path) -> None:
    """Note that ``path`` was written (for :func:`retire_unwritten`)."""
    held = _held(path)
    if held is not None:
        held[0].wrote(held[1])


def _held(path: str | os.PathLike) -> tuple[_Manifest, Path] | None:
    """The guarded folder ``path`` lies in, with ``path`` as that folder sees it; ``None``
    outside every held folder."""
    if not _GUARDS:
        return None
    path = _absolute(path)
    guard = _guard_of(path)
    return None if guard is None else (guard, path)


def held_inputs(path: str | os.PathLike) -> list[Path]:
    """The inputs (as given to :func:`check_outputs`) of the command holding the output
    folder that is or contains ``path``; none when no held folder does."""
    guard = _GUARDS.get(Path(path).resolve()) or _guard_of(_absolute(path))
    return list(guard.inputs) if guard is not None else []


def retire_unwritten(
    folder: str | os.PathLike,
    writer: str,
    patterns: Iterable[str],
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """End ``writer``'s call into the held ``folder`` (:func:`locked_output`): each file
    matching the glob ``patterns`` (relative to ``folder``) that an earlier call of
    ``writer`` wrote and this one has not is no longer ``writer``'s output, and is removed
    once no other function's last call wrote it — so that a folder a command writes again
    describes only its last run (no permutation file of a method or a pair no longer in
    it, no landscape of other models beside a new merge), and a folder two commands share
    keeps what each still shows. Files the user put there, lmckit's bookkeeping, files
    written before lmckit kept track of their writers and the command's inputs (as given to
    :func:`check_outputs`) are never removed; ``log`` gets one line naming what was.

    Returns:
        The removed paths.
    """
    guard = _GUARDS.get(Path(folder).resolve())
    if guard is None:
        raise RuntimeError(f"retire_unwritten: {folder} is not held by this process")
    folder = guard.folder
    removed: list[Path] = []
    changed = False
    for rel, owners in sorted(guard.owners.items()):
        if writer not in owners or rel in guard.written or not _matches(rel, patterns):
            continue
        owners.remove(writer)
        changed = True
        path = folder / rel
        if owners:
            continue
        del guard.owners[rel]
        ours = path.is_file() and not path.is_symlink()  # a link replaced it: not ours
        if ours and input_at(path, guard.inputs) is None:
            path.unlink()
            removed.append(path)
    if changed:
        guard._save()
    if removed and log is not None:
        names = ", ".join(str(p.relative_to(folder)) for p in removed)
        log(f"removed from {folder} what an earlier run wrote there and this one did not: {names}")
    return removed


_HELD: dict[Path, int] = {}  # locks this process holds: folder -> nesting depth


def folder_holder(folder: str | os.PathLike) -> str | None:
    """The pid (as written in the lock file) of the process that holds ``folder``
    through :func:`locked_output` now, or ``None`` when no process does."""
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked_output(
    folder: str | os.PathLike, what: str = "output folder", *, guard: bool = True
) -> Iterator[Path]:
    """Create ``folder`` (see :func:`prepare_output_dir`) and hold an exclusive lock on it
    for the ``with`` block, so two runs never write one folder at once. The lock is an
    ``flock`` on ``<folder>/.lmckit.lock``: the system releases it when the process ends,
    even on SIGKILL. Re-entrant within one process. A folder this call created is removed
    again if the block fails before writing anything into it. Scratch files of writers
    that were killed (:func:`clean_stale`) are removed once the lock is held.

    ``guard``: every write into the folder during the block goes through :func:`claim`,
    so nothing lmckit did not write there is ever overwritten (``<folder>/`` holds the list
    of what it wrote, :data:`MANIFEST`).

    Raises:
        OutputPathError: another process holds the folder (the message names its pid).
    """
    created = not Path(folder).exists()
    locked_before = (Path(folder) / LOCK).exists()
    before = set() if created or not Path(folder).is_dir() else set(os.listdir(folder))
    path = prepare_output_dir(folder, what).resolve()
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield path
        finally:
            _HELD[path] -= 1
        return
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
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
        clean_stale(path)
        if guard:
            _GUARDS[path] = _Manifest(path, adopt=locked_before)
        yield path
        failed = False
    finally:
        del _HELD[path]
        _GUARDS.pop(path, None)
        if failed and created and all(_internal(p.name) for p in path.iterdir()):
            # a run that failed before writing anything leaves no empty folder behind
            for p in path.iterdir():
                p.unlink()
            path.rmdir()
        elif failed and not locked_before and set(os.listdir(path)) <= before | {LOCK}:
            # a command refused in a folder lmckit never wrote leaves it as it was: a lock
            # left behind would make a later run adopt the user's files as lmckit's
            (path / LOCK).unlink(missing_ok=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def input_at(path: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> Path | None:
    """The one of ``inputs`` that ``path`` is — by path (symbolic links resolved) or as the
    same file (a hard link) — or ``None``."""
    path, inputs = Path(path), [Path(p) for p in inputs]
    same = next((p for p in inputs if p.resolve() == path.resolve()), None)
    if same is None and path.exists():
        same = next((p for p in inputs if p.exists() and os.path.samefile(p, path)), None)
    return same


def check_not_inputs(
    outputs: Iterable[str | os.PathLike], inputs: Iterable[str | os.PathLike], what: str = "--out"
) -> None:
    """Raise :class:`OutputPathError` if a file a command will write is one of its inputs —
    by path (symbolic links resolved) or as the same file (a hard link)."""
    inputs = [Path(p) for p in inputs]
    for out in map(Path, outputs):
        same = input_at(out, inputs)
        if same is not None:
            raise OutputPathError(
                f"{what} would write {out}, which is one of the inputs ({same}); choose "
                "another output"
            )


def check_outputs(
    outputs: Iterable[str | os.PathLike],
    inputs: Iterable[str | os.PathLike] = (),
    what: str = "--out",
) -> None:
    """Before any work: none of ``outputs`` is one of ``inputs``
    (:func:`check_not_inputs`), and each may be written in its guarded folder
    (:func:`claim`) — so a folder holding a file of the user's under an output's name is
    refused before the work, not after it."""
    outputs = [Path(p) for p in outputs]
    inputs = [Path(p) for p in inputs]
    check_not_inputs(outputs, inputs, what)
    for path in outputs:  # every output checked before any is claimed (listed as lmckit's)
        path = _absolute(path)
        guard = _guard_of(path)
        why = guard.conflict(path) if guard is not None else None
        if why is not None:
            raise OutputPathError(why)
    for path in outputs:
        claim(path)
        guard = _guard_of(_absolute(path))
        if guard is not None:
            guard.inputs.extend(p for p in inputs if p not in guard.inputs)


def check_output_file(
    path: str | os.PathLike,
    what: str,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    file_format: str,
) -> Path:
    """Check that the single file ``path`` may be written: not one of ``inputs``, and —
    if it exists — a JSON file lmckit wrote with ``"format": file_format`` (its earlier
    output), never some other file that happens to bear the name.

    Raises:
        OutputPathError: naming ``what``, the path and why.
    """
    path = Path(path)
    check_not_inputs([path], inputs, what)
    special = special_kind(path)
    if special is not None:
        raise OutputPathError(
            f"{what} {path} is {special}, not a regular file; lmckit writes its outputs as "
            "regular files (choose a file name)"
        )
    # its first bytes only: a large file of the user's is never read whole
    if (path.is_symlink() or path.exists()) and leading_format(path) != file_format:
        raise OutputPathError(
            f"{what} {path} exists and is not a file lmckit wrote ({file_format}); "
            "refusing to overwrite it (choose another name, or remove it first)"
        )
    return path


def writes_folder(argument: str = "out", *, replaces: Iterable[str] = ()) -> Callable[[F], F]:
    """Decorate a function that writes into the folder passed as ``argument``: the folder
    is locked (:func:`locked_output`) for the whole call. ``replaces``: glob patterns of its
    outputs that describe only its last call — after a call that returns, the matching files
    an earlier call wrote and this one did not are removed (:func:`retire_unwritten`, logged
    through the function's ``log`` argument where it has one)."""
    patterns = tuple(replaces)

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            folder = bound.arguments[argument]
            with locked_output(folder, "--out") as held:
                guard = _GUARDS.get(held) if patterns else None
                if guard is None:
                    return fn(*args, **kwargs)
                outer, guard.writer = guard.writer, (fn.__qualname__, patterns)
                try:
                    result = fn(*args, **kwargs)
                finally:
                    guard.writer = outer
                retire_unwritten(held, fn.__qualname__, patterns, bound.arguments.get("log"))
                return result

        return wrapper  # type: ignore[return-value]

    return decorate
