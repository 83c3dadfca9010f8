"""Sinkhorn re-basin: planted recovery for both objectives, BatchNorm models, checks."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.match import sinkhorn_matching
from lmckit.match.sinkhorn import log_sinkhorn
from lmckit.models import permutation_spec
from lmckit.perm import Permutation
from tests.zoo import outputs, planted, train_mlp


def test_log_sinkhorn_is_doubly_stochastic():
    p = log_sinkhorn(torch.randn(7, 7) * 3, 200).exp()
    assert torch.allclose(p.sum(0), torch.ones(7), atol=1e-5)
    assert torch.allclose(p.sum(1), torch.ones(7), atol=1e-5)


@pytest.mark.parametrize("objective", ["l2", "mid"])
def test_sinkhorn_recovers_a_planted_permutation(objective, digits):
    model, spec, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [24, 20]})
    kwargs = {"steps": 150} if objective == "l2" else {"model": model, "data": digits, "epochs": 3}
    result = sinkhorn_matching(spec, a, b, objective=objective, tau=0.5, **kwargs)
    x = digits.test_x[:50]
    assert torch.allclose(outputs(model, result.perm.apply(b), x), outputs(model, b, x), atol=1e-5)
    if objective == "l2":
        assert result.perm == truth
        assert result.history[-1] < result.history[0]
    else:
        assert result.distance_after < result.distance_before


def test_midpoint_objective_works_on_batchnorm_models(digits):
    """BatchNorm running statistics are buffers: they follow the soft permutation without
    gradients, and train-mode BatchNorm may update them."""
    trained = train_mlp(digits, 0, hidden=(24, 20), epochs=4, norm="batch")
    spec = permutation_spec(trained)
    a = {k: v.clone() for k, v in trained.state_dict().items()}
    truth = Permutation.random(spec, 3)
    b = truth.inverse().apply(a)
    result = sinkhorn_matching(
        spec, a, b, objective="mid", model=trained, data=digits, epochs=3, tau=0.5
    )
    assert result.iterations == 3 * len(digits.loader("train", batch_size=256))
    assert result.distance_after < 0.5 * result.distance_before
    for k, v in trained.state_dict().items():  # the inputs were not touched
        assert torch.equal(a[k], v)


def test_sinkhorn_rejects_bad_options():
    _, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [8]})
    with pytest.raises(ParamsError, match="objective must be"):
        sinkhorn_matching(spec, a, b, objective="kl")
    with pytest.raises(ParamsError, match="needs model= and data="):
        sinkhorn_matching(spec, a, b, objective="mid")
    with pytest.raises(ParamsError, match="lr must be a positive"):
        sinkhorn_matching(spec, a, b, lr=-1.0)
    with pytest.raises(ParamsError, match="tau must be a positive"):
        sinkhorn_matching(spec, a, b, tau=0.0)
    with pytest.raises(ParamsError, match="steps"):
        sinkhorn_matching(spec, a, b, steps=0)
