"""CCMM: Frank–Wolfe over doubly-stochastic maps, started from star-WM or a given start."""

import pytest

from lmckit.merge import ccmm, star
from lmckit.params import pairwise_inner_sum
from lmckit.perm import Permutation
from tests.merge.common import random_models


def test_ccmm_objective_never_decreases_and_beats_the_unaligned_models():
    _, spec, params = random_models(4, hidden=(32, 32))
    fw = ccmm(spec, params)
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(fw.history, fw.history[1:], strict=False))
    aligned = [p.apply(x) for p, x in zip(fw.perms, params, strict=True)]
    assert float(pairwise_inner_sum(aligned)) > float(pairwise_inner_sum(params))
    assert fw.info["init"] == "star-wm"


def test_ccmm_takes_a_start_per_model():
    _, spec, params = random_models(3)
    default = ccmm(spec, params, seed=0)
    start = list(star(spec, params, seed=0).perms)
    given = ccmm(spec, params, seed=0, init=start)
    assert given.perms == default.perms and given.info["init"] == "given"
    from_identity = ccmm(spec, params, init=[Permutation.identity(spec)] * 3)
    assert from_identity.history[0] == float(pairwise_inner_sum(params))


def test_ccmm_improves_strictly_beyond_its_star_start():
    for seed in range(2):
        _, spec, params = random_models(4, hidden=(32, 32), seed=seed)
        start = float(
            pairwise_inner_sum(
                [p.apply(x) for p, x in zip(star(spec, params).perms, params, strict=True)]
            )
        )
        fw = ccmm(spec, params)
        assert fw.history[0] == pytest.approx(start)
        aligned = [p.apply(x) for p, x in zip(fw.perms, params, strict=True)]
        assert float(pairwise_inner_sum(aligned)) > 1.1 * start
        assert fw.iterations > 1
