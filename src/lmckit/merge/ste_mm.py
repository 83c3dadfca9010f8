"""STE-MM (Linear Mode Connectivity between Multiple Models, Alg. 1), from the paper.

Model n is the reference. Proxies θ̂_1..θ̂_{n−1} start at θ_n. Every step projects each proxy
onto its model's orbit, ``π_i = WM(θ̂_i, θ_i)`` (accelerated: each model keeps its previous
permutation and LAP duals), draws mixture weights λ on the simplex, and takes an Adam step
on the loss of ``Σ_{i<n} λ_i π_i(θ_i) + λ_n θ_n``, with straight-through gradients to the
proxies. After training, a final projection gives the permutations (line 12).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.evaluate import bn_reset
from lmckit.match._functional import (
    as_batches,
    batch_loss,
    optimise,
    parameter_names,
    straight_through,
)
from lmckit.match.weight import WeightMatcher
from lmckit.merge.result import MergeResult, average_params, check_models, merge_with
from lmckit.perm import Params, Permutation, PermutationSpec


def simplex_weights(n: int, generator: torch.Generator, scheme: str = "dirichlet") -> Tensor:
    """``n`` positive weights summing to 1: uniform on the simplex (``"dirichlet"``, the
    distribution of Eq. 5) or independent U(0, 1) draws normalised (Alg. 1, lines 4–5)."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if scheme == "dirichlet":
        u = -torch.log1p(-u)  # Exp(1) draws, normalised: Dirichlet(1, …, 1)
    elif scheme != "normalized_uniform":
        raise ParamsError(f"scheme must be 'dirichlet' or 'normalized_uniform', got {scheme!r}")
    return u / u.sum()


def ste_mm(
    model: nn.Module,
    params_list: Sequence[Params],
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    spec: PermutationSpec | None = None,
    epochs: int = 10,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    weights: str = "dirichlet",
    bn_reset_loader: Iterable[tuple[Tensor, Tensor]] | None = None,
    progress=None,
) -> MergeResult:
    """Gather ``n`` models into one basin with STE-MM (defaults from the paper: lr 1e-3,
    10 epochs, batch 256). ``loader`` may be an lmckit ``Dataset``. The merged model's
    BatchNorm statistics are re-estimated on ``bn_reset_loader`` (default: the training
    batches) when the model has BatchNorm. ``history`` holds the mean loss per epoch."""
    start = time.perf_counter()
    spec = spec if spec is not None else model.permutation_spec()
    check_models(spec, params_list)
    if epochs < 1 or not lr > 0:
        raise ParamsError(f"need epochs ≥ 1 and lr > 0, got epochs={epochs}, lr={lr}")
    n = len(params_list)
    ref = params_list[-1]
    batches = as_batches(loader, batch_size, seed)
    learnable = parameter_names(model, ref)
    proxies = [
        {k: ref[k].detach().clone().requires_grad_(True) for k in learnable} for _ in range(n - 1)
    ]
    optimizer = torch.optim.Adam([t for p in proxies for t in p.values()], lr=lr)
    perms: list[Permutation] = [Permutation.identity(spec) for _ in range(n - 1)]
    duals: list = [None] * (n - 1)
    generator = torch.Generator().manual_seed(seed)

    matchers = [WeightMatcher(spec, params_list[i]) for i in range(n - 1)]

    def project(i: int) -> None:
        current = {**ref, **{k: v.detach() for k, v in proxies[i].items()}}
        r = matchers[i].match(
            current, init=perms[i], duals=duals[i], seed=seed, validate=False, distances=False
        )
        perms[i], duals[i] = r.perm, r.duals

    history, steps = [], 0
    was_training = model.training
    try:
        for epoch in range(epochs):
            total, count = 0.0, 0
            for x, y in batches:
                for i in range(n - 1):
                    project(i)
                lam = simplex_weights(n, generator, weights)
                members = [
                    straight_through(proxies[i], perms[i].apply(params_list[i]))
                    for i in range(n - 1)
                ]
                members.append(dict(ref))
                mixture = average_params(members, lam.tolist())
                value = optimise(optimizer, batch_loss(model, mixture, x, y))
                steps += 1
                total += value
                count += 1
                if progress is not None:
                    progress(epoch, steps, value)
            history.append(total / max(count, 1))
        for i in range(n - 1):
            project(i)
    finally:
        model.train(was_training)
    all_perms = (*perms, Permutation.identity(spec))
    merged = merge_with(params_list, all_perms)
    if any(k.endswith("running_mean") for k in merged):
        merged = bn_reset(model, merged, bn_reset_loader or batches)
    return MergeResult(
        all_perms,
        merged,
        "ste-mm",
        time.perf_counter() - start,
        tuple(history),
        steps,
        {"lr": lr, "epochs": epochs, "weights": weights},
    )
