"""The plain average of models without any alignment: one-shot FedAvg (McMahan et al.
2017, with a single communication round) — the baseline every permutation-aware merge has
to beat. Meaningful when the models share an initialisation; from independent
initialisations it is the naive merge that Git Re-Basin shows collapsing."""

from __future__ import annotations

import time
from collections.abc import Sequence

from torch import nn

from lmckit.data import DataSource
from lmckit.merge.result import MergeResult, check_models, merged_result
from lmckit.params import Params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify


def average(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
) -> MergeResult:
    """``(1/n) Σ θ_i`` with every permutation the identity (BatchNorm statistics reset on
    ``data`` when ``model`` and ``data`` are given, as for every merger).

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model, data: used only to BN-reset the merged model.
        reference, seed: accepted for a uniform merger signature; the average has no
            reference and draws nothing at random.
        progress: one :class:`~lmckit.progress.Progress` (step 1 of 1) once averaged.
    """
    start = time.perf_counter()
    check_models(spec, params_list, reference, seed=seed)
    perms = [Permutation.identity(spec) for _ in params_list]
    result = merged_result("average", params_list, perms, start, model=model, data=data, seed=seed)
    notify(progress, 1, 1)
    return result
