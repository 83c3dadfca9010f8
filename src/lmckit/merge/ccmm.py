"""Cycle-consistent multi-model merging (Crisostomi et al., 2024), as a Frank–Wolfe method.

Every model i gets, per group, a map ``P_i`` into a shared "universe" of units; pairwise maps
``P_i P_jᵀ`` are cycle-consistent by construction. The objective is the sum of all pairwise
inner products in the universe, ``f(P) = Σ_{i<j} ⟨P_i(θ_i), P_j(θ_j)⟩`` — equivalently the
sum of all pairwise squared distances, minimised. It is maximised over the relaxation to
doubly-stochastic matrices by Frank–Wolfe: the gradient of every ``P_i^g`` (autograd through
the multilinear objective) is turned into a vertex by a LAP, and a line search picks the step.
The result is rounded to permutations by one LAP per matrix and expressed in the frame of
the reference model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

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
def _line_search(spec, floating, soft, vertices, evaluations: int = 12) -> float:
    """Golden-section search of ``f(P + γ(V − P))`` over γ ∈ [0, 1] (plus the ends)."""

    def f(gamma: float) -> float:
        mix = [
            {g: s[g] + gamma * (v[g] - s[g]) for g in s}
            for s, v in zip(soft, vertices, strict=True)
        ]
        return float(_objective(spec, floating, mix))

    ratio = (5**0.5 - 1) / 2
    lo, hi = 0.0, 1.0
    c, d = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(evaluations):
        if fc >= fd:
            hi, d, fd = d, c, fc
            c = hi - ratio * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + ratio * (hi - lo)
            fd = f(d)
    candidates = {0.0: f(0.0), 1.0: f(1.0), (lo + hi) / 2: max(fc, fd)}
    return max(candidates, key=candidates.get)
