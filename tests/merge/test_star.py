"""Star merging: every model aligned to the reference by a two-model matcher."""

import pytest
import torch

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


def test_fedavg_weights_each_model_by_its_training_examples():
    """McMahan et al.'s FedAvg: Σ (n_k / N) θ_k, against the sum written out; the uniform
    average is what equal sizes give, and other sizes give another model."""
    from lmckit.merge import METHODS, average

    _, spec, params = random_models(3)
    sizes = [100, 400, 250]
    result = METHODS["fedavg"](spec, params, sizes=sizes)
    total = sum(sizes)
    for k, first in params[0].items():
        if first.dtype.is_floating_point:
            expected = sum(n / total * p[k].double() for n, p in zip(sizes, params, strict=True))
            assert torch.allclose(result.merged[k].double(), expected, atol=1e-6), k
    assert all(p.is_identity() for p in result.perms) and result.method == "fedavg"
    assert result.info["weights"] == pytest.approx([n / total for n in sizes])
    uniform = average(spec, params)
    equal = average(spec, params, sizes=[7, 7, 7])
    assert all(torch.allclose(uniform.merged[k], equal.merged[k]) for k in uniform.merged)
    assert not torch.allclose(uniform.merged["layers.0.weight"], result.merged["layers.0.weight"])
    with pytest.raises(ParamsError, match="3 sizes for 2 models"):
        average(spec, params[:2], sizes=sizes)
    with pytest.raises(ParamsError, match="sizes must be a list of integers ≥ 1"):
        average(spec, params, sizes=[1, 0, 2])
