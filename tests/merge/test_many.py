"""MergeMany: rounds of re-matching each model to the mean of the others."""

import pytest

from lmckit.merge import merge_many, star
from lmckit.params import pairwise_inner_sum
from lmckit.perm import Permutation
from tests.merge.common import random_models


def test_merge_many_improves_the_pairwise_objective_and_reports_it():
    _, spec, params = random_models(4, hidden=(32, 32))
    events = []
    result = merge_many(spec, params, progress=events.append)
    assert result.iterations >= 2 and len(result.history) == result.iterations
    assert result.history[-1] > result.history[0] > float(pairwise_inner_sum(params))
    aligned = [p.apply(x) for p, x in zip(result.perms, params, strict=True)]
    assert float(pairwise_inner_sum(aligned)) == pytest.approx(result.history[-1], rel=1e-12)
    assert [e.step for e in events] == list(range(1, result.iterations + 1))
    assert events[-1].metrics["changed"] == 0


def test_merge_many_from_its_own_answer_stops_at_once():
    _, spec, params = random_models(3)
    first = merge_many(spec, params, seed=1)
    again = merge_many(spec, params, seed=1, init=list(first.perms))
    assert again.iterations == 1 and again.perms == first.perms
    identity = merge_many(spec, params, seed=1, init=[Permutation.identity(spec)] * 3)
    assert identity.perms == first.perms


def test_merge_many_goes_beyond_star_weight_matching():
    """Planted copies are solved by star-WM alone; on independent models MergeMany must do
    better than aligning everything to one reference."""
    for seed in range(2):
        _, spec, params = random_models(4, hidden=(32, 32), seed=seed)
        star_aligned = [p.apply(x) for p, x in zip(star(spec, params).perms, params, strict=True)]
        result = merge_many(spec, params)
        assert result.history[-1] > 1.05 * float(pairwise_inner_sum(star_aligned))
