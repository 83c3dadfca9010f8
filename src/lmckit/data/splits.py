"""Index splits used by the papers' experiments. All return sorted ``LongTensor`` indices."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lmckit.errors import DataError
from lmckit.options import checked


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


@checked
def _class_labels(labels: Tensor) -> Tensor:
    """One class label per example (int64, CPU), or a :class:`DataError`: a class-based
    split of a language model's next-token targets ``(N, L)`` has no meaning."""
    labels = torch.as_tensor(labels)
    if labels.ndim != 1:
        raise DataError(
            f"a class-based split needs one label per example, got labels of shape "
            f"{tuple(labels.shape)} (next-token targets?); split such data with kind = 'random'"
        )
    if labels.numel() == 0:
        raise DataError("a class-based split needs at least one labelled example, got none")
    return labels.long().cpu()


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
    labels = _class_labels(labels)
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


@checked
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


@checked
def random_subset(n: int, fraction: float, *, seed: int = 0) -> Tensor:
    """A random ``fraction`` of ``range(n)``."""
    return random_partition(n, [fraction], seed=seed)[0]


@checked
def holdout_split(n: int, fraction: float = 0.2, *, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``(held_out, rest)``: e.g. the calibration split (default 20 % of the test set) on which
    a temperature is fitted, and the remainder on which calibrated metrics are reported."""
    if n < 0:
        raise DataError(f"holdout_split needs a number of examples ≥ 0, got {n}")
    held, rest = random_partition(n, [fraction, 1.0 - fraction], seed=seed)
    return held, rest


@checked
def dirichlet_split(
    labels: Tensor,
    *,
    clients: int,
    alpha: float,
    num_classes: int | None = None,
    seed: int = 0,
) -> list[Tensor]:
    """A label-skewed non-IID partition over ``clients`` (Hsu et al. 2019, the usual
    federated-learning benchmark split): for every class, proportions over the clients are
    drawn from ``Dirichlet(α·1)`` and the class's examples, shuffled, are cut at those
    proportions. Large ``α`` gives every client about the same class mix; small ``α`` gives
    each class (almost) to one client. Disjoint, covering every example once, seeded.

    A client may get no example at all when ``α`` is small; :meth:`Split.indices` refuses
    to train on an empty part.
    """
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise DataError(f"clients must be a positive integer, got {clients!r}")
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha > 0):
        raise DataError(f"alpha must be a positive number, got {alpha!r}")
    labels = _class_labels(labels)
    num_classes = int(num_classes or int(labels.max()) + 1)
    shuffle = _generator(seed)
    rng = np.random.default_rng([int(seed), 0xD1])
    parts: list[list[Tensor]] = [[] for _ in range(clients)]
    for c in range(num_classes):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=shuffle)]
        shares = rng.dirichlet(np.full(clients, float(alpha)))
        if not np.all(np.isfinite(shares)):  # every gamma draw underflowed: α is tiny
            shares = np.eye(clients)[rng.integers(clients)]
        cuts = np.rint(np.cumsum(shares) * len(idx)).astype(np.int64)
        cuts[-1] = len(idx)
        start = 0
        for k, end in enumerate(cuts):
            parts[k].append(idx[start:end])
            start = max(start, int(end))
    return [torch.cat(p).sort().values for p in parts]


SPLIT_KINDS = ("class-imbalanced", "dirichlet", "random")
KIND_SETTINGS = {
    "class-imbalanced": ("fraction",),
    "dirichlet": ("clients", "alpha"),
    "random": ("clients",),
}
"""The settings each kind of split takes (besides ``kind``, ``part`` and ``seed``)."""


@dataclass(frozen=True)
class Split:
    """The part of a training set one model trains on.

    Attributes:
        kind: ``"class-imbalanced"`` (Git Re-Basin §5.4: part 0 = "a" has ``fraction`` of
            each lower-half class and ``1 − fraction`` of each upper-half class, part 1 = "b"
            the rest), ``"dirichlet"`` (:func:`dirichlet_split` over ``clients`` with
            ``alpha``) or ``"random"`` (``clients`` random parts of equal size).
        part: which part, ``0 … parts − 1``.
        fraction, clients, alpha: the kind's parameters (:data:`KIND_SETTINGS`; a table
            naming another kind's is refused by :meth:`from_dict`).
        seed: the partition's seed — shared by every part, independent of the training
            seed, so that the clients of one partition train on disjoint data.
    """

    kind: str
    part: int
    fraction: float = 0.2
    clients: int = 2
    alpha: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SPLIT_KINDS:
            raise DataError(f"split kind must be one of {SPLIT_KINDS}, got {self.kind!r}")
        for name, value in (("fraction", self.fraction), ("alpha", self.alpha)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataError(f"split {name} must be a number, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DataError(f"split seed must be a non-negative integer, got {self.seed!r}")
        if self.kind == "class-imbalanced":
            if not 0.0 < self.fraction < 1.0:
                raise DataError(
                    f"split fraction must be in (0, 1), got {self.fraction} (at 0 or 1 the "
                    "two parts hold disjoint classes and nothing of the other's)"
                )
        elif isinstance(self.clients, bool) or not isinstance(self.clients, int):
            raise DataError(f"split clients must be an integer, got {self.clients!r}")
        elif self.clients < 1:
            raise DataError(f"split clients must be ≥ 1, got {self.clients}")
        if self.kind == "dirichlet" and not (math.isfinite(self.alpha) and self.alpha > 0):
            raise DataError(f"split alpha must be a positive number, got {self.alpha}")
        names = (
            "a or b (0 or 1)" if self.kind == "class-imbalanced" else f"0 … {self.parts_count - 1}"
        )
        if isinstance(self.part, bool) or not isinstance(self.part, int):
            raise DataError(f"split part must be {names}, got {self.part!r}")
        if not 0 <= self.part < self.parts_count:
            raise DataError(f"split part must be {names}, got {self.part}")

    @property
    def parts_count(self) -> int:
        """How many parts the partition has."""
        return 2 if self.kind == "class-imbalanced" else self.clients

    def parts(self, labels: Tensor, num_classes: int | None = None) -> list[Tensor]:
        """Every part's sorted indices into ``labels`` (the training labels)."""
        if self.kind == "class-imbalanced":
            return list(
                class_imbalanced_split(
                    labels, fraction=self.fraction, num_classes=num_classes, seed=self.seed
                )
            )
        if self.kind == "dirichlet":
            return dirichlet_split(
                labels, clients=self.clients, alpha=self.alpha, num_classes=num_classes,
                seed=self.seed,
            )  # fmt: skip
        return random_partition(len(labels), [1.0 / self.clients] * self.clients, seed=self.seed)

    def indices(self, labels: Tensor, num_classes: int | None = None) -> Tensor:
        """This part's sorted indices.

        Raises:
            DataError: the part is empty (a small Dirichlet ``alpha`` can leave a client
                without data).
        """
        idx = self.parts(labels, num_classes)[self.part]
        if len(idx) == 0:
            raise DataError(f"{self.describe()} holds no training example")
        return idx

    def to_dict(self) -> dict[str, Any]:
        """The kind, the part, the seed and the kind's own parameters (JSON-ready)."""
        out: dict[str, Any] = {"kind": self.kind, "part": self.part, "seed": self.seed}
        if self.kind == "class-imbalanced":
            out["fraction"] = self.fraction
        else:
            out["clients"] = self.clients
        if self.kind == "dirichlet":
            out["alpha"] = self.alpha
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Split:
        """Inverse of :meth:`to_dict`; ``part`` may be ``"a"``/``"b"`` for the
        class-imbalanced split. Unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise DataError(f"a split must be a table of settings, got {data!r}")
        known = {"kind", "part", "fraction", "clients", "alpha", "seed"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"unknown split setting(s) {unknown}; known: {sorted(known)}")
        if "kind" not in data or "part" not in data:
            raise DataError(f"a split needs a kind and a part, got {dict(data)}")
        own = KIND_SETTINGS.get(data["kind"])
        foreign = sorted(set(data) - {"kind", "part", "seed"} - set(own or ()))
        if own is not None and foreign:
            raise DataError(
                f"split kind {data['kind']!r} takes no {', '.join(foreign)} (its settings: "
                f"{', '.join(own)}, seed)"
            )
        fields = dict(data)
        if fields["part"] in ("a", "b"):
            fields["part"] = "ab".index(fields["part"])
        return cls(**fields)

    def describe(self) -> str:
        """A short human label, e.g. ``"dirichlet(α=0.1) part 2 of 4"``."""
        if self.kind == "class-imbalanced":
            return f"class-imbalanced({self.fraction:g}) part {'ab'[self.part]}"
        params = f"(α={self.alpha:g})" if self.kind == "dirichlet" else ""
        return f"{self.kind}{params} part {self.part} of {self.clients}"


@checked
def indices_digest(indices: Tensor) -> str:
    """SHA-256 of an index vector (as int64), for records of which examples were used."""
    return hashlib.sha256(indices.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()
