"""Index splits used by the papers' experiments. All return sorted ``LongTensor`` indices."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lmckit.errors import DataError


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def class_imbalanced_split(
    labels: Tensor, *, fraction: float = 0.2, num_classes: int | None = None, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Disjoint biased halves (Git Re-Basin §5.4).

    Dataset A gets ``fraction`` of the examples of each class in the lower half of the
    classes (0–49 for CIFAR-100) and ``1 − fraction`` of each class in the upper half; B
    gets the rest, i.e. the reverse. Together they cover every example once.
    """
    if not 0.0 <= fraction <= 1.0:
        raise DataError(f"fraction must be in [0, 1], got {fraction}")
    labels = torch.as_tensor(labels).long().cpu()
    num_classes = int(num_classes or int(labels.max()) + 1)
    g = _generator(seed)
    part_a, part_b = [], []
    for c in range(num_classes):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        share = fraction if c < num_classes // 2 else 1.0 - fraction
        k = round(share * len(idx))
        part_a.append(idx[:k])
        part_b.append(idx[k:])
    return torch.cat(part_a).sort().values, torch.cat(part_b).sort().values


def random_partition(n: int, fractions: Sequence[float], *, seed: int = 0) -> list[Tensor]:
    """Disjoint random subsets of ``range(n)`` with the given fractions (sum ≤ 1).

    ``random_partition(n, [0.5, 0.5])`` gives the two random halves of the width/split
    experiments; when the fractions sum to 1 every index is used (the last part takes the
    rounding remainder).
    """
    total = float(sum(fractions))
    if any(f < 0 for f in fractions) or total > 1 + 1e-9:
        raise DataError(f"fractions must be non-negative and sum to at most 1, got {fractions}")
    order = torch.randperm(n, generator=_generator(seed))
    sizes = [int(f * n) for f in fractions]
    if abs(total - 1) < 1e-9 and sizes:
        sizes[-1] = n - sum(sizes[:-1])
    parts, start = [], 0
    for size in sizes:
        parts.append(order[start : start + size].sort().values)
        start += size
    return parts


def random_subset(n: int, fraction: float, *, seed: int = 0) -> Tensor:
    """A random ``fraction`` of ``range(n)``."""
    return random_partition(n, [fraction], seed=seed)[0]


def holdout_split(n: int, fraction: float = 0.2, *, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``(held_out, rest)``: e.g. the calibration split (default 20 % of the test set) on which
    a temperature is fitted, and the remainder on which calibrated metrics are reported."""
    held, rest = random_partition(n, [fraction, 1.0 - fraction], seed=seed)
    return held, rest
