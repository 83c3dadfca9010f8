"""What every multi-model merger returns, and the mechanics they share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor, nn

from lmckit._checks import check_seed
from lmckit.data import DataSource
from lmckit.errors import LmcError, ParamsError
from lmckit.evaluate.bn import bn_reset
from lmckit.match.result import check_init, check_inputs
from lmckit.options import checked
from lmckit.params import Params, average_params, check_params_compatible, detached, has_batchnorm
from lmckit.perm import Permutation, PermutationSpec, permute_tensor

if TYPE_CHECKING:
    from lmckit.data import Dataset
    from lmckit.progress import ProgressCallback


@dataclass(frozen=True)
class MergeResult:
    """Permutations ``perms[i]`` of every model into a common frame and the merged model.

    ``perms[i].apply(params_list[i])`` are the aligned models; ``merged`` is their mean
    ``(1/n) Σ π_i(θ_i)`` — with BatchNorm statistics re-estimated on the data when the
    models have BatchNorm and the merger was given ``model`` and ``data``
    (``info["bn_reset"]`` says whether it was). The reference model gets the identity.
    """

    perms: tuple[Permutation, ...]
    merged: dict[str, Tensor]
    method: str
    seconds: float
    history: tuple[float, ...] = ()
    iterations: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class Merger(Protocol):
    """The mergers' one signature: one model from ``params_list`` (all of ``spec``),
    aligned to ``params_list[reference]``; the other arguments as for
    :class:`lmckit.match.Matcher`."""

    def __call__(
        self,
        spec: PermutationSpec,
        params_list: Any,
        *,
        model: Any = None,
        data: Dataset | None = None,
        reference: int = -1,
        seed: int = 0,
        progress: ProgressCallback | None = None,
        **options: Any,
    ) -> MergeResult: ...


def check_models(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    reference: int = -1,
    init: Sequence[Permutation] | None = None,
    seed: int = 0,
) -> int:
    """At least two models, all fitting the spec and each other, all finite; ``reference``
    an index into them, ``init`` (if any) one permutation of the spec per model and ``seed``
    a seed.

    Returns:
        the reference's index in ``[0, n)``.
    """
    if isinstance(params_list, dict) or not isinstance(params_list, Sequence):
        raise ParamsError(
            f"params_list must be a list of parameter dicts, got {type(params_list).__name__}"
        )
    n = len(params_list)
    if n < 2:
        raise ParamsError(f"merging needs at least 2 models, got {n}")
    for i, p in enumerate(params_list):
        try:
            check_inputs(spec, params_list[0], p)
        except LmcError as exc:
            raise type(exc)(f"model {i} vs model 0: {exc}") from None
    if isinstance(reference, bool) or not isinstance(reference, int) or not -n <= reference < n:
        raise ParamsError(f"reference must be an index into the {n} models, got {reference!r}")
    check_seed(seed)
    if init is not None:
        if isinstance(init, Permutation) or not isinstance(init, Sequence):
            raise ParamsError("init must be a list with one Permutation per model")
        if len(init) != n:
            raise ParamsError(f"init has {len(init)} permutations for {n} models")
        for p in init:
            check_init(spec, p)
    return reference % n


def canonicalise(perms: Sequence[Permutation], reference: int) -> tuple[Permutation, ...]:
    """Re-express all permutations in the frame of model ``reference`` (which gets the
    identity): ``π_i ← π_ref⁻¹ ∘ π_i``."""
    inv = perms[reference].inverse()
    return tuple(inv.compose(p) for p in perms)


@checked
def merge_with(
    params_list: Sequence[Params],
    perms: Sequence[Permutation],
    weights: Sequence[float] | None = None,
) -> dict:
    """``(1/n) Σ π_i(θ_i)``: the plain average of the aligned models — or ``Σ w_i π_i(θ_i)``
    with ``weights`` (summing to 1)."""
    if len(perms) != len(params_list) or not all(isinstance(p, Permutation) for p in perms):
        raise ParamsError(
            f"merge_with needs one Permutation per model: {len(params_list)} models, "
            f"{len(perms)} permutations"
        )
    for i, (p, params) in enumerate(zip(perms, params_list, strict=True)):
        p.spec.validate(params, what=f"model {i}")
        if i:
            check_params_compatible(params_list[0], params, names=("model 0", f"model {i}"))
    # tensor by tensor: the aligned models are never all in memory at once (two aligned
    # copies of a 1.1 B-parameter pair were 8.8 GB beside the merge)
    merged = {}
    pairs = list(zip(perms, params_list, strict=True))
    for name in params_list[0]:
        one = [{name: permute_tensor(params[name], p.spec, name, p)} for p, params in pairs]
        merged[name] = average_params(one, weights)[name]
    return merged


def merged_result(
    method: str,
    params_list: Sequence[Params],
    perms: Sequence[Permutation],
    started: float,
    *,
    model: nn.Module | None,
    data: DataSource | None,
    seed: int,
    history: Sequence[float] = (),
    iterations: int = 0,
    info: dict[str, Any] | None = None,
    members: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
) -> MergeResult:
    """The :class:`MergeResult` every merger returns: the average of the aligned models
    (only those listed in ``members``, if given; weighted by ``weights`` — one per model,
    summing to 1 — if given), BatchNorm-reset on ``data`` when it has running statistics
    and ``model`` and ``data`` are given (an averaged model's statistics are not the
    statistics of its activations)."""
    chosen = list(range(len(params_list)) if members is None else members)
    merged = merge_with(
        [detached(params_list[i]) for i in chosen],
        [perms[i] for i in chosen],
        None if weights is None else [weights[i] for i in chosen],
    )
    reset = has_batchnorm(merged) and model is not None and data is not None
    if reset:
        merged = bn_reset(model, merged, data, seed=seed)
    return MergeResult(
        tuple(perms),
        merged,
        method,
        time.perf_counter() - started,
        tuple(history),
        iterations,
        {**(info or {}), "bn_reset": reset},
    )
