"""Linear mode connectivity: the loss along ``θ(λ) = (1 − λ)·θ_A + λ·θ_B`` and its barriers.

:func:`interpolate` evaluates the path on a λ grid and returns a :class:`Curve` with loss,
accuracy and ECE per split, both barrier definitions, optionally the temperature-calibrated
loss (the width study's protocol) and the logit ensemble of the endpoints as a reference.
Interpolated BatchNorm networks are re-estimated at every interior λ (:func:`bn_reset`),
BN-free ones may be REPAIRed (:func:`repair`).

Barriers (for a metric ``m`` where lower is better, e.g. the loss):

* Git Re-Basin: ``max_λ m(θ_λ) − ½(m_A + m_B)``;
* convex: ``max_λ [m(θ_λ) − ((1 − λ)m_A + λ m_B)]``.

For accuracy (higher is better) the signs flip: the barrier is the largest *drop*.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit._checks import check_seed
from lmckit.data import DataSource
from lmckit.errors import ParamsError
from lmckit.evaluate.bn import bn_reset, channel_statistics, repair, repair_layers
from lmckit.evaluate.calibration import calibrated_loss, calibration_metrics
from lmckit.files import atomic_write_bytes, refuse_special
from lmckit.functional import check_model_fits, forward
from lmckit.metrics import predict
from lmckit.options import NonNegative, checked
from lmckit.params import Params, check_finite, check_params_compatible, lerp_params
from lmckit.progress import ProgressCallback, notify
from lmckit.resume import (
    ResumeError,
    check_resume_every,
    load_resume_state,
    save_interval,
    save_resume_state,
    tensors_digest,
)

__all__ = ["Curve", "barriers", "interpolate", "lambda_grid", "load_curves", "save_curves"]

Loader = Iterable[tuple[Tensor, Tensor]]


@dataclass
class Curve:
    """An interpolation curve: metric arrays of length ``len(lambdas)`` per split.

    ``splits[split]`` holds ``loss``, ``accuracy`` and ``ece`` and, when requested,
    ``temperature`` and ``calibrated_loss`` (temperature fitted on a held-out part of that
    split at each λ), ``ensemble_loss`` and ``ensemble_accuracy`` (logit ensemble
    ``(1−λ)·f_A + λ·f_B`` of the endpoints), and per class group ``g``
    ``accuracy[g]`` (and ``ensemble_accuracy[g]``): accuracy on the examples whose label is
    in the group. ``barriers[split][metric]`` has both barrier definitions (see the module
    docstring). With class groups, ``info["reliability"][split]`` holds the reliability
    diagrams (:func:`calibration_metrics` bins) at λ = 0, at λ = 1 and at the λ of least
    loss.
    """

    lambdas: list[float]
    splits: dict[str, dict[str, list[float]]]
    barriers: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def midpoint(self, split: str, metric: str) -> float:
        """The metric at the λ closest to ½."""
        i = int(np.argmin(np.abs(np.asarray(self.lambdas) - 0.5)))
        return self.splits[split][metric][i]

    def perplexities(self, split: str) -> dict[str, float]:
        """A language model's curve (per-token losses) in perplexity, ``exp`` of the loss:
        ``"perplexity.midpoint"`` and ``"perplexity.endpoints"`` (the mean of the two ends'
        perplexities, what the midpoint is compared with), and the same for the calibrated
        and ensemble losses where the curve has them."""
        out = {}
        for loss, name in (
            ("loss", "perplexity"),
            ("calibrated_loss", "calibrated_perplexity"),
            ("ensemble_loss", "ensemble_perplexity"),
        ):
            values = self.splits[split].get(loss)
            if values is None:
                continue
            out[f"{name}.midpoint"] = math.exp(self.midpoint(split, loss))
            out[f"{name}.endpoints"] = (math.exp(values[0]) + math.exp(values[-1])) / 2
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "lambdas": self.lambdas,
            "splits": self.splits,
            "barriers": self.barriers,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(
                list(data["lambdas"]),
                dict(data["splits"]),
                dict(data.get("barriers", {})),
                dict(data.get("info", {})),
            )
        except (KeyError, TypeError) as exc:
            raise ParamsError(f"not an interpolation curve: {exc}") from None


@checked
def save_curves(curves: Mapping[str, Curve], path: str | Path) -> tuple[Path, Path]:
    """Write curves as ``<path>.json`` (``{label: curve}``) and ``<path>.csv`` (one row per
    label, split, metric and λ), atomically; returns both paths."""
    stem = Path(path).with_suffix("")
    as_json = (json.dumps({k: c.to_dict() for k, c in curves.items()}, indent=2) + "\n").encode()
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    writer.writerow(["curve", "split", "metric", "lambda", "value"])
    for label, curve in curves.items():
        for split, metrics in curve.splits.items():
            for metric, values in metrics.items():
                for lam, value in zip(curve.lambdas, values, strict=True):
                    writer.writerow([label, split, metric, f"{lam:.6g}", f"{value:.8g}"])
    json_path, csv_path = stem.with_suffix(".json"), stem.with_suffix(".csv")
    atomic_write_bytes(json_path, as_json)
    atomic_write_bytes(csv_path, rows.getvalue().encode())
    return json_path, csv_path


@checked
def load_curves(path: str | Path) -> dict[str, Curve]:
    """Read curves written by :func:`save_curves` (the ``.json`` file)."""
    path = Path(path).with_suffix(".json")
    refuse_special(path, "curves file", ParamsError)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParamsError(f"cannot read curves from {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path} does not hold curves")
    return {str(k): Curve.from_dict(v) for k, v in data.items()}


@checked
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


@checked
def lambda_grid(lambdas: int | Sequence[float]) -> list[float]:
    """``n`` evenly spaced points of [0, 1], or the given points checked: increasing, finite,
    from exactly 0 to exactly 1 (barriers and the ensemble read the endpoints)."""
    if isinstance(lambdas, bool):
        raise ParamsError(f"lambdas must be a count ≥ 2 or a list of points, got {lambdas!r}")
    if isinstance(lambdas, int):
        if lambdas < 2:
            raise ParamsError(f"lambdas must be at least 2 points (0 and 1), got {lambdas}")
        return [float(x) for x in np.linspace(0.0, 1.0, lambdas)]
    try:
        lams = [float(x) for x in lambdas]
    except (TypeError, ValueError):
        raise ParamsError(
            f"lambdas must be a count or a list of numbers, got {lambdas!r}"
        ) from None
    if (
        len(lams) < 2
        or not all(math.isfinite(x) for x in lams)
        or lams[0] != 0.0
        or lams[-1] != 1.0
        or any(b <= a for a, b in itertools.pairwise(lams))
    ):
        raise ParamsError(
            f"lambdas must increase strictly from 0 to 1 (barriers and the ensemble use the "
            f"endpoints), got {lams[:3]}...{lams[-2:]}"
        )
    return lams


def _check_class_groups(
    model: nn.Module,
    params: Params,
    loaders: Mapping[str, Loader],
    class_groups: Mapping[str, Sequence[int]],
) -> None:
    """Every group names classes the model has (its output width, read off one batch):
    a class beyond them selects no example, and its accuracy would be NaN after all the
    work."""
    batch = next(iter(next(iter(loaders.values()))), None)
    if batch is None:
        return
    with torch.no_grad():
        classes = forward(model, params, batch[0].to(next(iter(params.values())).device)).shape[-1]
    for group, members in class_groups.items():
        bad = [
            c
            for c in members
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < classes
        ]
        if bad or not members:
            raise ParamsError(
                f"class_groups[{group!r}] must list classes in [0, {classes}) of the model's "
                f"{classes} outputs, got {list(members)!r}"
            )


@checked
def interpolate(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loaders: Mapping[str, Loader],
    *,
    lambdas: int | Sequence[float] = 25,
    bn_reset_data: DataSource | None = None,
    bn_reset_batches: int | None = None,
    repair_data: DataSource | None = None,
    calibrated: bool = False,
    calibration_fraction: float | None = None,
    ensemble: bool = False,
    class_groups: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    resume: str | os.PathLike | None = None,
    resume_every: NonNegative | None = None,
) -> Curve:
    """Evaluate the linear path from ``params_a`` (λ = 0) to ``params_b`` (λ = 1).

    Args:
        model: a module both parameter dicts fit (run functionally in eval mode).
        params_a, params_b: the endpoints (B already aligned to A, if it should be).
        loaders: ``{split name: loader}`` (e.g. ``{"train": ..., "test": ...}``).
        lambdas: number of evenly spaced points in [0, 1] (≥ 2), or the points themselves
            (increasing, from exactly 0 to exactly 1).
        bn_reset_data: re-estimate BatchNorm statistics at every interior λ on this data
            (an lmckit ``Dataset`` or batches; the endpoints keep their own statistics, so
            λ = 0/1 reproduce them exactly).
        bn_reset_batches: use only this many batches for each BN reset (only with
            ``bn_reset_data``).
        repair_data: apply :func:`repair` at every interior λ instead (BN-free nets); the
            endpoints' channel statistics are measured once for the whole curve.
        calibrated: also report the temperature-calibrated loss: per λ, fit β on a seeded
            ``calibration_fraction`` (default 0.2; only with ``calibrated``) of the split's
            examples and evaluate on the rest.
        ensemble: also report the logit ensemble ``(1−λ)·f_A + λ·f_B``.
        class_groups: ``{name: classes}`` — also report the accuracy on each group's
            examples (Git Re-Basin §5.4: the classes each half of the data favours), and
            reliability diagrams at the endpoints and the best λ.
        seed: fixes the calibration split and the BN-reset batch order.
        progress: a :class:`~lmckit.progress.Progress` after each λ evaluated.
        resume: a file (:mod:`lmckit.resume`) where the logits and labels of the points
            done are saved after a point once ``resume_every`` seconds have passed since
            the last save (default: the environment variable ``LMCKIT_RESUME_EVERY``, else
            60; the last point saves none) — a point of a BatchNorm network re-estimated on
            a large training set can take minutes. A call given a file that exists evaluates
            only the points after those saved, with the same curve as a call never
            interrupted (each point's logits depend only on the endpoints, λ, the data and
            the seed); the file must come from this path — the same endpoints, λ grid,
            BN-reset or REPAIR settings, seed and splits, and labels equal to the data's —
            or :class:`~lmckit.resume.ResumeError` names what differs. The caller deletes
            the file once the result is kept.
    """
    if not isinstance(loaders, Mapping) or not loaders:
        raise ParamsError("interpolate() needs loaders={split name: loader}, at least one")
    if bn_reset_data is not None and repair_data is not None:
        raise ParamsError("pass bn_reset_data or repair_data, not both")
    if calibration_fraction is not None and not calibrated:
        raise ParamsError("calibration_fraction applies to calibrated=True only; it was not set")
    if bn_reset_batches is not None and bn_reset_data is None:
        raise ParamsError("bn_reset_batches applies to a BN reset only; bn_reset_data is None")
    if calibration_fraction is None:
        calibration_fraction = 0.2
    check_resume_every(resume, resume_every, "interpolate")
    check_params_compatible(params_a, params_b)
    check_model_fits(model, params_a, "params_a")
    check_finite(params_a, "params_a")
    check_finite(params_b, "params_b")
    check_seed(seed)
    if class_groups:
        _check_class_groups(model, params_a, loaders, class_groups)
    lams = lambda_grid(lambdas)
    device = next(iter(params_a.values())).device
    endpoints = None
    if repair_data is not None:
        layers = repair_layers(model)
        endpoints = tuple(
            channel_statistics(model, p, repair_data, layers) for p in (params_a, params_b)
        )
    collected, labels = _logits_along(
        model, params_a, params_b, lams, loaders, device=device, repair_data=repair_data,
        endpoints=endpoints, bn_reset_data=bn_reset_data, bn_reset_batches=bn_reset_batches,
        seed=seed, progress=progress, resume=resume, resume_every=resume_every,
    )  # fmt: skip
    splits: dict[str, dict[str, list[float]]] = {}
    curve_barriers: dict[str, dict[str, dict[str, float]]] = {}
    reliability: dict[str, dict[str, Any]] = {}
    for split in loaders:
        metrics, reliable = _point_metrics(
            torch.stack(collected[split]), labels[split], lams, calibrated=calibrated,
            calibration_fraction=calibration_fraction, seed=seed, ensemble=ensemble,
            class_groups=class_groups,
        )  # fmt: skip
        if reliable is not None:
            reliability[split] = reliable
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
        "bn_reset": bn_reset_data is not None,
        "repair": repair_data is not None,
        "calibrated": calibrated,
        "ensemble": ensemble,
    }
    if class_groups:
        info["class_groups"] = {g: list(c) for g, c in class_groups.items()}
        info["reliability"] = reliability
    return Curve(lams, splits, curve_barriers, info)


def _logits_along(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    lams: list[float],
    loaders: Mapping[str, Any],
    *,
    device: torch.device,
    repair_data: Any,
    endpoints: Any,
    bn_reset_data: Any,
    bn_reset_batches: int | None,
    seed: int,
    progress: ProgressCallback | None,
    resume: str | os.PathLike | None,
    resume_every: float | None,
) -> tuple[dict[str, list[Tensor]], dict[str, Tensor]]:
    """Each split's logits at every λ (one tensor per point) and its labels: the model at
    ``lerp(A, B, λ)`` — REPAIRed or BN-reset at interior points — evaluated on the split's
    loader, resumed from and saved to ``resume`` (see :func:`interpolate`)."""
    collected: dict[str, list[Tensor]] = {s: [] for s in loaders}
    labels: dict[str, Tensor] = {}
    fingerprint: dict[str, Any] = {}
    done, seconds_before = 0, 0.0
    if resume is not None:
        resume_every = save_interval(resume_every)
        fingerprint = {
            "interpolate": {
                "lambdas": lams,
                "bn_reset": bn_reset_data is not None,
                "bn_reset_batches": bn_reset_batches,
                "repair": repair_data is not None,
                "seed": seed,
                "splits": sorted(loaders),
            },
            "params_a": tensors_digest(params_a),
            "params_b": tensors_digest(params_b),
        }
        loaded = load_resume_state(resume, fingerprint)
        if loaded is not None:
            done, seconds_before = _saved_points(loaded, loaders, len(lams), resume)
            tensors = loaded[0]
            for split in loaders:
                collected[split] = [tensors[f"logits/{split}/{i}"] for i in range(done)]
                labels[split] = tensors[f"labels/{split}"]
    resumed_from = {"epoch": done, "seconds": seconds_before}
    started = last_save = time.perf_counter()
    for i, lam in enumerate(lams):
        if i < done:
            continue
        params = lerp_params(params_a, params_b, lam)
        interior = 0.0 < lam < 1.0
        if interior and repair_data is not None:
            params = repair(model, params_a, params_b, lam, repair_data, endpoints=endpoints)
        elif interior and bn_reset_data is not None:
            params = bn_reset(model, params, bn_reset_data, n_batches=bn_reset_batches, seed=seed)
        for split, loader in loaders.items():
            logits, y = predict(model, params, loader, device=device)
            if split in labels and not torch.equal(labels[split], y):
                raise ResumeError(
                    f"resume file {resume} holds other labels for split {split!r} than its "
                    f"data gives ({len(labels[split])} saved, {len(y)} now: other examples "
                    "or another order); delete it to start the curve afresh"
                )
            collected[split].append(logits)
            labels[split] = y
        notify(progress, i + 1, len(lams), lam=lam)
        now = time.perf_counter()
        if resume is not None and i + 1 < len(lams) and now - last_save >= resume_every:
            tensors = {f"labels/{split}": y for split, y in labels.items()}
            for split, points in collected.items():
                tensors.update({f"logits/{split}/{j}": t for j, t in enumerate(points)})
            info = {
                "epoch": i + 1,
                "epochs": len(lams),
                "unit": "point",
                "seconds": seconds_before + now - started,
                "resumed_from": resumed_from,
            }
            save_resume_state(resume, tensors, info, fingerprint)
            last_save = now
    return collected, labels


def _point_metrics(
    stack: Tensor,
    y: Tensor,
    lams: Sequence[float],
    *,
    calibrated: bool,
    calibration_fraction: float,
    seed: int,
    ensemble: bool,
    class_groups: Mapping[str, Sequence[int]] | None,
) -> tuple[dict[str, list[float]], dict[str, Any] | None]:
    """One split's metrics at every λ from its logits ``stack`` (λ, N, C) and labels ``y``:
    loss, accuracy, ECE, and as asked the calibrated loss and temperature, the ensemble's,
    and each class group's accuracy — with, for class groups, the reliability bins at the
    endpoints and the best λ (else ``None``)."""
    metrics: dict[str, list[float]] = {
        "loss": [F.cross_entropy(lg, y).item() for lg in stack],
        "accuracy": [(lg.argmax(-1) == y).double().mean().item() for lg in stack],
        "ece": [calibration_metrics(lg, y)["ece"] for lg in stack],
    }
    if calibrated:
        fits = [calibrated_loss(lg, y, fraction=calibration_fraction, seed=seed) for lg in stack]
        metrics["temperature"] = [f["temperature"] for f in fits]
        metrics["calibrated_loss"] = [f["loss"] for f in fits]
    if ensemble:
        ens = [(1 - lam) * stack[0] + lam * stack[-1] for lam in lams]
        metrics["ensemble_loss"] = [F.cross_entropy(lg, y).item() for lg in ens]
        metrics["ensemble_accuracy"] = [(lg.argmax(-1) == y).double().mean().item() for lg in ens]
    if not class_groups:
        return metrics, None
    for group, classes in class_groups.items():
        mask = torch.isin(y, torch.as_tensor(list(classes), dtype=y.dtype))
        metrics[f"accuracy[{group}]"] = _masked_accuracy(stack, y, mask)
        if ensemble:
            metrics[f"ensemble_accuracy[{group}]"] = _masked_accuracy(ens, y, mask)
    best = int(np.argmin(metrics["loss"]))
    reliability = {
        str(lams[i]): calibration_metrics(stack[i], y)["bins"]
        for i in sorted({0, len(lams) - 1, best})
    }
    return metrics, reliability


def _saved_points(
    loaded: tuple[dict[str, Tensor], dict[str, Any]],
    loaders: Mapping[str, Loader],
    points: int,
    path: str | os.PathLike,
) -> tuple[int, float]:
    """``(points done, seconds spent)`` of a curve's resume file, after checking that it
    holds the labels and the logits of every split at each of those points."""
    tensors, info = loaded
    done, seconds = info.get("epoch"), info.get("seconds")
    bad = None
    if not isinstance(done, int) or not 0 < done < points or info.get("unit") != "point":
        bad = f"records {done!r} of {points} points done"
    elif not isinstance(seconds, int | float):
        bad = f"records {seconds!r} seconds"
    else:
        for split in loaders:
            names = [f"labels/{split}", *(f"logits/{split}/{i}" for i in range(done))]
            missing = [n for n in names if n not in tensors]
            if missing:
                bad = f"lacks {missing[0]}"
                break
            rows = {len(tensors[n]) for n in names}
            if len(rows) != 1:
                bad = f"holds {sorted(rows)} rows for split {split!r}"
                break
    if bad is not None:
        raise ResumeError(
            f"resume file {path} is not what an interpolation saves ({bad}); delete it to "
            "start the curve afresh"
        )
    return done, float(seconds)


def _masked_accuracy(logits: Sequence[Tensor], y: Tensor, mask: Tensor) -> list[float | None]:
    """Accuracy of each ``(N, C)`` logits on the examples in ``mask`` (None if empty)."""
    if not mask.any():
        return [None] * len(logits)
    return [(lg[mask].argmax(-1) == y[mask]).double().mean().item() for lg in logits]
