"""The papers' index splits."""

import pytest
import torch

from lmckit.data import (
    Split,
    class_imbalanced_split,
    dirichlet_split,
    holdout_split,
    indices_digest,
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


# ---- federated partitions: Dirichlet, random clients, the Split record ----


def _labels(per_class=600, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return labels[torch.randperm(len(labels), generator=g)]


def _shares(labels, parts, classes=10):
    """(clients, classes): each client's share of each class's examples."""
    counts = torch.stack([torch.bincount(labels[p], minlength=classes) for p in parts]).double()
    return counts / counts.sum(0, keepdim=True)


@pytest.mark.parametrize(
    "split",
    [
        Split("dirichlet", 0, clients=5, alpha=0.3, seed=2),
        Split("dirichlet", 0, clients=3, alpha=100.0),
        Split("random", 0, clients=4),
        Split("class-imbalanced", 0, fraction=0.2),
    ],
    ids=lambda s: s.kind,
)
def test_partitions_are_disjoint_and_cover_the_data(split):
    labels = _labels()
    parts = split.parts(labels)
    assert len(parts) == split.parts_count
    joined = torch.cat(parts)
    assert len(joined) == len(labels) and torch.equal(
        joined.sort().values, torch.arange(len(labels))
    )
    assert all(torch.equal(p, p.sort().values) for p in parts)


def test_dirichlet_large_alpha_is_near_uniform_and_small_alpha_near_one_class_per_client():
    labels = _labels()
    even = _shares(labels, dirichlet_split(labels, clients=4, alpha=1e4, seed=0))
    assert (even - 0.25).abs().max() < 0.03
    skewed = _shares(labels, dirichlet_split(labels, clients=4, alpha=1e-3, seed=0))
    assert skewed.max(0).values.min() > 0.99  # every class sits (almost) on one client
    middle = _shares(labels, dirichlet_split(labels, clients=4, alpha=1.0, seed=0))
    assert (middle - 0.25).abs().max() > 0.03 and middle.max(0).values.min() < 0.99


def test_the_same_seed_gives_the_same_partition_and_another_seed_another():
    labels = _labels()
    one = dirichlet_split(labels, clients=3, alpha=0.5, seed=7)
    again = dirichlet_split(labels, clients=3, alpha=0.5, seed=7)
    other = dirichlet_split(labels, clients=3, alpha=0.5, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(one, other, strict=True))


def test_a_split_names_its_part_and_round_trips():
    split = Split.from_dict({"kind": "class-imbalanced", "part": "b", "fraction": 0.2})
    assert split.part == 1 and split.describe() == "class-imbalanced(0.2) part b"
    assert Split.from_dict(split.to_dict()) == split
    fed = Split("dirichlet", 2, clients=4, alpha=0.1, seed=3)
    assert fed.to_dict() == {"kind": "dirichlet", "part": 2, "seed": 3, "clients": 4, "alpha": 0.1}
    assert fed.describe() == "dirichlet(α=0.1) part 2 of 4"
    assert Split("random", 1, clients=3).describe() == "random part 1 of 3"
    labels = _labels()
    assert torch.equal(fed.indices(labels), fed.parts(labels)[2])
    assert indices_digest(fed.indices(labels)) == indices_digest(fed.parts(labels)[2].clone())
    assert indices_digest(fed.indices(labels)) != indices_digest(fed.parts(labels)[1])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "iid", "part": 0}, "split kind must be one of"),
        ({"kind": "dirichlet", "part": 4, "clients": 4}, r"part must be 0 … 3, got 4"),
        ({"kind": "class-imbalanced", "part": 2}, r"part must be a or b \(0 or 1\)"),
        ({"kind": "dirichlet", "part": 0, "alpha": 0}, "alpha must be a positive number"),
        ({"kind": "random", "part": 0, "clients": 0}, "clients must be ≥ 1"),
        ({"kind": "class-imbalanced", "part": 0, "fraction": 1.5}, "fraction must be in"),
        ({"kind": "random", "part": 0, "shards": 3}, r"unknown split setting\(s\) \['shards'\]"),
        ({"kind": "random"}, "needs a kind and a part"),
    ],
)
def test_bad_splits_are_named(settings, message):
    with pytest.raises(DataError, match=message):
        Split.from_dict(settings)


def test_an_empty_client_is_refused():
    labels = torch.zeros(5, dtype=torch.long)  # one class of 5 examples over 8 clients
    parts = dirichlet_split(labels, clients=8, alpha=1e-3, seed=0)
    empty = next(k for k, p in enumerate(parts) if len(p) == 0)
    with pytest.raises(DataError, match=f"part {empty} of 8 holds no training example"):
        Split("dirichlet", empty, clients=8, alpha=1e-3).indices(labels)


def test_a_part_that_is_not_one_of_the_parts_is_named_with_the_parts_there_are():
    from lmckit.data.splits import Split

    for part in ("c", 2, -1, 1.5):
        with pytest.raises(DataError, match=r"split part must be a or b \(0 or 1\), got"):
            Split("class-imbalanced", part)
    with pytest.raises(DataError, match=r"split part must be 0 … 2, got 'x'"):
        Split("random", "x", clients=3)
