"""BatchNorm reset and REPAIR: exact statistics, measured against direct computation."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.evaluate import bn_reset, channel_statistics, evaluate, repair, repair_layers
from lmckit.match import weight_matching
from lmckit.models import build_model, permutation_spec
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


class _OwnForwardBatchNorm(torch.nn.BatchNorm2d):
    """A BatchNorm subclass with its own ``forward``: bn_reset must measure its inputs
    itself rather than read the buffers PyTorch's layer updates."""

    def forward(self, x):
        return super().forward(x)


def _bn_inputs(model, params, batches):
    """Brute force: every BatchNorm layer's inputs over all batches in train mode, float64."""
    seen = {}
    bns = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    hooks = [
        m.register_forward_pre_hook(
            lambda _m, i, n=n: seen.setdefault(n, []).append(i[0].detach().double())
        )
        for n, m in bns
    ]
    scratch = {k: v.clone() for k, v in params.items()}
    model.train()
    with torch.no_grad():
        for x, _ in batches:
            torch.func.functional_call(model, scratch, (x,))
    for h in hooks:
        h.remove()
    return {n: torch.cat(v).movedim(1, -1).reshape(-1, v[0].shape[1]) for n, v in seen.items()}


@pytest.mark.parametrize("kind", ["pytorch-layers", "own-forward-layers", "float64"])
def test_bn_reset_gives_every_layer_the_statistics_of_all_its_inputs(kind):
    torch.manual_seed(0)
    model = build_model("resnet20", width_multiplier=0.5, in_channels=1)
    if kind == "own-forward-layers":
        for m in model.modules():
            if type(m) is torch.nn.BatchNorm2d:
                m.__class__ = _OwnForwardBatchNorm
    dtype = torch.float64 if kind == "float64" else torch.float32
    model = model.to(dtype)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    for k, v in params.items():  # BN weights away from 1, so each layer's inputs differ
        if k.endswith(".weight") and v.ndim == 1:
            v.add_(0.5 * torch.randn_like(v))
    x = (2 * torch.randn(230, 1, 12, 12) + 0.7).to(dtype)
    batches = [(x[i : i + 64], None) for i in range(0, len(x), 64)]  # the last has 38
    fixed = bn_reset(model, params, batches)
    inputs = _bn_inputs(model, params, batches)
    assert len(inputs) == 21  # 19 in the residual path, 2 in the projection shortcuts
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for name, z in inputs.items():
        mean, var = fixed[f"{name}.running_mean"].double(), fixed[f"{name}.running_var"].double()
        assert torch.allclose(mean, z.mean(0), rtol=tol, atol=tol * z.std(0).max()), name
        assert torch.allclose(var, z.var(0), rtol=tol), name
        assert int(fixed[f"{name}.num_batches_tracked"]) == 4
    assert all(m.momentum == 0.1 for m in model.modules() if hasattr(m, "momentum"))


def test_bn_reset_replaces_non_finite_statistics_and_keeps_unused_layers():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 3, 3)
            self.bn = torch.nn.BatchNorm2d(3, momentum=None)
            self.spare = torch.nn.BatchNorm2d(3)  # never called

        def forward(self, x):
            return self.bn(self.conv(x)).mean((2, 3))

    model = Net()
    params = {k: v.clone() for k, v in model.state_dict().items()}
    params["bn.running_mean"][0] = float("nan")
    params["bn.running_var"][1] = float("inf")
    params["spare.running_mean"].fill_(0.25)
    x = torch.randn(40, 1, 6, 6)
    fixed = bn_reset(model, params, [(x[:25], None), (x[25:], None)])
    z = _bn_inputs(model, params, [(x, None)])["bn"]
    assert torch.allclose(fixed["bn.running_mean"].double(), z.mean(0), atol=1e-6)
    assert torch.allclose(fixed["bn.running_var"].double(), z.var(0), rtol=1e-5)
    assert torch.equal(fixed["spare.running_mean"], params["spare.running_mean"])
    assert torch.equal(fixed["spare.running_var"], params["spare.running_var"])
    assert model.bn.momentum is None and model.spare.momentum == 0.1
