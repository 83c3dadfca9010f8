"""The in-memory dataset every loader of :mod:`lmckit.data` returns (its own module, so
that the readers of each format — images, CIFAR, the code corpus — import it without
importing each other)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lmckit.data.loaders import TensorLoader, random_crop_flip
from lmckit.errors import DataError


@dataclass(frozen=True)
class Dataset:
    """A classification dataset held in memory, already normalised.

    Attributes:
        train_x, test_x: float32 inputs ``(N, *input_shape)``.
        train_y, test_y: int64 labels ``(N,)`` in ``[0, num_classes)``.
        augment: whether the papers train this data with random crop + flip (CIFAR).
        source: where the data was read from (for checkpoint sidecars).
    """

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int
    augment: bool = False
    source: str = ""

    @functools.cached_property
    def fingerprint(self) -> str:
        """The data's identity: SHA-256 over the name, the number of classes and every
        example's and label's bytes (after normalisation and padding), so two datasets
        share a fingerprint exactly when they hold the same data."""
        digest = hashlib.sha256(f"{self.name}|{self.num_classes}|".encode())
        for t in (self.train_x, self.train_y, self.test_x, self.test_y):
            t = t.detach().cpu().contiguous()
            digest.update(f"{t.dtype}{tuple(t.shape)}|".encode())
            digest.update(t.view(torch.uint8).numpy() if t.numel() else b"")
        return digest.hexdigest()

    @property
    def next_token(self) -> bool:
        """Whether this is a language model's data: token-id windows ``(N, L)`` with a
        next-token target at every position (``python-stdlib``), scored per token."""
        return self.train_y.ndim == 2

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, e.g. ``(1, 28, 28)``."""
        return tuple(self.train_x.shape[1:])

    def subset(self, train_idx: Tensor | None = None, test_idx: Tensor | None = None) -> Dataset:
        """The same dataset restricted to the given train/test indices."""
        return replace(
            self,
            train_x=self.train_x if train_idx is None else self.train_x[train_idx],
            train_y=self.train_y if train_idx is None else self.train_y[train_idx],
            test_x=self.test_x if test_idx is None else self.test_x[test_idx],
            test_y=self.test_y if test_idx is None else self.test_y[test_idx],
        )

    def loader(
        self,
        split: str = "train",
        *,
        batch_size: int = 512,
        shuffle: bool | None = None,
        seed: int = 0,
        augment: bool = False,
        drop_last: bool = False,
        device: torch.device | str | None = None,
    ) -> TensorLoader:
        """A :class:`TensorLoader` over ``split`` ("train" or "test"); shuffled by default for
        train only. ``augment`` applies random crop + flip (images only)."""
        if split not in ("train", "test"):
            raise DataError(f"split must be 'train' or 'test', got {split!r}")
        x, y = (self.train_x, self.train_y) if split == "train" else (self.test_x, self.test_y)
        if augment and x.ndim != 4:
            raise DataError(
                f"augmentation needs images (N, C, H, W); {self.name} has {tuple(x.shape)}"
            )
        return TensorLoader(
            x,
            y,
            batch_size=batch_size,
            shuffle=split == "train" if shuffle is None else shuffle,
            seed=seed,
            drop_last=drop_last,
            augment=random_crop_flip if augment else None,
            device=device,
        )


Batches = Iterable[tuple[Tensor, Tensor]]
"""Anything that yields ``(x, y)`` batches: a :class:`TensorLoader`, a ``DataLoader``, a list."""

DataSource = Dataset | Batches
"""What the data-driven methods accept as ``data=``: a :class:`Dataset` or batches."""
