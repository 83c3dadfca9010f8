"""BatchNorm reset and REPAIR: exact statistics, measured against direct computation."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.evaluate import bn_reset, channel_statistics, evaluate, repair, repair_layers
from lmckit.match import weight_matching
from lmckit.models import permutation_spec
from tests.zoo import train_mlp


@pytest.fixture(scope="module")
def bn_model(digits):
    return train_mlp(digits, 0, hidden=(64, 64), epochs=6, norm="batch")


@pytest.mark.parametrize("batch_size", [128, 500, 1437])
def test_bn_reset_gives_the_exact_statistics_of_the_first_layer(bn_model, digits, batch_size):
    params = bn_model.state_dict()
    fixed = bn_reset(bn_model, params, digits.loader("train", batch_size=batch_size))
    z = digits.train_x.flatten(1).double() @ params["layers.0.weight"].double().T
    z = z + params["layers.0.bias"].double()
    assert torch.allclose(fixed["norms.0.running_mean"].double(), z.mean(0), atol=1e-5)
    assert torch.allclose(fixed["norms.0.running_var"].double(), z.var(0), rtol=1e-4)
    n_batches = -(-len(digits.train_x) // batch_size)
    assert int(fixed["norms.0.num_batches_tracked"]) == n_batches


def test_bn_reset_restores_a_model_with_corrupted_statistics(bn_model, digits):
    params = {k: v.clone() for k, v in bn_model.state_dict().items()}
    test = digits.loader("test", batch_size=360)
    good = evaluate(bn_model, params, test).accuracy
    broken = dict(params)
    for k in params:
        if k.endswith("running_mean"):
            broken[k] = params[k] + 3.0
        if k.endswith("running_var"):
            broken[k] = params[k] * 25
    bad = evaluate(bn_model, broken, test).accuracy
    fixed = bn_reset(bn_model, broken, digits.loader("train", batch_size=128))
    assert bad < good - 0.2
    assert evaluate(bn_model, fixed, test).accuracy >= good - 0.02
    assert torch.equal(fixed["layers.0.weight"], params["layers.0.weight"])
    assert torch.equal(broken["norms.0.running_mean"], params["norms.0.running_mean"] + 3.0)
    with pytest.raises(ParamsError, match="no batches"):
        bn_reset(bn_model, params, [])


def test_channel_statistics_are_the_moments_of_the_layer_outputs(digits_pair, digits):
    model, a, _ = digits_pair
    stats = channel_statistics(model, a, digits, ["layers.0"])
    z = digits.train_x.flatten(1).double() @ a["layers.0.weight"].double().T
    z = z + a["layers.0.bias"].double()
    mean, std = stats["layers.0"]
    assert torch.allclose(mean, z.mean(0), atol=1e-5)
    assert torch.allclose(std, z.std(0, unbiased=False), atol=1e-5)


def test_repair_gives_every_layer_the_interpolated_statistics(digits_pair, digits):
    model, a, b = digits_pair
    b = weight_matching(permutation_spec(model), a, b).perm.apply(b)
    loader = digits.loader("train", batch_size=500, shuffle=False)
    layers = repair_layers(model)
    assert layers == ["layers.0", "layers.1"]
    for lam in (0.25, 0.5):
        fixed = repair(model, a, b, lam, loader)
        sa = channel_statistics(model, a, loader, layers)
        sb = channel_statistics(model, b, loader, layers)
        sf = channel_statistics(model, fixed, loader, layers)
        for layer in layers:
            for k in (0, 1):  # mean, std
                target = (1 - lam) * sa[layer][k] + lam * sb[layer][k]
                assert torch.allclose(sf[layer][k], target, atol=1e-3, rtol=1e-3)


def test_repair_refuses_normalised_networks(bn_model, digits):
    params = bn_model.state_dict()
    with pytest.raises(ParamsError, match="use bn_reset"):
        repair(bn_model, params, params, 0.5, digits)
