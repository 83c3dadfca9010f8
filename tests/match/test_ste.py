"""The straight-through estimator: better midpoints than weight matching's start, exact
planted recovery, determinism, checks."""

import pytest
import torch

from lmckit.errors import DataError, ParamsError
from lmckit.match import ste_matching, weight_matching
from lmckit.metrics import evaluate
from lmckit.models import permutation_spec
from lmckit.params import lerp_params
from lmckit.perm import Permutation
from tests.zoo import outputs, planted


def midpoint_loss(model, a, b, perm, data):
    mid = lerp_params(a, perm.apply(b), 0.5)
    return evaluate(model, mid, data.loader("test", batch_size=500)).loss


def test_ste_improves_the_midpoint_and_returns_an_equivalent_model(digits_pair, digits):
    model, a, b = digits_pair
    spec = permutation_spec(model)
    events = []
    ste = ste_matching(
        spec,
        a,
        b,
        model=model,
        data=digits,
        epochs=2,
        lr=1e-2,
        batch_size=128,
        progress=events.append,
    )
    naive = midpoint_loss(model, a, b, Permutation.identity(spec), digits)
    assert midpoint_loss(model, a, b, ste.perm, digits) < naive
    assert ste.info["best_midpoint_loss"] == min(ste.info["midpoint_eval_loss"])
    steps = 2 * len(digits.loader("train", batch_size=128))
    assert ste.iterations == steps and [e.step for e in events] == list(range(1, steps + 1))
    assert all(e.total == steps for e in events)
    x = digits.test_x[:50]
    assert torch.allclose(outputs(model, ste.perm.apply(b), x), outputs(model, b, x), atol=1e-5)
    again = ste_matching(spec, a, b, model=model, data=digits, epochs=2, lr=1e-2, batch_size=128)
    assert again.perm == ste.perm
    # STE starts from weight matching and must find a better midpoint (measured on this
    # pair: test loss 0.137 against WM's 0.148)
    wm = weight_matching(spec, a, b).perm
    assert ste.perm != wm
    assert midpoint_loss(model, a, b, ste.perm, digits) < midpoint_loss(model, a, b, wm, digits)


def test_ste_recovers_a_planted_permutation(digits):
    model, spec, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [32, 32]})
    result = ste_matching(spec, a, b, model=model, data=digits, epochs=1, batch_size=256)
    assert result.perm == truth


def test_ste_needs_model_data_and_sane_options(digits):
    model, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [8]})
    with pytest.raises(ParamsError, match="needs model= and data="):
        ste_matching(spec, a, b)
    for bad in ({"epochs": 0}, {"lr": -1.0}, {"lr": float("nan")}, {"batch_size": 0}):
        with pytest.raises(ParamsError, match=next(iter(bad))):
            ste_matching(spec, a, b, model=model, data=digits, **bad)
    with pytest.raises(ParamsError, match="no batches"):
        ste_matching(spec, a, b, model=model, data=[])
    one_shot = iter(digits.loader("train", batch_size=256))
    with pytest.raises(DataError, match="one-shot iterator"):
        ste_matching(spec, a, b, model=model, data=one_shot)


