"""Linear mode connectivity: interpolation curves, barriers, BatchNorm repair, calibration.

Everything runs functionally (``torch.func.functional_call``): one ``nn.Module`` evaluates
every interpolated, merged or re-estimated parameter set.

* :func:`interpolate` evaluates ``θ(λ) = (1 − λ)·θ_A + λ·θ_B`` on a λ grid and returns a
  :class:`Curve` with loss and accuracy per split, both barrier definitions, optionally the
  temperature-calibrated loss (the width study's protocol) and the logit ensemble of the
  endpoints as a reference.
* :func:`bn_reset` re-estimates BatchNorm running statistics of a parameter set;
  :func:`repair` (Jordan et al., 2023) restores per-channel statistics of BN-free MLPs/VGGs.
* :func:`fit_temperature`, :func:`calibration_metrics`: inverse temperature, ECE and
  reliability-diagram data; :func:`evaluate` (loss, accuracy) and :func:`predict` (logits).

Barriers (for a metric ``m`` where lower is better, e.g. the loss):

* Git Re-Basin: ``max_λ m(θ_λ) − ½(m_A + m_B)``;
* convex: ``max_λ [m(θ_λ) − ((1 − λ)m_A + λ m_B)]``.

For accuracy (higher is better) the signs flip: the barrier is the largest *drop*.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar
from torch import Tensor, nn

from lmckit.errors import DataError, ParamsError
from lmckit.metrics import evaluate
from lmckit.perm import Params, check_params_compatible

__all__ = [
    "Curve",
    "bn_reset",
    "calibration_metrics",
    "evaluate",
    "fit_temperature",
    "interpolate",
    "lerp_params",
    "predict",
    "repair",
]

Loader = Iterable[tuple[Tensor, Tensor]]


def lerp_params(params_a: Params, params_b: Params, lam: float) -> dict[str, Tensor]:
    """``(1 − λ)·A + λ·B`` for floating tensors, exact at the endpoints and for ``A == B``
    (computed from the nearer endpoint). Integer buffers come from the nearer endpoint."""
    out = {}
    for k, a in params_a.items():
        b = params_b[k]
        if not a.dtype.is_floating_point:
            out[k] = (a if lam < 0.5 else b).clone()
        elif lam <= 0.5:
            out[k] = a + lam * (b - a)
        else:
            out[k] = b + (1 - lam) * (a - b)
    return out


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


@torch.no_grad()
def bn_reset(
    model: nn.Module, params: Params, loader: Loader, n_batches: int | None = None
) -> dict[str, Tensor]:
    """A copy of ``params`` whose BatchNorm running statistics are re-estimated on ``loader``.

    Running means/variances are reset and recomputed as exact averages over the first
    ``n_batches`` batches (all by default) in train mode; nothing else changes. Models
    without BatchNorm get an unchanged copy. This is what an interpolated or merged BN
    network needs before it is evaluated (Git Re-Basin; Jordan et al., 2023).
    """
    new = {k: v.clone() for k, v in params.items()}
    bns = _bn_modules(model)
    if not bns:
        return new
    device = next(iter(params.values())).device
    saved = [(m, m.momentum) for _, m in bns]
    for name, m in bns:
        new[f"{name}.running_mean"].zero_()
        new[f"{name}.running_var"].fill_(1)
        new[f"{name}.num_batches_tracked"].zero_()
        m.momentum = None  # cumulative moving average = exact mean over the batches
    was_training = model.training
    model.train()
    seen = 0
    try:
        for i, (x, _) in enumerate(loader):
            if n_batches is not None and i >= n_batches:
                break
            torch.func.functional_call(model, new, (x.to(device),))
            seen += 1
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        model.train(was_training)
    if seen == 0:
        raise ParamsError("bn_reset got no batches")
    return new


def _linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]


@torch.no_grad()
def _channel_stats(model, params, loader, module_name: str, n_batches) -> tuple[Tensor, Tensor]:
    """Per-output-channel mean and std of ``module_name``'s output over the data."""
    module = dict(model.named_modules())[module_name]
    sums: list[Tensor] = []

    def hook(_m, _i, out):
        z = out.movedim(1, -1).reshape(-1, out.shape[1]).double()
        if not sums:
            sums.extend([torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)] * 2)
            sums.append(torch.zeros((), dtype=torch.float64))
        sums[0] = sums[0] + z.sum(0)
        sums[1] = sums[1] + (z * z).sum(0)
        sums[2] = sums[2] + z.shape[0]

    handle = module.register_forward_hook(hook)
    model.eval()
    device = next(iter(params.values())).device
    try:
        for i, (x, _) in enumerate(loader):
            if n_batches is not None and i >= n_batches:
                break
            torch.func.functional_call(model, params, (x.to(device),))
    finally:
        handle.remove()
    mean = sums[0] / sums[2]
    var = (sums[1] / sums[2] - mean**2).clamp_min(0)
    return mean, var.sqrt()


