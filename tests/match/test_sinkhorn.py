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


def test_the_paper_recipe_is_penas_procedure_written_out():
    """``recipe="paper"`` against Peña et al.'s procedure by hand for a two-hidden-layer
    MLP: logits ``I + 0.1·N(0, 1)``, 20 Sinkhorn normalisations at τ = 1, AdamW on the mean
    squared difference between θ_A and the softly permuted θ_B, rounding by the assignment
    maximising the final soft map."""
    from scipy.optimize import linear_sum_assignment

    _, spec, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [24, 20]})
    b = {
        k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
        for k, v in b.items()
    }  # fmt: skip  (not an exact copy: the rounding has work to do)
    steps, lr = 40, 0.3
    result = sinkhorn_matching(spec, a, b, steps=steps, lr=lr, seed=4, recipe="paper")
    g = torch.Generator().manual_seed(4)
    z = {name: (torch.eye(n) + 0.1 * torch.randn(n, n, generator=g)).requires_grad_(True)
         for name, n in spec.groups.items()}  # fmt: skip
    adamw = torch.optim.AdamW(z.values(), lr=lr)
    count = sum(v.numel() for v in a.values())
    history = []

    def soft():
        out = {}
        for name, logits in z.items():
            lp = logits
            for _ in range(20):
                lp = lp - torch.logsumexp(lp, dim=1, keepdim=True)
                lp = lp - torch.logsumexp(lp, dim=0, keepdim=True)
            out[name] = lp.exp()
        return out

    for _ in range(steps):
        p0, p1 = soft().values()
        moved = {
            "layers.0.weight": p0 @ b["layers.0.weight"],
            "layers.0.bias": p0 @ b["layers.0.bias"],
            "layers.1.weight": p1 @ b["layers.1.weight"] @ p0.T,
            "layers.1.bias": p1 @ b["layers.1.bias"],
            "layers.2.weight": b["layers.2.weight"] @ p1.T,
            "layers.2.bias": b["layers.2.bias"],
        }
        loss = sum(((a[k] - moved[k]) ** 2).sum() for k in a) / count
        adamw.zero_grad()
        loss.backward()
        adamw.step()
        history.append(loss.item())
    rounded = {
        name: torch.as_tensor(linear_sum_assignment(p.detach().numpy(), maximize=True)[1])
        for name, p in soft().items()
    }
    assert result.history == pytest.approx(history, rel=1e-4)
    assert result.perm == Permutation(spec, rounded) == truth
    assert result.info["recipe"] == "paper"
    # the default starts near uniform with Adam: a different trajectory from the first step
    default = sinkhorn_matching(spec, a, b, steps=steps, lr=lr, seed=4)
    assert default.history[0] != pytest.approx(history[0], rel=1e-3)
    with pytest.raises(ParamsError, match="recipe must be one of"):
        sinkhorn_matching(spec, a, b, recipe="pena")
    with pytest.raises(ParamsError, match="init does not apply"):
        sinkhorn_matching(spec, a, b, recipe="paper", init=truth)
