"""Helpers the test modules share: small zoo configurations, planted permutations, loaders
and briefly trained models."""

from __future__ import annotations

import torch

from lmckit.data import TensorLoader
from lmckit.match import weight_matching
from lmckit.models import build_model, permutation_spec
from lmckit.params import params_distance
from lmckit.perm import Permutation, PermutationSpec

# Small versions of every zoo family and normalisation: (name, config, input shape).
SMALL_ZOO = [
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
SMALL_ZOO_IDS = [
    f"{n}-{'-'.join(f'{k}={v}' for k, v in c.items() if k != 'in_channels')}"
    for n, c, _ in SMALL_ZOO
]


def nontrivial(
    model: torch.nn.Module, seed: int = 1, scale: float = 0.1, batches_tracked: int = 0
) -> torch.nn.Module:
    """Random norm parameters and running statistics, so every tensor carries signal (a
    spec that forgot one of them would be caught)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(scale * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.num_batches_tracked.fill_(batches_tracked)
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm | torch.nn.LayerNorm):
                m.weight.copy_(1 + 2 * scale * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(scale * torch.randn(m.bias.shape, generator=g))
    return model


class PickledCode:
    """Pickles to a call of ``open(marker, "w")``: loading it runs code, which the readers
    must refuse; ``marker`` appears if they do not."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def planted(name: str, config: dict, seed: int = 0):
    """``(model, spec, a, b, truth)`` with ``b`` a permuted copy of ``a`` and
    ``truth.apply(b) == a``."""
    torch.manual_seed(seed)
    model = nontrivial(build_model(name, **config))
    spec = permutation_spec(model)
    a = {k: v.clone() for k, v in model.state_dict().items()}
    truth = Permutation.random(spec, 100 + seed)
    b = truth.inverse().apply(a)
    return model, spec, a, b, truth


def random_pair(name: str, config: dict, seed: int = 0):
    """``(model, spec, a, b)``: two independent random initialisations."""
    torch.manual_seed(seed)
    model = nontrivial(build_model(name, **config))
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: v.clone() for k, v in nontrivial(build_model(name, **config), 2).state_dict().items()}
    return model, permutation_spec(model), a, b


def outputs(model: torch.nn.Module, params, x: torch.Tensor) -> torch.Tensor:
    """Eval-mode outputs of ``model`` run with ``params``."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.func.functional_call(model, params, (x,))
    finally:
        model.train(training)


def random_loader(shape, n: int = 256, seed: int = 0, classes: int = 1) -> TensorLoader:
    """Gaussian inputs of ``shape`` with labels in ``[0, classes)``, batches of 64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorLoader(x, y, batch_size=64)


def train_mlp(data, seed: int, hidden=(64, 64), epochs: int = 8, **config):
    """An MLP trained briefly on ``data`` (Adam 3e-3, batch 64)."""
    from lmckit.train import TrainConfig, init_model, train

    model = init_model(
        "mlp",
        {"in_dim": 64, "hidden": list(hidden), "out_dim": data.num_classes, **config},
        seed,
    )
    train(
        model,
        data,
        TrainConfig(epochs=epochs, batch_size=64, lr=3e-3, seed=seed),
        evaluate_each_epoch=False,
    )
    return model


def tiny_spec() -> PermutationSpec:
    # 5 → 4 → 3 → 2 MLP with a BatchNorm on the first hidden layer
    return PermutationSpec(
        groups={"h0": 4, "h1": 3},
        axes={
            "l0.weight": ("h0", None),
            "l0.bias": ("h0",),
            "bn.weight": ("h0",),
            "bn.bias": ("h0",),
            "bn.running_mean": ("h0",),
            "bn.running_var": ("h0",),
            "bn.num_batches_tracked": (),
            "l1.weight": ("h1", "h0"),
            "l1.bias": ("h1",),
            "l2.weight": (None, "h1"),
            "l2.bias": (None,),
        },
    )


def tiny_params(seed: int = 0, dtype=torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "l0.weight": (4, 5),
        "l0.bias": (4,),
        "bn.weight": (4,),
        "bn.bias": (4,),
        "bn.running_mean": (4,),
        "bn.running_var": (4,),
        "l1.weight": (3, 4),
        "l1.bias": (3,),
        "l2.weight": (2, 3),
        "l2.bias": (2,),
    }
    params = {k: torch.randn(s, generator=g, dtype=dtype) for k, s in shapes.items()}
    params["bn.num_batches_tracked"] = torch.tensor(7)
    return params


def moving_permutation(spec: PermutationSpec, seed: int) -> Permutation:
    """A random permutation that moves every group that can move (seeds from ``seed`` up
    until one does; a pinned group of one head — multi-query attention's rotary key/value
    head — has the identity only)."""
    fixed = {g for g in spec.pinned if spec.heads[g][1] == 1}
    truth = Permutation.random(spec, seed)
    while any(
        torch.equal(truth[g], torch.arange(n)) for g, n in spec.groups.items() if g not in fixed
    ):
        seed += 1
        truth = Permutation.random(spec, seed)
    return truth


def planted_recovery(model: torch.nn.Module, spec: PermutationSpec, restarts: int = 1) -> None:
    """Assert that WM (best of ``restarts`` starts) on ``(a, π⁻¹(a))`` finds π exactly (π
    drawn until it moves every group), ``a`` being ``model``'s weights."""
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    truth = moving_permutation(spec, 7)
    b = truth.inverse().apply(a)
    result = weight_matching(spec, a, b, restarts=restarts)
    assert result.perm == truth
    assert params_distance(a, result.perm.apply(b)) < 1e-5 * params_distance(a, b)
