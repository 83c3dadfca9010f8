"""Cycle-consistent multi-model merging (Crisostomi et al., 2024), as a Frank–Wolfe method.

Every model i gets, per group, a map ``P_i`` into a shared "universe" of units; pairwise maps
``P_i P_jᵀ`` are cycle-consistent by construction. The objective is the sum of all pairwise
inner products in the universe, ``f(P) = Σ_{i<j} ⟨P_i(θ_i), P_j(θ_j)⟩`` — equivalently the
sum of all pairwise squared distances, minimised. It is maximised over the relaxation to
doubly-stochastic matrices by Frank–Wolfe: the gradient of every ``P_i^g`` (autograd through
the multilinear objective) is turned into a vertex by a LAP, and an exact line search (the
objective is a quartic in the step) picks the step.
The result is rounded to permutations by one LAP per matrix and expressed in the frame of
the reference model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from lmckit.lap import solve_lap
from lmckit.match.sinkhorn import soft_apply
from lmckit.merge.result import MergeResult, canonicalise, check_models, merge_with
from lmckit.merge.star import star
from lmckit.perm import Params, Permutation, PermutationSpec


def _objective(spec, floating, soft_list) -> torch.Tensor:
    aligned = [soft_apply(spec, p, s) for p, s in zip(floating, soft_list, strict=True)]
    total = aligned[0][next(iter(aligned[0]))].new_zeros((), dtype=torch.float64)
    for k in aligned[0]:
        stack = torch.stack([a[k] for a in aligned]).double()
        s = stack.sum(0)
        total = total + 0.5 * ((s * s).sum() - (stack * stack).sum())
    return total


def ccmm(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    max_iter: int = 50,
    tol: float = 1e-9,
    init: str = "star",
    reference: int = -1,
    seed: int = 0,
) -> MergeResult:
    """Merge ``n`` models by Frank–Wolfe on ``Σ_{i<j} ⟨P_iθ_i, P_jθ_j⟩``.

    Args:
        max_iter: Frank–Wolfe iterations.
        tol: stop when the Frank–Wolfe gap falls below ``tol · |f|``.
        init: ``"star"`` (start from weight matching of every model to the reference) or
            ``"identity"``.
    ``history`` is the relaxed objective per iteration; ``info["fw_gap"]`` the last gap.
    """
    start = time.perf_counter()
    check_models(spec, params_list)
    n = len(params_list)
    floating_keys = [k for k, t in params_list[0].items() if t.dtype.is_floating_point]
    sub = PermutationSpec(
        groups=spec.groups,
        axes={k: spec.axes[k] for k in floating_keys},
        self_maps=spec.self_maps & set(floating_keys),
    )
    floating = [{k: p[k] for k in floating_keys} for p in params_list]
    device = params_list[0][floating_keys[0]].device
    dtype = params_list[0][floating_keys[0]].dtype
    if init == "star":
        start_perms = star(spec, params_list, reference=reference, seed=seed).perms
    else:
        start_perms = [Permutation.identity(spec)] * n

    def one_hot(perm: Permutation) -> dict:
        return {
            g: torch.eye(m, dtype=dtype, device=device)[perm[g].to(device)]
            for g, m in spec.groups.items()
        }

    soft = [one_hot(p) for p in start_perms]
    history: list[float] = []
    gap = float("nan")
    iterations = 0
    for it in range(max_iter):
        iterations = it + 1
        leaves = [{g: m.detach().requires_grad_(True) for g, m in s.items()} for s in soft]
        f = _objective(sub, floating, leaves)
        grads = torch.autograd.grad(f, [m for s in leaves for m in s.values()])
        history.append(float(f.detach()))
        vertices, k, gap = [], 0, 0.0
        for s in soft:
            vertex = {}
            for g, m in s.items():
                grad = grads[k]
                k += 1
                p, _ = solve_lap(grad, maximize=True)
                vertex[g] = torch.eye(m.shape[0], dtype=dtype, device=device)[p.to(device)]
                gap += float((grad * (vertex[g] - m)).sum())
            vertices.append(vertex)
        if gap <= tol * max(abs(history[-1]), 1e-30):
            break
        step = _line_search(sub, floating, soft, vertices)
        if step <= 0:
            break
        soft = [
            {g: s[g] + step * (v[g] - s[g]) for g in s} for s, v in zip(soft, vertices, strict=True)
        ]
    perms = []
    for s in soft:
        perms.append(Permutation(spec, {g: solve_lap(m, maximize=True)[0] for g, m in s.items()}))
    perms = list(canonicalise(perms, reference % n))
    return MergeResult(
        tuple(perms),
        merge_with(params_list, perms),
        "ccmm",
        time.perf_counter() - start,
        tuple(history),
        iterations,
        {"fw_gap": gap, "init": init},
    )


@torch.no_grad()
def _line_search(spec, floating, soft, vertices) -> float:
    """Exact line search of ``f(P + γ(V − P))`` on γ ∈ [0, 1].

    Every aligned tensor is at most quadratic in γ (a group acts on at most two of its
    axes), so each pairwise inner product — and ``f`` — is a polynomial of degree ≤ 4:
    five evaluations determine it, and its maximum is read off a fine grid."""
    gammas = np.linspace(0.0, 1.0, 5)
    values = []
    for gamma in gammas:
        mix = [
            {g: s[g] + float(gamma) * (v[g] - s[g]) for g in s}
            for s, v in zip(soft, vertices, strict=True)
        ]
        values.append(float(_objective(spec, floating, mix)))
    poly = np.polynomial.Polynomial.fit(gammas, values, 4)
    grid = np.linspace(0.0, 1.0, 1001)
    return float(grid[int(np.argmax(poly(grid)))])
