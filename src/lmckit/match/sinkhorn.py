"""Sinkhorn re-basin (Peña et al., 2023): learn soft permutations, then round them.

Each group gets a matrix of logits; log-domain Sinkhorn iterations at temperature ``tau``
turn it into a doubly-stochastic ``P_g`` (rows index A's units, columns B's), which acts on
every axis of the group as ``aligned[i] = Σ_j P_g[i, j] · B[j]`` — for a hard permutation
this is lmckit's convention. The logits are trained with Adam on either

* ``"l2"``: ``‖θ_A − P(θ_B)‖²`` (a relaxation of weight matching; needs no data), or
* ``"mid"``: the loss of the midpoint ``½(θ_A + P(θ_B))`` on data.

At the end each ``P_g`` is rounded to the permutation maximising ``Σ_i P_g[i, p[i]]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, module_mode
from lmckit.lap import assign_groups
from lmckit.match.network import (
    Recipe,
    batch_loss,
    batches_per_pass,
    check_training_options,
    is_paper_recipe,
    optimise,
    require_model_and_data,
)
from lmckit.match.result import MatchResult, check_inputs
from lmckit.options import Count, Positive, checked
from lmckit.params import Params, detached, is_running_stat, lerp_params, params_distance
from lmckit.perm import Permutation, PermutationSpec, axis_groups, group_rows, put_group_rows
from lmckit.progress import ProgressCallback, notify

Objective = Literal["l2", "mid"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)


def log_sinkhorn(logits: Tensor, n_iter: int) -> Tensor:
    """Alternating row/column normalisation in log space; returns ``log P``."""
    log_p = logits
    for _ in range(n_iter):
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
    return log_p


def soft_apply(spec: PermutationSpec, params: Params, soft: Mapping[str, Tensor]) -> dict:
    """Apply per-group (soft) permutation matrices ``P_g`` (``n × n``) to every grouped axis."""
    out = {}
    for name, t in params.items():
        for axis, entry in enumerate(spec.axes[name]):
            for g in axis_groups(entry):
                # one row per unit: its blocks, repeats and direct-sum segments move with it
                rows = group_rows(spec, name, axis, g, t)
                t = put_group_rows(spec, name, axis, g, t, soft[g] @ rows)
        out[name] = t
    return out


@checked
def sinkhorn_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    init: Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    objective: Objective = "l2",
    tau: Positive = 1.0,
    sinkhorn_iters: Count = 20,
    steps: Count = 200,
    epochs: Count = 1,
    lr: Positive = 0.1,
    batch_size: Count = 256,
    recipe: Recipe = "lmckit",
) -> MatchResult:
    """Learn soft permutations of B towards A and round them to a :class:`Permutation`.

    Args:
        spec, params_a, params_b: as for every matcher.
        model, data: needed by ``objective="mid"`` (the module the dicts fit; an lmckit
            ``Dataset`` or re-iterable ``(x, y)`` batches); unused by ``"l2"``.
        init: start near this permutation (logits 5 on its entries) instead of near-uniform
            logits with small seeded noise.
        seed: seeds the logits' noise and the batch order.
        progress: a :class:`~lmckit.progress.Progress` after every step
            (``metrics["loss"]``).
        objective: ``"l2"`` (``steps`` Adam steps on the weight distance) or ``"mid"``
            (``epochs`` passes over ``data`` on the midpoint loss, in train mode).
        tau: Sinkhorn temperature (logits are divided by it); smaller is harder.
        sinkhorn_iters: row/column normalisations per evaluation.
        lr: Adam learning rate on the logits.
        batch_size: for a ``Dataset``.
        recipe: ``"lmckit"`` (default) or ``"paper"`` — Peña et al.'s settings, which Ito
            et al. used through the authors' code: logits start identity-biased,
            ``I + 0.1·N(0, 1)`` (our default starts near uniform, ``0.01·N(0, 1)``, so
            the rounding is not pulled towards the identity), the optimiser is AdamW
            (PyTorch's default weight decay 0.01) instead of Adam, and the ``"l2"`` loss is
            the mean squared difference over the model's parameters (running statistics
            left out) instead of the squared distance relative to ``‖θ_A‖²``. The number
            of steps stays explicit (``steps``; the paper's "epochs" of the L2 loss are
            passes over data that the loss never reads). ``init`` does not apply.
            Both recipes differentiate through the unrolled Sinkhorn iterations; Peña et
            al. differentiate implicitly at the fixed point — the same gradient when the
            iterations have converged.

    BatchNorm running statistics are buffers, not inputs of the midpoint loss (train mode
    normalises with batch statistics), so they are permuted with the soft maps but carry no
    gradient.
    """
    start = time.perf_counter()
    paper = is_paper_recipe(recipe, init, "starts from identity-biased logits (Peña et al.)")
    if objective not in OBJECTIVES:
        raise ParamsError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "mid":
        model = require_model_and_data("sinkhorn_matching(objective='mid')", model, data)
    if not (isinstance(tau, int | float) and math.isfinite(tau) and tau > 0):
        raise ParamsError(f"tau must be a positive number, got {tau!r}")
    check_training_options(
        "sinkhorn_matching",
        lr=lr,
        sinkhorn_iters=sinkhorn_iters,
        **({"steps": steps} if objective == "l2" else {"epochs": epochs, "batch_size": batch_size}),
    )
    check_inputs(spec, params_a, params_b, init, seed)
    if model is not None and objective == "mid":
        check_model_fits(model, params_a, "params_a")
    params_a, params_b = detached(params_a), detached(params_b)
    device = next(iter(params_a.values())).device
    dtype = next(t for t in params_a.values() if t.dtype.is_floating_point).dtype
    generator = torch.Generator().manual_seed(seed)
    logits = {}
    for g, n in spec.groups.items():
        if g in spec.copies:  # acts through its tie's axes only: kept at init's
            continue
        if paper:
            base = torch.eye(n, dtype=dtype) + 0.1 * torch.randn(
                n, n, generator=generator, dtype=dtype
            )
        else:
            base = 0.01 * torch.randn(n, n, generator=generator, dtype=dtype)
        if init is not None:
            base[torch.arange(n), init[g]] += 5.0
        logits[g] = base.to(device).requires_grad_(True)
    optimizer = (torch.optim.AdamW if paper else torch.optim.Adam)(logits.values(), lr=lr)
    floating = {k: v for k, v in params_b.items() if v.dtype.is_floating_point}
    fixed = {k: v for k, v in params_b.items() if not v.dtype.is_floating_point}
    sub_spec = spec.restrict(floating)
    compared = [k for k in floating if not (paper and is_running_stat(k))]
    if paper:  # Peña et al.'s DistL2Loss: the mean over the parameters' entries
        scale = float(sum(floating[k].numel() for k in compared))
    else:
        scale = sum(float((params_a[k].double() ** 2).sum()) for k in compared)

    def soft_b() -> dict:
        soft = {g: log_sinkhorn(z / tau, sinkhorn_iters).exp() for g, z in logits.items()}
        permuted = soft_apply(sub_spec, floating, soft)
        # Buffers are state, not inputs: no gradient through them (and BatchNorm may then
        # update them in place in train mode).
        buffers = {k: v.detach() for k, v in permuted.items() if is_running_stat(k)}
        return {**permuted, **buffers, **fixed}

    history: list[float] = []
    n_steps = 0
    if objective == "l2":
        for _ in range(steps):
            permuted = soft_b()
            loss = sum(((params_a[k] - permuted[k]) ** 2).sum() for k in compared) / scale
            history.append(optimise(optimizer, loss, "sinkhorn_matching", n_steps))
            n_steps += 1
            notify(progress, n_steps, steps, loss=history[-1])
    else:
        batches = as_batches(data, batch_size=batch_size, seed=seed, passes=epochs)
        per_pass = batches_per_pass(batches)
        with module_mode(model, True):
            for epoch in range(epochs):
                for x, y in batches:
                    loss = batch_loss(model, lerp_params(params_a, soft_b(), 0.5), x, y)
                    history.append(optimise(optimizer, loss, "sinkhorn_matching", n_steps))
                    n_steps += 1
                    notify(
                        progress,
                        n_steps,
                        per_pass and per_pass * epochs,
                        loss=history[-1],
                        epoch=epoch + 1,
                    )
        if n_steps == 0:
            raise ParamsError("sinkhorn_matching(objective='mid') got no batches")
    with torch.no_grad():
        soft = {g: log_sinkhorn(z / tau, sinkhorn_iters).exp() for g, z in logits.items()}
        perms = assign_groups(soft, spec.heads, spec.pinned)
    start_copies = init or Permutation.identity(spec)
    perm = Permutation(spec, {**perms, **{c: start_copies[c] for c in spec.copies}})
    return MatchResult(
        alignment=perm,
        method=f"sinkhorn[{objective}]",
        history=tuple(history),
        iterations=n_steps,
        seconds=time.perf_counter() - start,
        distance_before=params_distance(params_a, params_b),
        distance_after=params_distance(params_a, perm.apply(params_b)),
        info={"tau": tau, "objective": objective, "lr": lr, "recipe": recipe},
    )
