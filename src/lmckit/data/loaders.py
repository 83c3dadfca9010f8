"""Batch iteration over in-memory tensors, with seeded shuffling and batched augmentation.

A :class:`TensorLoader` yields ``(x, y)`` batches like a ``DataLoader`` over a
``TensorDataset`` but slices whole batches at once (no per-item Python work), which is what
makes small models train fast on CPU. Epoch ``e`` of a loader with seed ``s`` always visits
the same order, so training is reproducible and resumable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lmckit.errors import DataError
from lmckit.options import checked

Augment = Callable[[Tensor, torch.Generator], Tensor]


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator determined by ``(seed, epoch)``, independent across both."""
    state = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


@checked
def random_crop_flip(x: Tensor, generator: torch.Generator, *, padding: int = 4) -> Tensor:
    """The papers' CIFAR augmentation, batched: zero-pad by ``padding``, take a random crop of
    the original size, flip horizontally with probability ½. ``x``: ``(N, C, H, W)``."""
    n, _, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = (dy[:, None] + torch.arange(h)).to(x.device)  # (N, H)
    cols = dx[:, None] + torch.arange(w)  # (N, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols).to(x.device)
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


class TensorLoader:
    """Iterate over ``(x[idx], y[idx])`` batches.

    Args:
        x: inputs ``(N, ...)``; y: integer labels ``(N,)``.
        batch_size: examples per batch.
        shuffle: visit a fresh random order each epoch (seeded by ``(seed, epoch)``).
        seed: fixes the order and the augmentation draws.
        drop_last: skip a final incomplete batch.
        augment: ``f(x_batch, generator) -> x_batch``, e.g. :func:`random_crop_flip`.
        device: where batches are moved (default: where ``x`` lives).

    Each ``iter()`` starts the next epoch; :meth:`set_epoch` chooses it explicitly.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        *,
        batch_size: int = 512,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        augment: Augment | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if len(x) != len(y):
            raise DataError(f"x has {len(x)} examples but y has {len(y)}")
        if batch_size < 1:
            raise DataError(f"batch_size must be ≥ 1, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size = int(batch_size)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.augment = augment
        self.device = torch.device(device) if device is not None else None
        self.epoch = 0

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_examples(self) -> int:
        """Number of examples the loader covers."""
        return len(self.x)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` visit epoch ``epoch``'s order."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        g = epoch_generator(self.seed, self.epoch)
        self.epoch += 1
        n = len(self.x)
        order = torch.randperm(n, generator=g) if self.shuffle else None
        for b in range(len(self)):
            sl = slice(b * self.batch_size, min((b + 1) * self.batch_size, n))
            if order is None:
                xb, yb = self.x[sl], self.y[sl]
            else:
                idx = order[sl].to(self.x.device)
                xb, yb = self.x[idx], self.y[idx]
            if self.augment is not None:
                xb = self.augment(xb, g)
            if self.device is not None:
                xb, yb = (
                    xb.to(self.device, non_blocking=True),
                    yb.to(self.device, non_blocking=True),
                )
            yield xb, yb
