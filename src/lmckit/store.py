"""One result store: every cached artifact keyed by everything that determines it.

An artifact — a checkpoint, a permutation, a curve, a merge, an analysis — is stored under
a key that is the SHA-256 of a canonical JSON document holding:

* the step's **kind** and **settings** (every option that changes the result),
* the **content hashes of its inputs** (a checkpoint's weights SHA-256, a permutation's
  canonical hash) — never their paths or names,
* the **dataset identity** (name and a hash of every example and label),
* the **lmckit version**.

A result is reused only when a stored artifact has exactly that key; anything else is
computed afresh. The key document is written into the artifact's ``meta.json``, together
with the SHA-256 of every file the artifact holds and a digest of ``meta.json`` itself,
all checked when the artifact is reused: an edited record, a file list that no longer
lists every file, a key that is not its document's hash or a damaged file is an error
naming the artifact, never a result. Artifacts are written
into a scratch folder and renamed into place, so an interrupted run leaves none half
written.

Layout: ``<root>/<kind>/<key[:2]>/<key>/`` with ``meta.json`` and the artifact's files;
``<root>/partial/<key>.resume`` while a long job computing ``key`` is under way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmckit import __version__
from lmckit.errors import LmcError
from lmckit.files import atomic_path, atomic_write_json, claim, scratch_prefix

__all__ = ["Artifact", "Store", "StoreError", "canonical_json", "content_hash", "make_key"]

STORE_FORMAT = 2
"""2: ``meta.json`` carries its own digest and lists every file of its artifact; keys of
format 1 are never reused (their records were not authenticated)."""


class StoreError(LmcError):
    """A stored artifact is damaged or does not hold what its key says."""


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set | frozenset):
        return [_plain(v) for v in (sorted(value) if isinstance(value, set | frozenset) else value)]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), allow_nan=True)


def content_hash(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def make_key(
    kind: str,
    settings: Mapping[str, Any],
    inputs: Mapping[str, str] | None = None,
    dataset: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(key, document)``: the key of an artifact of ``kind`` computed with ``settings``
    from inputs with the given content hashes, on the dataset with the given identity."""
    document = {
        "kind": kind,
        "settings": _plain(dict(settings)),
        "inputs": dict(sorted((inputs or {}).items())),
        "dataset": dataset,
        "lmckit_version": __version__,
        "store_format": STORE_FORMAT,
    }
    return content_hash(document), document


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Artifact:
    """A stored artifact: its folder and its ``meta.json`` (``key``, ``document``,
    ``files``, ``content`` and whatever the producer recorded under ``record``)."""

    folder: Path
    meta: dict[str, Any]

    @property
    def key(self) -> str:
        """The artifact's key."""
        return self.meta["key"]

    @property
    def content(self) -> str:
        """The hash downstream artifacts key on (the producer's choice, e.g. weights SHA-256)."""
        return self.meta["content"]

    @property
    def record(self) -> dict[str, Any]:
        """What the producer recorded about the result (metrics, timings)."""
        return self.meta.get("record", {})

    def file(self, name: str) -> Path:
        """Path of one of the artifact's files."""
        return self.folder / name


def meta_digest(meta: Mapping[str, Any]) -> str:
    """SHA-256 of an artifact's ``meta.json`` without its own ``meta_sha256`` entry."""
    return content_hash({k: v for k, v in meta.items() if k != "meta_sha256"})


def _record_problem(record: Any) -> str | None:
    if not isinstance(record, Mapping):
        return "its record is not a table"
    return None


def _meta_problem(meta: Any, kind: str, key: str) -> str | None:
    """Why ``meta`` cannot be believed for the artifact ``kind``/``key``, or ``None``."""
    if not isinstance(meta, dict):
        return "meta.json is not a table"
    if meta.get("meta_sha256") != meta_digest(meta):
        return "meta.json does not match its own digest (meta_sha256)"
    if meta.get("key") != key:
        return f"meta.json records key {meta.get('key')}, not {key}"
    document = meta.get("document")
    if not isinstance(document, dict) or content_hash(document) != key:
        return "the key is not the hash of the document meta.json records"
    if document.get("kind") != kind:
        return f"meta.json records kind {document.get('kind')!r}, not {kind!r}"
    files = meta.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return "meta.json's file list is malformed"
    if not isinstance(meta.get("content"), str):
        return "meta.json's content hash is malformed"
    return _record_problem(meta.get("record", {}))


