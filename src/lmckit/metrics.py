"""Loss, accuracy and logits of a model — or of any parameter set for it — over a loader.

Runs functionally (``torch.func.functional_call``) when ``params`` is given, so one
``nn.Module`` evaluates any number of parameter sets without copies. Evaluation is in eval
mode; the module's own modes are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import islice

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.data import Dataset
from lmckit.errors import DataError, ParamsError
from lmckit.functional import check_labels, check_model_fits, forward, module_mode, per_token
from lmckit.options import checked
from lmckit.params import Params, check_finite

__all__ = ["Metrics", "batch_mean", "evaluate", "fixed_batches", "predict"]

Loader = Iterable[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Metrics:
    """Mean cross-entropy ``loss``, ``accuracy`` in [0, 1], over ``count`` examples."""

    loss: float
    accuracy: float
    count: int

    def to_dict(self) -> dict[str, float]:
        """JSON-ready fields."""
        return asdict(self)


def _outputs(
    model: nn.Module, params: Params | None, loader: Loader, device, caller: str
) -> Iterator[tuple[Tensor, Tensor]]:
    """``(logits, labels)`` per batch, in eval mode without gradients; labels on the
    logits' device; a language model's ``(N, L, C)`` outputs one row per token
    (:func:`~lmckit.functional.per_token`). Raises :class:`DataError` for an empty loader."""
    if params is not None:
        check_model_fits(model, params)
        check_finite(params, "params")
    elif isinstance(model, nn.Module):
        check_finite(model.state_dict(), f"{type(model).__name__}'s own weights")
    if device is None:
        first = next(iter(params.values())) if params else next(model.parameters())
        device = first.device
    if not isinstance(loader, Iterable) or isinstance(loader, Dataset):
        raise DataError(
            f"{caller}() needs an iterable of (x, y) batches, got {type(loader).__name__} "
            "(for an lmckit Dataset pass data.loader('test'))"
        )
    seen = False
    with torch.no_grad(), module_mode(model, False):
        for x, y in loader:
            out = forward(model, params, x.to(device))
            seen = True
            out, y = per_token(out, y.to(out.device))
            check_labels(out, y, f"{caller}()")
            yield out, y
    if not seen:
        raise DataError(f"{caller}() got an empty loader")


@checked
def evaluate(
    model: nn.Module,
    params: Params | None,
    loader: Loader,
    *,
    device: torch.device | str | None = None,
) -> Metrics:
    """Evaluate ``model`` with ``params`` substituted (``None``: its own weights).

    Batches are moved to ``device`` (default: the device of the parameters).
    """
    total_loss, correct, count = 0.0, 0, 0
    for logits, y in _outputs(model, params, loader, device, "evaluate"):
        total_loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        count += len(y)
    return Metrics(loss=total_loss / count, accuracy=correct / count, count=count)


@checked
def predict(
    model: nn.Module,
    params: Params | None,
    loader: Loader,
    *,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits ``(N, C)`` (float32, CPU) and labels ``(N,)`` of ``model`` with ``params``
    (``None``: its own weights) over ``loader``; for a language model one row per token,
    ``N`` = sequences × length."""
    outs, ys = [], []
    for logits, y in _outputs(model, params, loader, device, "predict"):
        outs.append(logits.float().cpu())
        ys.append(y.cpu())
    return torch.cat(outs), torch.cat(ys)


@checked
def fixed_batches(
    loader: Loader, n_batches: int | None, device: torch.device | str, what: str
) -> list[tuple[Tensor, Tensor]]:
    """The first ``n_batches`` batches of ``loader`` (all when None) on ``device``, held in
    memory so that several passes see the same examples.

    Raises:
        ParamsError: the loader yields no batch (``what`` names the computation).
    """
    batches = [(x.to(device), y.to(device)) for x, y in islice(loader, n_batches)]
    if not batches:
        raise ParamsError(f"{what} needs at least one batch of data")
    return batches


@checked
def batch_mean(
    model: nn.Module,
    params: Params,
    batches: Sequence[tuple[Tensor, Tensor]],
    fn: Callable[[Tensor, Tensor], Tensor],
) -> float:
    """The example-weighted mean of ``fn(outputs, targets)`` (a batch mean) over
    ``batches`` (token-weighted for a language model's outputs), in eval mode without
    gradients (modes restored)."""
    total, count = 0.0, 0
    with torch.no_grad(), module_mode(model, False):
        for x, y in batches:
            out, y = per_token(forward(model, params, x), y)
            total += float(fn(out, y)) * len(y)
            count += len(y)
    if count == 0:
        raise ParamsError("batch_mean got no examples (empty batches)")
    return total / count
