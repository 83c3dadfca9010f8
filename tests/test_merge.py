"""Multi-model merging and its metrics."""

import math

import pytest
import torch

from lmckit.analysis import (
    distance_ratios,
    exact_weighted_hessian_trace,
    multi_model_metrics,
    plane_landscape,
    sharpness,
    triplet_angles,
)
from lmckit.data import TensorLoader, load_dataset
from lmckit.errors import ParamsError, SpecError
from lmckit.merge import ccmm, merge_many, star, ste_mm
from lmckit.merge.result import pairwise_inner_sum
from lmckit.merge.ste_mm import simplex_weights
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation, params_distance


def planted_copies(n=4, config=None, seed=0):
    torch.manual_seed(seed)
    model = build_model("mlp", **(config or {"in_dim": 64, "hidden": [24, 20]}))
    spec = permutation_spec(model)
    base = model.state_dict()
    return model, spec, base, [Permutation.random(spec, 10 + i).apply(base) for i in range(n)]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


METHODS = {
    "star-wm": lambda m, s, ps, d: star(s, ps),
    "star-ste": lambda m, s, ps, d: star(s, ps, method="ste", model=m, loader=d, epochs=1),
    "merge-many": lambda m, s, ps, d: merge_many(s, ps),
    "ccmm": lambda m, s, ps, d: ccmm(s, ps),
    "ste-mm": lambda m, s, ps, d: ste_mm(m, ps, d, epochs=1),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_planted_copies_are_merged_back_into_the_original(method, digits):
    model, spec, _, copies = planted_copies()
    result = METHODS[method](model, spec, copies, digits)
    reference = copies[-1]
    assert result.perms[-1].is_identity()
    for perm, params in zip(result.perms, copies, strict=True):
        assert params_distance(perm.apply(params), reference) == 0.0
    assert params_distance(result.merged, reference) < 1e-6


@pytest.mark.parametrize("method", ["star-wm", "merge-many", "ccmm"])
def test_merging_is_deterministic_for_a_seed(method, digits):
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=64, hidden=[16, 16]) for _ in range(3)]
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    first = METHODS[method](models[0], spec, params, digits)
    again = METHODS[method](models[0], spec, params, digits)
    assert first.perms == again.perms


def test_merge_many_improves_the_pairwise_objective():
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=64, hidden=[32, 32]) for _ in range(4)]
    spec = permutation_spec(models[0])
    result = merge_many(spec, [m.state_dict() for m in models])
    assert result.iterations >= 2 and result.history[-1] >= result.history[0]
    params = [m.state_dict() for m in models]
    fw = ccmm(spec, params)
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(fw.history, fw.history[1:], strict=False))
    aligned = [p.apply(x) for p, x in zip(fw.perms, params, strict=True)]
    assert pairwise_inner_sum(aligned) > pairwise_inner_sum(params)


def test_merge_rejects_bad_inputs():
    _, spec, base, copies = planted_copies(2)
    with pytest.raises(ParamsError, match="at least 2 models"):
        merge_many(spec, copies[:1])
    other = build_model("mlp", in_dim=64, hidden=[24, 21]).state_dict()
    with pytest.raises(SpecError, match="model 1 vs model 0"):
        merge_many(spec, [base, other])
    with pytest.raises(ParamsError, match="needs model= and loader="):
        star(spec, copies, method="ste")


def test_simplex_weights():
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([simplex_weights(3, g) for _ in range(4000)])
    assert torch.allclose(draws.sum(1), torch.ones(4000, dtype=torch.float64))
    assert (draws > 0).all()
    assert draws[:, 0].mean().item() == pytest.approx(1 / 3, abs=0.02)
    # Dirichlet(1,1,1): each coordinate is Beta(1, 2) with variance 1/18
    assert draws[:, 0].var().item() == pytest.approx(1 / 18, rel=0.1)
    with pytest.raises(ParamsError):
        simplex_weights(3, g, "gaussian")


def test_geometry_of_a_regular_simplex():
    eye = [{"w": torch.eye(4)[i]} for i in range(4)]  # vertices of a regular 3-simplex
    assert distance_ratios(eye) == pytest.approx([1.0] * 6)
    assert triplet_angles(eye) == pytest.approx([60.0] * 12)
    right = [
        {"w": torch.tensor([0.0, 0.0])},
        {"w": torch.tensor([1.0, 0.0])},
        {"w": torch.tensor([0.0, 1.0])},
    ]
    assert sorted(triplet_angles(right)) == pytest.approx([45.0, 45.0, 90.0])


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
    # scale check: tr(H ⊙ θθᵀ) is a quadratic form in θ's magnitudes, not a constant
    assert exact != 0.0


def test_multi_model_metrics_and_landscape(digits):
    from lmckit.train import TrainConfig, init_model, train

    models = []
    for seed in range(3):
        m = init_model("mlp", {"in_dim": 64, "hidden": [32, 32], "out_dim": 10}, seed)
        train(
            m,
            digits,
            TrainConfig(epochs=10, batch_size=64, lr=3e-3, seed=seed),
            evaluate_each_epoch=False,
        )
        models.append(m.state_dict())
    model = m
    spec = permutation_spec(model)
    result = merge_many(spec, models)
    test = digits.loader("test", batch_size=360)
    metrics = multi_model_metrics(model, models, result.perms, test)
    assert metrics.n == 3 and len(metrics.distance_ratios) == 3 and len(metrics.triplet_angles) == 3
    assert sum(metrics.triplet_angles) == pytest.approx(180.0)
    assert metrics.loss_gap == pytest.approx(metrics.merged_loss - metrics.mean_loss)
    assert math.isfinite(metrics.pairwise_gap)
    aligned = [p.apply(x) for p, x in zip(result.perms, models, strict=True)]
    land = plane_landscape(model, aligned, test, resolution=5, margin=0.0)
    assert land.points[0] == (0.0, 0.0) and land.points[1][1] == 0.0
    from lmckit.metrics import evaluate

    corner = evaluate(model, aligned[0], test).loss
    assert land.loss[0][0] == pytest.approx(corner, rel=1e-4)
    with pytest.raises(ParamsError, match="exactly 3"):
        plane_landscape(model, aligned[:2], test)
