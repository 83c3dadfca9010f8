"""Hutchinson sharpness against an exact weighted Hessian trace computed independently."""

import pytest
import torch
import torch.nn.functional as F

from lmckit.analysis import exact_weighted_hessian_trace, sharpness
from lmckit.data import TensorLoader
from lmckit.errors import ParamsError
from lmckit.models import build_model


def weighted_hessian_trace(model, params, x, y) -> float:
    """``Σ_k H_kk θ_k²`` of the mean cross-entropy over all of ``x``, written here from the
    definition (full Hessian of a flat parameter vector), sharing no code with lmckit."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [params[n].shape for n in names]
    flat = torch.cat([params[n].reshape(-1) for n in names])

    def loss(vector):
        chunks = torch.split(vector, [s.numel() for s in shapes])
        current = dict(params)
        current.update({n: c.view(s) for n, c, s in zip(names, chunks, shapes, strict=True)})
        return F.cross_entropy(torch.func.functional_call(model, current, (x,)), y)

    hessian = torch.autograd.functional.hessian(loss, flat)
    return float((hessian.diagonal() * flat**2).sum())


def test_sharpness_matches_the_exact_weighted_hessian_trace():
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=4, hidden=[5], out_dim=3).double()
    x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
    loader = TensorLoader(x, y, batch_size=32)
    params = model.state_dict()
    exact = weighted_hessian_trace(model, params, x, y)
    assert exact_weighted_hessian_trace(model, params, loader) == pytest.approx(exact, rel=1e-9)
    estimate = sharpness(model, params, loader, probes=300, seed=1)
    assert abs(estimate.value - exact) <= 3 * estimate.stderr
    assert estimate.stderr < 0.2 * abs(exact)
    assert exact != 0.0
    with pytest.raises(ParamsError, match="at least 2 probes"):
        sharpness(model, params, loader, probes=1)
    with pytest.raises(ParamsError, match="at least one batch"):
        sharpness(model, params, [], probes=2)
