"""A code corpus that every machine with Python has: the standard library's own sources, as
bytes for a byte-level language model.

``python-stdlib`` reads every ``*.py`` file under the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``), or under a folder the caller names — any source
tree works the same way. Left out: the standard library's own test suites and tools
(folders named ``test``, ``tests``, ``idlelib``, ``lib2to3``, ``turtledemo``), installed
packages (``site-packages``, ``dist-packages``) and caches (``__pycache__``).

* **Split by file**, never inside a file: a file is a test file when the first four bytes of
  the SHA-256 of its path relative to the root, read as an integer, are ``< 2³² / 10``
  (≈ 10 %), so the split depends on the file's path only and is the same on every machine.
* Each split's files are concatenated in path order and cut into non-overlapping windows of
  ``context`` bytes; ``x`` is a window, ``y`` the same window shifted by one byte (the next
  byte at every position). Inputs ``(N, context)`` int64 byte values, targets ``(N, context)``
  int64, ``num_classes = 256``.
* The corpus's identity — the interpreter's version, the number of files and the SHA-256 of
  each split's bytes — goes into ``Dataset.source``: the standard library differs between
  Python releases, so a number measured on it names the release.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from lmckit.errors import DataError, DatasetNotFoundError

if TYPE_CHECKING:
    from lmckit.data.dataset import Dataset

EXCLUDED_FOLDERS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "site-packages",
        "dist-packages",
        "__pycache__",
    }
)
DEFAULT_CONTEXT = 128
VOCAB_SIZE = 256
TEST_SHARE = 10  # one file in ten, by the hash of its relative path


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[Path]:
    """Every ``*.py`` file under ``root`` outside :data:`EXCLUDED_FOLDERS`, sorted by its
    path relative to ``root``."""
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_FOLDERS.isdisjoint(rel.parts[:-1]) and path.is_file():
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_test_file(relative: str) -> bool:
    """Whether the file at ``relative`` (a POSIX path under the root) is in the test split."""
    head = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:4], "big")
    return head < 2**32 // TEST_SHARE


def _windows(stream: bytes, context: int, split: str, root: Path) -> tuple[torch.Tensor, ...]:
    count = (len(stream) - 1) // context
    if count < 1:
        raise DataError(
            f"the {split} split of the code corpus in {root} holds {len(stream)} bytes, fewer "
            f"than one window of {context} + 1; give a larger source tree or a shorter context"
        )
    data = torch.from_numpy(np.frombuffer(stream, dtype=np.uint8).astype(np.int64))
    x = data[: count * context].view(count, context).clone()
    y = data[1 : count * context + 1].view(count, context).clone()
    return x, y


def load_code_corpus(
    root: str | os.PathLike | None = None, *, context: int = DEFAULT_CONTEXT
) -> Dataset:
    """The ``python-stdlib`` dataset (see the module docstring): the Python sources under
    ``root`` (default: this interpreter's standard library) as byte windows of ``context``.

    Raises:
        DatasetNotFoundError: ``root`` does not exist or holds no ``*.py`` file.
        DataError: a split holds less than one window, or a file cannot be read.
    """
    from lmckit.data.dataset import Dataset

    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise DataError(f"context must be a positive integer, got {context!r}")
    base = stdlib_root() if root is None else Path(root)
    if not base.is_dir():
        what = "is not a folder" if base.exists() else "does not exist"
        raise DatasetNotFoundError(f"code corpus folder {base} {what}")
    files = corpus_files(base)
    if not files:
        raise DatasetNotFoundError(
            f"no *.py file under {base} (outside {', '.join(sorted(EXCLUDED_FOLDERS))})"
        )
    parts: dict[str, list[bytes]] = {"train": [], "test": []}
    for path in files:
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        parts["test" if is_test_file(path.relative_to(base).as_posix()) else "train"].append(text)
    streams = {split: b"".join(chunks) for split, chunks in parts.items()}
    for split in ("train", "test"):
        if not parts[split]:
            raise DataError(
                f"the code corpus in {base} has {len(files)} file(s), none of them in the "
                f"{split} split (one file in {TEST_SHARE} is a test file, by its path)"
            )
    train_x, train_y = _windows(streams["train"], context, "train", base)
    test_x, test_y = _windows(streams["test"], context, "test", base)
    version = ".".join(map(str, sys.version_info[:3]))
    digests = {s: hashlib.sha256(b).hexdigest()[:16] for s, b in streams.items()}
    source = (
        f"{base} (Python {version}; {len(parts['train'])} train / {len(parts['test'])} test "
        f"files, {len(streams['train'])} / {len(streams['test'])} bytes; sha256 "
        f"{digests['train']} / {digests['test']})"
    )
    return Dataset(
        name="python-stdlib",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=VOCAB_SIZE,
        source=source,
    )
