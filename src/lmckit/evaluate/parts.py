"""Models trained on parts of the data, measured where each part is strong.

Git Re-Basin §5.4 trains A and B on class-imbalanced halves and asks whether their merge
beats both — on the whole test set and on each half's classes; a federated merge of ``N``
label-skewed clients asks the same of every client. This module names each part's
*majority classes* (the classes it holds more than its fair share of) and reports, for any
set of parameter sets and their logit ensemble, the loss, accuracy and expected calibration
error on the test set and the accuracy restricted to each part's majority classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.data.splits import Split
from lmckit.errors import ParamsError
from lmckit.evaluate.calibration import calibration_metrics
from lmckit.metrics import predict
from lmckit.params import Params

__all__ = ["ENSEMBLE", "majority_classes", "part_groups", "parts_report"]

ENSEMBLE = "ensemble"
"""The name of the logit ensemble's entry in :func:`parts_report`."""


def majority_classes(split: Split, labels: Tensor, num_classes: int | None = None) -> list[int]:
    """The classes of which ``split``'s part holds more than ``1 / parts`` of the examples
    (for Git Re-Basin's 20 %/80 % halves: part a's upper-half classes). Classes absent from
    ``labels`` are in no part's majority."""
    labels = torch.as_tensor(labels).long().cpu()
    num_classes = int(num_classes or int(labels.max()) + 1)
    mine = torch.bincount(labels[split.indices(labels, num_classes)], minlength=num_classes)
    every = torch.bincount(labels, minlength=num_classes)
    share = mine.double() / every.clamp_min(1).double()
    return [c for c in range(num_classes) if every[c] > 0 and share[c] > 1.0 / split.parts_count]


def part_groups(
    splits: Sequence[Split | None], labels: Tensor, num_classes: int | None = None
) -> dict[str, list[int]]:
    """``{"part a": [classes], "part 2": [...]}`` for each distinct part among ``splits``
    (``None`` entries — models trained on all the data — and random splits, which favour no
    class by construction, add nothing), in first-seen order. Parts of different partitions
    are an error: their classes are not comparable."""
    groups: dict[str, list[int]] = {}
    splits = [s for s in splits if s is not None and s.kind != "random"]
    partitions = {repr({**s.to_dict(), "part": None}) for s in splits}
    if len(partitions) > 1:
        raise ParamsError(
            "the models were trained on parts of different partitions "
            f"({len(partitions)} distinct); per-part accuracy needs one partition"
        )
    for split in splits:
        name = f"part {'ab'[split.part] if split.kind == 'class-imbalanced' else split.part}"
        if name not in groups:
            groups[name] = majority_classes(split, labels, num_classes)
    return groups


def parts_report(
    model: nn.Module,
    params: Mapping[str, Params],
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    groups: Mapping[str, Sequence[int]] | None = None,
    ensemble_of: Sequence[str] = (),
    n_bins: int = 15,
) -> dict[str, dict[str, Any]]:
    """Loss, accuracy and ECE of every named parameter set on ``loader``, and its accuracy
    on each class group; with ``ensemble_of``, also the logit ensemble (mean of logits) of
    those sets under :data:`ENSEMBLE`.

    Args:
        model: the architecture (run functionally).
        params: name -> parameter set (e.g. ``{"merged": ..., "input 0": ...}``).
        loader: ``(x, y)`` batches (the test set).
        groups: name -> classes (:func:`part_groups`); an empty group is reported as None.
        ensemble_of: names in ``params`` whose logits are averaged.

    Returns:
        name -> ``{"loss", "accuracy", "ece", "groups": {group: accuracy or None}}``.
    """
    unknown = [n for n in ensemble_of if n not in params]
    if unknown:
        raise ParamsError(f"ensemble_of names {unknown}, which are not in params")
    logits = {name: predict(model, p, loader) for name, p in params.items()}
    if ensemble_of:
        stacked = torch.stack([logits[n][0] for n in ensemble_of])
        logits[ENSEMBLE] = (stacked.mean(0), logits[ensemble_of[0]][1])
    out = {}
    for name, (lg, y) in logits.items():
        correct = (lg.argmax(1) == y).double()
        in_group = {}
        for group, classes in (groups or {}).items():
            mask = torch.isin(y, torch.as_tensor(list(classes), dtype=y.dtype))
            in_group[group] = float(correct[mask].mean()) if mask.any() else None
        out[name] = {
            "loss": F.cross_entropy(lg.double(), y).item(),
            "accuracy": float(correct.mean()),
            "ece": calibration_metrics(lg, y, n_bins)["ece"],
            "groups": in_group,
        }
    return out
