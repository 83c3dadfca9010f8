"""The Taylor-predicted barrier against a closed form (a quadratic loss, where eq. 2 is
exact) and its curvature against Hessian-vector products by double backward."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmckit.analysis.taylor import line_derivatives, taylor_barrier
from lmckit.data import TensorLoader
from lmckit.errors import ParamsError
from lmckit.models import build_model
from tests.zoo import nontrivial


def mse(outputs, targets):
    return F.mse_loss(outputs.squeeze(-1), targets)


def test_prediction_is_exact_for_linear_regression():
    torch.manual_seed(0)
    x = torch.randn(300, 6, dtype=torch.float64)
    y = x @ torch.randn(6, dtype=torch.float64) + 0.3 * torch.randn(300, dtype=torch.float64)
    model = nn.Linear(6, 1).double()
    a = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    b = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    lams = [0.1, 0.5, 0.8]
    result = taylor_barrier(
        model, a, b, TensorLoader(x, y, batch_size=64), lambdas=lams, loss_fn=mse
    )
    torch.testing.assert_close(
        torch.tensor(result.predicted), torch.tensor(result.actual), atol=1e-6, rtol=0
    )
    # closed form: for L(θ) = mean (Xθ − y)², B(λ) = −λ(1−λ)‖X(θ_B − θ_A)‖²/N (convex)
    design = torch.cat([x, torch.ones(300, 1, dtype=torch.float64)], 1)
    delta = torch.cat([b["weight"][0] - a["weight"][0], b["bias"] - a["bias"]])
    gap = float((design @ delta).pow(2).mean())
    for lam, value in zip(lams, result.actual, strict=True):
        assert value == pytest.approx(-lam * (1 - lam) * gap, rel=1e-9)
    assert result.curvature_a == pytest.approx(2 * gap / float(delta @ delta), rel=1e-9)


def hvp_by_double_backward(model, params, v, x, y):
    """``(vᵀ∇L, vᵀHv)`` by the textbook route: gradient with a graph, then the gradient
    of ``∇L·v``."""
    names = list(v)
    leaves = {k: params[k].detach().clone().requires_grad_(True) for k in names}
    loss = F.cross_entropy(torch.func.functional_call(model, {**params, **leaves}, (x,)), y)
    grads = torch.autograd.grad(loss, [leaves[k] for k in names], create_graph=True)
    gv = sum((g * v[k]).sum() for g, k in zip(grads, names, strict=True))
    hv = torch.autograd.grad(gv, [leaves[k] for k in names])
    return float(gv.detach()), float(sum((h * v[k]).sum() for h, k in zip(hv, names, strict=True)))


@pytest.mark.parametrize(
    ("name", "config", "shape"),
    [
        ("mlp", {"in_dim": 8, "hidden": [7, 6], "out_dim": 3}, (8,)),
        ("resnet20", {"width_multiplier": 0.25, "in_channels": 1, "num_classes": 3}, (1, 8, 8)),
    ],
    ids=["mlp", "resnet20-bn"],
)
def test_slopes_and_curvatures_match_double_backward(name, config, shape):
    torch.manual_seed(1)
    model = nontrivial(build_model(name, **config)).double()
    params = model.state_dict()
    x, y = torch.randn(40, *shape, dtype=torch.float64), torch.randint(0, 3, (40,))
    v = {k: torch.randn_like(p) for k, p in model.named_parameters()}
    model.eval()
    slope, curvature = hvp_by_double_backward(model, params, v, x, y)
    model.train()
    batches = [(x[:15], y[:15]), (x[15:], y[15:])]  # batched accumulation of a full-batch loss
    _, f1, f2 = line_derivatives(model, params, v, batches)
    assert f1 == pytest.approx(slope, rel=1e-8, abs=1e-10)
    assert f2 == pytest.approx(curvature, rel=1e-8, abs=1e-10)
    assert model.training  # modes restored


def test_prediction_on_a_smooth_network_is_its_formula_and_converges_as_beta_shrinks():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    a = model.state_dict()
    step = {k: torch.randn_like(v) for k, v in a.items()}
    x, y = torch.randn(64, 8, dtype=torch.float64), torch.randint(0, 3, (64,))
    errors = []
    for scale in (0.1, 0.025):
        b = {k: v + scale * step[k] for k, v in a.items()}
        r = taylor_barrier(model, a, b, TensorLoader(x, y, batch_size=20), lambdas=[0.25, 0.5])
        for lam, predicted in zip(r.lambdas, r.predicted, strict=True):
            expected = (
                lam
                * (1 - lam)
                * (
                    r.distance * (r.slope_a - r.slope_b)
                    + 0.5 * r.distance**2 * (lam * r.curvature_a + (1 - lam) * r.curvature_b)
                )
            )
            assert predicted == pytest.approx(expected, rel=1e-12)
        errors.append([abs(p - q) for p, q in zip(r.predicted, r.actual, strict=True)])
        for p, q in zip(r.predicted, r.actual, strict=True):
            assert p == pytest.approx(q, rel=0.1)
    # the remainder is O(β³): a quarter of the distance, far less than a quarter of the error
    assert all(small < big / 8 for small, big in zip(errors[1], errors[0], strict=True))


def test_bad_inputs():
    model = build_model("mlp", in_dim=4, hidden=[5], out_dim=3)
    a = model.state_dict()
    loader = TensorLoader(torch.randn(8, 4), torch.randint(0, 3, (8,)), batch_size=4)
    with pytest.raises(ParamsError, match="equal"):
        taylor_barrier(model, a, a, loader)
    b = {k: v + 1 for k, v in a.items()}
    with pytest.raises(ParamsError, match="lambdas"):
        taylor_barrier(model, a, b, loader, lambdas=[1.5])
    with pytest.raises(ParamsError, match="batch"):
        taylor_barrier(model, a, b, [])