class Store:
    """Keyed artifacts under ``root`` (see the module docstring).

    ``reuse_from``: other stores, only ever read: an artifact missing under ``root`` but
    stored in one of them (checked as :meth:`get` checks its own) is copied under ``root``
    and reused — how a run takes the finished results of another experiment's run without
    writing into that run's folder.
    """

    def __init__(
        self, root: str | os.PathLike, reuse_from: Iterable[str | os.PathLike] = ()
    ) -> None:
        self.root = Path(root)
        self.reuse_from = tuple(Path(r) for r in reuse_from)

    def folder(self, kind: str, key: str) -> Path:
        """Where the artifact of ``kind`` with ``key`` lives (whether or not it exists)."""
        return self.root / kind / key[:2] / key

    def resume_file(self, key: str) -> Path:
        """Where the job computing the artifact with ``key`` keeps its resume file
        (:mod:`lmckit.resume`) until the artifact is stored: ``<root>/partial/<key>.resume``.

        With :attr:`reuse_from`, a resume file missing here but kept in one of those stores
        (a job that run left half done) is first copied here, so the job goes on from where
        that run stopped; the other store's file is only read (an unreadable one is not
        copied), and the file's fingerprint is checked on loading as for any resume file."""
        from lmckit.resume import saved_progress  # torch: only where a job needs it

        path = self.root / "partial" / f"{key}.resume"
        if path.exists():
            return path
        for other in self.reuse_from:
            found = other / "partial" / f"{key}.resume"
            if saved_progress(found) is not None:  # an unreadable one would come back
                claim(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(path) as scratch:
                    shutil.copyfile(found, scratch)
                break
        return path

    def resume_files(self) -> list[Path]:
        """Every resume file in the store."""
        return sorted((self.root / "partial").glob("*.resume"))

    def get(self, kind: str, key: str, *, verify: bool = True) -> Artifact | None:
        """The artifact with exactly this key, or ``None`` if there is none.

        ``meta.json`` is checked before anything in it is believed: its digest
        (``meta_sha256``, of everything else it holds), its key against the document it
        records (the key is that document's hash) and the kind, its record (numbers or
        nothing) and — with ``verify`` — its list of files against the folder: every file
        there listed, every listed file there with the SHA-256 it records.

        Raises:
            StoreError: an artifact is stored under the key but its ``meta.json`` fails any
                of these checks (the message names the folder and what failed).
        """
        folder = self.folder(kind, key)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            return self._copy_in(kind, key)
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(
                f"stored artifact {folder} has an unreadable meta.json: {exc}"
            ) from None
        problem = _meta_problem(meta, kind, key)
        if problem is not None:
            raise StoreError(
                f"stored artifact {folder}: {problem}; its meta.json was changed or damaged "
                "after it was written — delete the folder to recompute it"
            )
        if verify:
            present = sorted(p.name for p in folder.iterdir() if p.name != "meta.json")
            unlisted = sorted(set(present) - set(meta["files"]))
            if unlisted:
                raise StoreError(
                    f"stored artifact {folder} holds files its meta.json does not list "
                    f"({', '.join(unlisted)}); delete the folder to recompute it"
                )
            for name, expected in meta["files"].items():
                path = folder / name
                if not path.is_file() or _file_sha256(path) != expected:
                    raise StoreError(
                        f"stored artifact file {path} is missing or damaged (its SHA-256 does "
                        "not match meta.json); delete the folder to recompute it"
                    )
        return Artifact(folder, meta)

    def _copy_in(self, kind: str, key: str) -> Artifact | None:
        """The artifact from the first of :attr:`reuse_from` that stores it (verified),
        copied under :attr:`root` through a scratch folder renamed into place."""
        for other in self.reuse_from:
            found = Store(other).get(kind, key)
            if found is None:
                continue

            def copy(scratch: Path, source: Path = found.folder) -> None:
                for path in sorted(source.iterdir()):
                    shutil.copy2(path, scratch / path.name)

            self._place(kind, key, copy)
            return self.get(kind, key)
        return None

    def _place(self, kind: str, key: str, fill: Callable[[Path], None]) -> None:
        """``fill(scratch)`` writes an artifact's files (``meta.json`` included) into a
        scratch folder beside its place, which is then renamed into place in one step; if
        another writer stored the same key meanwhile, its copy is kept."""
        final = self.folder(kind, key)
        claim(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(
            tempfile.mkdtemp(prefix=scratch_prefix(key[:12]), suffix=".scratch", dir=final.parent)
        )
        try:
            fill(scratch)
            os.chmod(scratch, 0o755)
            try:
                os.rename(scratch, final)
            except OSError:
                if not (final / "meta.json").is_file():
                    raise
                shutil.rmtree(scratch)  # the same key was stored concurrently: keep that one
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def put(
        self,
        kind: str,
        key: str,
        document: Mapping[str, Any],
        write: Callable[[Path], tuple[str, Mapping[str, Any]]],
    ) -> Artifact:
        """Compute and store an artifact: ``write(folder)`` writes its files into a scratch
        folder and returns ``(content hash, record)``; the folder is then renamed into place
        in one step. If another writer stored the same key meanwhile, its copy is kept."""

        def fill(scratch: Path) -> None:
            content, record = write(scratch)
            files = {p.name: _file_sha256(p) for p in sorted(scratch.iterdir()) if p.is_file()}
            meta = {
                "key": key,
                "document": dict(document),
                "content": content,
                "files": files,
                "record": _plain(dict(record)),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            bad = _record_problem(meta["record"])
            if bad is not None:
                raise StoreError(f"refusing to store {kind} {key[:12]}: {bad}")
            meta["meta_sha256"] = meta_digest(meta)
            atomic_write_json(scratch / "meta.json", meta)

        self._place(kind, key, fill)
        artifact = self.get(kind, key, verify=False)
        assert artifact is not None
        return artifact

    def get_or_put(
        self,
        kind: str,
        key: str,
        document: Mapping[str, Any],
        write: Callable[[Path], tuple[str, Mapping[str, Any]]],
    ) -> tuple[Artifact, bool]:
        """``(artifact, reused)`` for a key made with :func:`make_key`."""
        found = self.get(kind, key)
        if found is not None:
            return found, True
        return self.put(kind, key, document, write), False

    def get_or_compute(
        self,
        kind: str,
        settings: Mapping[str, Any],
        write: Callable[[Path], tuple[str, Mapping[str, Any]]],
        *,
        inputs: Mapping[str, str] | None = None,
        dataset: str | None = None,
    ) -> tuple[Artifact, bool]:
        """``(artifact, reused)``: the stored artifact for this key, or a new one."""
        key, document = make_key(kind, settings, inputs, dataset)
        return self.get_or_put(kind, key, document, write)
