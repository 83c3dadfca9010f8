"""Statistics repair of interpolated and merged networks: BatchNorm reset and REPAIR.

Averaging two networks' weights averages their layers' outputs only approximately: the
merged network's hidden units have smaller variance (variance collapse; Jordan et al.,
2023), and an averaged BatchNorm layer keeps statistics that are not those of its inputs.

* :func:`bn_reset` re-estimates every BatchNorm layer's running statistics as exact
  averages over data — what an interpolated or merged BN network needs before evaluation.
* :func:`repair` (REPAIR) fixes BN-free networks: each hidden Linear/Conv layer's output
  channels get the interpolated mean and standard deviation of the endpoints'.
  :func:`channel_statistics` measures those per-channel statistics in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice

import torch
from torch import Tensor, nn

from lmckit._checks import check_number
from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, forward, module_mode
from lmckit.options import checked
from lmckit.params import Params, lerp_params

__all__ = ["ChannelStats", "bn_reset", "channel_statistics", "repair", "repair_layers"]

ChannelStats = Mapping[str, tuple[Tensor, Tensor]]
"""Layer name -> per-output-channel ``(mean, std)`` (float64) of its output over data."""


class _ChannelSums:
    """Per-channel Σz, Σz² and count of tensors ``(N, C, ...)`` — every position a sample —
    accumulated in float64, so statistics over many batches are exact."""

    def __init__(self) -> None:
        self.total: Tensor | None = None
        self.squares: Tensor | None = None
        self.count = 0

    def add(self, x: Tensor) -> None:
        z = x.detach().movedim(1, -1).reshape(-1, x.shape[1]).double()
        if self.total is None:
            self.total, self.squares = z.new_zeros(z.shape[1]), z.new_zeros(z.shape[1])
        self.total += z.sum(0)
        self.squares += (z * z).sum(0)
        self.count += z.shape[0]

    def mean_var(self, unbiased: bool) -> tuple[Tensor, Tensor]:
        mean = self.total / self.count
        spread = (self.squares - self.count * mean**2).clamp_min(0)
        return mean, spread / (max(self.count - 1, 1) if unbiased else self.count)


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


@checked
@torch.no_grad()
def bn_reset(
    model: nn.Module,
    params: Params,
    data: DataSource,
    *,
    n_batches: int | None = None,
    batch_size: int = 500,
    seed: int = 0,
) -> dict[str, Tensor]:
    """A copy of ``params`` whose BatchNorm running statistics are re-estimated on ``data``.

    The network runs in train mode over the first ``n_batches`` batches (all by default),
    every BatchNorm layer normalising with its batch's statistics as in training, while the
    sums of each layer's inputs are accumulated; the running mean and (unbiased) variance are
    then the exact statistics of those inputs over all the examples — independent of how
    the examples were batched, unlike BatchNorm's own running averages. Nothing else
    changes; a model without BatchNorm gets an unchanged copy.

    Args:
        data: an lmckit ``Dataset`` (its training split, shuffled by ``seed``, in batches of
            ``batch_size``) or ``(x, y)`` batches.
    """
    check_model_fits(model, params)
    new = {k: v.detach().clone() for k, v in params.items()}
    bns = _bn_modules(model)
    if not bns:
        return new
    batches = as_batches(data, batch_size=batch_size, seed=seed)
    device = next(iter(params.values())).device
    sums = {name: _ChannelSums() for name, _ in bns}
    handles = [
        m.register_forward_pre_hook(lambda _m, inputs, name=name: sums[name].add(inputs[0]))
        for name, m in bns
    ]
    seen = 0
    try:
        with module_mode(model, True):
            for x, _ in islice(batches, n_batches):
                forward(model, new, x.to(device))
                seen += 1
    finally:
        for h in handles:
            h.remove()
    if seen == 0:
        raise ParamsError("bn_reset got no batches")
    for name, _ in bns:
        mean, var = sums[name].mean_var(unbiased=True)  # BatchNorm stores unbiased variances
        new[f"{name}.running_mean"] = mean.to(new[f"{name}.running_mean"])
        new[f"{name}.running_var"] = var.to(new[f"{name}.running_var"])
        new[f"{name}.num_batches_tracked"].fill_(seen)
    return new


@checked
def repair_layers(model: nn.Module) -> list[str]:
    """The layers REPAIR corrects: every Linear/Conv2d in registration order (taken as
    forward order) except the last, whose outputs are the logits.

    Raises:
        ParamsError: the model has normalisation layers (use :func:`bn_reset`).
    """
    if any(
        isinstance(m, nn.modules.batchnorm._BatchNorm | nn.LayerNorm | nn.GroupNorm)
        for m in model.modules()
    ):
        raise ParamsError("repair() is for networks without normalisation layers; use bn_reset()")
    layers = [n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    return layers[:-1]


@checked
@torch.no_grad()
def channel_statistics(
    model: nn.Module,
    params: Params,
    data: DataSource,
    layers: Sequence[str],
    *,
    n_batches: int | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-output-channel mean and standard deviation of each layer's output over ``data``
    (every spatial position a sample), all layers in one pass, in eval mode.

    Returns:
        ``{layer: (mean, std)}``, float64 tensors of length ``channels``.
    """
    check_model_fits(model, params)
    modules = dict(model.named_modules())
    unknown = [name for name in layers if name not in modules]
    if unknown:
        raise ParamsError(f"layers {unknown} are not modules of {type(model).__name__}")
    sums = {name: _ChannelSums() for name in layers}
    handles = [
        modules[name].register_forward_hook(lambda _m, _i, out, name=name: sums[name].add(out))
        for name in layers
    ]
    device = next(iter(params.values())).device
    batches = as_batches(data, shuffle=False)
    try:
        with module_mode(model, False):
            for x, _ in islice(batches, n_batches):
                forward(model, params, x.to(device))
    finally:
        for h in handles:
            h.remove()
    if any(s.count == 0 for s in sums.values()):
        raise ParamsError("channel_statistics got no batches (or the layers never ran)")
    out = {}
    for name, s in sums.items():
        mean, var = s.mean_var(unbiased=False)
        out[name] = (mean, var.sqrt())
    return out


