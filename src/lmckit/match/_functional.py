"""Shared mechanics of the methods that train through the network (STE, Sinkhorn's
midpoint objective, STE-MM): argument checks, the batch loss, straight-through gradients."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit._checks import check_int, check_positive
from lmckit.errors import ParamsError
from lmckit.functional import forward
from lmckit.params import Params


def require_model_and_data(method: str, model: nn.Module | None, data: object) -> nn.Module:
    """The module, or a :class:`ParamsError` saying what ``method`` is missing."""
    missing = [name for name, value in (("model=", model), ("data=", data)) if value is None]
    if missing:
        raise ParamsError(f"{method} needs {' and '.join(missing)} (it runs the network on data)")
    if not isinstance(model, nn.Module):
        raise ParamsError(f"{method}: model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def check_training_options(method: str, **options: float) -> None:
    """``lr`` a positive number; every other option (``epochs``, ``batch_size``, ``steps``
    ...) an integer ≥ 1."""
    for name, value in options.items():
        if name == "lr":
            check_positive(name, value, where=f"{method}: ")
        else:
            check_int(name, value, where=f"{method}: ")


def batch_loss(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of ``model`` run with ``params`` on one batch, in the module's current
    mode. The callers run in train mode, so BatchNorm layers use the batch's statistics:
    an interpolated network's statistics are re-estimated on every batch (a BN reset)."""
    device = next(iter(params.values())).device
    return F.cross_entropy(forward(model, params, x.to(device)), y.to(device))


def parameter_names(model: nn.Module, params: Params) -> list[str]:
    """Names of the module's parameters (not buffers), all of which must be in ``params``."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in params]
    if missing:
        raise ParamsError(f"parameters {missing[:5]} of the model are missing from the params")
    return names


def straight_through(proxy: Mapping[str, Tensor], projected: Mapping[str, Tensor]) -> dict:
    """Forward values of ``projected``, gradients to ``proxy`` (for the keys it has):
    ``proxy + (projected − proxy).detach()``; other entries pass through unchanged."""
    return {
        k: proxy[k] + (v - proxy[k]).detach() if k in proxy else v for k, v in projected.items()
    }


def optimise(optimizer: torch.optim.Optimizer, loss: Tensor) -> float:
    """One optimiser step on ``loss``; returns its value."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def batches_per_pass(batches: object) -> int | None:
    """``len(batches)`` when the loader knows it, for progress totals."""
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None
