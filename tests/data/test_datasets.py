"""Datasets by name: lookup order, normalisation, padding, checks of what files hold."""

import numpy as np
import pytest
import torch

import lmckit.data.datasets as ds
from lmckit.data import (
    fashion_mnist_available,
    load_dataset,
    read_cifar_batch,
    write_cifar_batch,
    write_idx,
)
from lmckit.errors import DataError, DatasetNotFoundError
from tests.data.files import write_cifar_dir, write_tiny_idx


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


def test_a_partial_copy_on_the_lookup_path_is_an_error_not_skipped(tmp_path, monkeypatch):
    """$LMCKIT_DATA holding some of the files is a mistake to report: the complete copy in
    the cache behind it must not be taken silently in its place."""
    write_tiny_idx(tmp_path / "cache" / "lmckit" / "mnist", n_train=9)
    write_tiny_idx(tmp_path / "env" / "mnist", n_train=7)
    (tmp_path / "env" / "mnist" / "train-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setenv("LMCKIT_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetNotFoundError, match="incomplete: train-labels-idx1-ubyte"):
        load_dataset("mnist", download=False)
    write_cifar_dir(tmp_path / "cache" / "lmckit" / "cifar-10-batches-py")
    write_cifar_dir(tmp_path / "env" / "cifar-10-batches-py")
    (tmp_path / "env" / "cifar-10-batches-py" / "data_batch_2").unlink()
    with pytest.raises(DatasetNotFoundError, match="incomplete: data_batch_2 missing"):
        load_dataset("cifar10", download=False)
    monkeypatch.delenv("LMCKIT_DATA")
    assert len(load_dataset("mnist", download=False).train_x) == 9


def test_debian_package_location_is_used(tmp_path, monkeypatch):
    write_tiny_idx(tmp_path / "debian")
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "debian")
    assert fashion_mnist_available()
    assert load_dataset("fashion-mnist", download=False).source == str(tmp_path / "debian")


def test_missing_dataset_says_where_it_looked_and_how_to_get_it(tmp_path):
    assert not fashion_mnist_available()
    with pytest.raises(DatasetNotFoundError) as exc:
        load_dataset("fashion-mnist", download=False)
    msg = str(exc.value)
    assert "no-debian-package" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "LMCKIT_DATA" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="not in the data folder") as exc:
        load_dataset("fashion-mnist", tmp_path / "empty", download=False)
    assert str(tmp_path / "empty") in str(exc.value)


