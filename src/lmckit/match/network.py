"""Shared mechanics of the methods that train through the network (STE, Sinkhorn's
midpoint objective, STE-MM): argument checks, the batch loss, straight-through gradients."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit._checks import check_int, check_positive
from lmckit.data import as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_labels, forward, per_token
from lmckit.params import Params


def require_model_and_data(method: str, model: nn.Module | None, data: object) -> nn.Module:
    """The module, or a :class:`ParamsError` saying what ``method`` is missing."""
    missing = [name for name, value in (("model=", model), ("data=", data)) if value is None]
    if missing:
        raise ParamsError(f"{method} needs {' and '.join(missing)} (it runs the network on data)")
    if not isinstance(model, nn.Module):
        raise ParamsError(f"{method}: model must be a torch.nn.Module, got {type(model).__name__}")
    return model


Recipe = Literal["lmckit", "paper"]
"""``recipe=`` of the methods with a paper-exact version: lmckit's defaults, or the paper's
procedure as written (a ``Literal``, so that option checks refuse any other spelling before
a run starts). Called ``variant=`` in 0.1.0; the old name is accepted for one release
(:data:`lmckit.options.RENAMED_OPTIONS`)."""
RECIPES: tuple[str, ...] = get_args(Recipe)


def is_paper_recipe(recipe: str, init: object = None, why: str = "") -> bool:
    """Check ``recipe`` (one of :data:`RECIPES`); ``True`` for ``"paper"``. The paper's
    procedure fixes its own start, so an ``init`` is refused with ``why``."""
    if recipe not in RECIPES:
        raise ParamsError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    paper = recipe == "paper"
    if paper and init is not None:
        raise ParamsError(f'recipe="paper" {why}; init does not apply')
    return paper


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
    out, y = per_token(forward(model, params, x.to(device)), y.to(device))
    check_labels(out, y, "a training batch")
    return F.cross_entropy(out, y)


def parameter_names(model: nn.Module, params: Params) -> list[str]:
    """Names of the module's parameters (not buffers), all of which must be in ``params``."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in params]
    if missing:
        raise ParamsError(f"parameters {missing[:5]} of the model are missing from the params")
    return names


class _ThroughTo(torch.autograd.Function):
    """Forward: a given value, unchanged; backward: the gradient times a weight for each
    of the proxies it stands for."""

    @staticmethod
    def forward(ctx, value: Tensor, weights: tuple[float, ...], *proxies: Tensor) -> Tensor:
        ctx.weights = weights
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return (None, None, *(grad * w for w in ctx.weights))


def straight_through(
    value: Mapping[str, Tensor], proxies: Sequence[tuple[Mapping[str, Tensor], float]]
) -> dict[str, Tensor]:
    """The straight-through estimator of a weighted mixture of projections.

    ``value`` is the mixture ``Σ_i w_i π_i(θ_i)`` (plus any members without a proxy),
    computed without autograd; ``proxies`` lists ``(proxy_i, w_i)`` for the members whose
    projection ``π_i`` is treated as the identity in the backward pass. Returns ``value``'s
    tensors, each wired so that ``proxy_i[k]`` receives ``w_i`` times its gradient — the
    gradient of ``Σ_i w_i (proxy_i + (π_i(θ_i) − proxy_i).detach())`` — without forming
    that sum: the forward costs nothing and the backward one multiply per proxy tensor.
    Keys no proxy has pass through as they are."""
    out = {}
    for k, v in value.items():
        wired = [(proxy[k], w) for proxy, w in proxies if k in proxy]
        if wired:
            v = _ThroughTo.apply(v, tuple(w for _, w in wired), *(t for t, _ in wired))
        out[k] = v
    return out


def optimise(
    optimizer: torch.optim.Optimizer, loss: Tensor, what: str = "the optimiser", step: int = 0
) -> float:
    """One optimiser step on ``loss``; returns its value.

    Raises:
        ParamsError: the loss, or the parameters after the step, are not finite — naming
            ``what``, the step and the learning rate (a too large ``lr`` diverges; without
            this a later solve reports non-finite costs that name neither).
    """
    optimizer.zero_grad(set_to_none=True)
    value = loss.item()
    if math.isfinite(value):
        loss.backward()
        optimizer.step()
    learned = [p for group in optimizer.param_groups for p in group["params"]]
    if not math.isfinite(value) or not all(bool(torch.isfinite(p).all()) for p in learned):
        lr = optimizer.param_groups[0].get("lr")
        lr = f"{lr:g}" if isinstance(lr, float) else repr(lr)
        found = "its loss" if not math.isfinite(value) else "the parameters it learns"
        raise ParamsError(
            f"{what} diverged at step {step + 1}: {found} became non-finite (lr={lr}); "
            "lower the learning rate"
        )
    return value


def batches_per_pass(batches: object) -> int | None:
    """``len(batches)`` when the loader knows it, for progress totals."""
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None


def example_batch(data: object, what: str) -> Tensor:
    """The first rows (at most 8) of ``data``'s first batch, in order: the example input a
    graph is read with. ``what`` names the caller in the error when there is none."""
    first = None if data is None else next(iter(as_batches(data, batch_size=8)), None)
    if first is None:
        raise ParamsError(f"{what} needs example_inputs= or data= (with at least one batch)")
    return first[0][:8]
