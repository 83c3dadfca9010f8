"""Datasets as in-memory tensors with a fixed train/test split and documented normalisation.

=============== ============ ======================================================================
name            shape        source and normalisation
=============== ============ ======================================================================
fashion-mnist   (1, 28, 28)  IDX files; pixels/255, then (x − 0.2860) / 0.3530
mnist           (1, 28, 28)  IDX files; pixels/255, then (x − 0.1307) / 0.3081
cifar10         (3, 32, 32)  python pickle batches; per-channel mean (0.4914, 0.4822, 0.4465),
                             std (0.2470, 0.2435, 0.2616)
cifar100        (3, 32, 32)  as cifar10 with mean (0.5071, 0.4865, 0.4409), std (0.2673, 0.2564,
                             0.2762); fine labels
digits          (1, 8, 8)    scikit-learn's bundled 8×8 digits (1,797 images), pixels/16, then
                             standardised by the training split's mean/std; fixed seeded split
                             of 1,437 train / 360 test
synthetic       (d,)         seeded Gaussian mixture (two clusters per class), no files needed
python-stdlib   (128,)       the Python standard library's own ``*.py`` sources as bytes, split
                             by file; windows of 128 byte ids, next-byte targets ``(N, 128)``,
                             256 classes (:mod:`lmckit.data.text`); ``root``: any source tree
=============== ============ ======================================================================

``pad_to=32`` zero-pads images *before* normalisation (so the border is background), e.g. to
feed 28×28 (Fashion-)MNIST to the CIFAR-sized conv nets.

IDX lookup order: an explicit ``root`` alone (``root`` or ``root/<name>``; files missing
there are an error naming them, never a reason to use a copy found elsewhere); without one,
``$LMCKIT_DATA/<name>`` and ``$LMCKIT_DATA`` →
``~/.cache/lmckit/<name>`` → ``/usr/share/datasets/fashion-mnist`` (Debian package
``dataset-fashion-mnist``; Fashion-MNIST only) → a download from the canonical URLs into
the cache, verified by MD5. CIFAR is looked up the same way (directory
``cifar-10-batches-py`` / ``cifar-100-python``) and downloaded as the official tarball.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lmckit.data.cifar import CIFAR10_FILES, CIFAR100_FILES, read_cifar_batch
from lmckit.data.dataset import Batches, Dataset, DataSource
from lmckit.data.download import download, extract_tar
from lmckit.data.idx import read_idx
from lmckit.data.text import DEFAULT_CONTEXT, load_code_corpus
from lmckit.errors import DataError, DatasetNotFoundError
from lmckit.options import checked

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# Canonical sources: (mirrors, {file.gz: md5}); the MD5s are those published with the data.
IDX_SOURCES: dict[str, tuple[list[str], dict[str, str]]] = {
    "fashion-mnist": (
        [
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ],
        {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
    ),
    "mnist": (
        [
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ],
        {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    ),
}
CIFAR_SOURCES = {
    "cifar10": (
        "cifar-10-batches-py",
        ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"],
        "c58f30108f718f92721af3b95e74349a",
    ),
    "cifar100": (
        "cifar-100-python",
        ["https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"],
        "eb9058c3a382ffc7106e4002c42a8d85",
    ),
}
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
NORMALISATION = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
DATASETS = ("fashion-mnist", "mnist", "cifar10", "cifar100", "digits", "synthetic", "python-stdlib")
# Input shape of each dataset as stored (before any padding); synthetic's is its default.
INPUT_SHAPES = {
    "fashion-mnist": (1, 28, 28),
    "mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
    "digits": (1, 8, 8),
    "synthetic": (32,),
    "python-stdlib": (DEFAULT_CONTEXT,),
}
ALIASES = {
    "fmnist": "fashion-mnist",
    "fashion_mnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
    "stdlib": "python-stdlib",
}


def as_batches(
    data: DataSource,
    *,
    batch_size: int = 256,
    shuffle: bool = True,
    seed: int = 0,
    split: str = "train",
    passes: int = 1,
) -> Batches:
    """``data`` as ``(x, y)`` batches: a :class:`Dataset` becomes a loader over ``split``
    (shuffled by ``seed`` when ``shuffle``), anything iterable is used as given.

    Raises:
        DataError: ``data`` is not iterable, or is a one-shot iterator although the caller
            makes ``passes > 1`` over it (the later passes would silently see nothing).
    """
    if isinstance(data, Dataset):
        return data.loader(split, batch_size=batch_size, shuffle=shuffle, seed=seed)
    if isinstance(data, str | bytes) or not isinstance(data, Iterable):
        raise DataError(
            f"data must be an lmckit Dataset or an iterable of (x, y) batches, got "
            f"{type(data).__name__}"
        )
    if passes > 1 and iter(data) is data:
        raise DataError(
            f"data is a one-shot iterator ({type(data).__name__}) but {passes} passes are "
            "needed; pass a list of batches, a DataLoader or an lmckit Dataset"
        )
    if isinstance(data, list | tuple):  # batches held in memory: each one checked up front
        bad = next(
            (
                (i, b)
                for i, b in enumerate(data)
                if not (isinstance(b, list | tuple) and 1 <= len(b) <= 2)
                or not isinstance(b[0], Tensor)
                or (len(b) == 2 and b[1] is not None and not isinstance(b[1], Tensor))
            ),
            None,
        )
        if bad is not None:
            raise DataError(
                f"data[{bad[0]}] is {type(bad[1]).__name__} {bad[1]!r}"[:120]
                + "; each batch must be (inputs, labels) tensors (or (inputs,))"
            )
    return data


def _normalise(images: np.ndarray, scale: float, mean, std, pad_to: int | None) -> Tensor:
    """uint8 ``(N, C, H, W)`` → float32, padded (background 0) then standardised per channel."""
    x = torch.from_numpy(images).float().div_(scale)
    if pad_to is not None:
        h, w = x.shape[-2:]
        if pad_to < max(h, w):
            raise DataError(f"pad_to={pad_to} is smaller than the images ({h}×{w})")
        top, left = (pad_to - h) // 2, (pad_to - w) // 2
        x = F.pad(x, (left, pad_to - w - left, top, pad_to - h - top))
    mean_t = torch.tensor(mean).view(1, -1, 1, 1)
    std_t = torch.tensor(std).view(1, -1, 1, 1)
    return x.sub_(mean_t).div_(std_t).contiguous()


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lmckit"


def _candidates(name: str, root: str | os.PathLike | None, subdir: str) -> list[Path]:
    out: list[Path] = []
    if root is not None:
        # An explicit folder that does not exist is a mistake to report, not a hint to
        # ignore in favour of some other copy of the data.
        if not Path(root).is_dir():
            what = "is not a folder" if Path(root).exists() else "does not exist"
            raise DatasetNotFoundError(f"data folder {root} {what}")
        # the data the user pointed at, or an error: never a copy found elsewhere
        return [Path(root), Path(root) / subdir]
    env = os.environ.get("LMCKIT_DATA")
    if env:
        out += [Path(env) / subdir, Path(env)]
    out.append(_cache_dir() / subdir)
    if name == "fashion-mnist":
        out.append(DEBIAN_FASHION_MNIST)
    return out


def _find_idx_file(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def _load_idx_dir(directory: Path) -> dict[str, np.ndarray] | None:
    files = {k: _find_idx_file(directory, stem) for k, stem in IDX_FILES.items()}
    if any(f is None for f in files.values()):
        return None
    return {k: read_idx(f) for k, f in files.items()}


def _download_target(subdir: str) -> Path:
    env = os.environ.get("LMCKIT_DATA")
    return (Path(env) if env else _cache_dir()) / subdir


def _how_to_get(name: str) -> str:
    tips = ["pass root=/path (CLI: --data-dir)", "set $LMCKIT_DATA"]
    if name == "fashion-mnist":
        tips.insert(0, "install the Debian package: apt-get install dataset-fashion-mnist")
    return "; ".join(tips) + "; or allow a download (download=True) on a machine with internet"


def _not_found(name: str, what: str, looked: list[Path], failure: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"{name} not found. Looked for {what} in: {', '.join(str(p) for p in looked)}. "
        f"Download: {failure}. To get it: {_how_to_get(name)}."
    )


def _check_labels(labels: np.ndarray, num_classes: int, what: str) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(((labels < 0) | (labels >= num_classes)).sum())
        raise DataError(
            f"{what}: {bad} label(s) outside [0, {num_classes}) (found {int(labels.min())}.."
            f"{int(labels.max())}); the file is corrupted or not this dataset"
        )


def _refuse_incomplete_idx(name: str, directory: Path) -> None:
    found = {k: _find_idx_file(directory, stem) for k, stem in IDX_FILES.items()}
    missing = [IDX_FILES[k] for k, f in found.items() if f is None]
    if 0 < len(missing) < len(IDX_FILES):
        raise DatasetNotFoundError(
            f"{name} in {directory} is incomplete: {', '.join(missing)}[.gz] missing "
            "(complete it or remove the folder's IDX files)"
        )


def load_idx_dataset(
    name: str, root=None, *, download_missing: bool = True, pad_to=None
) -> Dataset:
    """Fashion-MNIST or MNIST from IDX files (see the module docstring for the lookup order)."""
    looked = _candidates(name, root, name)
    download_target = _download_target(name) if download_missing and root is None else None
    arrays, where = None, None
    for directory in looked:
        arrays = _load_idx_dir(directory)
        if arrays is not None:
            where = directory
            break
        # A partial copy is a mistake to report, never a reason to take another copy
        # silently — except where a download is about to complete it.
        if root is None and directory != download_target:
            _refuse_incomplete_idx(name, directory)
    if arrays is None and root is not None:
        for directory in looked:
            _refuse_incomplete_idx(name, directory)
        raise DatasetNotFoundError(
            f"{name} is not in the data folder {root} (looked for "
            f"{IDX_FILES['train_images']}[.gz] and the other three IDX files in "
            f"{', '.join(str(d) for d in looked)})"
        )
    if arrays is None:
        failure = "downloads disabled"
        if download_missing:
            mirrors, md5s = IDX_SOURCES[name]
            target = _download_target(name)
            try:
                for fname, md5 in md5s.items():
                    download([m + fname for m in mirrors], target / fname, md5)
                arrays, where = _load_idx_dir(target), target
            except DataError as exc:
                failure = str(exc)
        if arrays is None:
            raise _not_found(name, f"{IDX_FILES['train_images']}[.gz] and friends", looked, failure)
    for split in ("train", "test"):
        n_img, n_lab = len(arrays[f"{split}_images"]), len(arrays[f"{split}_labels"])
        if n_img != n_lab or arrays[f"{split}_images"].ndim != 3:
            raise DataError(
                f"{name} in {where}: {split} images {arrays[f'{split}_images'].shape} do not "
                f"match labels {arrays[f'{split}_labels'].shape}"
            )
        _check_labels(arrays[f"{split}_labels"], 10, f"{name} {split} labels in {where}")
    mean, std = NORMALISATION[name]
    return Dataset(
        name=name,
        train_x=_normalise(arrays["train_images"][:, None], 255.0, mean, std, pad_to),
        train_y=torch.from_numpy(arrays["train_labels"].astype(np.int64)),
        test_x=_normalise(arrays["test_images"][:, None], 255.0, mean, std, pad_to),
        test_y=torch.from_numpy(arrays["test_labels"].astype(np.int64)),
        num_classes=10,
        source=str(where),
    )


def load_cifar(name: str, root=None, *, download_missing: bool = True, pad_to=None) -> Dataset:
    """CIFAR-10 or CIFAR-100 from the python batches (see the module docstring)."""
    subdir, urls, md5 = CIFAR_SOURCES[name]
    files = CIFAR10_FILES if name == "cifar10" else CIFAR100_FILES
    label_key = "labels" if name == "cifar10" else "fine_labels"
    looked = _candidates(name, root, subdir)
    every_file = files["train"] + files["test"]
    download_folder = _download_target("") / subdir if download_missing and root is None else None

    def refuse_incomplete(directory: Path) -> None:
        missing = [f for f in every_file if not (directory / f).is_file()]
        if 0 < len(missing) < len(every_file):
            raise DatasetNotFoundError(
                f"{name} in {directory} is incomplete: {', '.join(missing)} missing"
            )

    where = None
    for directory in looked:
        if all((directory / f).is_file() for f in every_file):
            where = directory
            break
        # a partial copy is reported, never skipped for another copy (unless a download
        # is about to replace it)
        if root is None and directory != download_folder:
            refuse_incomplete(directory)
    if where is None and root is not None:
        for directory in looked:
            refuse_incomplete(directory)
        raise DatasetNotFoundError(
            f"{name} is not in the data folder {root} (looked for {subdir}/ with "
            f"{files['test'][0]} in {', '.join(str(d) for d in looked)})"
        )
    if where is None:
        failure = "downloads disabled"
        if download_missing:
            target = _download_target("")
            try:
                archive = download(urls, target / f"{subdir}.tar.gz", md5)
                extract_tar(archive, target)
                where = target / subdir
            except DataError as exc:
                failure = str(exc)
        if where is None:
            raise _not_found(name, f"{subdir}/ with {files['test'][0]}", looked, failure)
    parts = {}
    num_classes = 10 if name == "cifar10" else 100
    for split in ("train", "test"):
        batches = [read_cifar_batch(where / f, label_key) for f in files[split]]
        for f, (_, labels) in zip(files[split], batches, strict=True):
            _check_labels(labels, num_classes, f"{name} labels in {where / f}")
        parts[split] = (
            np.concatenate([b[0] for b in batches]),
            np.concatenate([b[1] for b in batches]),
        )
    mean, std = NORMALISATION[name]
    return Dataset(
        name=name,
        train_x=_normalise(parts["train"][0], 255.0, mean, std, pad_to),
        train_y=torch.from_numpy(parts["train"][1]),
        test_x=_normalise(parts["test"][0], 255.0, mean, std, pad_to),
        test_y=torch.from_numpy(parts["test"][1]),
        num_classes=num_classes,
        augment=True,
        source=str(where),
    )


def load_digits_dataset(*, pad_to: int | None = None, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8×8 digits, split 1,437 / 360 by a seeded permutation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        raise DataError(
            "the digits dataset needs scikit-learn (pip install scikit-learn)"
        ) from None
    bunch = load_digits()
    images = bunch.images.astype(np.float32)[:, None]  # (1797, 1, 8, 8), values 0..16
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    n_test = 360
    test_idx, train_idx = order[:n_test], order[n_test:]
    x = torch.from_numpy(images) / 16.0
    if pad_to is not None:
        pad = pad_to - 8
        x = F.pad(x, (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2))
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    return Dataset(
        name="digits",
        train_x=x[train_idx].contiguous(),
        train_y=labels[train_idx],
        test_x=x[test_idx].contiguous(),
        test_y=labels[test_idx],
        num_classes=10,
        source="sklearn.datasets.load_digits",
    )


@checked
def make_synthetic(
    *, n_train: int = 4000, n_test: int = 1000, dim: int = 32, num_classes: int = 4, seed: int = 0
) -> Dataset:
    """A seeded Gaussian mixture: each class is two clusters in ``dim`` dimensions, so a
    linear model cannot fit it perfectly but a small MLP can."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, 2, dim, generator=g) * 1.5

    def sample(n: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(0, num_classes, (n,), generator=g)
        which = torch.randint(0, 2, (n,), generator=g)
        x = centres[y, which] + torch.randn(n, dim, generator=g)
        return x, y

    train_x, train_y = sample(n_train)
    test_x, test_y = sample(n_test)
    mean, std = train_x.mean(0), train_x.std(0)
    return Dataset(
        name="synthetic",
        train_x=(train_x - mean) / std,
        train_y=train_y,
        test_x=(test_x - mean) / std,
        test_y=test_y,
        num_classes=num_classes,
        source=f"synthetic(seed={seed}, dim={dim}, classes={num_classes})",
    )


@checked
def canonical_name(name: str) -> str:
    """The registry name of a dataset (accepts aliases such as ``fmnist``, ``cifar-10``)."""
    if not isinstance(name, str):
        raise DataError(f"a dataset name must be a string, got {type(name).__name__}")
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    return key


@checked
def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    pad_to: int | None = None,
) -> Dataset:
    """Load a dataset by name (``fashion-mnist``, ``mnist``, ``cifar10``, ``cifar100``,
    ``digits``, ``synthetic``, ``python-stdlib``); see the module docstring for lookup and
    normalisation. For ``python-stdlib``, ``root`` is the source tree to read instead of this
    interpreter's standard library.

    Raises:
        DatasetNotFoundError: the files were found nowhere; the message lists where lmckit
            looked and how to get the data.
        DataError: a file exists but is corrupted or of the wrong format.
    """
    key = canonical_name(name)
    if root is not None and key in ("digits", "synthetic"):
        raise DataError(f"{key} needs no data folder (it is built in); drop the folder {root}")
    if key in IDX_SOURCES:
        return load_idx_dataset(key, root, download_missing=download, pad_to=pad_to)
    if key in CIFAR_SOURCES:
        return load_cifar(key, root, download_missing=download, pad_to=pad_to)
    if key == "python-stdlib":
        if pad_to is not None:
            raise DataError("python-stdlib is text (byte windows): it takes no pad_to")
        return load_code_corpus(root)
    if key == "digits":
        return load_digits_dataset(pad_to=pad_to)
    return make_synthetic()


@checked
def fashion_mnist_available(root: str | os.PathLike | None = None) -> bool:
    """Whether Fashion-MNIST can be loaded without a download."""
    return any(_load_idx_dir_exists(d) for d in _candidates("fashion-mnist", root, "fashion-mnist"))


def _load_idx_dir_exists(directory: Path) -> bool:
    return all(_find_idx_file(directory, stem) is not None for stem in IDX_FILES.values())