def test_an_explicit_folder_is_used_alone_never_a_copy_elsewhere(tmp_path, monkeypatch):
    """A --data-dir that lacks some files is an error naming them, even where the cache or
    the Debian package holds a complete copy (it used to fall back to that copy)."""
    write_tiny_idx(tmp_path / "debian")
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", tmp_path / "debian")
    write_tiny_idx(tmp_path / "cache" / "lmckit" / "fashion-mnist", n_train=9)
    mine = tmp_path / "mine"
    write_tiny_idx(mine)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (mine / name).unlink()
    with pytest.raises(DatasetNotFoundError, match="incomplete: t10k-images-idx3-ubyte"):
        load_dataset("fashion-mnist", mine, download=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="not in the data folder"):
        load_dataset("fashion-mnist", tmp_path / "empty")
    write_cifar_dir(tmp_path / "c" / "cifar-10-batches-py")
    (tmp_path / "c" / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DatasetNotFoundError, match="incomplete: test_batch missing"):
        load_dataset("cifar10", tmp_path / "c", download=False)
    with pytest.raises(DataError, match="needs no data folder"):
        load_dataset("digits", mine)
    assert len(load_dataset("fashion-mnist", download=False).train_x) == 9  # the cache
    with pytest.raises(DataError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")


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


def test_digits_and_synthetic_need_no_files():
    digits = load_dataset("digits")
    assert digits.train_x.shape == (1437, 1, 8, 8) and digits.test_x.shape == (360, 1, 8, 8)
    assert abs(digits.train_x.mean().item()) < 1e-4
    assert torch.equal(load_dataset("digits").train_y, digits.train_y)
    assert load_dataset("digits", pad_to=32).train_x.shape[-2:] == (32, 32)
    syn = load_dataset("synthetic")
    assert syn.train_x.shape == (4000, 32) and syn.num_classes == 4
    assert torch.equal(load_dataset("synthetic").train_x, syn.train_x)


def test_real_fashion_mnist_when_installed(monkeypatch):
    monkeypatch.setattr(ds, "DEBIAN_FASHION_MNIST", ds.Path("/usr/share/datasets/fashion-mnist"))
    if not fashion_mnist_available():
        pytest.skip("Debian package dataset-fashion-mnist is not installed")
    data = load_dataset("fashion-mnist", download=False)
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert abs(data.train_x.mean().item()) < 0.01 and abs(data.train_x.std().item() - 1) < 0.01
    assert torch.bincount(data.test_y).tolist() == [1000] * 10


def test_an_explicit_folder_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    write_tiny_idx(tmp_path / "cache" / "lmckit" / "mnist")  # a copy it must not fall back to
    with pytest.raises(DatasetNotFoundError, match=r"data folder .*nowhere does not exist"):
        load_dataset("mnist", tmp_path / "nowhere", download=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetNotFoundError, match="is not a folder"):
        load_dataset("mnist", tmp_path / "file", download=False)


def test_labels_outside_the_classes_are_refused(tmp_path):
    arrays = write_tiny_idx(tmp_path / "fm", gz=False)
    labels = arrays["t10k-labels-idx1-ubyte"].copy()
    labels[[2, 5]] = [10, 255]
    write_idx(tmp_path / "fm" / "t10k-labels-idx1-ubyte", labels)
    with pytest.raises(DataError, match=r"test labels in .*: 2 label\(s\) outside \[0, 10\)"):
        load_dataset("fashion-mnist", tmp_path / "fm", download=False)
    write_cifar_dir(tmp_path / "cifar-10-batches-py")
    write_cifar_batch(
        tmp_path / "cifar-10-batches-py" / "test_batch", np.zeros((2, 3, 32, 32)), [3, 12]
    )
    with pytest.raises(DataError, match=r"test_batch: 1 label\(s\) outside \[0, 10\)"):
        load_dataset("cifar10", tmp_path, download=False)


@pytest.mark.parametrize("top", [9, 10])
def test_a_label_equal_to_the_number_of_classes_is_outside_them(tmp_path, top):
    """The bound is strict: labels run 0 … classes − 1, so a file whose only stray label is
    exactly 10 of 10 classes is refused (IDX and CIFAR alike) and one whose top label is 9
    loads."""
    arrays = write_tiny_idx(tmp_path / "fm", gz=False)
    labels = arrays["train-labels-idx1-ubyte"].copy()
    labels[:] = np.minimum(labels, 9)
    labels[3] = top
    write_idx(tmp_path / "fm" / "train-labels-idx1-ubyte", labels)
    write_cifar_dir(tmp_path / "cifar-10-batches-py")
    write_cifar_batch(
        tmp_path / "cifar-10-batches-py" / "test_batch", np.zeros((2, 3, 32, 32)), [0, top]
    )
    if top == 9:
        assert (
            int(load_dataset("fashion-mnist", tmp_path / "fm", download=False).train_y.max()) == 9
        )
        assert int(load_dataset("cifar10", tmp_path, download=False).test_y.max()) == 9
        return
    with pytest.raises(DataError, match=r"1 label\(s\) outside \[0, 10\) \(found 0\.\.10\)"):
        load_dataset("fashion-mnist", tmp_path / "fm", download=False)
    with pytest.raises(DataError, match=r"test_batch: 1 label\(s\) outside \[0, 10\)"):
        load_dataset("cifar10", tmp_path, download=False)


def test_as_batches_takes_datasets_and_reiterable_batches():
    from lmckit.data import as_batches

    data = load_dataset("synthetic")
    loader = as_batches(data, batch_size=1000, shuffle=False)
    assert [len(x) for x, _ in loader] == [1000] * 4
    batches = [(torch.zeros(2, 3), torch.zeros(2))]
    assert as_batches(batches, passes=3) is batches
    with pytest.raises(DataError, match="one-shot iterator"):
        as_batches(iter(batches), passes=2)
    with pytest.raises(DataError, match="Dataset or an iterable"):
        as_batches(42)
