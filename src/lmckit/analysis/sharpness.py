"""Sharpness ``tr(H ⊙ θθᵀ)`` (STE-MM §6.2, Eq. 6) by Hutchinson's estimator.

``tr(H ⊙ θθᵀ) = E_z[(z ⊙ θ)ᵀ H (z ⊙ θ)]`` for Rademacher ``z``: each probe costs one
Hessian-vector product per batch (double backward through the functional model). ``H`` is
the Hessian of the mean cross-entropy over the evaluation batches with respect to the
model's *parameters* (buffers such as BatchNorm statistics are held fixed; eval mode).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.functional import (
    check_model_fits,
    forward,
    module_mode,
    per_token,
    twice_differentiable,
)
from lmckit.metrics import fixed_batches
from lmckit.options import checked
from lmckit.params import Params


@dataclass(frozen=True)
class Sharpness:
    """Estimate of ``tr(H ⊙ θθᵀ)`` with its standard error over ``probes`` probes."""

    value: float
    stderr: float
    probes: int
    samples: tuple[float, ...]


def _loss_fn(model: nn.Module, params: Params, names: list[str], batches):
    buffers = {k: v for k, v in params.items() if k not in names}

    def loss(*tensors: Tensor) -> Tensor:
        current = {**buffers, **dict(zip(names, tensors, strict=True))}
        total = 0.0
        count = 0
        for x, y in batches:
            out, y = per_token(forward(model, current, x), y)
            total = total + F.cross_entropy(out, y, reduction="sum")
            count += len(y)
        return total / count

    return loss


@checked
def sharpness(
    model: nn.Module,
    params: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    probes: int = 10,
    n_batches: int | None = 4,
    seed: int = 0,
) -> Sharpness:
    """Hutchinson estimate of ``tr(H ⊙ θθᵀ)`` at ``params`` on the first ``n_batches``
    batches of ``loader`` (all when None), with ``probes`` Rademacher probes (eval mode;
    the module's modes are restored)."""
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 2:
        raise ParamsError(f"sharpness needs at least 2 probes for a standard error, got {probes!r}")
    check_model_fits(model, params)
    names = [n for n, _ in model.named_parameters()]
    batches = fixed_batches(loader, n_batches, next(iter(params.values())).device, "sharpness")
    theta = [params[n].detach() for n in names]
    loss = _loss_fn(model, params, names, batches)
    g = torch.Generator().manual_seed(seed)
    samples = []
    with module_mode(model, False), twice_differentiable():
        for _ in range(probes):
            v = [t * (torch.randint(0, 2, t.shape, generator=g).to(t) * 2 - 1) for t in theta]
            _, hv = torch.autograd.functional.hvp(loss, tuple(theta), tuple(v))
            samples.append(float(sum((a * b).sum() for a, b in zip(v, hv, strict=True))))
    mean = sum(samples) / probes
    var = sum((s - mean) ** 2 for s in samples) / (probes - 1)
    return Sharpness(mean, math.sqrt(var / probes), probes, tuple(samples))


@checked
def exact_weighted_hessian_trace(
    model: nn.Module,
    params: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    n_batches: int | None = 4,
) -> float:
    """``Σ_k H_kk θ_k²`` from the full Hessian — only for tiny models (tests, checks)."""
    check_model_fits(model, params)
    names = [n for n, _ in model.named_parameters()]
    batches = fixed_batches(loader, n_batches, next(iter(params.values())).device, "sharpness")
    theta = [params[n].detach() for n in names]
    sizes = [t.numel() for t in theta]
    loss = _loss_fn(model, params, names, batches)

    def flat_loss(flat: Tensor) -> Tensor:
        parts = torch.split(flat, sizes)
        return loss(*[p.view_as(t) for p, t in zip(parts, theta, strict=True)])

    flat = torch.cat([t.reshape(-1) for t in theta])
    with module_mode(model, False), twice_differentiable():
        hessian = torch.autograd.functional.hessian(flat_loss, flat)
    return float((torch.diagonal(hessian) * flat**2).sum())
