"""Simplex geometry of aligned models (STE-MM §6.1, Figs. 6/7/9/10): are the permuted models
the vertices of a regular simplex? Then all pairwise distances equal their mean and every
triplet's angles are 60°."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from lmckit.errors import ParamsError
from lmckit.options import checked
from lmckit.params import Params, params_distance


@checked
def pairwise_distances(aligned: Sequence[Params]) -> torch.Tensor:
    """``(n, n)`` float64 matrix of L2 distances between the parameter sets."""
    n = len(aligned)
    d = torch.zeros(n, n, dtype=torch.float64)
    for i, j in itertools.combinations(range(n), 2):
        d[i, j] = d[j, i] = params_distance(aligned[i], aligned[j])
    return d


@checked
def distance_ratios(aligned: Sequence[Params]) -> list[float]:
    """``‖θ_i − θ_j‖ / mean_{k<l} ‖θ_k − θ_l‖`` for every pair ``i < j`` (all 1 for a regular
    simplex; NaN when all the models are identical)."""
    if len(aligned) < 2:
        raise ParamsError(f"distance ratios need at least 2 models, got {len(aligned)}")
    return _ratios(pairwise_distances(aligned))


@checked
def triplet_angles(aligned: Sequence[Params]) -> list[float]:
    """The three interior angles (degrees) of every triangle ``(θ_i, θ_j, θ_k)`` (NaN at a
    vertex where two of the models coincide)."""
    return _angles(pairwise_distances(aligned))


@checked
def simplex_geometry(aligned: Sequence[Params]) -> dict[str, list[float]]:
    """``pair_distances`` (``‖θ_i − θ_j‖`` for every pair ``i < j`` in
    ``itertools.combinations`` order), ``distance_ratios`` and ``triplet_angles`` (empty
    below three models) from one pass over the pairs: STE-MM Figs. 6, 9 and 7/10."""
    if len(aligned) < 2:
        raise ParamsError(f"the geometry of models needs at least 2 of them, got {len(aligned)}")
    d = pairwise_distances(aligned)
    return {
        "pair_distances": _pairs(d),
        "distance_ratios": _ratios(d),
        "triplet_angles": _angles(d),
    }


def _pairs(d: torch.Tensor) -> list[float]:
    return [float(d[i, j]) for i, j in itertools.combinations(range(len(d)), 2)]


def _ratios(d: torch.Tensor) -> list[float]:
    pairs = _pairs(d)
    mean = sum(pairs) / len(pairs)
    if mean == 0.0:  # identical models: no simplex, no ratios
        return [math.nan] * len(pairs)
    return [p / mean for p in pairs]


def _angles(d: torch.Tensor) -> list[float]:
    angles = []
    for i, j, k in itertools.combinations(range(len(d)), 3):
        a, b, c = float(d[j, k]), float(d[i, k]), float(d[i, j])  # sides opposite i, j, k
        for opp, s1, s2 in ((a, b, c), (b, a, c), (c, a, b)):
            if s1 == 0.0 or s2 == 0.0:  # two coinciding models: the angle is undefined
                angles.append(math.nan)
                continue
            cos = (s1 * s1 + s2 * s2 - opp * opp) / (2 * s1 * s2)
            angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cos)))))
    return angles
