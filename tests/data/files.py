"""Dataset files the data tests write themselves."""

import hashlib

import numpy as np

from lmckit.data import (
    write_cifar_batch,
    write_idx,
)


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


def gz_mirror(tmp_path, arrays):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    md5s = {}
    for stem, arr in arrays.items():
        path = write_idx(mirror / f"{stem}.gz", arr)
        md5s[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return mirror, md5s


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
