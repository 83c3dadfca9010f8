"""Arithmetic on parameter dicts: checks, interpolation, averages, inner products, distances.

A parameter dict maps ``state_dict()`` keys to tensors, parameters and buffers alike. Every
function here treats the two kinds of tensor in one way, documented once:

* **floating tensors** (weights, biases, norm parameters, BatchNorm running statistics) are
  combined arithmetically;
* **integer buffers** (``num_batches_tracked``) cannot be averaged: a combination takes them
  from the member with the largest weight (the first one among equals), cloned, so that a
  train-mode forward pass of the result never increments an input's counter.

Inner products and distances run over the floating tensors only, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real

import torch
from torch import Tensor

from lmckit.errors import ParamsError
from lmckit.options import checked

__all__ = [
    "Params",
    "average_params",
    "check_finite",
    "check_params_compatible",
    "detached",
    "floating_names",
    "has_batchnorm",
    "is_running_stat",
    "lerp_params",
    "pairwise_inner_sum",
    "params_distance",
    "params_inner",
    "squared_distance",
]

Params = Mapping[str, Tensor]
"""A parameter dict: ``state_dict()`` keys to tensors (parameters and buffers)."""


@checked
def is_running_stat(name: str) -> bool:
    """Whether ``name`` is a BatchNorm running statistic (by its ``state_dict`` name)."""
    return name.endswith(("running_mean", "running_var"))


@checked
def has_batchnorm(params: Params) -> bool:
    """Whether the parameter dict holds BatchNorm running statistics — the sign that an
    interpolated or merged copy of it needs its statistics re-estimated."""
    return any(is_running_stat(k) for k in params)


@checked
def floating_names(params: Params) -> list[str]:
    """Keys of the floating-point tensors, in dict order."""
    return [k for k, t in params.items() if t.dtype.is_floating_point]


def short_list(items: Sequence[str], limit: int = 6) -> str:
    """``['a', 'b', ...] (9 in all)``: a bounded rendering of names for error messages."""
    shown = ", ".join(repr(x) for x in items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)} in all)"


@checked
def check_params_compatible(
    params_a: Params, params_b: Params, *, names: tuple[str, str] = ("A", "B")
) -> None:
    """Raise :class:`ParamsError` unless both dicts have the same keys, shapes and dtypes."""
    a_name, b_name = names
    if set(params_a) != set(params_b):
        only_a = sorted(set(params_a) - set(params_b))
        only_b = sorted(set(params_b) - set(params_a))
        raise ParamsError(
            f"parameter dicts have different keys: only in {a_name} {short_list(only_a)}, only "
            f"in {b_name} {short_list(only_b)}"
        )
    for k, a in params_a.items():
        b = params_b[k]
        if a.shape != b.shape:
            raise ParamsError(
                f"{k!r} has shape {tuple(a.shape)} in {a_name} but {tuple(b.shape)} in {b_name}"
            )
        if a.dtype != b.dtype:
            raise ParamsError(f"{k!r} has dtype {a.dtype} in {a_name} but {b.dtype} in {b_name}")


@checked
def check_finite(params: Params, what: str, *, error: type[Exception] = ParamsError) -> None:
    """Raise ``error`` naming the first entry that is not a tensor with values (a meta-device
    tensor has none) or the first floating tensor with NaN or infinite entries."""
    if not isinstance(params, Mapping):
        raise error(f"{what} must be a dict of tensors, got {type(params).__name__}")
    for name, t in params.items():
        if not isinstance(t, Tensor):
            raise error(f"{what}: entry {name!r} is a {type(t).__name__}, not a tensor")
        if t.device.type == "meta":
            raise error(
                f"{what}: tensor {name!r} is on the meta device and holds no values (load "
                "weights into the model first, e.g. to_empty() then load_state_dict())"
            )
        if (t.dtype.is_floating_point or t.dtype.is_complex) and not torch.isfinite(t).all():
            bad = int((~torch.isfinite(t)).sum())
            raise error(f"{what}: tensor {name!r} has {bad} NaN/infinite value(s)")


def check_products_finite(
    params_a: Params, params_b: Params, names: tuple[str, str] = ("model A", "model B")
) -> None:
    """Raise :class:`ParamsError` if a sum of products of one tensor of each — what every
    cost matrix, distance and inner product between two models sums — could overflow the
    tensors' floating type: ``max|a| · max|b| · numel`` beyond its largest value (finite
    weights of 3e38 overflow float32 at the first product; matching then met infinite
    costs and numpy warned, naming no model). ``names`` say the two models in the message."""
    for name, a in params_a.items():
        b = params_b.get(name)
        if b is None or not a.dtype.is_floating_point or not a.numel():
            continue
        dtype = a.dtype if a.dtype in (torch.float32, torch.float64) else torch.float32
        limit = torch.finfo(dtype).max
        top_a = float(a.detach().abs().max())
        top_b = float(b.detach().abs().max())
        if top_a * top_b * a.numel() >= limit:
            which = names[0] if top_a >= top_b else names[1]
            raise ParamsError(
                f"{which}: tensor {name!r} holds values up to {max(top_a, top_b):.3g}, so its "
                f"products with the other model's overflow {str(dtype).replace('torch.', '')} "
                "(their sums exceed its largest value): these are not trained weights, or need "
                "rescaling (or float64) first"
            )


@checked
def detached(params: Params) -> dict[str, Tensor]:
    """The same tensors cut from autograd (no copy): what algorithms that differentiate
    their own objectives work on, so no gradient ever reaches a caller's parameters."""
    return {k: v.detach() for k, v in params.items()}


