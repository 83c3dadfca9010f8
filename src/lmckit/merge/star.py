"""Star merging (STE-MM §3's baseline): match every model to one reference independently."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from torch import nn

from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.match import METHODS as MATCHERS
from lmckit.merge.result import MergeResult, check_models, merged_result
from lmckit.options import checked
from lmckit.params import Params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify


@checked
def star(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    method: str = "wm-fast",
    average: Literal["all", "others"] = "all",
    **match_options,
) -> MergeResult:
    """Align every model to ``params_list[reference]`` with a two-model matcher, then average.

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model, data: passed to the matcher (needed by data-driven ones) and used to
            BN-reset the merged model.
        reference: index of the model the others are aligned to (it gets the identity).
        seed: passed to every match.
        progress: a :class:`~lmckit.progress.Progress` after each model is matched.
        method: a name from :data:`lmckit.match.METHODS` (``"wm-fast"``, ``"ste"``, ...).
        average: ``"all"`` — the merged model is the mean of all ``n`` aligned models — or
            ``"others"``: the mean of the ``n − 1`` aligned models other than the reference,
            ``(1/(n−1)) Σ_{i≠ref} π_i(θ_i)``, the merged model of STE-MM's Fig. 1.
        match_options: further options of that matcher (``epochs=``, ``lr=`` ...).
    """
    start = time.perf_counter()
    ref = check_models(spec, params_list, reference, seed=seed)
    if method not in MATCHERS:
        raise ParamsError(f"star method must be one of {sorted(MATCHERS)}, got {method!r}")
    if average not in ("all", "others"):
        raise ParamsError(f"average must be 'all' or 'others', got {average!r}")
    if average == "others" and len(params_list) < 2:
        raise ParamsError("average='others' needs at least 2 models")
    matcher = MATCHERS[method]
    match_options = matcher.check_options(match_options, where=f"star(method={method!r}): ")
    n = len(params_list)
    perms = []
    for i, params in enumerate(params_list):
        if i == ref:
            perms.append(Permutation.identity(spec))
            continue
        result = matcher(
            spec, params_list[ref], params, model=model, seed=seed,
            data=data if matcher.needs_data else None,  # data also BN-resets the merge
            **match_options,
        )  # fmt: skip
        perms.append(result.alignment)
        notify(progress, len(perms) - (ref < i), n - 1, model=i)
    return merged_result(
        f"star-{method}" + ("-others" if average == "others" else ""),
        params_list,
        perms,
        start,
        model=model,
        data=data,
        seed=seed,
        info={"reference": ref, "average": average},
        members=None if average == "all" else [i for i in range(n) if i != ref],
    )
