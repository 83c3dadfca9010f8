"""The barrier a second-order Taylor expansion predicts (Ito et al. Theorem 3.1, eq. 2).

With ``β = ‖θ_B − θ_A‖`` and the unit direction ``μ = (θ_B − θ_A)/β`` over the model's
*parameters*, expanding the loss at both ends of the path ``θ(λ) = (1−λ)θ_A + λθ_B``
(lmckit's convention: λ is the weight of B; the paper's λ is the weight of A, ``λ_paper =
1 − λ``) gives

    B(λ) ≈ λ(1−λ) [ β μᵀ(∇L(θ_A) − ∇L(θ_B)) + ½ β² (λ μᵀH_Aμ + (1−λ) μᵀH_Bμ) ]

where ``B(λ) = L(θ(λ)) − (1−λ)L(θ_A) − λL(θ_B)``. Only four numbers enter: the directional
slopes ``μᵀ∇L`` and curvatures ``μᵀHμ`` at the two ends. They are the first and second
derivatives of ``ε ↦ L(θ + εμ)`` at 0, computed exactly by differentiating twice with
respect to the one scalar ε (double backward: the Hessian-vector product ``Hμ`` contracted
with μ as it is formed) in one pass over the data per end — never a Hessian. Per end this
costs what one gradient + HVP pass costs; on 2 CPU cores forward-over-forward ``jvp`` was
1.5× slower for a 3×512 MLP and 14 % faster for ResNet-20 (``benchmarks/bench_analysis.py``),
so the simpler route stays. ``L`` is the mean loss over every
batch of the loader (full-batch), accumulated batch by batch.

Buffers (BatchNorm running statistics) are held at each end's own values and the model runs
in eval mode; the actual barrier interpolates them along with the parameters, so for
BatchNorm nets the two are not the same function (a shortcoming of the expansion itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
from lmckit.metrics import batch_mean, fixed_batches
from lmckit.options import checked
from lmckit.params import Params, check_finite, check_params_compatible, lerp_params

__all__ = ["TaylorBarrier", "line_derivatives", "taylor_barrier"]

LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(outputs, targets)`` → the *mean* loss of the batch (0-dim tensor)."""


@dataclass(frozen=True)
class TaylorBarrier:
    """Predicted (eq. 2) and actual barrier at each λ, with the expansion's ingredients.

    ``distance`` is β; ``slope_*`` are ``μᵀ∇L`` and ``curvature_*`` are ``μᵀHμ`` at A and B;
    ``loss_*`` the mean losses at the ends; ``loss_path`` the mean loss at each λ.
    """

    lambdas: tuple[float, ...]
    predicted: tuple[float, ...]
    actual: tuple[float, ...]
    distance: float
    slope_a: float
    slope_b: float
    curvature_a: float
    curvature_b: float
    loss_a: float
    loss_b: float
    loss_path: tuple[float, ...]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


def line_derivatives(
    model: nn.Module,
    params: Params,
    direction: Params,
    batches: Sequence[tuple[Tensor, Tensor]],
    loss_fn: LossFn = F.cross_entropy,
) -> tuple[float, float, float]:
    """``(f(0), f'(0), f''(0))`` of ``f(ε) = L(params + ε·direction)``, ``L`` the mean of
    ``loss_fn`` over all examples of ``batches`` (eval mode).

    ``direction`` holds a tensor for every parameter that moves (any subset of the keys);
    ``f'(0) = directionᵀ∇L`` and ``f''(0) = directionᵀ H direction``.
    """
    base = {k: v.detach() for k, v in params.items()}
    moving = {k: direction[k].detach().to(base[k]) for k in direction}
    ref = next(iter(moving.values()))
    totals = torch.zeros(3, dtype=torch.float64)
    count = 0
    with module_mode(model, False), twice_differentiable():
        for x, y in batches:
            eps = torch.zeros((), dtype=ref.dtype, device=ref.device, requires_grad=True)
            current = {**base, **{k: base[k] + eps * d for k, d in moving.items()}}
            out, y = per_token(forward(model, current, x), y)
            f0 = loss_fn(out, y) * len(y)
            (f1,) = torch.autograd.grad(f0, eps, create_graph=True)
            # a loss linear along the line leaves f' without a graph: f'' is exactly 0
            f2 = torch.autograd.grad(f1, eps)[0] if f1.requires_grad else torch.zeros_like(f1)
            totals += torch.stack([f0.detach(), f1.detach(), f2.detach()]).double().cpu()
            count += len(y)
    f0, f1, f2 = (totals / count).tolist()
    return f0, f1, f2


@checked
def taylor_barrier(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    lambdas: Sequence[float] = (0.5,),
    n_batches: int | None = None,
    loss_fn: LossFn = F.cross_entropy,
) -> TaylorBarrier:
    """Eq. 2's prediction of the barrier between ``params_a`` and ``params_b`` (already
    aligned: pass ``perm.apply(params_b)``) at each λ, beside the actual barrier.

    Args:
        loader: batches ``(x, y)``; the first ``n_batches`` (all when None) are held fixed
            and the loss is their example-weighted mean.
        lambdas: points of the path ``(1−λ)θ_A + λθ_B``, each in [0, 1].
        loss_fn: mean loss of a batch (default cross-entropy); twice differentiable in
            forward mode.

    Raises:
        ParamsError: the parameter sets do not fit the model or each other, hold NaN, a λ
            is outside [0, 1], or the loader yields no batch.
    """
    check_model_fits(model, params_a, "params_a")
    check_params_compatible(params_a, params_b)
    check_finite(params_a, "params_a")
    check_finite(params_b, "params_b")
    lams = tuple(float(v) for v in lambdas)
    if not lams or any(not 0.0 <= v <= 1.0 for v in lams):
        raise ParamsError(f"lambdas must be numbers in [0, 1], got {list(lambdas)!r}")
    names = [n for n, p in model.named_parameters() if p.dtype.is_floating_point]
    diff = {k: params_b[k].detach().double() - params_a[k].detach().double() for k in names}
    beta = float(torch.sqrt(sum((d * d).sum() for d in diff.values())))
    if beta == 0.0:
        raise ParamsError("the two parameter sets are equal: there is no direction to expand in")
    mu = {k: d / beta for k, d in diff.items()}
    device = next(iter(params_a.values())).device
    batches = fixed_batches(loader, n_batches, device, "the Taylor barrier")
    loss_a, slope_a, curv_a = line_derivatives(model, params_a, mu, batches, loss_fn)
    loss_b, slope_b, curv_b = line_derivatives(model, params_b, mu, batches, loss_fn)
    predicted, actual, path = [], [], []
    for lam in lams:
        curvature = lam * curv_a + (1 - lam) * curv_b
        predicted.append(lam * (1 - lam) * (beta * (slope_a - slope_b) + 0.5 * beta**2 * curvature))
        loss = batch_mean(model, lerp_params(params_a, params_b, lam), batches, loss_fn)
        path.append(loss)
        actual.append(loss - (1 - lam) * loss_a - lam * loss_b)
    return TaylorBarrier(
        lams,
        tuple(predicted),
        tuple(actual),
        beta,
        slope_a,
        slope_b,
        curv_a,
        curv_b,
        loss_a,
        loss_b,
        tuple(path),
    )
