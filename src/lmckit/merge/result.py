"""What every multi-model merger returns, and the mechanics they share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lmckit.errors import LmcError, ParamsError
from lmckit.match.result import check_inputs
from lmckit.perm import Params, Permutation, PermutationSpec


@dataclass(frozen=True)
class MergeResult:
    """Permutations ``perms[i]`` of every model into a common frame and the merged model.

    ``perms[i].apply(params[i])`` are the aligned models; ``merged`` is their mean
    ``(1/n) Σ π_i(θ_i)``. Methods with a reference model give it the identity.
    """

    perms: tuple[Permutation, ...]
    merged: dict[str, Tensor]
    method: str
    seconds: float
    history: tuple[float, ...] = ()
    iterations: int = 0
    info: dict[str, Any] = field(default_factory=dict)


def check_models(spec: PermutationSpec, params_list: Sequence[Params]) -> None:
    """At least two models, all fitting the spec and each other, all finite."""
    if len(params_list) < 2:
        raise ParamsError(f"merging needs at least 2 models, got {len(params_list)}")
    for i, p in enumerate(params_list[1:], start=1):
        try:
            check_inputs(spec, params_list[0], p)
        except LmcError as exc:
            raise type(exc)(f"model {i} vs model 0: {exc}") from None


def average_params(params_list: Sequence[Params], weights: Sequence[float] | None = None) -> dict:
    """Weighted mean of floating tensors (uniform by default); integer buffers from model 0."""
    n = len(params_list)
    w = [1.0 / n] * n if weights is None else [float(x) for x in weights]
    out = {}
    for k, first in params_list[0].items():
        if first.dtype.is_floating_point:
            acc = w[0] * first
            for wi, p in zip(w[1:], params_list[1:], strict=True):
                acc = acc + wi * p[k]
            out[k] = acc
        else:
            out[k] = first.clone()
    return out


def merge_with(params_list: Sequence[Params], perms: Sequence[Permutation]) -> dict:
    """``(1/n) Σ π_i(θ_i)``."""
    return average_params([p.apply(params) for p, params in zip(perms, params_list, strict=True)])


def pairwise_inner_sum(aligned: Sequence[Params]) -> float:
    """``Σ_{i<j} ⟨θ_i, θ_j⟩`` over floating tensors, via ``½(‖Σθ‖² − Σ‖θ‖²)``."""
    total = 0.0
    for k, t in aligned[0].items():
        if not t.dtype.is_floating_point:
            continue
        stack = torch.stack([a[k].double() for a in aligned])
        s = stack.sum(0)
        total += 0.5 * (float((s * s).sum()) - float((stack * stack).sum()))
    return total


def canonicalise(perms: Sequence[Permutation], reference: int) -> tuple[Permutation, ...]:
    """Re-express all permutations in the frame of model ``reference`` (which gets the
    identity): ``π_i ← π_ref⁻¹ ∘ π_i``. The merged model is permuted accordingly."""
    inv = perms[reference].inverse()
    return tuple(inv.compose(p) for p in perms)
