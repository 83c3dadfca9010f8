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

import time
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.lap import solve_lap
from lmckit.match._functional import as_batches, batch_loss, midpoint
from lmckit.match.result import MatchResult, check_inputs
from lmckit.perm import Params, Permutation, PermutationSpec, params_distance

OBJECTIVES = ("l2", "mid")


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
        for axis, g in enumerate(spec.axes[name]):
            if g is None:
                continue
            moved = t.movedim(axis, 0)
            t = (soft[g] @ moved.reshape(moved.shape[0], -1)).reshape(moved.shape).movedim(0, axis)
        out[name] = t
    return out


def sinkhorn_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    objective: str = "l2",
    model: nn.Module | None = None,
    loader: Iterable[tuple[Tensor, Tensor]] | None = None,
    tau: float = 1.0,
    sinkhorn_iters: int = 20,
    steps: int = 200,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 256,
    init: Permutation | None = None,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> MatchResult:
    """Learn soft permutations of B towards A and round them to a :class:`Permutation`.

    Args:
        objective: ``"l2"`` (``steps`` Adam steps on the weight distance) or ``"mid"``
            (``epochs`` passes over ``loader`` on the midpoint loss; needs ``model``).
        tau: Sinkhorn temperature (logits are divided by it); smaller is harder.
        sinkhorn_iters: row/column normalisations per evaluation.
        init: start near this permutation (logits 5 on its entries) instead of near-uniform
            logits with small seeded noise.
        progress: ``progress(step, loss)`` after every step.
    """
    start = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ParamsError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "mid" and (model is None or loader is None):
        raise ParamsError("objective='mid' needs model= and loader=")
    if not tau > 0:
        raise ParamsError(f"tau must be positive, got {tau}")
    check_inputs(spec, params_a, params_b)
    device = next(iter(params_a.values())).device
    dtype = next(t for t in params_a.values() if t.dtype.is_floating_point).dtype
    generator = torch.Generator().manual_seed(seed)
    logits = {}
    for g, n in spec.groups.items():
        base = 0.01 * torch.randn(n, n, generator=generator, dtype=dtype)
        if init is not None:
            base[torch.arange(n), init[g]] += 5.0
        logits[g] = base.to(device).requires_grad_(True)
    optimizer = torch.optim.Adam(logits.values(), lr=lr)
    floating = {k: v for k, v in params_b.items() if v.dtype.is_floating_point}
    fixed = {k: v for k, v in params_b.items() if not v.dtype.is_floating_point}
    sub_spec = PermutationSpec(
        groups=spec.groups,
        axes={k: spec.axes[k] for k in floating},
        self_maps=spec.self_maps & set(floating),
    )
    scale = sum(float((v.double() ** 2).sum()) for k, v in params_a.items() if k in floating)

    def soft_b() -> dict:
        soft = {g: log_sinkhorn(z / tau, sinkhorn_iters).exp() for g, z in logits.items()}
        return {**soft_apply(sub_spec, floating, soft), **fixed}

    def step(loss: Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    history: list[float] = []
    was_training = model.training if model is not None else None
    n_steps = 0
    try:
        if objective == "l2":
            for _ in range(steps):
                permuted = soft_b()
                loss = sum(((params_a[k] - permuted[k]) ** 2).sum() for k in floating) / scale
                history.append(step(loss))
                n_steps += 1
                if progress is not None:
                    progress(n_steps, history[-1])
        else:
            batches = as_batches(loader, batch_size, seed)
            for _ in range(epochs):
                for x, y in batches:
                    loss = batch_loss(
                        model, midpoint(params_a, soft_b()), x.to(device), y.to(device)
                    )
                    history.append(step(loss))
                    n_steps += 1
                    if progress is not None:
                        progress(n_steps, history[-1])
    finally:
        if model is not None:
            model.train(was_training)
    with torch.no_grad():
        perms = {}
        for g, z in logits.items():
            p_soft = log_sinkhorn(z / tau, sinkhorn_iters).exp()
            perms[g], _ = solve_lap(p_soft, maximize=True)
    perm = Permutation(spec, perms)
    return MatchResult(
        perm=perm,
        method=f"sinkhorn[{objective}]",
        history=tuple(history),
        iterations=n_steps,
        seconds=time.perf_counter() - start,
        distance_before=params_distance(params_a, params_b),
        distance_after=params_distance(params_a, perm.apply(params_b)),
        info={"tau": tau, "objective": objective, "lr": lr},
    )
