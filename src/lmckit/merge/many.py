"""MergeMany (Git Re-Basin, Alg. 3): match each model to the mean of the others.

Rounds visit the models in a random order; each is re-matched by weight matching to the
average of the others (as currently permuted), warm-started from its previous permutation
and its own persistent LAP duals. Stops after a round in which no permutation changed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from lmckit._checks import check_int
from lmckit.data import DataSource
from lmckit.match import WeightMatcher
from lmckit.merge.result import MergeResult, canonicalise, check_models, merged_result
from lmckit.options import Count, checked
from lmckit.params import Params, average_params, detached, pairwise_inner_sum
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify


@checked
def merge_many(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    init: Sequence[Permutation] | None = None,
    max_rounds: Count = 100,
) -> MergeResult:
    """Merge ``n`` models by MergeMany.

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model, data: used only to BN-reset the merged model (weight matching needs neither).
        reference: the model whose frame the permutations are finally expressed in.
        seed: fixes the visiting order of each round and the group orders.
        progress: a :class:`~lmckit.progress.Progress` after each round
            (``metrics["objective"]``, ``metrics["changed"]``).
        init: a starting permutation per model (identity by default).
        max_rounds: upper bound on the rounds.

    ``history`` is ``Σ_{i<j} ⟨π_iθ_i, π_jθ_j⟩`` after each round.
    """
    start = time.perf_counter()
    ref = check_models(spec, params_list, reference, init, seed)
    check_int("max_rounds", max_rounds)
    params_list = [detached(p) for p in params_list]
    n = len(params_list)
    perms = list(init) if init is not None else [Permutation.identity(spec) for _ in range(n)]
    aligned = [p.apply(params) for p, params in zip(perms, params_list, strict=True)]
    matchers = [WeightMatcher(spec, params) for params in params_list]
    duals: list = [None] * n
    generator = torch.Generator().manual_seed(seed)
    history: list[float] = []
    rounds = 0
    for _ in range(max_rounds):
        rounds += 1
        changed = 0
        for i in torch.randperm(n, generator=generator).tolist():
            others = average_params([aligned[j] for j in range(n) if j != i])
            r = matchers[i].match(
                others,
                init=perms[i],
                duals=duals[i],
                seed=seed + rounds,
                validate=False,
                distances=False,
                objective=False,
            )
            duals[i] = r.duals
            if r.alignment != perms[i]:
                perms[i] = r.alignment
                aligned[i] = r.alignment.apply(params_list[i])
                changed += 1
        history.append(float(pairwise_inner_sum(aligned)))
        notify(progress, rounds, None, objective=history[-1], changed=changed)
        if not changed:
            break
    return merged_result(
        "merge-many",
        params_list,
        canonicalise(perms, ref),
        start,
        model=model,
        data=data,
        seed=seed,
        history=history,
        iterations=rounds,
    )
