"""Merging under random permutations (the width study §3.2, App. F.4–F.5, Fig. 18–19).

If wide networks are linearly connected *without* permutations, any permutation should do:
merge ``π_A(θ_A)`` and ``π_B(θ_B)`` for random ``π_A, π_B`` and compare with no
permutation and with a found one (e.g. weight matching). Every merge is scored as the paper
does: accuracy, loss, and the temperature-calibrated loss — the inverse temperature fitted
on a seeded 20 % of the evaluation examples, every metric reported on the other 80 % — with
barriers against the mean of the endpoints on the same 80 %.

The paper's "inverse temperature" (Fig. 19) is "the factor by which the logits are
divided": that is ``temperature`` here, ``1/β`` for the ``β`` of
:func:`lmckit.evaluate.calibration.fit_temperature` (which *multiplies* the logits). Values
below 1 sharpen the softmax — what LEWC's shrunken logits need.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.data import holdout_split
from lmckit.errors import ParamsError
from lmckit.evaluate.bn import bn_reset
from lmckit.evaluate.calibration import calibrated_loss
from lmckit.functional import check_model_fits
from lmckit.metrics import predict
from lmckit.options import checked
from lmckit.params import Params, check_finite, check_params_compatible, has_batchnorm, lerp_params
from lmckit.perm import Permutation, PermutationSpec

__all__ = ["RandomPermutationMerges", "random_permutation_merges", "scored_logits"]


def scored_logits(
    logits: Tensor, labels: Tensor, *, fraction: float = 0.2, seed: int = 0
) -> dict[str, Any]:
    """Accuracy, loss and calibrated loss on the examples
    :func:`~lmckit.evaluate.calibration.calibrated_loss` scores (its ``rest``), the
    temperature fitted on its seeded ``fraction`` (``held``): ``logits`` ``(N, C)``,
    ``labels`` ``(N,)``. Same ``N``, ``fraction`` and ``seed`` give the same split
    (:func:`~lmckit.data.holdout_split`)."""
    fit = calibrated_loss(logits, labels, fraction=fraction, seed=seed)
    x, y = logits[fit["rest"]].double(), labels[fit["rest"]].long()
    return {
        "accuracy": float((x.argmax(1) == y).double().mean()),
        "loss": float(F.cross_entropy(x, y)),
        "calibrated_loss": fit["loss"],
        "temperature": fit["temperature"],
    }


@dataclass(frozen=True)
class RandomPermutationMerges:
    """Scores of the endpoints and of each merge at one λ.

    Attributes:
        lam: B's weight in ``(1 − λ)π_A(θ_A) + λπ_B(θ_B)``.
        endpoints: ``{"a": scores, "b": scores}``.
        merges: ``{label: scores}`` for ``"none"``, the given permutation (``"given"``) and
            ``"random{i}"``; scores are ``accuracy``, ``loss``, ``calibrated_loss``,
            ``temperature`` (the paper's inverse temperature, see the module docstring),
            ``accuracy_barrier`` and ``calibrated_loss_barrier`` (against the endpoints'
            ``(1 − λ)·A + λ·B``).
        held, rest: how many examples fitted the temperature / were scored.
    """

    lam: float
    endpoints: dict[str, dict[str, float]]
    merges: dict[str, dict[str, float]]
    held: int
    rest: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@checked
def random_permutation_merges(
    model: nn.Module,
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    n: int = 5,
    perm: Permutation | None = None,
    lam: float = 0.5,
    seed: int = 0,
    fraction: float = 0.2,
    bn_reset_data: Any = None,
) -> RandomPermutationMerges:
    """Merge ``π_A(θ_A)`` with ``π_B(θ_B)`` for ``n`` random pairs of permutations (seeded),
    for no permutation, and for ``perm`` (applied to θ_B) when given; score each on
    ``loader`` as the module docstring says. ``loader`` is iterated once per model, so it
    must give the same examples in the same order each time (a test loader, not a shuffled
    one or a one-shot generator).

    BatchNorm merges are BN-reset on ``bn_reset_data`` (required for BatchNorm models).
    """
    for what, p in (("params_a", params_a), ("params_b", params_b)):
        check_model_fits(model, p, what)
        check_finite(p, what)
    check_params_compatible(params_a, params_b)
    if n < 0:
        raise ParamsError(f"n must be ≥ 0, got {n}")
    if has_batchnorm(params_a) and bn_reset_data is None:
        raise ParamsError(
            "merged BatchNorm models need their statistics re-estimated: pass bn_reset_data"
        )
    logits_a, labels = predict(model, params_a, loader)
    logits_b, labels_b = predict(model, params_b, loader)
    if not torch.equal(labels, labels_b):
        raise ParamsError(
            "the loader gave different examples on a second pass: pass a re-iterable loader "
            "with a fixed order (e.g. data.loader('test'))"
        )
    score = partial(scored_logits, labels=labels, fraction=fraction, seed=seed)
    held, rest = holdout_split(len(labels), fraction, seed=seed)  # the split score uses
    ends = {"a": score(logits_a), "b": score(logits_b)}
    pairs: dict[str, tuple[Params, Params]] = {"none": (params_a, params_b)}
    if perm is not None:
        pairs["given"] = (params_a, perm.apply(params_b))
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        pi_a, pi_b = Permutation.random(spec, gen), Permutation.random(spec, gen)
        pairs[f"random{i}"] = (pi_a.apply(params_a), pi_b.apply(params_b))
    reference_acc = (1 - lam) * ends["a"]["accuracy"] + lam * ends["b"]["accuracy"]
    reference_loss = (1 - lam) * ends["a"]["calibrated_loss"] + lam * ends["b"]["calibrated_loss"]
    merges = {}
    for label, (pa, pb) in pairs.items():
        merged = lerp_params(pa, pb, lam)
        if has_batchnorm(merged):
            merged = bn_reset(model, merged, bn_reset_data)
        logits, _ = predict(model, merged, loader)
        s = score(logits)
        s["accuracy_barrier"] = reference_acc - s["accuracy"]
        s["calibrated_loss_barrier"] = s["calibrated_loss"] - reference_loss
        merges[label] = s
    return RandomPermutationMerges(
        lam=float(lam),
        endpoints=ends,
        merges=merges,
        held=len(held),
        rest=len(rest),
    )
