"""L2 distances between two models before and after a permutation, tensor by tensor
(Ito et al. Table 1: "L2 dist. w/o WM" and "w/ WM")."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from lmckit.errors import SpecError
from lmckit.options import checked
from lmckit.params import Params, check_params_compatible, is_running_stat
from lmckit.perm import Permutation

__all__ = ["Distances", "l2_distances"]


@dataclass(frozen=True)
class Distances:
    """``‖A_k − B_k‖`` and ``‖A_k − π(B)_k‖`` per floating tensor (``per_tensor[k] =
    (before, after)``), and the totals ``sqrt(Σ ‖·‖²)`` over the parameters and over the
    buffers (BatchNorm running statistics), kept apart: only parameters define the loss
    landscape, and buffers are re-estimated after merging anyway."""

    per_tensor: dict[str, tuple[float, float]]
    parameters: tuple[float, float]
    buffers: tuple[float, float]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {
            "per_tensor": {k: list(v) for k, v in self.per_tensor.items()},
            "parameters": list(self.parameters),
            "buffers": list(self.buffers),
        }


@checked
def l2_distances(
    params_a: Params,
    params_b: Params,
    perm: Permutation | None = None,
    *,
    buffers: Collection[str] | None = None,
) -> Distances:
    """Distances from A to B and to ``perm.apply(B)`` (the same when ``perm`` is None), in
    float64 over the floating tensors; integer buffers (``num_batches_tracked``) are left out.

    Args:
        buffers: names of the buffers (e.g. ``dict(model.named_buffers())``); default: the
            BatchNorm running statistics, recognised by name.
    """
    check_params_compatible(params_a, params_b)
    if perm is not None:
        perm.spec.validate(params_b)
        aligned = perm.apply(params_b)
    else:
        aligned = params_b
    if buffers is not None:
        unknown = sorted(set(buffers) - set(params_a))
        if unknown:
            raise SpecError(f"buffers not in the parameters: {unknown[:5]}")
    is_buffer = (lambda k: k in buffers) if buffers is not None else is_running_stat
    per_tensor = {}
    sq = {"parameters": [0.0, 0.0], "buffers": [0.0, 0.0]}
    for k, a in params_a.items():
        if not a.dtype.is_floating_point:
            continue
        a64 = a.detach().double()
        before = float((a64 - params_b[k].detach().double()).pow(2).sum())
        after = float((a64 - aligned[k].detach().double()).pow(2).sum())
        per_tensor[k] = (math.sqrt(before), math.sqrt(after))
        kind = sq["buffers" if is_buffer(k) else "parameters"]
        kind[0] += before
        kind[1] += after
    return Distances(
        per_tensor,
        (math.sqrt(sq["parameters"][0]), math.sqrt(sq["parameters"][1])),
        (math.sqrt(sq["buffers"][0]), math.sqrt(sq["buffers"][1])),
    )
