"""Reader and writer for the IDX format of (Fashion-)MNIST, raw or gzipped."""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from lmckit.errors import DataError
from lmckit.options import checked

# IDX type code -> big-endian numpy dtype
_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder("="): code for code, dt in _DTYPES.items()}


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read IDX file {path}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path} is a corrupted or truncated gzip file ({exc})") from None
    return raw


@checked
def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or not) into a native-endian numpy array.

    Raises:
        DataError: unreadable file, bad magic number, unknown type code, or a payload whose
            length disagrees with the header's dimensions.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic number {data[:4]!r})")
    code, ndim = data[2], data[3]
    if code not in _DTYPES:
        raise DataError(f"{path}: unknown IDX type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = _DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{path}: IDX header promises shape {shape} ({expected} bytes of data) but the file "
            f"holds {len(data) - header} bytes — truncated or corrupted"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


@checked
def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool | None = None) -> Path:
    """Write ``array`` as IDX; gzipped when ``compress`` is True or the name ends in ``.gz``."""
    path = Path(path)
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _CODES:
        raise DataError(f"IDX cannot store dtype {array.dtype}")
    code = _CODES[native]
    payload = struct.pack(f">BBBB{array.ndim}I", 0, 0, code, array.ndim, *array.shape)
    payload += array.astype(_DTYPES[code], copy=False).tobytes()
    if compress or (compress is None and path.suffix == ".gz"):
        payload = gzip.compress(payload, mtime=0)
    path.write_bytes(payload)
    return path
