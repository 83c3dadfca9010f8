"""What every matcher returns, and the input checks they share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lmckit.errors import ParamsError
from lmckit.lap import LapDuals
from lmckit.perm import Params, Permutation, PermutationSpec, check_params_compatible


@dataclass(frozen=True)
class MatchResult:
    """A permutation of model B onto model A and how it was found.

    ``perm.apply(params_b)`` is π(θ_B), aligned to θ_A.

    Attributes:
        perm: the permutation.
        method: the matcher's name.
        history: the matcher's objective after each iteration (weight matching: the inner
            product ⟨θ_A, π(θ_B)⟩ over the matched tensors after each sweep; STE/Sinkhorn:
            the loss per epoch).
        iterations: sweeps (weight matching) or optimisation steps.
        seconds: wall-clock time.
        distance_before, distance_after: ‖θ_A − θ_B‖ and ‖θ_A − π(θ_B)‖ over all
            floating-point tensors.
        duals: per-group LAP duals to warm-start a later call (weight matching, STE).
        info: method-specific extras (timings, settings).
    """

    perm: Permutation
    method: str
    history: tuple[float, ...]
    iterations: int
    seconds: float
    distance_before: float
    distance_after: float
    duals: Mapping[str, LapDuals] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def check_inputs(spec: PermutationSpec, params_a: Params, params_b: Params) -> None:
    """Both dicts fit the spec and each other, and every floating tensor is finite.

    Raises:
        SpecError / ParamsError naming the offending tensor.
    """
    spec.validate(params_a, what="params_a")
    spec.validate(params_b, what="params_b")
    check_params_compatible(params_a, params_b)
    for which, params in (("A", params_a), ("B", params_b)):
        for name, t in params.items():
            if t.dtype.is_floating_point and not torch.isfinite(t).all():
                raise ParamsError(f"model {which}: tensor {name!r} has NaN or infinite values")


def is_running_stat(name: str) -> bool:
    """BatchNorm running statistics, by their ``state_dict`` names."""
    return name.endswith(("running_mean", "running_var"))


def matched_names(params: Mapping[str, Tensor], include_running_stats: bool) -> list[str]:
    """Floating tensors that enter weight matching's objective."""
    return [
        k
        for k, t in params.items()
        if t.dtype.is_floating_point and (include_running_stats or not is_running_stat(k))
    ]
