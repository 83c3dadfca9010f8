"""Three models aligned to one (Ito et al. §5.3, Figs. 4–5, Table 3): B and C are each
matched to A; are ``π_b(θ_b)`` and ``π_c(θ_c)`` aligned with *each other*?

Weight matching aligns singular vectors, so ``π_b(θ_b)`` and ``π_c(θ_c)`` inherit an
alignment through A and their midpoint stays good; a data-driven method (STE) need not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor, nn

from lmckit.analysis.spectral import alignment, layer_svds
from lmckit.data import DataSource
from lmckit.evaluate import bn_reset
from lmckit.metrics import evaluate
from lmckit.options import checked
from lmckit.params import Params, has_batchnorm, lerp_params
from lmckit.perm import Permutation, PermutationSpec

__all__ = ["PAIRS", "ThreeModels", "three_models"]

PAIRS = ("a-b", "a-c", "b-c")
"""The three pairs, in Table 3's order: (θ_a, π_b θ_b), (θ_a, π_c θ_c), (π_b θ_b, π_c θ_c)."""


@dataclass(frozen=True)
class ThreeModels:
    """Per pair (keys of :data:`PAIRS`): singular-vector alignment ``R`` at ``gamma``, and
    the barriers at the midpoint λ = ½: ``loss_barrier = L(mid) − ½(L₁ + L₂)``,
    ``accuracy_barrier = ½(acc₁ + acc₂) − acc(mid)`` (negative: the midpoint is better)."""

    gamma: float
    R: dict[str, float]
    loss_barrier: dict[str, float]
    accuracy_barrier: dict[str, float]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return dict(vars(self))


@checked
def three_models(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    params_c: Params,
    perm_b: Permutation,
    perm_c: Permutation,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    gamma: float = 0.3,
    bn_reset_data: DataSource | None = None,
) -> ThreeModels:
    """R and midpoint barriers for the three pairs of ``θ_a``, ``π_b(θ_b)``, ``π_c(θ_c)``
    (``perm_b``, ``perm_c`` align B and C to A). Midpoints of BatchNorm nets are BN-reset on
    ``bn_reset_data`` when given (the paper resets them on the training set)."""
    svds = {"a": layer_svds(params_a)}
    aligned = {"a": params_a, "b": perm_b.apply(params_b), "c": perm_c.apply(params_c)}
    svds["b"], svds["c"] = layer_svds(aligned["b"]), layer_svds(aligned["c"])
    metrics = {k: evaluate(model, p, loader) for k, p in aligned.items()}
    R, loss_barrier, acc_barrier = {}, {}, {}
    for pair in PAIRS:
        i, j = pair.split("-")
        R[pair] = alignment(
            spec, aligned[i], aligned[j], gamma=gamma, svds_a=svds[i], svds_b=svds[j]
        ).total
        mid = lerp_params(aligned[i], aligned[j], 0.5)
        if bn_reset_data is not None and has_batchnorm(mid):
            mid = bn_reset(model, mid, bn_reset_data)
        m = evaluate(model, mid, loader)
        loss_barrier[pair] = m.loss - 0.5 * (metrics[i].loss + metrics[j].loss)
        acc_barrier[pair] = 0.5 * (metrics[i].accuracy + metrics[j].accuracy) - m.accuracy
    return ThreeModels(float(gamma), R, loss_barrier, acc_barrier)
