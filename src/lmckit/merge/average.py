"""The average of models without any alignment — the baseline every permutation-aware
merge has to beat. Meaningful when the models share an initialisation; from independent
initialisations it is the naive merge that Git Re-Basin shows collapsing.

Two weightings: the *uniform* average ``(1/n) Σ θ_i``, and one-shot *FedAvg* (McMahan et
al. 2017, Alg. 1 with a single communication round), which weights each client's model by
the number of examples it trained on: ``Σ (n_k / N) θ_k`` with ``N = Σ n_k``. Under
label-skewed (Dirichlet) splits the clients' sizes differ several-fold, and the two
differ."""

from __future__ import annotations

import time
from collections.abc import Sequence

from torch import nn

from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.merge.result import MergeResult, check_models, merged_result
from lmckit.options import Count, check_value, checked
from lmckit.params import Params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify


@checked
def average(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    sizes: Sequence[Count] | None = None,
) -> MergeResult:
    """``(1/n) Σ θ_i`` — or, with ``sizes``, FedAvg's ``Σ (n_k / N) θ_k`` — with every
    permutation the identity (BatchNorm statistics reset on ``data`` when ``model`` and
    ``data`` are given, as for every merger).

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model, data: used only to BN-reset the merged model.
        reference, seed: accepted for a uniform merger signature; the average has no
            reference and draws nothing at random.
        progress: one :class:`~lmckit.progress.Progress` (step 1 of 1) once averaged.
        sizes: the number of training examples of each model (FedAvg's ``n_k``); ``None``
            weights every model alike.
    """
    start = time.perf_counter()
    check_models(spec, params_list, reference, seed=seed)
    weights = None
    if sizes is not None:
        check_value("sizes", sizes, Sequence[Count])
        if len(sizes) != len(params_list):
            raise ParamsError(f"{len(sizes)} sizes for {len(params_list)} models")
        weights = [n / sum(sizes) for n in sizes]
    perms = [Permutation.identity(spec) for _ in params_list]
    result = merged_result(
        "average" if sizes is None else "fedavg",
        params_list,
        perms,
        start,
        model=model,
        data=data,
        seed=seed,
        weights=weights,
        info={} if weights is None else {"weights": weights, "sizes": list(sizes)},
    )
    notify(progress, 1, 1)
    return result
