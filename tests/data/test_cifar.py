"""The CIFAR batch reader, which never runs pickled code."""

import pickle

import numpy as np
import pytest

from lmckit.data import (
    read_cifar_batch,
    write_cifar_batch,
)
from lmckit.errors import DataError
from tests.zoo import PickledCode


def test_cifar_reader_refuses_pickled_code_and_reports_corruption(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "evil").write_bytes(
        pickle.dumps({b"data": PickledCode(str(marker)), b"labels": [1]})
    )
    with pytest.raises(DataError, match=r"not a safe CIFAR batch \(refusing to load global"):
        read_cifar_batch(tmp_path / "evil")
    assert not marker.exists()
    good = write_cifar_batch(tmp_path / "good", np.zeros((4, 3, 32, 32)), [0, 1, 2, 3])
    (tmp_path / "cut").write_bytes(good.read_bytes()[:500])
    with pytest.raises(DataError, match="corrupted CIFAR batch"):
        read_cifar_batch(tmp_path / "cut")
    with pytest.raises(DataError, match="missing keys"):
        read_cifar_batch(tmp_path / "good", label_key="fine_labels")