@torch.no_grad()
def repair(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    lam: float,
    loader: Loader,
    *,
    n_batches: int | None = None,
    eps: float = 1e-5,
) -> dict[str, Tensor]:
    """REPAIR (Jordan et al., 2023) for networks without normalisation layers.

    Interpolates ``A`` and (already aligned) ``B`` at ``λ`` and then, layer by layer in
    forward order, rescales every hidden Linear/Conv layer's output channels so that their
    mean and standard deviation on the data equal the interpolation of the endpoints'
    (``(1−λ)·μ_A + λ·μ_B``, likewise σ). Earlier corrections are in place when a layer is
    measured, which is what REPAIR's inserted-and-fused BatchNorm layers compute.

    Raises:
        ParamsError: the model has normalisation layers (use :func:`bn_reset`) .
    """
    if any(
        isinstance(m, nn.modules.batchnorm._BatchNorm | nn.LayerNorm | nn.GroupNorm)
        for m in model.modules()
    ):
        raise ParamsError("repair() is for networks without normalisation layers; use bn_reset()")
    check_params_compatible(params_a, params_b)
    merged = lerp_params(params_a, params_b, lam)
    layers = _linear_layers(model)[:-1]  # the output layer's logits are left alone
    for name, _ in layers:
        mean_a, std_a = _channel_stats(model, params_a, loader, name, n_batches)
        mean_b, std_b = _channel_stats(model, params_b, loader, name, n_batches)
        mean_m, std_m = _channel_stats(model, merged, loader, name, n_batches)
        target_mean = (1 - lam) * mean_a + lam * mean_b
        target_std = (1 - lam) * std_a + lam * std_b
        scale = (target_std / (std_m + eps)).float()
        w = merged[f"{name}.weight"]
        shape = (-1,) + (1,) * (w.ndim - 1)
        merged[f"{name}.weight"] = w * scale.view(shape).to(w)
        bias_key = f"{name}.bias"
        if bias_key in merged:
            b = merged[bias_key]
            merged[bias_key] = (b - mean_m.float().to(b)) * scale.to(b) + target_mean.float().to(b)
    return merged


def fit_temperature(logits: Tensor, labels: Tensor, bounds=(1e-3, 1e3)) -> float:
    """The inverse temperature ``β`` minimising ``NLL(softmax(β · logits), labels)``
    (a 1-D bounded search over ``log β``)."""
    logits, labels = logits.double(), labels.long()

    def nll(log_beta: float) -> float:
        return F.cross_entropy(logits * math.exp(log_beta), labels).item()

    res = minimize_scalar(
        nll,
        bounds=(math.log(bounds[0]), math.log(bounds[1])),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(res.x))


