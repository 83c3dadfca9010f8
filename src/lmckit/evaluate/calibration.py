"""Temperature calibration of the softmax and calibration error.

The width study evaluates interpolated networks after *temperature calibration*: their
logits are scaled by an inverse temperature β fitted on a held-out part of the split,
and the calibrated loss is reported on the rest (never on the examples β was fitted on).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar
from torch import Tensor

from lmckit._checks import check_int, check_number, check_positive, check_seed
from lmckit.data import holdout_split
from lmckit.errors import ParamsError
from lmckit.options import checked

__all__ = ["calibrated_loss", "calibration_metrics", "fit_temperature"]


def check_logits(logits: Tensor, labels: Tensor) -> None:
    """``logits`` ``(N, C)`` with ``N ≥ 1`` and ``labels`` ``(N,)`` in ``[0, C)``."""
    if logits.ndim != 2 or labels.shape != (logits.shape[0],) or logits.shape[0] == 0:
        raise ParamsError(
            f"expected logits (N, C) and labels (N,) with N ≥ 1, got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if not logits.dtype.is_floating_point:
        raise ParamsError(f"logits must be floating point, got {logits.dtype}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ParamsError(f"labels must be integer class indices, got {labels.dtype}")
    if int(labels.min()) < 0 or int(labels.max()) >= logits.shape[1]:
        raise ParamsError(f"labels must be in [0, {logits.shape[1]}) for {logits.shape[1]} classes")
    bad = int((~torch.isfinite(logits)).sum())
    if bad:
        raise ParamsError(
            f"logits hold {bad} non-finite value(s) (NaN or ±inf): the model diverged or its "
            "parameters are not finite"
        )


def _pair(value: Any) -> tuple[Any, Any]:
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ParamsError(f"bounds must be a pair (low, high), got {value!r}")
    return value[0], value[1]


@checked
def fit_temperature(logits: Tensor, labels: Tensor, bounds=(1e-3, 1e3)) -> float:
    """The inverse temperature ``β`` minimising ``NLL(softmax(β · logits), labels)``
    (a 1-D bounded search over ``log β``). ``logits``: ``(N, C)``; ``labels``: ``(N,)``;
    ``bounds``: the search interval of β, ``0 < low < high``."""
    check_logits(logits, labels)
    low, high = (check_positive(f"bounds[{i}]", b) for i, b in enumerate(_pair(bounds)))
    if not low < high:
        raise ParamsError(f"bounds must be (low, high) with low < high, got {bounds!r}")
    logits, labels = logits.double(), labels.long()

    def nll(log_beta: float) -> float:
        return F.cross_entropy(logits * math.exp(log_beta), labels).item()

    res = minimize_scalar(
        nll,
        bounds=(math.log(low), math.log(high)),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(res.x))


@checked
def calibrated_loss(
    logits: Tensor, labels: Tensor, *, fraction: float = 0.2, seed: int = 0
) -> dict[str, Any]:
    """Temperature-calibrated cross-entropy: β fitted on a seeded ``fraction`` of the
    examples (:func:`~lmckit.data.holdout_split`), the loss reported on the others.

    Returns:
        ``{"temperature": 1/β, "loss": calibrated loss on the rest, "held": indices β was
        fitted on, "rest": indices the loss is measured on}`` (disjoint, covering all).
    """
    check_logits(logits, labels)
    fraction = check_number("fraction", fraction, low=0, high=1, low_open=True, high_open=True)
    check_seed(seed)
    held, rest = holdout_split(len(labels), fraction, seed=seed)
    if len(held) == 0 or len(rest) == 0:
        raise ParamsError(
            f"{len(labels)} examples are too few to hold out {fraction:.0%} for calibration"
        )
    beta = fit_temperature(logits[held], labels[held])
    loss = F.cross_entropy(logits[rest].double() * beta, labels[rest].long()).item()
    return {"temperature": 1.0 / beta, "loss": loss, "held": held, "rest": rest}


@checked
def calibration_metrics(logits: Tensor, labels: Tensor, n_bins: int = 15) -> dict[str, Any]:
    """Expected calibration error and reliability-diagram data (equal-width confidence bins).

    Bin ``k`` of ``n_bins`` holds the confidences in ``(k/n_bins, (k+1)/n_bins]`` (the first
    also 0). Returns ``{"ece", "bins": [{"lower", "upper", "confidence", "accuracy",
    "count"}]}`` with ``n_bins`` entries.
    """
    check_logits(logits, labels)
    check_int("n_bins", n_bins)
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
