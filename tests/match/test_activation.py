"""Activation matching: planted recovery on every zoo family, taps, input checks."""

import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lmckit import PermutationSpec
from lmckit.errors import ParamsError
from lmckit.match import activation_matching
from tests.zoo import SMALL_ZOO, SMALL_ZOO_IDS, outputs, planted, random_loader, random_pair


def alive_units(model, params, loader):
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


@pytest.mark.parametrize(("name", "config", "shape"), SMALL_ZOO, ids=SMALL_ZOO_IDS)
@pytest.mark.parametrize("statistic", ["correlation", "cross_moment"])
def test_activation_matching_recovers_a_planted_permutation(name, config, shape, statistic):
    model, spec, a, b, truth = planted(name, config)
    loader = random_loader(shape)
    result = activation_matching(spec, a, b, model=model, data=loader, statistic=statistic)
    alive = alive_units(model, a, loader)
    for g in spec.groups:
        assert torch.equal(result.perm[g][alive[g]], truth[g][alive[g]]), g
    x = torch.cat([x for x, _ in loader])
    assert torch.allclose(outputs(model, result.perm.apply(b), x), outputs(model, b, x), atol=1e-4)
    assert result.iterations == 4 and result.info["examples"] == 256


def test_a_dataset_is_read_in_order_and_n_batches_limits_it(digits):
    model, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [32, 32]})
    events = []
    result = activation_matching(
        spec, a, b, model=model, data=digits, batch_size=100, n_batches=3, progress=events.append
    )
    assert result.iterations == 3 and result.info["examples"] == 300
    assert [e.step for e in events] == [1, 2, 3] and events[0].total == 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)
        self.unused = torch.nn.ReLU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_taps_for_a_model_of_ones_own():
    model = Net()
    spec = PermutationSpec(
        {"h": 3},
        {
            "fc1.weight": ("h", None),
            "fc1.bias": ("h",),
            "fc2.weight": (None, "h"),
            "fc2.bias": (None,),
        },
    )
    params = model.state_dict()
    loader = random_loader((4,))
    result = activation_matching(
        spec, params, params, model=model, data=loader, taps={"h": ["act"]}
    )
    assert result.distance_after == 0.0
    # without taps the traced graph's ReLU output is read: the same activations
    from_graph = activation_matching(spec, params, params, model=model, data=loader)
    assert from_graph.perm == result.perm and from_graph.history == result.history
    with pytest.raises(ParamsError, match="not a module"):
        activation_matching(spec, params, params, model=model, data=loader, taps={"h": ["x"]})
    with pytest.raises(ParamsError, match=r"taps \['unused'\] produced no output"):
        activation_matching(spec, params, params, model=model, data=loader, taps={"h": ["unused"]})


def test_missing_model_or_data_and_bad_options_are_named():
    model, spec, a, b, _ = planted("mlp", {"in_dim": 64, "hidden": [8]})
    loader = random_loader((64,))
    with pytest.raises(ParamsError, match="needs model="):
        activation_matching(spec, a, b, data=loader)
    with pytest.raises(ParamsError, match="needs data="):
        activation_matching(spec, a, b, model=model)
    with pytest.raises(ParamsError, match="statistic must be"):
        activation_matching(spec, a, b, model=model, data=loader, statistic="cosine")
    with pytest.raises(ParamsError, match="n_batches"):
        activation_matching(spec, a, b, model=model, data=loader, n_batches=0)
    with pytest.raises(ParamsError, match="got no batches"):
        activation_matching(spec, a, b, model=model, data=[])
    other = torch.nn.Linear(64, 10)
    with pytest.raises(ParamsError, match="do not fit Linear"):
        activation_matching(spec, a, b, model=other, data=loader)


@pytest.mark.parametrize("statistic", ["correlation", "cross_moment"])
def test_the_gains_are_the_naive_statistics_of_the_activations(statistic):
    """Against statistics computed directly from all activations at once: Pearson
    correlation (centred, normalised) or the raw cross-moment E[z_A z_Bᵀ]."""
    model, spec, a, b = random_pair("mlp", {"in_dim": 10, "hidden": [12], "out_dim": 3})
    loader = random_loader((10,), n=300)
    x = torch.cat([x for x, _ in loader])
    za = torch.relu(x @ a["layers.0.weight"].T + a["layers.0.bias"]).double()
    zb = torch.relu(x @ b["layers.0.weight"].T + b["layers.0.bias"]).double()
    if statistic == "correlation":
        gains = torch.corrcoef(torch.cat([za.T, zb.T]))[:12, 12:]
    else:
        gains = za.T @ zb / len(x)
    rows, cols = linear_sum_assignment(gains.numpy(), maximize=True)
    result = activation_matching(spec, a, b, model=model, data=loader, statistic=statistic)
    assert result.perm["hidden0"].tolist() == cols.tolist()
    assert result.history[0] == pytest.approx(float(gains[rows, cols].sum()), rel=1e-9)