def calibration_metrics(logits: Tensor, labels: Tensor, n_bins: int = 15) -> dict[str, Any]:
    """Expected calibration error and reliability-diagram data (equal-width confidence bins).

    Returns ``{"ece", "bins": [{"lower", "upper", "confidence", "accuracy", "count"}]}``.
    """
    probs = logits.double().softmax(-1)
    conf, pred = probs.max(-1)
    correct = (pred == labels).double()
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    bins, ece, n = [], 0.0, len(labels)
    for lo, hi in itertools.pairwise(edges):
        mask = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        count = int(mask.sum())
        if count:
            c, a = float(conf[mask].mean()), float(correct[mask].mean())
            ece += count / n * abs(c - a)
        else:
            c = a = float("nan")
        bins.append(
            {"lower": float(lo), "upper": float(hi), "confidence": c, "accuracy": a, "count": count}
        )
    return {"ece": ece, "bins": bins}


@dataclass
class Curve:
    """An interpolation curve: metric arrays of length ``len(lambdas)`` per split.

    ``splits[split]`` holds ``loss`` and ``accuracy`` and, when requested, ``calibrated_loss``
    (temperature fitted on the calibration part of that split at each λ), ``ece``,
    ``ensemble_loss`` and ``ensemble_accuracy`` (logit ensemble
    ``(1−λ)·f_A + λ·f_B`` of the endpoints). ``barriers[split][metric]`` has both barrier
    definitions (see the module docstring).
    """

    lambdas: list[float]
    splits: dict[str, dict[str, list[float]]]
    barriers: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def midpoint(self, split: str, metric: str) -> float:
        """The metric at the λ closest to ½."""
        i = int(np.argmin(np.abs(np.asarray(self.lambdas) - 0.5)))
        return self.splits[split][metric][i]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "lambdas": self.lambdas,
            "splits": self.splits,
            "barriers": self.barriers,
            "info": self.info,
        }


