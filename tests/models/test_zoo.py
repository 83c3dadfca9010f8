"""Zoo invariants: a random permutation never changes a model's function, and every
tensor's permutation is needed (the spec has no missing or extra axes)."""

import copy

import pytest
import torch

from lmckit import ModelConfigError, Permutation
from lmckit.models import MLP, VGG, ResNet20, build_model, model_config, permutation_spec
from lmckit.params import params_distance
from tests.zoo import nontrivial

# (name, config, input shape without batch)
ZOO = [
    ("mlp", {"in_dim": 784, "hidden": [512, 512, 512]}, (1, 28, 28)),
    ("mlp", {"in_dim": 784, "hidden": [1024, 1024, 1024]}, (784,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 48], "bias": False}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 48, 40], "norm": "batch"}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 48], "norm": "layer"}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [32, 32, 32, 32], "skip": True}, (64,)),
    ("mlp", {"in_dim": 64, "hidden": [64, 64, 64], "skip": True, "norm": "batch"}, (64,)),
    ("vgg", {"depth": 11, "width_multiplier": 1, "norm": "batch", "in_channels": 1}, (1, 32, 32)),
    ("vgg", {"depth": 11, "width_multiplier": 2, "norm": "batch"}, (3, 32, 32)),
    ("vgg", {"depth": 11, "width_multiplier": 1, "norm": "layer"}, (3, 32, 32)),
    ("vgg", {"depth": 11, "width_multiplier": 1, "norm": None}, (3, 32, 32)),
    ("vgg", {"depth": 16, "width_multiplier": 0.25, "norm": "batch"}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 1, "norm": "batch"}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 2, "norm": "batch", "in_channels": 1}, (1, 32, 32)),
    ("resnet20", {"width_multiplier": 1, "norm": "layer"}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 2, "norm": "layer", "num_classes": 100}, (3, 32, 32)),
]
IDS = [f"{n}-" + "-".join(f"{k}={v}" for k, v in c.items()) for n, c, _ in ZOO]


def make(name, config, dtype=torch.float32):
    model = build_model(name, **config).to(dtype)
    nontrivial(model, seed=0, scale=0.3, batches_tracked=11)
    return model


def outputs(model, params, x, train: bool):
    model.train(train)
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,))


@pytest.mark.parametrize(("name", "config", "shape"), ZOO, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_random_permutation_preserves_outputs(name, config, shape, dtype):
    model = make(name, config, dtype)
    spec = permutation_spec(model)
    params = dict(model.state_dict())
    spec.validate(params)
    perm = Permutation.random(spec, 123)
    permuted = perm.apply(params)
    assert params_distance(params, permuted) > 0
    x = torch.randn(6, *shape, dtype=dtype)
    for train in (False, True):
        ref = outputs(model, params, x, train)
        got = outputs(model, permuted, x, train)
        assert ref.abs().max() > 1e-3  # the comparison is not between zeros
        tol = rounding_tolerance(model, params, x, train, ref)
        assert (ref - got).abs().max().item() <= tol, f"train={train}"


def rounding_tolerance(model, params, x, train: bool, ref) -> float:
    """How far a permuted model's outputs may be from the unpermuted ones by rounding
    alone: a permutation reorders sums, so in float32 the two differ by about the model's
    own rounding error — measured here against a float64 twin — not by a fixed 1e-5 that
    a BatchNorm layer's batch statistics exceed on some machines. Plus 100 machine
    epsilons of the outputs' scale (float64, where the twin is the model itself)."""
    eps = torch.finfo(ref.dtype).eps
    scale = ref.abs().max().item()
    if ref.dtype == torch.float64:
        return 100 * eps * scale
    twin = copy.deepcopy(model).double()
    exact = outputs(
        twin,
        {k: v.double() if v.is_floating_point() else v.clone() for k, v in params.items()},
        x.double(),
        train,
    )
    own = (ref.double() - exact).abs().max().item()
    return 10 * own + 100 * eps * scale


SENSITIVITY = [0, 3, 5, 6, 9, 12, 14]  # small/varied members of ZOO, one per kind of layer


@pytest.mark.parametrize("index", SENSITIVITY, ids=[IDS[i] for i in SENSITIVITY])
def test_every_permuted_tensor_matters(index):
    """Undo the permutation of any single tensor and the outputs change: the spec lists no
    axis that the function does not couple to its group."""
    name, config, shape = ZOO[index]
    if name == "vgg":
        config = {**config, "width_multiplier": 0.25}
    model = make(name, config, torch.float64)
    spec = permutation_spec(model)
    params = dict(model.state_dict())
    permuted = Permutation.random(spec, 7).apply(params)
    x = torch.randn(4, *shape, dtype=torch.float64)
    ref = outputs(model, params, x, train=False)
    checked = 0
    for key, axes in spec.axes.items():
        if not any(g is not None for g in axes):
            continue
        broken = dict(permuted, **{key: params[key]})
        diff = (outputs(model, broken, x, train=False) - ref).abs().max().item()
        assert diff > 1e-8, f"undoing the permutation of {key!r} changed nothing"
        checked += 1
    assert checked >= 2 * len(spec.groups)


def test_resnet_groups_follow_residual_streams():
    spec = ResNet20(width_multiplier=2).permutation_spec()
    assert spec.groups["stage0"] == 32 and spec.groups["stage2"] == 128
    assert spec.axes["conv1.weight"][0] == "stage0"
    assert spec.axes["stages.0.2.conv2.weight"][:2] == ("stage0", "stage0.block2")
    assert spec.axes["stages.1.0.conv1.weight"][:2] == ("stage1.block0", "stage0")
    assert spec.axes["stages.1.0.shortcut.0.weight"][:2] == ("stage1", "stage0")
    assert spec.axes["fc.weight"] == (None, "stage2")
    assert len(spec.groups) == 3 + 9


def test_build_model_round_trips_config_and_rejects_bad_options():
    for name, config, _ in ZOO[:8]:
        model = build_model(name, **config)
        again = build_model(model_config(model)["name"], **model_config(model))
        assert model_config(again) == model_config(model)
    assert build_model("vgg16", width_multiplier=0.125).config["depth"] == 16
    with pytest.raises(ModelConfigError, match="unknown model 'alexnet'"):
        build_model("alexnet")
    with pytest.raises(ModelConfigError, match=r"unknown option\(s\) \['widht'\]"):
        build_model("mlp", widht=3)
    with pytest.raises(ModelConfigError, match="skip=True needs equal hidden widths"):
        MLP(hidden=[4, 5], skip=True)
    with pytest.raises(ModelConfigError, match="depth must be one of"):
        VGG(depth=13)
    with pytest.raises(ModelConfigError, match="norm must be"):
        ResNet20(norm=None)
    with pytest.raises(ModelConfigError, match="width_multiplier must be a positive"):
        VGG(width_multiplier=0)


def test_vgg_rejects_small_images():
    with pytest.raises(ValueError, match="at least 32×32"):
        VGG(width_multiplier=0.125, in_channels=1)(torch.zeros(2, 1, 28, 28))
