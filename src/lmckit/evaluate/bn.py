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
from functools import partial
from itertools import islice

import torch
from torch import Tensor, nn

from lmckit._checks import check_int, check_number
from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, forward, module_mode
from lmckit.options import checked
from lmckit.params import Params, lerp_params

__all__ = ["ChannelStats", "bn_reset", "channel_statistics", "repair", "repair_layers"]

ChannelStats = Mapping[str, tuple[Tensor, Tensor]]
"""Layer name -> per-output-channel ``(mean, std)`` (float64) of its output over data."""


class _ChannelMoments:
    """Per-channel count, mean and sum of squared deviations of tensors ``(N, C, ...)`` —
    every position a sample — over batches. Each batch's moments are combined with the
    running ones in float64 by Chan et al.'s pairwise update, so the result is the
    statistics of all the samples at once whatever the batch sizes, without the cancellation
    of Σz² − n·mean²."""

    def __init__(self) -> None:
        self.mean: Tensor | None = None
        self.squares: Tensor | None = None  # Σ (z - mean)²
        self.count = 0

    def add(self, x: Tensor) -> None:
        x = x.detach()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        var, mean = torch.var_mean(x, dim=[0, *range(2, x.ndim)], correction=0)
        self.add_moments(x.numel() // x.shape[1], mean, var)

    def add_moments(self, count: int, mean: Tensor, var: Tensor) -> None:
        """One batch of ``count`` samples per channel with this ``mean`` and biased ``var``."""
        mean, squares = mean.to(torch.float64, copy=True), var.double() * count
        if self.mean is None or self.squares is None:
            self.mean, self.squares, self.count = mean, squares, count
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.squares = self.squares + squares + delta**2 * (self.count * count / total)
        self.count = total

    def mean_var(self, unbiased: bool) -> tuple[Tensor, Tensor]:
        assert self.mean is not None and self.squares is not None
        return self.mean, self.squares / (max(self.count - 1, 1) if unbiased else self.count)


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


def _reports_batch_moments(m: nn.Module, running_mean: Tensor) -> bool:
    """Whether ``m`` is one of PyTorch's own BatchNorm layers (its ``forward`` unchanged) with
    float32/64 statistics: in train mode with momentum 1 its running buffers then hold the
    batch's mean and unbiased variance, computed by the normalisation itself. Measuring the
    input again costs up to 70 % of the forward pass (ResNet-20 on the CPU); any other layer
    (a subclass with its own ``forward``, half-precision buffers) is measured that way."""
    return type(m).forward is nn.modules.batchnorm._BatchNorm.forward and running_mean.dtype in (
        torch.float32,
        torch.float64,
    )


def _take_batch_moments(acc: _ChannelMoments, m: nn.Module, inputs: tuple, _out: Tensor) -> None:
    count = inputs[0].numel() // inputs[0].shape[1]
    # the buffers are the ones functional_call substituted, just updated with momentum 1
    acc.add_moments(count, m.running_mean, m.running_var * ((count - 1) / count))


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
    every BatchNorm layer normalising with its batch's statistics as in training, while each
    batch's per-channel mean and variance of each layer's inputs are combined in float64;
    the running mean and (unbiased) variance are then the statistics of those inputs over
    all the examples at once (to float32 rounding) — independent of how the examples were
    batched, unlike BatchNorm's own running averages. PyTorch's own BatchNorm layers hand
    over the batch statistics they compute anyway (their momentum is 1 during the pass and
    restored after), so the pass costs one training-mode forward per batch; a subclass with
    its own ``forward`` has its inputs measured again. A layer the forward pass never uses
    keeps its statistics. Nothing else changes; a model without BatchNorm gets an unchanged
    copy.

    Args:
        data: an lmckit ``Dataset`` (its training split, shuffled by ``seed``, in batches of
            ``batch_size``) or ``(x, y)`` batches.
    """
    check_model_fits(model, params)
    if n_batches is not None:
        check_int("n_batches", n_batches, minimum=0, where="bn_reset: ")
    new = {k: v.detach().clone() for k, v in params.items()}
    bns = _bn_modules(model)
    if not bns:
        return new
    batches = as_batches(data, batch_size=batch_size, seed=seed)
    device = next(iter(params.values())).device
    sums = {name: _ChannelMoments() for name, _ in bns}
    momenta = {name: m.momentum for name, m in bns}
    handles = []
    seen = 0
    try:
        for name, m in bns:
            if _reports_batch_moments(m, new[f"{name}.running_mean"]):
                # momentum 1: the buffers hold the batch's own statistics (0 · NaN is NaN, so
                # whatever the old statistics were, they are cleared first)
                m.momentum = 1.0
                new[f"{name}.running_mean"].zero_()
                new[f"{name}.running_var"].fill_(1.0)
                handles.append(m.register_forward_hook(partial(_take_batch_moments, sums[name])))
            else:
                handles.append(
                    m.register_forward_pre_hook(lambda _m, i, acc=sums[name]: acc.add(i[0]))
                )
        with module_mode(model, True):
            for x, _ in islice(batches, n_batches):
                forward(model, new, x.to(device))
                seen += 1
    finally:
        for h in handles:
            h.remove()
        for name, m in bns:
            m.momentum = momenta[name]
    if seen == 0:
        raise ParamsError("bn_reset got no batches")
    for name, _ in bns:
        if sums[name].count == 0:  # a layer the forward pass never used keeps its statistics
            for buffer in ("running_mean", "running_var"):
                new[f"{name}.{buffer}"] = params[f"{name}.{buffer}"].detach().clone()
            continue
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
    sums = {name: _ChannelMoments() for name in layers}
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