def barriers(lambdas: Sequence[float], values: Sequence[float], higher_is_better: bool) -> dict:
    """Both barrier definitions of one metric curve (exactly 0 for a constant curve)."""
    lam = np.asarray(lambdas, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    sign = -1.0 if higher_is_better else 1.0
    v = sign * v
    ends = v[0] + lam * (v[-1] - v[0])
    return {
        "rebasin": float(v.max() - 0.5 * (v[0] + v[-1])),
        "convex": float((v - ends).max()),
    }


def predict(
    model: nn.Module, params: Params | None, loader: Loader, *, device=None
) -> tuple[Tensor, Tensor]:
    """Logits ``(N, C)`` (float32, CPU) and labels ``(N,)`` of ``model`` with ``params``
    (``None``: its own weights) over ``loader``, in eval mode (the mode is restored)."""
    if device is None:
        first = next(iter(params.values())) if params else next(model.parameters())
        device = first.device
    was_training = model.training
    model.eval()
    outs, ys = [], []
    try:
        with torch.no_grad():
            for x, y in loader:
                x = x.to(device)
                out = (
                    model(x) if params is None else torch.func.functional_call(model, params, (x,))
                )
                outs.append(out.float().cpu())
                ys.append(y.cpu())
    finally:
        model.train(was_training)
    if not outs:
        raise DataError("predict() got an empty loader")
    return torch.cat(outs), torch.cat(ys)


def interpolate(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    lambdas: int | Sequence[float] = 25,
    loaders: Mapping[str, Loader] | None = None,
    *,
    bn_reset_loader: Loader | None = None,
    bn_reset_batches: int | None = None,
    repair_loader: Loader | None = None,
    calibrated: bool = False,
    calibration_fraction: float = 0.2,
    ensemble: bool = False,
    seed: int = 0,
    progress=None,
) -> Curve:
    """Evaluate the linear path from ``params_a`` (λ = 0) to ``params_b`` (λ = 1).

    Args:
        lambdas: number of evenly spaced points in [0, 1] (≥ 2), or the points themselves
            (increasing, from exactly 0 to exactly 1).
        loaders: ``{split name: loader}`` (e.g. ``{"train": ..., "test": ...}``).
        bn_reset_loader: re-estimate BatchNorm statistics at every interior λ on this data
            (the endpoints keep their own statistics, so λ = 0/1 reproduce them exactly).
        repair_loader: apply :func:`repair` at every interior λ instead (BN-free nets).
        calibrated: also report the temperature-calibrated loss: per λ, fit β on a seeded
            ``calibration_fraction`` of the split's examples and evaluate on the rest.
        ensemble: also report the logit ensemble ``(1−λ)·f_A + λ·f_B``.
        progress: ``progress(done, total)`` after each λ.
    """
    if loaders is None or not loaders:
        raise ParamsError("interpolate() needs loaders={split: loader}")
    check_params_compatible(params_a, params_b)
    lams = list(np.linspace(0.0, 1.0, lambdas)) if isinstance(lambdas, int) else list(lambdas)
    lams = [float(x) for x in lams]
    if len(lams) < 2 or lams[0] != 0.0 or lams[-1] != 1.0 or lams != sorted(lams):
        raise ParamsError(
            f"lambdas must increase from 0 to 1 (barriers and the ensemble use the endpoints), "
            f"got {lams[:3]}...{lams[-2:]}"
        )
    device = next(iter(params_a.values())).device
    collected: dict[str, list[Tensor]] = {s: [] for s in loaders}
    labels: dict[str, Tensor] = {}
    for i, lam in enumerate(lams):
        params = lerp_params(params_a, params_b, lam)
        interior = 0.0 < lam < 1.0
        if interior and repair_loader is not None:
            params = repair(model, params_a, params_b, lam, repair_loader)
        elif interior and bn_reset_loader is not None:
            params = bn_reset(model, params, bn_reset_loader, bn_reset_batches)
        for split, loader in loaders.items():
            logits, y = predict(model, params, loader, device=device)
            collected[split].append(logits)
            labels[split] = y
        if progress is not None:
            progress(i + 1, len(lams))
    splits: dict[str, dict[str, list[float]]] = {}
    curve_barriers: dict[str, dict[str, dict[str, float]]] = {}
    for split in loaders:
        y = labels[split]
        stack = torch.stack(collected[split])  # (λ, N, C)
        metrics: dict[str, list[float]] = {
            "loss": [F.cross_entropy(lg, y).item() for lg in stack],
            "accuracy": [(lg.argmax(-1) == y).double().mean().item() for lg in stack],
            "ece": [calibration_metrics(lg, y)["ece"] for lg in stack],
        }
        if calibrated:
            g = torch.Generator().manual_seed(seed)
            order = torch.randperm(len(y), generator=g)
            k = max(1, int(calibration_fraction * len(y)))
            held, rest = order[:k], order[k:]
            betas = [fit_temperature(lg[held], y[held]) for lg in stack]
            metrics["temperature"] = [1.0 / b for b in betas]
            metrics["calibrated_loss"] = [
                F.cross_entropy(lg[rest] * b, y[rest]).item()
                for lg, b in zip(stack, betas, strict=True)
            ]
        if ensemble:
            ens = [(1 - lam) * stack[0] + lam * stack[-1] for lam in lams]
            metrics["ensemble_loss"] = [F.cross_entropy(lg, y).item() for lg in ens]
            metrics["ensemble_accuracy"] = [
                (lg.argmax(-1) == y).double().mean().item() for lg in ens
            ]
        splits[split] = metrics
        curve_barriers[split] = {
            "loss": barriers(lams, metrics["loss"], higher_is_better=False),
            "accuracy": barriers(lams, metrics["accuracy"], higher_is_better=True),
        }
        if calibrated:
            curve_barriers[split]["calibrated_loss"] = barriers(
                lams, metrics["calibrated_loss"], higher_is_better=False
            )
    info = {
        "bn_reset": bn_reset_loader is not None,
        "repair": repair_loader is not None,
        "calibrated": calibrated,
        "ensemble": ensemble,
    }
    return Curve(lams, splits, curve_barriers, info)
