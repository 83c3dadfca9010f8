"""Figures, saved as PNG. Plotting only draws: the data behind a figure is written by its
caller (``evaluate.save_curves`` for curves, JSON for the rest), so every plot can be
redrawn or tabulated without rerunning."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt

from lmckit._io import atomic_path
from lmckit.evaluate import Curve

SPLIT_STYLE = {"train": "--", "test": "-"}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_interpolation(
    curves: Mapping[str, Curve], path: str | Path, *, title: str = "", loss_key: str = "loss"
) -> Path:
    """Loss and accuracy along λ for several curves (e.g. naive and each matching method).

    Train is dashed, test solid; one colour per curve. If a curve carries ensemble
    metrics, the ensemble of the first such curve is drawn in grey as the reference.
    """
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ensemble_drawn = False
    for i, (label, curve) in enumerate(curves.items()):
        for split, metrics in curve.splits.items():
            style = SPLIT_STYLE.get(split, ":")
            axes[0].plot(
                curve.lambdas,
                metrics[loss_key],
                style,
                color=colours[i % len(colours)],
                label=f"{label} ({split})",
            )
            axes[1].plot(
                curve.lambdas,
                [100 * a for a in metrics["accuracy"]],
                style,
                color=colours[i % len(colours)],
                label=f"{label} ({split})",
            )
            if "ensemble_loss" in metrics and not ensemble_drawn and split == "test":
                axes[0].plot(
                    curve.lambdas,
                    metrics["ensemble_loss"],
                    "-",
                    color="0.55",
                    lw=2.5,
                    alpha=0.6,
                    label="ensemble (test)",
                )
                axes[1].plot(
                    curve.lambdas,
                    [100 * a for a in metrics["ensemble_accuracy"]],
                    "-",
                    color="0.55",
                    lw=2.5,
                    alpha=0.6,
                    label="ensemble (test)",
                )
                ensemble_drawn = True
    axes[0].set_ylabel("calibrated loss" if loss_key == "calibrated_loss" else "loss")
    axes[1].set_ylabel("accuracy (%)")
    for ax in axes:
        ax.set_xlabel("λ  (0 = model A, 1 = model B)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_barriers(
    barriers: Mapping[str, Mapping[str, float]], path: str | Path, *, title: str = ""
) -> Path:
    """Bar chart of barriers: ``{method: {"loss": x, "accuracy": y}}`` (accuracy in [0, 1],
    drawn in percentage points)."""
    path = Path(path)
    methods = list(barriers)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, metric, scale, unit in (
        (axes[0], "loss", 1, "loss barrier"),
        (axes[1], "accuracy", 100, "accuracy barrier (pp)"),
    ):
        values = [scale * barriers[m][metric] for m in methods]
        bars = ax.bar(methods, values, color=["0.6"] + ["C0"] * (len(methods) - 1))
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_ylabel(unit)
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_sweep(
    results: Mapping[str, Mapping[int, Mapping[str, float]]],
    path: str | Path,
    *,
    metrics: tuple[tuple[str, str], ...] = (
        ("merged_accuracy", "merged test accuracy (%)"),
        ("loss_gap", "L(merged) − mean L(θ_i)"),
    ),
    title: str = "",
) -> Path:
    """Metric vs number of merged models, one line per method (STE-MM Fig. 3).

    ``results[method][n][metric]``; accuracies are drawn in percent."""
    path = Path(path)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8))
    axes = [axes] if len(metrics) == 1 else list(axes)
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for method, by_n in results.items():
            ns = sorted(int(n) for n in by_n)
            scale = 100 if "accuracy" in key else 1
            values = [scale * by_n[n][key] if n in by_n else scale * by_n[str(n)][key] for n in ns]
            ax.plot(ns, values, "o-", label=method)
        ax.set_xlabel("number of models n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_landscape(landscape, path: str | Path, *, labels=("π₁(θ₁)", "π₂(θ₂)", "π₃(θ₃)")) -> Path:
    """Contour plots of loss and accuracy on the plane through three models, points marked."""
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, grid, name in (
        (axes[0], landscape.loss, "test loss"),
        (axes[1], [[100 * a for a in row] for row in landscape.accuracy], "test accuracy (%)"),
    ):
        cs = ax.contourf(landscape.xs, landscape.ys, grid, levels=20, cmap="viridis")
        fig.colorbar(cs, ax=ax)
        for (x, y), label in zip(landscape.points, labels, strict=True):
            ax.plot(x, y, "o", color="white", mec="black")
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), color="white")
        ax.set_title(name)
        ax.set_aspect("equal")
    return _save(fig, path)


def plot_geometry(ratios, angles, path: str | Path, *, title: str = "") -> Path:
    """Histograms of pairwise distance ratios and triplet angles (regular simplex: 1 and 60°)."""
    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    # NaN marks undefined ratios/angles (coinciding models): nothing to draw for them.
    axes[0].hist([r for r in ratios if math.isfinite(r)], bins=20, color="C0")
    axes[0].axvline(1.0, color="k", lw=0.8)
    axes[0].set_xlabel("‖π_iθ_i − π_jθ_j‖ / mean")
    axes[1].hist([a for a in angles if math.isfinite(a)], bins=20, color="C1")
    axes[1].axvline(60.0, color="k", lw=0.8)
    axes[1].set_xlabel("triplet angle (°)")
    if title:
        fig.suptitle(title)
    return _save(fig, path)