def _integer_source(weights: Sequence[float]) -> int:
    """The member whose integer buffers a weighted combination keeps (see module docstring)."""
    return max(range(len(weights)), key=lambda i: (weights[i], -i))


@checked
def lerp_params(params_a: Params, params_b: Params, lam: float) -> dict[str, Tensor]:
    """``(1 − λ)·A + λ·B`` for floating tensors; integer buffers by the module's rule.

    Computed from the nearer endpoint (``A + λ(B − A)`` for λ ≤ ½, ``B + (1 − λ)(A − B)``
    above), so λ = 0 and λ = 1 return the endpoints bit for bit and ``A == B`` gives ``A``
    at every λ. Works on tensors that require grad (the result stays differentiable).
    """
    check_params_compatible(params_a, params_b)
    if isinstance(lam, bool) or not isinstance(lam, Real) or not math.isfinite(lam):
        raise ParamsError(f"λ must be a finite number, got {lam!r}")
    lam = float(lam)
    keep = _integer_source((1.0 - lam, lam))
    out = {}
    for k, a in params_a.items():
        b = params_b[k]
        if not a.dtype.is_floating_point:
            out[k] = (a, b)[keep].clone()
        elif lam <= 0.5:
            out[k] = a + lam * (b - a)
        else:
            out[k] = b + (1.0 - lam) * (a - b)
    return out


@checked
def average_params(
    params_list: Sequence[Params], weights: Sequence[float] | Tensor | None = None
) -> dict[str, Tensor]:
    """``Σ_i w_i θ_i`` for floating tensors (uniform ``w_i = 1/n`` by default); integer
    buffers by the module's rule. Weights are used as given (they need not sum to 1)."""
    n = len(params_list)
    if n == 0:
        raise ParamsError("average_params needs at least one parameter dict")
    w = [1.0 / n] * n if weights is None else [float(x) for x in weights]
    if len(w) != n:
        raise ParamsError(f"{len(w)} weights for {n} parameter dicts")
    if not all(math.isfinite(x) for x in w):
        raise ParamsError(f"weights must be finite, got {w}")
    for i, p in enumerate(params_list[1:], start=1):
        check_params_compatible(params_list[0], p, names=("model 0", f"model {i}"))
    keep = _integer_source(w)
    out = {}
    for k, first in params_list[0].items():
        if first.dtype.is_floating_point:
            acc = w[0] * first
            for wi, p in zip(w[1:], params_list[1:], strict=True):
                acc = acc + wi * p[k]
            out[k] = acc
        else:
            out[k] = params_list[keep][k].clone()
    return out


@checked
def params_inner(params_a: Params, params_b: Params) -> float:
    """``Σ_k ⟨A_k, B_k⟩`` over the floating tensors, in float64."""
    check_params_compatible(params_a, params_b)
    a, b = detached(params_a), detached(params_b)
    return float(sum((a[k].double() * b[k].double()).sum() for k in floating_names(a)))


@checked
def params_distance(params_a: Params, params_b: Params) -> float:
    """Euclidean distance ``sqrt(Σ_k ‖A_k − B_k‖²)`` over the floating tensors, in float64."""
    check_params_compatible(params_a, params_b)
    return math.sqrt(
        sum(squared_distance(params_a[k], params_b[k]) for k in floating_names(params_a))
    )


@checked
def squared_distance(a: Tensor, b: Tensor, chunk: int = 1 << 18) -> float:
    """``‖a − b‖²`` in float64, by chunks of the difference (no float64 copy of a whole
    tensor)."""
    diff = (a.detach() - b.detach()).reshape(-1)
    total = 0.0
    for part in diff.split(chunk):
        part = part.double()
        total += float(part @ part)
    return total


@checked
def pairwise_inner_sum(params_list: Sequence[Params]) -> Tensor:
    """``Σ_{i<j} ⟨θ_i, θ_j⟩`` over the floating tensors, as ``½(‖Σ_i θ_i‖² − Σ_i ‖θ_i‖²)``.

    Returns a 0-dim float64 tensor that stays differentiable when the inputs require grad
    (CCMM's objective); ``float()`` it for a number. Maximising it over permutations is
    minimising the sum of all pairwise squared distances.
    """
    if not params_list:
        raise ParamsError("pairwise_inner_sum needs at least one parameter dict")
    total = torch.zeros((), dtype=torch.float64)
    for k in floating_names(params_list[0]):
        stack = torch.stack([p[k] for p in params_list]).double()
        s = stack.sum(0)
        total = total.to(s.device) + 0.5 * ((s * s).sum() - (stack * stack).sum())
    return total
