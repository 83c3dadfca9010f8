"""Loss and accuracy of a model (or of any parameter set for it) over a loader.

Runs functionally (``torch.func.functional_call``) when ``params`` is given, so one
``nn.Module`` evaluates any number of parameter sets without copies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import DataError
from lmckit.perm import Params


@dataclass(frozen=True)
class Metrics:
    """Mean cross-entropy ``loss``, ``accuracy`` in [0, 1], over ``count`` examples."""

    loss: float
    accuracy: float
    count: int

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return asdict(self)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    params: Params | None,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    device: torch.device | str | None = None,
) -> Metrics:
    """Evaluate ``model`` with ``params`` substituted (``None``: its own weights), eval mode.

    The model's train/eval mode is restored afterwards. Batches are moved to ``device``
    (default: the device of the model's first parameter).
    """
    if device is None:
        first = next(iter(params.values())) if params else next(model.parameters())
        device = first.device
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x) if params is None else torch.func.functional_call(model, params, (x,))
            total_loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            count += len(y)
    finally:
        model.train(was_training)
    if count == 0:
        raise DataError("evaluate() got an empty loader")
    return Metrics(loss=total_loss / count, accuracy=correct / count, count=count)
