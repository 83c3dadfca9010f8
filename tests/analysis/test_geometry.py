"""Simplex geometry: distance ratios and triplet angles against closed forms."""

import math

import pytest
import torch

from lmckit.analysis import distance_ratios, pairwise_distances, triplet_angles
from lmckit.errors import ParamsError


def test_geometry_of_a_regular_simplex_and_a_right_triangle():
    eye = [{"w": torch.eye(4)[i]} for i in range(4)]  # vertices of a regular 3-simplex
    assert distance_ratios(eye) == pytest.approx([1.0] * 6)
    assert triplet_angles(eye) == pytest.approx([60.0] * 12)
    assert torch.allclose(pairwise_distances(eye), math.sqrt(2) * (1 - torch.eye(4).double()))
    right = [
        {"w": torch.tensor([0.0, 0.0])},
        {"w": torch.tensor([1.0, 0.0])},
        {"w": torch.tensor([0.0, 1.0])},
    ]
    assert sorted(triplet_angles(right)) == pytest.approx([45.0, 45.0, 90.0])


def test_coinciding_models_give_nan_not_a_crash():
    same = [{"w": torch.ones(3)}, {"w": torch.ones(3)}]
    assert all(math.isnan(r) for r in distance_ratios(same))
    two_equal = [{"w": torch.zeros(2)}, {"w": torch.zeros(2)}, {"w": torch.ones(2)}]
    angles = triplet_angles(two_equal)
    assert sum(math.isnan(a) for a in angles) == 2


def test_simplex_geometry_is_the_three_measures_from_one_distance_matrix():
    """Five random parameter sets: the pair distances are each pair's distance taken
    directly, and the ratios and angles equal the functions that compute them alone."""
    import itertools

    from lmckit.analysis import simplex_geometry
    from lmckit.params import params_distance

    torch.manual_seed(0)
    models = [{"w": torch.randn(3, 4, dtype=torch.float64)} for _ in range(5)]
    geometry = simplex_geometry(models)
    pairs = itertools.combinations(range(5), 2)
    assert geometry["pair_distances"] == pytest.approx(
        [params_distance(models[i], models[j]) for i, j in pairs], rel=1e-12
    )
    assert geometry["distance_ratios"] == pytest.approx(distance_ratios(models), rel=1e-12)
    assert geometry["triplet_angles"] == pytest.approx(triplet_angles(models), rel=1e-12)
    assert simplex_geometry(models[:2])["triplet_angles"] == []
    with pytest.raises(ParamsError, match="at least 2"):
        simplex_geometry(models[:1])
