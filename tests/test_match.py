"""Two-model matching: planted recovery, functional equivalence, monotone objectives."""

import pytest
import torch

from lmckit.data import TensorLoader, load_dataset
from lmckit.errors import ParamsError, SpecError
from lmckit.match import activation_matching, sinkhorn_matching, ste_matching, weight_matching
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation, params_distance

ZOO = [
    ("mlp", {"in_dim": 64, "hidden": [48, 40, 32]}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 32, 32], "skip": True, "norm": "layer"}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 32], "norm": "batch"}, (64,)),
    ("vgg", {"depth": 11, "width_multiplier": 0.25, "in_channels": 1}, (1, 32, 32)),
    (
        "vgg",
        {"depth": 11, "width_multiplier": 0.25, "norm": "layer", "in_channels": 1},
        (1, 32, 32),
    ),
    ("resnet20", {"width_multiplier": 1, "in_channels": 1}, (1, 16, 16)),
    ("resnet20", {"width_multiplier": 1, "norm": "layer", "in_channels": 1}, (1, 16, 16)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in c.items() if k != 'in_channels')}" for n, c, _ in ZOO]


def nontrivial(model):
    """Random norm parameters and running statistics, so every tensor carries signal."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm | torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model


def planted(name, config, seed=0):
    torch.manual_seed(seed)
    model = nontrivial(build_model(name, **config))
    spec = permutation_spec(model)
    a = dict(model.state_dict())
    truth = Permutation.random(spec, 100 + seed)
    b = truth.inverse().apply(a)  # so that truth.apply(b) == a
    return model, spec, a, b, truth


def outputs(model, params, x):
    model.eval()
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,))


@pytest.mark.parametrize(("name", "config", "shape"), ZOO, ids=IDS)
def test_weight_matching_recovers_a_planted_permutation(name, config, shape):
    model, spec, a, b, truth = planted(name, config)
    result = weight_matching(spec, a, b)
    assert result.perm == truth
    assert result.distance_after == 0.0 and result.distance_before > 1
    assert result.iterations <= 4
    x = torch.randn(3, *shape)
    assert torch.allclose(outputs(model, result.perm.apply(b), x), outputs(model, b, x), atol=1e-5)


@pytest.mark.parametrize(
    ("name", "config", "shape"), ZOO[:1] + ZOO[3:4] + ZOO[5:6], ids=[IDS[0], IDS[3], IDS[5]]
)
def test_weight_matching_recovers_through_noise(name, config, shape):
    _, spec, a, b, truth = planted(name, config)
    g = torch.Generator().manual_seed(3)
    noisy = {
        k: v + 0.01 * v.std() * torch.randn(v.shape, generator=g)
        if v.is_floating_point() and v.numel() > 1
        else v
        for k, v in b.items()
    }
    assert weight_matching(spec, a, noisy).perm == truth


def test_weight_matching_objective_never_decreases_and_warm_start_agrees():
    torch.manual_seed(0)
    model_a = build_model("vgg", depth=11, width_multiplier=0.25, in_channels=1)
    model_b = build_model("vgg", depth=11, width_multiplier=0.25, in_channels=1)
    spec = permutation_spec(model_a)
    a, b = model_a.state_dict(), model_b.state_dict()
    warm = weight_matching(spec, a, b, seed=5)
    cold = weight_matching(spec, a, b, seed=5, warm_start=False)
    scipy = weight_matching(spec, a, b, seed=5, lap_backend="scipy")
    assert len(warm.history) >= 2
    assert all(y >= x - 1e-6 * abs(x) for x, y in zip(warm.history, warm.history[1:], strict=False))
    assert warm.history[-1] == pytest.approx(cold.history[-1], rel=1e-6)
    assert warm.history[-1] == pytest.approx(scipy.history[-1], rel=1e-6)
    assert warm.distance_after < warm.distance_before
    d = params_distance(a, warm.perm.apply(b))
    assert warm.distance_after == pytest.approx(d)
    again = weight_matching(spec, a, b, seed=5)
    assert again.perm == warm.perm  # deterministic for a seed
    resumed = weight_matching(spec, a, b, init=warm.perm, duals=warm.duals, seed=1)
    assert resumed.iterations == 1 and resumed.perm == warm.perm
    assert (
        warm.info["lap_solves"] + warm.info["skipped_solves"] == len(spec.groups) * warm.iterations
    )
    assert warm.info["skipped_solves"] > 0  # the confirming sweep re-solves only what moved


def test_weight_matching_can_ignore_running_stats():
    _, spec, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [32, 32], "norm": "batch"})
    result = weight_matching(spec, a, b, include_running_stats=False)
    assert result.perm == truth


def test_weight_matching_rejects_bad_inputs():
    _, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [32, 32]})
    other = build_model("mlp", in_dim=64, hidden=[32, 16]).state_dict()
    with pytest.raises(SpecError, match="params_b"):
        weight_matching(spec, a, other)
    nan = dict(b, **{"layers.1.weight": b["layers.1.weight"].clone()})
    nan["layers.1.weight"][0, 0] = float("nan")
    with pytest.raises(ParamsError, match=r"model B: tensor 'layers.1.weight' has NaN"):
        weight_matching(spec, a, nan)
    with pytest.raises(ParamsError, match="dtype"):
        weight_matching(spec, a, {k: v.double() for k, v in b.items()})


def random_loader(shape, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorLoader(
        torch.randn(n, *shape, generator=g), torch.zeros(n, dtype=torch.long), batch_size=64
    )


def alive_units(model, params, loader, spec):
    """Units whose activation varies over the data (dead units cannot be matched by data)."""
    taps, stats = model.activation_taps(), {}
    modules = dict(model.named_modules())
    hooks = [
        modules[t].register_forward_hook(
            lambda m, i, o, t=t: stats.setdefault(t, []).append(
                o.movedim(1, -1).reshape(-1, o.shape[1])
            )
        )
        for ts in taps.values()
        for t in ts
    ]
    outputs(model, params, torch.cat([x for x, _ in loader]))
    for h in hooks:
        h.remove()
    return {g: sum(torch.cat(stats[t]).std(0) for t in ts) > 1e-6 for g, ts in taps.items()}


@pytest.mark.parametrize(("name", "config", "shape"), ZOO, ids=IDS)
@pytest.mark.parametrize("method", ["correlation", "cross_moment"])
def test_activation_matching_recovers_a_planted_permutation(name, config, shape, method):
    model, spec, a, b, truth = planted(name, config)
    loader = random_loader(shape)
    result = activation_matching(model, a, b, loader, method=method)
    alive = alive_units(model, a, loader, spec)
    for g in spec.groups:
        assert torch.equal(result.perm[g][alive[g]], truth[g][alive[g]]), g
    x = torch.cat([x for x, _ in loader])
    assert torch.allclose(outputs(model, result.perm.apply(b), x), outputs(model, b, x), atol=1e-4)
    assert result.iterations == 4 and result.info["examples"] == 256


def test_activation_matching_needs_taps():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    from lmckit import PermutationSpec

    spec = PermutationSpec(
        {"h": 3},
        {"0.weight": ("h", None), "0.bias": ("h",), "2.weight": (None, "h"), "2.bias": (None,)},
    )
    params = model.state_dict()
    loader = random_loader((4,))
    with pytest.raises(ParamsError, match="pass taps="):
        activation_matching(model, params, params, loader, spec=spec)
    result = activation_matching(model, params, params, loader, spec=spec, taps={"h": ["1"]})
    assert result.distance_after == 0.0


@pytest.fixture(scope="module")
def digits_pair():
    """Two MLPs trained briefly on digits from different seeds."""
    from lmckit.train import TrainConfig, init_model, train

    data = load_dataset("digits")
    models = []
    for seed in (0, 1):
        m = init_model("mlp", {"in_dim": 64, "hidden": [64, 64], "out_dim": 10}, seed)
        train(
            m,
            data,
            TrainConfig(epochs=8, batch_size=64, lr=3e-3, seed=seed),
            evaluate_each_epoch=False,
        )
        models.append(m)
    return data, models[0], models[0].state_dict(), models[1].state_dict()


def midpoint_loss(model, a, b, perm, data):
    from lmckit.match._functional import midpoint
    from lmckit.metrics import evaluate

    return evaluate(model, midpoint(a, perm.apply(b)), data.loader("test", batch_size=500)).loss


def test_ste_improves_the_midpoint_and_returns_an_equivalent_model(digits_pair):
    data, model, a, b = digits_pair
    spec = permutation_spec(model)
    wm = weight_matching(spec, a, b)
    ste = ste_matching(model, a, b, data, epochs=2, lr=1e-2, batch_size=128)
    naive = midpoint_loss(model, a, b, Permutation.identity(spec), data)
    assert midpoint_loss(model, a, b, ste.perm, data) < naive
    assert ste.info["best_midpoint_loss"] == min(ste.info["midpoint_eval_loss"])
    assert ste.iterations == 2 * len(data.loader("train", batch_size=128))
    x = data.test_x[:50]
    assert torch.allclose(outputs(model, ste.perm.apply(b), x), outputs(model, b, x), atol=1e-5)
    assert wm.distance_after < wm.distance_before
    again = ste_matching(model, a, b, data, epochs=2, lr=1e-2, batch_size=128)
    assert again.perm == ste.perm


def test_ste_recovers_a_planted_permutation():
    model, _, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [32, 32]})
    data = load_dataset("digits")
    result = ste_matching(model, a, b, data, epochs=1, lr=1e-3, batch_size=256)
    assert result.perm == truth


@pytest.mark.parametrize("objective", ["l2", "mid"])
def test_sinkhorn_recovers_a_planted_permutation(objective):
    model, spec, a, b, truth = planted("mlp", {"in_dim": 64, "hidden": [24, 20]})
    data = load_dataset("digits")
    kwargs = {"steps": 150} if objective == "l2" else {"model": model, "loader": data, "epochs": 3}
    result = sinkhorn_matching(spec, a, b, objective=objective, tau=0.5, **kwargs)
    x = data.test_x[:50]
    assert torch.allclose(outputs(model, result.perm.apply(b), x), outputs(model, b, x), atol=1e-5)
    if objective == "l2":
        assert result.perm == truth
        assert result.history[-1] < result.history[0]
    else:
        assert result.distance_after < result.distance_before


def test_sinkhorn_rejects_bad_options():
    _, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [8]})
    with pytest.raises(ParamsError, match="objective must be"):
        sinkhorn_matching(spec, a, b, objective="kl")
    with pytest.raises(ParamsError, match="needs model= and loader="):
        sinkhorn_matching(spec, a, b, objective="mid")


def test_weight_matcher_reuse_agrees_with_fresh_calls():
    from lmckit.match import WeightMatcher

    torch.manual_seed(0)
    models = [build_model("resnet20", width_multiplier=0.5, in_channels=1) for _ in range(4)]
    spec = permutation_spec(models[0])
    b = models[0].state_dict()
    matcher = WeightMatcher(spec, b)
    previous = None
    for m in models[1:] + models[1:2]:  # revisit a model after the caches have moved on
        a = m.state_dict()
        reused = matcher.match(a, init=previous)
        fresh = weight_matching(spec, a, b, init=previous)
        assert reused.perm == fresh.perm and reused.history == fresh.history
        previous = reused.perm
