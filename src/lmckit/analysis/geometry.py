"""Simplex geometry of aligned models (STE-MM §6.1, Figs. 6/7/9/10): are the permuted models
the vertices of a regular simplex? Then all pairwise distances equal their mean and every
triplet's angles are 60°."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from lmckit.perm import Params


def _flat(params: Params) -> torch.Tensor:
    return torch.cat(
        [
            t.detach().reshape(-1).double().cpu()
            for t in params.values()
            if t.dtype.is_floating_point
        ]
    )


def pairwise_distances(aligned: Sequence[Params]) -> torch.Tensor:
    """``(n, n)`` matrix of L2 distances between the parameter vectors."""
    flat = torch.stack([_flat(p) for p in aligned])
    return torch.cdist(flat[None], flat[None])[0]


def distance_ratios(aligned: Sequence[Params]) -> list[float]:
    """``‖θ_i − θ_j‖ / mean_{k<l} ‖θ_k − θ_l‖`` for every pair ``i < j`` (all 1 for a regular
    simplex)."""
    d = pairwise_distances(aligned)
    pairs = [float(d[i, j]) for i, j in itertools.combinations(range(len(aligned)), 2)]
    mean = sum(pairs) / len(pairs)
    return [p / mean for p in pairs]


def triplet_angles(aligned: Sequence[Params]) -> list[float]:
    """The three interior angles (degrees) of every triangle ``(θ_i, θ_j, θ_k)``."""
    d = pairwise_distances(aligned)
    angles = []
    for i, j, k in itertools.combinations(range(len(aligned)), 3):
        a, b, c = float(d[j, k]), float(d[i, k]), float(d[i, j])  # sides opposite i, j, k
        for opp, s1, s2 in ((a, b, c), (b, a, c), (c, a, b)):
            cos = (s1 * s1 + s2 * s2 - opp * opp) / max(2 * s1 * s2, 1e-300)
            angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cos)))))
    return angles
