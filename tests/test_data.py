"""Dataset readers, lookup, downloads, loaders and splits — on files the tests write."""

import gzip
import hashlib
import pickle
import tarfile

import numpy as np
import pytest
import torch

import lmckit.data.datasets as ds
from lmckit.data import (
    TensorLoader,
    class_imbalanced_split,
    fashion_mnist_available,
    holdout_split,
    load_dataset,
    random_crop_flip,
    random_partition,
    random_subset,
    read_cifar_batch,
    read_idx,
    write_cifar_batch,
    write_idx,
)
from lmckit.errors import DataError, DatasetNotFoundError


@pytest.fixture(autouse=True)
def isolated_lookup(tmp_path, monkeypatch):
    """No test sees the machine's real datasets, cache or network by accident."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LMCKIT_DATA", raising=False)
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")


def write_tiny_idx(directory, n_train=30, n_test=12, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(directory / f"{stem}{ext}", arr)
    return arrays


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


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_from_explicit_path(tmp_path, gz):
    arrays = write_tiny_idx(tmp_path / "fm", gz=gz)
    data = load_dataset("fashion-mnist", tmp_path / "fm", download=False)
    assert data.train_x.shape == (30, 1, 28, 28) and data.test_x.shape == (12, 1, 28, 28)
    assert data.train_y.dtype == torch.int64 and data.num_classes == 10
    expected = (arrays["train-images-idx3-ubyte"][3] / 255.0 - 0.2860) / 0.3530
    assert np.allclose(data.train_x[3, 0].numpy(), expected, atol=1e-6)
    assert torch.equal(
        data.test_y, torch.from_numpy(arrays["t10k-labels-idx1-ubyte"].astype(np.int64))
    )
    padded = load_dataset("fmnist", tmp_path / "fm", download=False, pad_to=32)
    assert padded.train_x.shape == (30, 1, 32, 32)
    background = (0 - 0.2860) / 0.3530
    assert torch.allclose(padded.train_x[:, :, :2, :], torch.tensor(background))
    assert torch.equal(padded.train_x[:, :, 2:30, 2:30], data.train_x)


def test_lookup_order_explicit_then_env_then_cache(tmp_path, monkeypatch):
    write_tiny_idx(tmp_path / "env" / "mnist", n_train=7, seed=1)
    write_tiny_idx(tmp_path / "cache" / "lmckit" / "mnist", n_train=9, seed=2)
    write_tiny_idx(tmp_path / "explicit", n_train=5, seed=3)
    assert len(load_dataset("mnist", download=False).train_x) == 9  # cache
    monkeypatch.setenv("LMCKIT_DATA", str(tmp_path / "env"))
    assert len(load_dataset("mnist", download=False).train_x) == 7  # env beats cache
    assert len(load_dataset("mnist", tmp_path / "explicit", download=False).train_x) == 5


def test_debian_package_location_is_used(tmp_path, monkeypatch):
    write_tiny_idx(tmp_path / "debian")
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "debian")
    assert fashion_mnist_available()
    assert load_dataset("fashion-mnist", download=False).source == str(tmp_path / "debian")


def test_missing_dataset_says_where_it_looked_and_how_to_get_it(tmp_path):
    assert not fashion_mnist_available()
    with pytest.raises(DatasetNotFoundError) as exc:
        load_dataset("fashion-mnist", tmp_path / "nowhere", download=False)
    msg = str(exc.value)
    assert str(tmp_path / "nowhere") in msg and "no-debian-package" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "LMCKIT_DATA" in msg
    with pytest.raises(DataError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")


def gz_mirror(tmp_path, arrays):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    md5s = {}
    for stem, arr in arrays.items():
        path = write_idx(mirror / f"{stem}.gz", arr)
        md5s[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return mirror, md5s


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


def write_cifar_dir(directory, cifar100=False, n=6, seed=0):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    names = (
        ["train", "test"] if cifar100 else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    )
    key = "fine_labels" if cifar100 else "labels"
    for name in names:
        write_cifar_batch(
            directory / name,
            rng.integers(0, 256, (n, 3, 32, 32)),
            rng.integers(0, 100 if cifar100 else 10, n),
            label_key=key,
        )


def test_cifar_batches_round_trip_and_load(tmp_path):
    write_cifar_dir(tmp_path / "cifar-10-batches-py")
    images, labels = read_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch")
    assert images.shape == (6, 3, 32, 32) and images.dtype == np.uint8 and labels.shape == (6,)
    data = load_dataset("cifar10", tmp_path, download=False)
    assert data.train_x.shape == (30, 3, 32, 32) and data.test_x.shape == (6, 3, 32, 32)
    assert data.augment and data.num_classes == 10
    write_cifar_dir(tmp_path / "c100" / "cifar-100-python", cifar100=True)
    data = load_dataset("cifar100", tmp_path / "c100", download=False)
    assert data.num_classes == 100 and data.train_x.shape == (6, 3, 32, 32)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_cifar_reader_refuses_pickled_code_and_reports_corruption(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "evil").write_bytes(pickle.dumps({b"data": _Exploit(str(marker)), b"labels": [1]}))
    with pytest.raises(DataError, match=r"not a safe CIFAR batch \(refusing to load global"):
        read_cifar_batch(tmp_path / "evil")
    assert not marker.exists()
    good = write_cifar_batch(tmp_path / "good", np.zeros((4, 3, 32, 32)), [0, 1, 2, 3])
    (tmp_path / "cut").write_bytes(good.read_bytes()[:500])
    with pytest.raises(DataError, match="corrupted CIFAR batch"):
        read_cifar_batch(tmp_path / "cut")
    with pytest.raises(DataError, match="missing keys"):
        read_cifar_batch(tmp_path / "good", label_key="fine_labels")


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


def test_digits_and_synthetic_need_no_files():
    digits = load_dataset("digits")
    assert digits.train_x.shape == (1437, 1, 8, 8) and digits.test_x.shape == (360, 1, 8, 8)
    assert abs(digits.train_x.mean().item()) < 1e-4
    assert torch.equal(load_dataset("digits").train_y, digits.train_y)
    assert load_dataset("digits", pad_to=32).train_x.shape[-2:] == (32, 32)
    syn = load_dataset("synthetic")
    assert syn.train_x.shape == (4000, 32) and syn.num_classes == 4
    assert torch.equal(load_dataset("synthetic").train_x, syn.train_x)


def test_class_imbalanced_split_follows_git_rebasin_5_4():
    labels = torch.arange(100).repeat_interleave(50)  # 100 classes × 50
    a, b = class_imbalanced_split(labels, fraction=0.2, seed=1)
    assert len(set(a.tolist()) & set(b.tolist())) == 0 and len(a) + len(b) == len(labels)
    counts_a = torch.bincount(labels[a], minlength=100)
    assert (counts_a[:50] == 10).all() and (counts_a[50:] == 40).all()
    a2, _ = class_imbalanced_split(labels, fraction=0.2, seed=1)
    assert torch.equal(a, a2)


def test_random_partitions_and_holdout():
    halves = random_partition(101, [0.5, 0.5], seed=3)
    assert sum(len(h) for h in halves) == 101
    assert not set(halves[0].tolist()) & set(halves[1].tolist())
    assert len(random_subset(100, 0.3, seed=0)) == 30
    held, rest = holdout_split(1000, 0.2)
    assert len(held) == 200 and len(rest) == 800
    with pytest.raises(DataError):
        random_partition(10, [0.7, 0.7])


def test_loader_is_seeded_per_epoch_and_covers_everything():
    x, y = torch.arange(50).float()[:, None], torch.arange(50)
    loader = TensorLoader(x, y, batch_size=8, shuffle=True, seed=4)
    e0 = torch.cat([b for _, b in loader])
    e1 = torch.cat([b for _, b in loader])
    assert sorted(e0.tolist()) == list(range(50)) and not torch.equal(e0, e1)
    loader.set_epoch(0)
    assert torch.equal(torch.cat([b for _, b in loader]), e0)
    assert len(TensorLoader(x, y, batch_size=8, drop_last=True)) == 6
    with pytest.raises(DataError, match="50 examples but y has 3"):
        TensorLoader(x, y[:3])


def test_random_crop_flip_returns_crops_of_the_padded_image():
    x = torch.randn(16, 3, 32, 32)
    out = random_crop_flip(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        found = any(
            torch.equal(out[i], padded[i, :, dy : dy + 32, dx : dx + 32])
            or torch.equal(out[i], padded[i, :, dy : dy + 32, dx : dx + 32].flip(-1))
            for dy in range(9)
            for dx in range(9)
        )
        assert found


def test_real_fashion_mnist_when_installed(monkeypatch):
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", ds.Path("/usr/share/datasets/fashion-mnist"))
    if not fashion_mnist_available():
        pytest.skip("Debian package dataset-fashion-mnist is not installed")
    data = load_dataset("fashion-mnist", download=False)
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert abs(data.train_x.mean().item()) < 0.01 and abs(data.train_x.std().item() - 1) < 0.01
    assert torch.bincount(data.test_y).tolist() == [1000] * 10
