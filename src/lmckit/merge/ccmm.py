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
from torch import nn

from lmckit._checks import check_int, check_number
from lmckit.data import DataSource
from lmckit.lap import assign_groups
from lmckit.match.sinkhorn import soft_apply
from lmckit.merge.result import MergeResult, canonicalise, check_models, merged_result
from lmckit.merge.star import star
from lmckit.options import Count, NonNegative, checked
from lmckit.params import Params, floating_names, pairwise_inner_sum
from lmckit.perm import Permutation, PermutationSpec, axis_groups
from lmckit.progress import ProgressCallback, notify


def _aligned(spec, floating, soft_list) -> list[dict]:
    return [soft_apply(spec, p, s) for p, s in zip(floating, soft_list, strict=True)]


@checked
def ccmm(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    init: Sequence[Permutation] | None = None,
    max_iter: Count = 50,
    tol: NonNegative = 1e-9,
) -> MergeResult:
    """Merge ``n`` models by Frank–Wolfe on ``Σ_{i<j} ⟨P_iθ_i, P_jθ_j⟩``.

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model, data: used only to BN-reset the merged model.
        reference: the model whose frame the permutations are finally expressed in.
        seed: seeds the star weight matching that gives the default start.
        progress: a :class:`~lmckit.progress.Progress` after each Frank–Wolfe iteration
            (``metrics["objective"]``, ``metrics["gap"]``).
        init: a starting permutation per model; default: weight matching of every model to
            the reference (star-WM) — from the identity Frank–Wolfe stalls in worse
            stationary points.
        max_iter: Frank–Wolfe iterations.
        tol: stop when the Frank–Wolfe gap falls below ``tol · |f|``.

    ``history`` is the relaxed objective per iteration; ``info["fw_gap"]`` the last gap.

    Cost per iteration: the objective and its gradient, then an exact line search that
    aligns every model at two more steps (an aligned weight matrix is quadratic in the
    step, so three alignments give the objective at every step); memory: the inputs and
    every model aligned at three steps.
    """
    start = time.perf_counter()
    ref = check_models(spec, params_list, reference, init, seed)
    check_int("max_iter", max_iter)
    check_number("tol", tol, low=0.0)
    floating_keys = floating_names(params_list[0])
    sub = spec.restrict(floating_keys)
    floating = [{k: p[k].detach() for k in floating_keys} for p in params_list]
    device = params_list[0][floating_keys[0]].device
    dtype = params_list[0][floating_keys[0]].dtype
    start_perms = (
        list(init) if init is not None else star(spec, params_list, reference=ref, seed=seed).perms
    )

    def one_hot(perm: Permutation) -> dict:
        return {
            g: torch.eye(m, dtype=dtype, device=device)[perm[g].to(device)]
            for g, m in spec.groups.items()
            if g not in spec.copies  # query heads inside their key/value group: kept
        }

    soft = [one_hot(p) for p in start_perms]
    history: list[float] = []
    gap = float("nan")
    iterations = 0
    for it in range(max_iter):
        iterations = it + 1
        leaves = [{g: m.detach().requires_grad_(True) for g, m in s.items()} for s in soft]
        aligned = _aligned(sub, floating, leaves)
        f = pairwise_inner_sum(aligned)
        grads = torch.autograd.grad(f, [m for s in leaves for m in s.values()])
        history.append(float(f.detach()))
        vertices, k, gap = [], 0, 0.0
        for s in soft:
            grad = dict(zip(s, grads[k : k + len(s)], strict=True))
            k += len(s)
            # the oracle: a vertex maximising ⟨grad, ·⟩
            best = assign_groups(grad, spec.heads, spec.pinned)
            vertex = {}
            for g, m in s.items():
                vertex[g] = torch.eye(m.shape[0], dtype=dtype, device=device)[best[g].to(device)]
                gap += float((grad[g] * (vertex[g] - m)).sum())
            vertices.append(vertex)
        notify(progress, iterations, max_iter, objective=history[-1], gap=gap)
        if gap <= tol * max(abs(history[-1]), 1e-30):
            break
        at_start = [{k: t.detach() for k, t in a.items()} for a in aligned]
        step = _line_search(sub, floating, soft, vertices, at_start)
        if step <= 0:
            break
        soft = [
            {g: s[g] + step * (v[g] - s[g]) for g in s} for s, v in zip(soft, vertices, strict=True)
        ]
    perms = [
        Permutation(
            spec,
            {
                **assign_groups(s, spec.heads, spec.pinned),
                **{c: start[c] for c in spec.copies},  # attached to B's heads: still valid
            },
        )
        for s, start in zip(soft, start_perms, strict=True)
    ]
    return merged_result(
        "ccmm",
        params_list,
        canonicalise(perms, ref),
        start,
        model=model,
        data=data,
        seed=seed,
        history=history,
        iterations=iterations,
        info={"fw_gap": gap, "init": "given" if init is not None else "star-wm"},
    )


_GRAM_CHUNK = 1 << 20  # entries of a tensor per float64 stack in the line search


@torch.no_grad()
def _line_search(spec, floating, soft, vertices, at_start) -> float:
    """Exact line search of ``f(P + γ(V − P))`` on γ ∈ [0, 1]; ``at_start`` holds the
    models aligned at γ = 0.

    An aligned tensor is a polynomial in γ of degree at most ``d``, the number of group
    actions on it (each soft matrix is linear in γ; ``d`` = 2 for a weight matrix), so its
    values ``a_ij`` at ``d + 1`` nodes give it everywhere: ``a_i(γ) = Σ_j L_j(γ) a_ij``
    (Lagrange). ``d`` further alignments — matrix products, the costly part — are all the
    search needs: ``f(γ) = ½ Σ_jl L_j(γ) L_l(γ) M_jl`` with the node Gram
    ``M_jl = Σ_{i≠i'} ⟨a_ij, a_i'l⟩`` (float64), exact for any γ; its maximum is read
    off a fine grid."""
    degree = max(sum(len(axis_groups(e)) for e in spec.axes[k]) for k in at_start[0])
    nodes = np.linspace(0.0, 1.0, max(degree, 1) + 1)
    at_nodes = [at_start] + [
        _aligned(
            spec,
            floating,
            [
                {g: s[g] + float(gamma) * (v[g] - s[g]) for g in s}
                for s, v in zip(soft, vertices, strict=True)
            ],
        )
        for gamma in nodes[1:]
    ]
    gram = torch.zeros(len(nodes), len(nodes), dtype=torch.float64)
    models = range(len(at_start))
    for k in at_start[0]:
        flat = [at[i][k].reshape(-1) for i in models for at in at_nodes]
        for lo in range(0, flat[0].numel(), _GRAM_CHUNK):  # bounds the float64 copy
            x = torch.stack([t[lo : lo + _GRAM_CHUNK] for t in flat]).double()
            x = x.reshape(len(models), len(nodes), -1)  # (models, nodes, entries)
            total = x.sum(0)
            gram += (total @ total.T - torch.bmm(x, x.transpose(1, 2)).sum(0)).cpu()
    grid = np.linspace(0.0, 1.0, 1001)
    basis = np.stack(
        [np.prod([(grid - x) / (node - x) for x in nodes if x != node], axis=0) for node in nodes],
        axis=1,
    )  # (grid, nodes): L_j(γ)
    values = 0.5 * np.einsum("gj,jl,gl->g", basis, gram.numpy(), basis)
    return float(grid[int(np.argmax(values))])
