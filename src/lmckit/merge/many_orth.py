"""MergeMany over orthogonal maps as well as permutations.

Git Re-Basin's Alg. 3 re-matches each model to the mean of the others; here each re-match is
:func:`~lmckit.match.orthogonal.orthogonal_weight_matching` — Procrustes for the groups the
model's graph lets rotate (the residual stream with its norm gains folded, each head's
query/key and value/output dimensions), LAPs elsewhere — warm-started from the model's
previous map. It starts from MergeMany's permutations (over the same folded models) and
stops after a round whose objective ``Σ_{i<j} ⟨T_iθ_i, T_jθ_j⟩`` rises by less than a
relative ``1e-9``. The merged model is the mean of the aligned, norm-folded models, in the
reference's frame; it computes with every gain one (folded), so it loads into the same
module. Invertible and scaling maps are not searched (they do not keep weight distances; a
weight objective would shrink them): each kind's orthogonal maps are.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmckit._checks import check_int
from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.match.network import example_batch
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.merge.many import merge_many
from lmckit.merge.result import MergeResult, check_models
from lmckit.options import Count, checked
from lmckit.params import Params, average_params, detached, pairwise_inner_sum
from lmckit.perm import PermutationSpec
from lmckit.progress import ProgressCallback, notify
from lmckit.transform import Transform, fold_norms, orthogonal_subgroup

__all__ = ["merge_many_orthogonal"]


@checked
def merge_many_orthogonal(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    example_inputs: Tensor | Sequence[Any] | None = None,
    example_kwargs: Mapping[str, Any] | None = None,
    max_rounds: Count = 50,
    rel_tol: float = 1e-9,
) -> MergeResult:
    """Merge ``n`` models by MergeMany over permutations and orthogonal maps.

    Args:
        spec, params_list: the models (at least two, fitting the spec), norms not folded.
        model: the module they fit; its graph decides which groups rotate
            (:func:`lmckit.tracing.symmetry_kinds`).
        data: where the example batch comes from when ``example_inputs`` is not given.
        reference: the model whose frame the maps are finally expressed in.
        seed: the rounds' visiting orders and the descents' group orders.
        progress: a :class:`~lmckit.progress.Progress` after each round
            (``metrics["objective"]``).
        example_inputs, example_kwargs: a batch to read the graph with.
        max_rounds: upper bound on the rounds.
        rel_tol: stop when a round raises the objective by less than this, relatively.

    Returns:
        :class:`~lmckit.merge.MergeResult` whose ``perms`` are
        :class:`~lmckit.transform.Transform` s of the folded models (the reference's is the
        identity) and ``merged`` the mean of the aligned folded models; ``history`` is the
        objective after MergeMany's start and after each round.

    Raises:
        ParamsError: no model, no example batch, or a model whose graph lets nothing rotate.
    """
    from lmckit.tracing import symmetry_kinds

    start = time.perf_counter()
    ref = check_models(spec, params_list, reference, None, seed)
    check_int("max_rounds", max_rounds)
    if not isinstance(model, nn.Module):
        raise ParamsError("merge_many_orthogonal needs model= (its graph says what rotates)")
    if example_inputs is None:
        example_inputs = example_batch(data, "merge_many_orthogonal")
    kinds = symmetry_kinds(model, example_inputs, spec, example_kwargs=example_kwargs).spec
    kinds = orthogonal_subgroup(kinds)
    if not kinds.kinds:
        raise ParamsError(
            f"no group of {type(model).__name__} admits an orthogonal map: use merge-many"
        )
    folded = [fold_norms(kinds, detached(p)) for p in params_list]
    n = len(folded)
    start_perms = merge_many(kinds, folded, reference=ref, seed=seed).perms
    maps = [Transform.from_permutation(p) for p in start_perms]
    aligned = [t.apply(p) for t, p in zip(maps, folded, strict=True)]
    generator = torch.Generator().manual_seed(seed)
    history = [float(pairwise_inner_sum(aligned))]
    rounds = 0
    for _ in range(max_rounds):
        rounds += 1
        for i in torch.randperm(n, generator=generator).tolist():
            others = average_params([aligned[j] for j in range(n) if j != i])
            result = orthogonal_weight_matching(
                kinds, others, folded[i], init=maps[i], seed=seed + rounds, max_iter=20
            )
            maps[i] = result.alignment
            aligned[i] = maps[i].apply(folded[i])
        history.append(float(pairwise_inner_sum(aligned)))
        notify(progress, rounds, None, objective=history[-1])
        if history[-1] - history[-2] <= rel_tol * abs(history[-2]):
            break
    back = maps[ref].inverse()
    maps = [Transform.identity(kinds) if i == ref else back.compose(t) for i, t in enumerate(maps)]
    merged = average_params([t.apply(p) for t, p in zip(maps, folded, strict=True)])
    return MergeResult(
        perms=tuple(maps),
        merged=merged,
        method="merge-many-orth",
        seconds=time.perf_counter() - start,
        history=tuple(history),
        iterations=rounds,
        info={"kinds": dict(kinds.kinds), "bn_reset": False},
    )
