"""Shared mechanics of the data-driven matchers (STE, Sinkhorn): batches, midpoints, loss."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.perm import Params


def as_batches(loader, batch_size: int, seed: int) -> Iterable[tuple[Tensor, Tensor]]:
    """A loader as given, or — for an object with ``.loader()`` (an lmckit ``Dataset``) — its
    shuffled training split in batches of ``batch_size``."""
    if hasattr(loader, "loader") and callable(loader.loader):
        return loader.loader("train", batch_size=batch_size, shuffle=True, seed=seed)
    return loader


def midpoint(params_a: Params, params_b: Mapping[str, Tensor], weight_b: float = 0.5) -> dict:
    """``(1 − w)·A + w·B`` for floating tensors; integer buffers are copied from A (cloned, so
    that a train-mode forward pass never increments A's ``num_batches_tracked``)."""
    out = {}
    for k, a in params_a.items():
        b = params_b[k]
        out[k] = (1 - weight_b) * a + weight_b * b if a.dtype.is_floating_point else a.clone()
    return out


def batch_loss(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of ``model`` run with ``params`` in train mode: BatchNorm layers use the
    batch's statistics, i.e. the interpolated network's statistics are re-estimated on every
    batch (a BN reset), as an interpolated BN model needs."""
    device = next(iter(params.values())).device
    model.train()
    out = torch.func.functional_call(model, dict(params), (x.to(device),))
    return F.cross_entropy(out, y.to(device))


def parameter_names(model: nn.Module, params: Params) -> list[str]:
    """Names of the module's parameters (not buffers), all of which must be in ``params``."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in params]
    if missing:
        raise ParamsError(f"parameters {missing[:5]} of the model are missing from params_a")
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
