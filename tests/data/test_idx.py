"""The IDX reader and writer."""

import gzip

import numpy as np
import pytest

from lmckit.data import (
    read_idx,
    write_idx,
)
from lmckit.errors import DataError


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    arr = (np.arange(2 * 3 * 4).reshape(2, 3, 4) - 5).astype(dtype)
    path = write_idx(tmp_path / f"x{suffix}", arr)
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if suffix else b"\x00\x00")
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and np.array_equal(out, arr)


def test_idx_corruption_is_reported(tmp_path):
    arr = np.zeros((5, 28, 28), dtype=np.uint8)
    raw = write_idx(tmp_path / "ok", arr).read_bytes()
    (tmp_path / "short").write_bytes(raw[:-10])
    with pytest.raises(DataError, match="truncated or corrupted"):
        read_idx(tmp_path / "short")
    (tmp_path / "magic").write_bytes(b"\x01\x02" + raw[2:])
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "magic")
    gz = gzip.compress(raw)
    (tmp_path / "bad.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(DataError, match="corrupted or truncated gzip"):
        read_idx(tmp_path / "bad.gz")
    with pytest.raises(DataError, match="cannot read IDX file"):
        read_idx(tmp_path / "absent")
