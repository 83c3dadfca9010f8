"""MergeMany (Git Re-Basin, Alg. 3): match each model to the mean of the others.

Rounds visit the models in a random order; each is re-matched by weight matching to the
average of the others (as currently permuted), warm-started from its previous permutation
and its own persistent LAP duals. Stops after a round in which no permutation changed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from lmckit.match import weight_matching
from lmckit.merge.result import (
    MergeResult,
    average_params,
    canonicalise,
    check_models,
    merge_with,
    pairwise_inner_sum,
)
from lmckit.perm import Params, Permutation, PermutationSpec


def merge_many(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    max_rounds: int = 100,
    seed: int = 0,
    reference: int = -1,
) -> MergeResult:
    """Merge ``n`` models by MergeMany; ``history`` is ``Σ_{i<j} ⟨π_iθ_i, π_jθ_j⟩`` after
    each round. Permutations are finally expressed in the frame of ``reference``."""
    start = time.perf_counter()
    check_models(spec, params_list)
    n = len(params_list)
    perms = [Permutation.identity(spec) for _ in range(n)]
    aligned = [dict(p) for p in params_list]
    duals: list = [None] * n
    generator = torch.Generator().manual_seed(seed)
    history: list[float] = []
    rounds = 0
    for _ in range(max_rounds):
        rounds += 1
        changed = False
        for i in torch.randperm(n, generator=generator).tolist():
            others = average_params([aligned[j] for j in range(n) if j != i])
            r = weight_matching(
                spec, others, params_list[i], init=perms[i], duals=duals[i], seed=seed + rounds
            )
            duals[i] = r.duals
            if r.perm != perms[i]:
                perms[i] = r.perm
                aligned[i] = r.perm.apply(params_list[i])
                changed = True
        history.append(pairwise_inner_sum(aligned))
        if not changed:
            break
    perms = list(canonicalise(perms, reference % n))
    return MergeResult(
        tuple(perms),
        merge_with(params_list, perms),
        "merge-many",
        time.perf_counter() - start,
        tuple(history),
        rounds,
    )
