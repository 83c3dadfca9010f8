"""Straight-through estimator matching (Git Re-Basin, Alg. 2).

A free copy θ̃ of the parameters starts at θ_A. Every step projects it onto B's orbit by
weight matching, ``π = WM(θ̃, θ_B)`` — warm-started from the previous step's permutation and
LAP duals, so most steps cost one sweep of matrix products — and evaluates the loss at the
midpoint ``½(θ_A + π(θ_B))``. The forward pass uses π(θ_B); the backward pass treats the
projection as the identity, so the gradient updates θ̃. The permutation with the lowest
midpoint loss on held evaluation batches is returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from itertools import islice

import torch
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.match._functional import (
    as_batches,
    batch_loss,
    midpoint,
    optimise,
    parameter_names,
    straight_through,
)
from lmckit.match.result import MatchResult, check_inputs
from lmckit.match.weight import WeightMatcher
from lmckit.perm import Params, Permutation, PermutationSpec, params_distance


@torch.no_grad()
def _eval_loss(model, params_a, params_b, perm, batches) -> float:
    mid = midpoint(params_a, perm.apply(params_b))
    losses = [batch_loss(model, mid, x, y).item() for x, y in batches]
    return sum(losses) / len(losses)


def ste_matching(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    spec: PermutationSpec | None = None,
    epochs: int = 1,
    lr: float = 1e-3,
    batch_size: int = 256,
    eval_batches: int = 4,
    seed: int = 0,
    init: Permutation | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> MatchResult:
    """Learn a permutation of B that makes the midpoint with A a low-loss model.

    Args:
        model: module the parameter dicts fit (run functionally).
        loader: ``(x, y)`` batches, or an lmckit ``Dataset`` (then its training split is
            used, shuffled, in batches of ``batch_size``).
        epochs: passes over ``loader``.
        lr: Adam learning rate on the proxy θ̃.
        eval_batches: batches (the first ones of the first pass, fixed) on which each
            epoch's permutation is scored by its midpoint loss; the best is returned.
        seed: seeds the weight-matching group orders.
        init: permutation to start weight matching from (identity by default).
        progress: ``progress(epoch, step, loss)`` after every step.

    BatchNorm models are evaluated in train mode (per-batch statistics) throughout, which
    re-estimates the midpoint's statistics on each batch.
    """
    start = time.perf_counter()
    if spec is None:
        spec = model.permutation_spec()
    check_inputs(spec, params_a, params_b)
    if epochs < 1 or not lr > 0:
        raise ParamsError(f"need epochs ≥ 1 and lr > 0, got epochs={epochs}, lr={lr}")
    batches = as_batches(loader, batch_size, seed)
    learnable = parameter_names(model, params_a)
    proxy = {k: params_a[k].detach().clone().requires_grad_(True) for k in learnable}
    optimizer = torch.optim.Adam(proxy.values(), lr=lr)
    eval_set = [(x, y) for x, y in islice(iter(batches), eval_batches)]
    if not eval_set:
        raise ParamsError("ste_matching got an empty loader")

    matcher = WeightMatcher(spec, params_b)

    def project(perm, duals):
        current = {**params_a, **{k: v.detach() for k, v in proxy.items()}}
        return matcher.match(
            current, init=perm, duals=duals, seed=seed, validate=False, distances=False
        )

    wm = project(init, None)
    perm, duals = wm.perm, wm.duals
    best_perm, best_loss = perm, _eval_loss(model, params_a, params_b, perm, eval_set)
    history, eval_history = [], [best_loss]
    steps = wm_seconds = 0
    was_training = model.training
    try:
        for epoch in range(epochs):
            total, count = 0.0, 0
            for x, y in batches:
                t0 = time.perf_counter()
                wm = project(perm, duals)
                wm_seconds += time.perf_counter() - t0
                perm, duals = wm.perm, wm.duals
                straight = straight_through(proxy, perm.apply(params_b))
                value = optimise(optimizer, batch_loss(model, midpoint(params_a, straight), x, y))
                steps += 1
                total += value
                count += 1
                if progress is not None:
                    progress(epoch, steps, value)
            history.append(total / max(count, 1))
            final = project(perm, duals)
            perm, duals = final.perm, final.duals
            score = _eval_loss(model, params_a, params_b, perm, eval_set)
            eval_history.append(score)
            if score < best_loss:
                best_perm, best_loss = perm, score
    finally:
        model.train(was_training)
    return MatchResult(
        perm=best_perm,
        method="ste",
        history=tuple(history),
        iterations=steps,
        seconds=time.perf_counter() - start,
        distance_before=params_distance(params_a, params_b),
        distance_after=params_distance(params_a, best_perm.apply(params_b)),
        duals=duals,
        info={
            "midpoint_eval_loss": tuple(eval_history),
            "best_midpoint_loss": best_loss,
            "wm_seconds": wm_seconds,
            "lr": lr,
            "epochs": epochs,
        },
    )
