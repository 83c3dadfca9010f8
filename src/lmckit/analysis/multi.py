"""The STE-MM paper's multi-model metrics for a set of aligned models."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from lmckit.analysis.geometry import simplex_geometry
from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.evaluate import bn_reset, evaluate
from lmckit.options import checked
from lmckit.params import Params, average_params, lerp_params
from lmckit.perm import Permutation
from lmckit.transform import Transform, align


@dataclass
class MultiModelMetrics:
    """For aligned models ``π_i(θ_i)`` and their mean (the merged model):

    * ``merged_loss``, ``merged_accuracy``;
    * ``mean_loss``, ``mean_accuracy`` of the individual models;
    * ``loss_gap = L(merged) − mean_i L(θ_i)`` (STE-MM Fig. 3b);
    * ``pairwise_gap = 2/(n(n−1)) Σ_{i<j} L(½(π_iθ_i + π_jθ_j)) − mean_i L(θ_i)`` (Fig. 4);
    * ``pair_distances``: ``‖π_iθ_i − π_jθ_j‖`` for every pair ``i < j`` in
      ``itertools.combinations`` order (Fig. 6);
    * ``distance_ratios`` (Fig. 9) and ``triplet_angles`` (Figs. 7/10).
    """

    n: int
    merged_loss: float
    merged_accuracy: float
    mean_loss: float
    mean_accuracy: float
    loss_gap: float
    pairwise_gap: float | None
    distance_ratios: list[float] = field(default_factory=list)
    triplet_angles: list[float] = field(default_factory=list)
    pair_distances: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return vars(self)


@checked
def multi_model_metrics(
    model: nn.Module,
    params_list: Sequence[Params],
    perms: Sequence[Permutation | Transform],
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    bn_reset_data: DataSource | None = None,
    pairwise: bool = True,
    merged: Params | None = None,
) -> MultiModelMetrics:
    """Evaluate the merged model and the geometry of the aligned models on ``loader``.

    ``merged`` overrides the plain average (e.g. a merger's BN-reset result). The plain
    average and the pairwise midpoints of BN models are BN-reset on ``bn_reset_data``
    when given."""
    if not isinstance(perms, Sequence) or len(perms) != len(params_list):
        got = len(perms) if isinstance(perms, Sequence) else type(perms).__name__
        raise ParamsError(f"need one permutation per model ({len(params_list)}), got {got}")
    aligned = [align(p, params) for p, params in zip(perms, params_list, strict=True)]

    def fix(params):
        return bn_reset(model, params, bn_reset_data) if bn_reset_data is not None else params

    individual = [evaluate(model, p, loader) for p in params_list]
    mean_loss = sum(m.loss for m in individual) / len(individual)
    mean_acc = sum(m.accuracy for m in individual) / len(individual)
    merged_params = merged if merged is not None else fix(average_params(aligned))
    merged_eval = evaluate(model, merged_params, loader)
    pair_gap = None
    if pairwise:
        losses = [
            evaluate(model, fix(lerp_params(aligned[i], aligned[j], 0.5)), loader).loss
            for i, j in itertools.combinations(range(len(aligned)), 2)
        ]
        pair_gap = sum(losses) / len(losses) - mean_loss
    return MultiModelMetrics(
        n=len(params_list),
        merged_loss=merged_eval.loss,
        merged_accuracy=merged_eval.accuracy,
        mean_loss=mean_loss,
        mean_accuracy=mean_acc,
        loss_gap=merged_eval.loss - mean_loss,
        pairwise_gap=pair_gap,
        **simplex_geometry(aligned),
    )