@checked
@torch.no_grad()
def repair(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    lam: float,
    data: DataSource,
    *,
    endpoints: tuple[ChannelStats, ChannelStats] | None = None,
    n_batches: int | None = None,
    eps: float = 1e-5,
) -> dict[str, Tensor]:
    """REPAIR (Jordan et al., 2023) of the interpolation ``(1 − λ)·A + λ·B``.

    Layer by layer in forward order, every hidden Linear/Conv layer's output channels of
    the interpolated network are rescaled so that their mean and standard deviation on
    ``data`` equal the interpolation of the endpoints' (``(1 − λ)·μ_A + λ·μ_B``, likewise
    σ). Earlier corrections are in place when a layer is measured, which is what REPAIR's
    inserted-and-fused BatchNorm layers compute.

    Args:
        params_b: model B, already aligned to A.
        data: an lmckit ``Dataset`` (training split, in order) or re-iterable batches.
        endpoints: the endpoints' :func:`channel_statistics` over :func:`repair_layers`,
            to reuse across λ; measured here (one pass per endpoint) when ``None``.
        n_batches: use the first ``n_batches`` batches (all by default).

    Costs one pass over the data per corrected layer, plus two without ``endpoints``.

    Raises:
        ParamsError: the model has normalisation layers (use :func:`bn_reset`).
    """
    lam = check_number("lam", lam, low=0.0, high=1.0)
    layers = repair_layers(model)
    if endpoints is None:
        endpoints = (
            channel_statistics(model, params_a, data, layers, n_batches=n_batches),
            channel_statistics(model, params_b, data, layers, n_batches=n_batches),
        )
    stats_a, stats_b = endpoints
    merged = lerp_params(params_a, params_b, lam)
    for name in layers:
        mean_a, std_a = stats_a[name]
        mean_b, std_b = stats_b[name]
        mean_m, std_m = channel_statistics(model, merged, data, [name], n_batches=n_batches)[name]
        target_mean = (1 - lam) * mean_a + lam * mean_b
        target_std = (1 - lam) * std_a + lam * std_b
        scale = target_std / (std_m + eps)
        w = merged[f"{name}.weight"]
        merged[f"{name}.weight"] = w * scale.to(w).view((-1,) + (1,) * (w.ndim - 1))
        bias_key = f"{name}.bias"
        if bias_key in merged:
            b = merged[bias_key]
            merged[bias_key] = ((b.double() - mean_m) * scale + target_mean).to(b)
    return merged
