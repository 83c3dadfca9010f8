"""The papers' index splits."""

import pytest
import torch

from lmckit.data import (
    class_imbalanced_split,
    holdout_split,
    random_partition,
    random_subset,
)
from lmckit.errors import DataError


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
