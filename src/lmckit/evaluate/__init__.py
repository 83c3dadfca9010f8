"""Evaluating linear mode connectivity.

* :mod:`~lmckit.evaluate.interpolation` — curves along ``(1 − λ)·θ_A + λ·θ_B`` and their
  barriers (:func:`interpolate`, :class:`Curve`, :func:`barriers`);
* :mod:`~lmckit.evaluate.bn` — statistics repair of interpolated and merged networks
  (:func:`bn_reset` for BatchNorm, :func:`repair` for BN-free nets);
* :mod:`~lmckit.evaluate.calibration` — temperature calibration and ECE;
* :func:`evaluate` / :func:`predict` — loss, accuracy and logits of any parameter set.

Everything runs functionally (``torch.func.functional_call``): one ``nn.Module`` evaluates
every interpolated, merged or re-estimated parameter set, and comes back in its own modes.
"""

from lmckit.evaluate.bn import bn_reset, channel_statistics, repair, repair_layers
from lmckit.evaluate.calibration import calibrated_loss, calibration_metrics, fit_temperature
from lmckit.evaluate.interpolation import (
    Curve,
    barriers,
    interpolate,
    lambda_grid,
    load_curves,
    save_curves,
)
from lmckit.metrics import Metrics, evaluate, predict

__all__ = [
    "Curve",
    "Metrics",
    "barriers",
    "bn_reset",
    "calibrated_loss",
    "calibration_metrics",
    "channel_statistics",
    "evaluate",
    "fit_temperature",
    "interpolate",
    "lambda_grid",
    "load_curves",
    "predict",
    "repair",
    "repair_layers",
    "save_curves",
]
