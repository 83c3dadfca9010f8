"""Reader and writer for the CIFAR-10/100 "python version" pickle batches — without
trusting pickle: only the numpy array reconstruction that the batches use is allowed."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np

from lmckit.errors import DataError
from lmckit.options import checked

try:  # numpy ≥ 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _multiarray

import _codecs

# Exactly what a pickled numpy array needs; anything else (os.system, eval, ...) is refused.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy._core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _codecs.encode,
}

CIFAR10_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR100_FILES = {"train": ["train"], "test": ["test"]}


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _ArrayOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _RefusedGlobal(
                f"refusing to load global {module}.{name}: a CIFAR batch holds only arrays, "
                "lists and strings"
            ) from None


@checked
def read_cifar_batch(
    path: str | os.PathLike, label_key: str = "labels"
) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR batch file.

    Returns:
        ``images`` uint8 ``(N, 3, 32, 32)`` and ``labels`` int64 ``(N,)``. ``label_key`` is
        ``"labels"`` for CIFAR-10 and ``"fine_labels"`` for CIFAR-100.

    Raises:
        DataError: unreadable or corrupted file, a pickle that references anything but numpy
            arrays, missing keys, or inconsistent sizes.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read CIFAR batch {path}: {exc.strerror or exc}") from None
    try:
        obj = _ArrayOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _RefusedGlobal as exc:
        raise DataError(f"{path}: not a safe CIFAR batch ({exc})") from None
    except Exception as exc:  # truncated/garbled pickles raise many types
        raise DataError(f"{path}: corrupted CIFAR batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a dict, found {type(obj).__name__}")
    obj = {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}
    if "data" not in obj or label_key not in obj:
        raise DataError(f"{path}: missing keys; need 'data' and {label_key!r}, found {sorted(obj)}")
    data = np.asarray(obj["data"])
    labels = np.asarray(obj[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(
            f"{path}: 'data' should be uint8 (N, 3072), found {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    return data.reshape(-1, 3, 32, 32), labels


@checked
def write_cifar_batch(
    path: str | os.PathLike, images: np.ndarray, labels, label_key: str = "labels"
) -> Path:
    """Write a batch in the CIFAR python format (images uint8 ``(N, 3, 32, 32)``)."""
    path = Path(path)
    images = np.asarray(images, dtype=np.uint8).reshape(len(images), 3072)
    batch = {
        b"data": images,
        label_key.encode(): [int(v) for v in labels],
        b"batch_label": b"lmckit",
    }
    with open(path, "wb") as fh:
        pickle.dump(batch, fh, protocol=2)
    return path