def test_straight_through_mixture_has_the_naive_estimators_value_and_gradients():
    """The wired mixture against the autograd formulation it replaces —
    ``Σ_i w_i (proxy_i + (π_i(θ_i) − proxy_i).detach())`` plus members without a proxy —
    for the loss of a real network: same forward values, same gradient on every proxy."""
    from lmckit.functional import forward
    from lmckit.match.network import straight_through
    from lmckit.params import average_params
    from lmckit.train import init_model

    config = {"in_dim": 12, "hidden": [9, 7], "out_dim": 4}
    model = init_model("mlp", config, 0)
    members = [dict(init_model("mlp", config, s).state_dict()) for s in range(3)]
    weights = [0.2, 0.5, 0.3]
    x, y = torch.randn(16, 12, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 4

    proxies = {
        i: {k: (v * 0.9).requires_grad_(True) for k, v in members[i].items() if "weight" in k}
        for i in (1, 2)
    }
    naive_members = [
        {
            k: proxies[i][k] + (v - proxies[i][k]).detach()
            if i in proxies and k in proxies[i]
            else v
            for k, v in m.items()
        }
        for i, m in enumerate(members)
    ]
    naive = average_params(naive_members, weights)
    loss = torch.nn.functional.cross_entropy(forward(model, naive, x), y)
    expected = torch.autograd.grad(loss, [t for i in (1, 2) for t in proxies[i].values()])

    with torch.no_grad():
        mixture = average_params(members, weights)
    wired = straight_through(mixture, [(proxies[i], weights[i]) for i in (1, 2)])
    for k in mixture:
        assert torch.allclose(wired[k], naive[k], atol=1e-6)
    loss = torch.nn.functional.cross_entropy(forward(model, wired, x), y)
    got = torch.autograd.grad(loss, [t for i in (1, 2) for t in proxies[i].values()])
    assert len(got) == len(expected) == 2 * sum("weight" in k for k in members[0])
    for g, e in zip(got, expected, strict=True):
        assert g.abs().sum() > 0 and torch.allclose(g, e, rtol=1e-5, atol=1e-7)


def test_the_paper_recipe_is_git_re_basin_alg_2_written_out(digits_pair, digits):
    """``recipe="paper"`` against Alg. 2 by hand: θ̃ starts at θ_A; each step projects θ̃ by
    weight matching from the identity, evaluates the loss at ½(θ_A + π(θ_B)), and moves θ̃ by
    a plain step along half the midpoint's gradient (straight through); the last projection
    is returned."""
    import torch.nn.functional as F

    model, a, b = digits_pair
    spec = permutation_spec(model)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(digits.train_x), generator=g)[: 5 * 64]
    batches = [
        (digits.train_x[order[i : i + 64]], digits.train_y[order[i : i + 64]])
        for i in range(0, len(order), 64)
    ]
    lr = 0.5
    result = ste_matching(
        spec, a, b, model=model, data=batches, epochs=1, lr=lr, recipe="paper", seed=3
    )
    proxy = {k: v.clone() for k, v in a.items()}
    for x, y in batches:
        perm = weight_matching(spec, proxy, b, seed=3, warm_start=False).perm
        mid = {k: ((a[k] + perm.apply(b)[k]) / 2).requires_grad_(True) for k in a}
        loss = F.cross_entropy(torch.func.functional_call(model, mid, (x,)), y)
        grads = torch.autograd.grad(loss, list(mid.values()))
        with torch.no_grad():
            proxy = {k: proxy[k] - lr * 0.5 * gr for k, gr in zip(mid, grads, strict=True)}
    last = weight_matching(spec, proxy, b, seed=3, warm_start=False).perm
    first = weight_matching(spec, a, b, seed=3, warm_start=False).perm
    assert result.perm == last and last != first  # the descent moved the projection
    assert result.info["recipe"] == "paper"
    with pytest.raises(ParamsError, match="recipe must be one of"):
        ste_matching(spec, a, b, model=model, data=batches, recipe="git")
    with pytest.raises(ParamsError, match="init does not apply"):
        ste_matching(spec, a, b, model=model, data=batches, recipe="paper", init=first)


def test_the_paper_recipe_returns_the_last_projection_even_when_an_earlier_was_better(
    digits_pair, digits
):
    model, a, b = digits_pair
    spec = permutation_spec(model)
    batches = [(digits.train_x[i : i + 64], digits.train_y[i : i + 64]) for i in range(0, 256, 64)]
    result = ste_matching(spec, a, b, model=model, data=batches, epochs=3, lr=200.0, recipe="paper")
    scores = result.info["midpoint_eval_loss"]  # the start's, then each epoch's projection
    assert scores[-1] > min(scores)  # a big step: the last projection is not the best
    assert result.info["best_midpoint_loss"] == scores[-1]
    mid = lerp_params(a, result.perm.apply(b), 0.5)
    assert evaluate(model, mid, batches).loss == pytest.approx(scores[-1], rel=1e-5)


def test_cold_duals_give_the_warm_result(digits_pair, digits):
    """STE-MM Fig. 2's comparison for STE: with every LAP cold, the same projections and
    the same returned permutation — the duals only save work."""
    model, a, b = digits_pair
    spec = permutation_spec(model)
    batches = [(digits.train_x[i : i + 64], digits.train_y[i : i + 64]) for i in range(0, 320, 64)]
    options = dict(model=model, data=batches, epochs=2, lr=0.05, seed=1)
    warm = ste_matching(spec, a, b, **options)
    cold = ste_matching(spec, a, b, warm_duals=False, **options)
    assert warm.perm == cold.perm and warm.history == cold.history
    assert warm.info["warm_duals"] and not cold.info["warm_duals"]
    scores = warm.info["midpoint_eval_loss"]  # each epoch's projection, scored
    assert scores == cold.info["midpoint_eval_loss"] and len(set(scores)) > 1  # they moved


@pytest.mark.parametrize("method", ["ste", "ste-mm", "sinkhorn-mid"])
def test_a_learning_rate_that_diverges_is_named_at_its_step(digits_pair, digits, method):
    """``lr=1e308``: the first step makes the free copy infinite; the error names the
    method, the step and the learning rate (it was 'cost matrix has 1024 non-finite
    entries', from the next projection's LAP)."""
    from lmckit.errors import ParamsError
    from lmckit.match import sinkhorn_matching
    from lmckit.merge import ste_mm

    model, a, b = digits_pair
    spec = permutation_spec(model)
    batches = [(digits.train_x[:64], digits.train_y[:64])]
    name = {"ste": "ste_matching", "ste-mm": "ste_mm", "sinkhorn-mid": "sinkhorn_matching"}
    with pytest.raises(ParamsError, match=rf"{name[method]} diverged at step 1: .*lr=1e\+308"):
        if method == "ste":
            ste_matching(spec, a, b, model=model, data=batches, epochs=1, lr=1e308)
        elif method == "ste-mm":
            ste_mm(spec, [a, b], model=model, data=batches, epochs=1, lr=1e308)
        else:
            sinkhorn_matching(
                spec, a, b, model=model, data=batches, objective="mid", epochs=1, lr=1e308
            )
