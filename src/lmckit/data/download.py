"""Downloads with checksum verification, written atomically (temp file + rename)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from lmckit.errors import DataError
from lmckit.files import atomic_path

TIMEOUT_S = 60


def file_md5(path: str | os.PathLike) -> str:
    """Hex MD5 of a file (integrity check of downloads; not used for security)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _ChecksumMismatch(Exception):
    pass


def download(urls: list[str], dest: str | os.PathLike, md5: str) -> Path:
    """Fetch the first URL of ``urls`` that answers into ``dest`` and check its MD5.

    The file appears at ``dest`` only once complete and verified. An existing ``dest`` with
    the right checksum is kept as is.

    Raises:
        DataError: every URL failed (the reasons are listed) or the checksum did not match.
    """
    dest = Path(dest)
    if dest.exists() and file_md5(dest) == md5:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            with atomic_path(dest) as tmp:
                with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
                    shutil.copyfileobj(resp, out)
                got = file_md5(tmp)
                if got != md5:
                    raise _ChecksumMismatch(f"checksum mismatch (md5 {got}, expected {md5})")
            return dest
        except _ChecksumMismatch as exc:
            failures.append(f"{url}: {exc}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failures.append(f"{url}: {getattr(exc, 'reason', None) or exc}")
    raise DataError(f"could not download {dest.name}:\n  " + "\n  ".join(failures))


def extract_tar(archive: str | os.PathLike, into: str | os.PathLike) -> None:
    """Extract a (gzipped) tar archive, refusing links and paths that leave ``into``."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise DataError(f"cannot extract {archive}: {exc}") from None
