"""Star merging: every model aligned to the reference by a two-model matcher."""

import pytest

from lmckit.errors import ParamsError
from lmckit.match import weight_matching
from lmckit.merge import star
from tests.merge.common import random_models


def test_star_is_independent_weight_matching_to_the_reference():
    _, spec, params = random_models(4)
    result = star(spec, params, reference=1, seed=2)
    for i, p in enumerate(params):
        expected = weight_matching(spec, params[1], p, seed=2).perm
        assert result.perms[i] == expected
    events = []
    star(spec, params, progress=events.append)
    assert [(e.step, e.total) for e in events] == [(1, 3), (2, 3), (3, 3)]


def test_star_rejects_unknown_matchers():
    _, spec, params = random_models(2)
    with pytest.raises(ParamsError, match="star method must be one of"):
        star(spec, params, method="magic")


def test_star_can_average_only_the_models_other_than_the_reference():
    """STE-MM Fig. 1 merges (1/(n−1)) Σ_{i<n} π_i(θ_i): the reference itself is left out."""
    import torch

    from lmckit.params import average_params

    _, spec, params = random_models(4)
    everything = star(spec, params)
    others = star(spec, params, average="others")
    assert others.perms == everything.perms and others.method == "star-wm-fast-others"
    expected = average_params(
        [p.apply(x) for p, x in zip(others.perms[:3], params[:3], strict=True)]
    )
    assert all(torch.allclose(others.merged[k], expected[k]) for k in expected)
    assert not torch.allclose(
        others.merged["layers.0.weight"], everything.merged["layers.0.weight"]
    )
    with pytest.raises(ParamsError, match="average must be"):
        star(spec, params, average="some")
