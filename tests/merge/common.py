"""Fixtures of the merger tests: planted copies and the registry's methods as callables."""

import torch

from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation


def planted_copies(n=4, config=None, seed=0):
    """``(model, spec, base, copies)``: ``n`` randomly permuted copies of one model."""
    torch.manual_seed(seed)
    model = build_model("mlp", **(config or {"in_dim": 64, "hidden": [24, 20]}))
    spec = permutation_spec(model)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    return model, spec, base, [Permutation.random(spec, 10 + i).apply(base) for i in range(n)]


def random_models(n=3, hidden=(16, 16), seed=0, **config):
    torch.manual_seed(seed)
    models = [build_model("mlp", in_dim=64, hidden=list(hidden), **config) for _ in range(n)]
    return models[0], permutation_spec(models[0]), [m.state_dict() for m in models]


def transformer_models(n=2, seed=0):
    """``(model, spec, params_list, batches)``: ``n`` tiny zoo GPTs from different seeds and
    three labelled batches of tokens — models with orthogonal and invertible symmetries, for
    the methods that refuse MLPs (``wm-orth``, ``merge-many-orth``, ...)."""
    models = []
    for i in range(n):
        torch.manual_seed(seed + i)
        models.append(
            build_model("gpt", vocab_size=20, context=8, dim=16, depth=1, heads=4, mlp_dim=32)
        )
    g = torch.Generator().manual_seed(seed)
    batches = [
        (torch.randint(0, 20, (16, 8), generator=g), torch.randint(0, 20, (16, 8), generator=g))
        for _ in range(3)
    ]
    return models[0], permutation_spec(models[0]), [m.state_dict() for m in models], batches
