"""Downloads: checksums, mirrors, archives — against local file:// mirrors."""

import hashlib
import tarfile

import pytest

import lmckit.data.datasets as ds
from lmckit.data import (
    load_dataset,
)
from lmckit.errors import DatasetNotFoundError
from tests.data.files import gz_mirror, write_cifar_dir, write_tiny_idx


def test_download_verifies_checksums_and_falls_back_to_the_next_mirror(tmp_path, monkeypatch):
    arrays = write_tiny_idx(tmp_path / "src", gz=False)
    mirror, md5s = gz_mirror(tmp_path, arrays)
    mirrors = [(tmp_path / "dead").as_uri() + "/", mirror.as_uri() + "/"]
    monkeypatch.setitem(ds.IDX_SOURCES, "mnist", (mirrors, md5s))
    data = load_dataset("mnist")
    assert len(data.train_x) == 30
    cached = tmp_path / "cache" / "lmckit" / "mnist"
    assert sorted(p.name for p in cached.iterdir()) == sorted(md5s)  # no temp files left
    assert data.source == str(cached)


def test_download_with_wrong_checksum_is_refused(tmp_path, monkeypatch):
    arrays = write_tiny_idx(tmp_path / "src", gz=False)
    mirror, md5s = gz_mirror(tmp_path, arrays)
    md5s["train-images-idx3-ubyte.gz"] = "0" * 32
    monkeypatch.setitem(ds.IDX_SOURCES, "mnist", ([mirror.as_uri() + "/"], md5s))
    with pytest.raises(DatasetNotFoundError, match="checksum mismatch"):
        load_dataset("mnist")
    assert not (tmp_path / "cache" / "lmckit" / "mnist" / "train-images-idx3-ubyte.gz").exists()


def test_cifar_download_extracts_the_verified_tarball(tmp_path, monkeypatch):
    write_cifar_dir(tmp_path / "build" / "cifar-10-batches-py")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "build" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(
        ds.CIFAR_SOURCES, "cifar10", ("cifar-10-batches-py", [archive.as_uri()], md5)
    )
    data = load_dataset("cifar10")
    assert data.train_x.shape == (30, 3, 32, 32)
