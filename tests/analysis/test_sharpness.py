"""Hutchinson sharpness against the exact weighted Hessian trace of a tiny model."""

import pytest
import torch

from lmckit.analysis import exact_weighted_hessian_trace, sharpness
from lmckit.data import TensorLoader
from lmckit.errors import ParamsError
from lmckit.models import build_model


def test_sharpness_matches_the_exact_weighted_hessian_trace():
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=4, hidden=[5], out_dim=3).double()
    x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
    loader = TensorLoader(x, y, batch_size=32)
    params = model.state_dict()
    exact = exact_weighted_hessian_trace(model, params, loader)
    estimate = sharpness(model, params, loader, probes=300, seed=1)
    assert abs(estimate.value - exact) <= 3 * estimate.stderr
    assert estimate.stderr < 0.2 * abs(exact)
    assert exact != 0.0
    with pytest.raises(ParamsError, match="at least 2 probes"):
        sharpness(model, params, loader, probes=1)
    with pytest.raises(ParamsError, match="at least one batch"):
        sharpness(model, params, [], probes=2)
