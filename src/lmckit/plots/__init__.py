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
from matplotlib.ticker import NullFormatter

from lmckit.evaluate import Curve
from lmckit.files import atomic_path

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


def _grid(n: int, width: float = 3.2, height: float = 2.8, cols: int = 4):
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat[:n])


def plot_spectra(
    spectra: Mapping[str, list], path: str | Path, *, labels=None, title: str = ""
) -> Path:
    """One panel per layer: every model's singular values in descending order, overlaid
    (Ito et al. Fig. 1 / Fig. 6). ``spectra[layer]`` is a list of 1-D sequences, one per
    model; ``labels`` names the models."""
    path = Path(path)
    fig, axes = _grid(len(spectra))
    for ax, (layer, values) in zip(axes, spectra.items(), strict=True):
        for k, s in enumerate(values):
            label = labels[k] if labels is not None else None
            ax.plot(range(1, len(s) + 1), [float(v) for v in s], lw=1, label=label)
        ax.set_title(layer, fontsize=8)
        ax.set_xlabel("index", fontsize=8)
        ax.set_ylabel("singular value", fontsize=8)
        ax.tick_params(labelsize=7)
    if labels is not None and len(labels) <= 10:
        axes[0].legend(fontsize=6)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def grouped_bars(
    ax,
    groups: list[str],
    series: Mapping[str, list[tuple[float, float]]],
    colors: Mapping[str, str] | None = None,
) -> None:
    """Draw on ``ax`` one bar per series within each group: ``series[label][i]`` is the
    ``(value, error)`` of group ``i`` (error 0 for none); labels go to the legend and crowded
    group names are slanted. ``colors`` fixes a series' colour by its label."""
    width = 0.8 / max(len(series), 1)
    for k, (label, points) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(
            xs,
            [m for m, _ in points],
            width,
            yerr=[e for _, e in points],
            capsize=3,
            label=label,
            color=(colors or {}).get(label),
        )
    crowded = len(groups) > 4
    ax.set_xticks(
        range(len(groups)),
        groups,
        fontsize=8,
        rotation=30 if crowded else 0,
        ha="right" if crowded else "center",
    )
    ax.axhline(0, color="k", lw=0.6)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def plot_alignment_bars(
    values: Mapping[str, Mapping[str, float]],
    path: str | Path,
    *,
    ylabel: str = "R",
    errors=None,
    title: str = "",
) -> Path:
    """Grouped bars: ``values[group][bar]`` (e.g. ``{"γ=0.3": {"wm": 0.4, "none": 0.01}}``,
    Ito et al. Fig. 2); ``errors`` of the same shape draws error bars."""
    path = Path(path)
    groups = list(values)
    bars = list(dict.fromkeys(b for g in groups for b in values[g]))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups) * max(len(bars), 1) / 2, 3.4))
    grouped_bars(
        ax,
        groups,
        {
            bar: [
                (values[g].get(bar, math.nan), errors[g].get(bar, 0.0) if errors else 0.0)
                for g in groups
            ]
            for bar in bars
        },
    )
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_layer_distances(
    distances: Mapping[str, Mapping[str, float]], path: str | Path, *, title: str = ""
) -> Path:
    """Horizontal bars of the L2 distance per tensor, one bar per label (``"before"``,
    ``"wm"``...): ``distances[label][tensor]``."""
    path = Path(path)
    labels = list(distances)
    tensors = list(dict.fromkeys(t for lab in labels for t in distances[lab]))
    height = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.32 * len(tensors) * max(len(labels), 1) / 2))
    for k, lab in enumerate(labels):
        ys = [i + (k - (len(labels) - 1) / 2) * height for i in range(len(tensors))]
        ax.barh(ys, [distances[lab].get(t, math.nan) for t in tensors], height, label=lab)
    ax.set_yticks(range(len(tensors)), tensors, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("L2 distance to A")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_cosine_heatmaps(
    cosines: Mapping[str, tuple], path: str | Path, *, title: str = ""
) -> Path:
    """Per layer, |cos| between A's and π(B)'s top singular vectors: left vectors above,
    right vectors below (an aligned pair is a bright diagonal)."""
    path = Path(path)
    layers = list(cosines)
    fig, axes = plt.subplots(2, len(layers), figsize=(2.4 * len(layers), 4.8), squeeze=False)
    for col, layer in enumerate(layers):
        for row, (name, matrix) in enumerate(zip(("left", "right"), cosines[layer], strict=True)):
            ax = axes[row][col]
            ax.imshow([[float(v) for v in r] for r in matrix], vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"{layer}\n{name}" if row == 0 else name, fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_taylor(
    results: Mapping[str, Mapping[str, list]], path: str | Path, *, title: str = ""
) -> Path:
    """Actual barrier (solid) and eq. 2's Taylor prediction (dashed) along λ, one colour per
    label: ``results[label]`` holds ``lambdas``, ``actual`` and ``predicted``."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (label, r) in enumerate(results.items()):
        colour = f"C{i % 10}"
        ax.plot(r["lambdas"], r["actual"], "-o", ms=3, color=colour, label=f"{label}: actual")
        ax.plot(r["lambdas"], r["predicted"], "--", color=colour, label=f"{label}: Taylor")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("λ")
    ax.set_ylabel("L(θ(λ)) − ((1−λ)L_A + λL_B)")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_counterexample(
    result, predictions, path: str | Path, *, extent=(-1, 1, -1, 1), data=None, columns=None
) -> Path:
    """Git Re-Basin Fig. 6 (and 7): left, the error along λ for every permutation; right, a
    grid of prediction images, one row per permutation and one column per λ.
    ``predictions[k][c]`` is a 2-D array of ``f(x) ≥ 0`` over ``extent``; ``data = (x, y)``
    adds a scatter of the data (Fig. 7) as a last panel; ``columns`` labels the λ of each
    column."""
    path = Path(path)
    rows = len(predictions)
    cols = len(predictions[0])
    fig = plt.figure(figsize=(4.5 + 1.3 * cols + (3.2 if data is not None else 0), 1.3 * rows + 1))
    n_panels = 2 + (data is not None)
    ratios = [3.4, 1.3 * cols] + ([3.0] if data is not None else [])
    outer = fig.add_gridspec(1, n_panels, width_ratios=ratios, wspace=0.25)
    ax = fig.add_subplot(outer[0])
    for k, values in enumerate(result.values):
        ax.plot(
            result.lambdas,
            [100 * v for v in values],
            label=f"π{k}: barrier {100 * result.barriers[k]:.1f} %",
        )
    ax.set_xlabel("λ")
    ax.set_ylabel("error (%)")
    ax.legend(fontsize=7)
    inner = outer[1].subgridspec(rows, cols, wspace=0.05, hspace=0.1)
    for r in range(rows):
        for c in range(cols):
            sub = fig.add_subplot(inner[r, c])
            sub.imshow(
                predictions[r][c], origin="lower", extent=extent, cmap="coolwarm", vmin=0, vmax=1
            )
            sub.set_xticks([])
            sub.set_yticks([])
            if c == 0:
                sub.set_ylabel(f"π{r}", fontsize=8)
            if r == 0 and columns is not None:
                sub.set_title(f"λ = {columns[c]:g}", fontsize=8)
    if data is not None:
        x, y = data
        sub = fig.add_subplot(outer[2])
        sub.scatter(x[:, 0], x[:, 1], c=y, s=2, cmap="coolwarm")
        sub.set_aspect("equal")
        sub.set_title("data", fontsize=9)
    return _save(fig, path)


LAYERWISE_PANELS = (
    ("lewc", "LEWC: cos(f(θ_C), λ^ℓ mixture)"),
    ("weak_additivity", "weak additivity of ReLU"),
    ("reciprocal_ab", "E‖W_A z_B‖ / E‖W_A z_A‖"),
    ("merged_cosine", "cos(W_A z_C, W_A z_A)"),
    ("commutativity", "commutativity distance"),
    ("norm_ratio", "E‖f(θ_C)‖ / E‖f_A + f_B‖"),
    ("activation_cosine", "cos(f_A, f_B)"),
    ("non_overlap", "non-overlap of large-moment units"),
)


def plot_layerwise(
    results: Mapping[str, Mapping], path: str | Path, *, errors=None, title: str = ""
) -> Path:
    """The width study's layer diagnostics (Fig. 3, 4, 6, 7, 8, 11, 14, 20), one panel per
    metric, one line per label against the layer: ``results[label]`` is a
    :meth:`lmckit.analysis.Layerwise.to_dict` (or any ``{"layers": [{"name", metric...}]}``);
    ``errors[label][metric]`` optional per-layer standard deviations. The norm panel also
    shows LEWC's predicted ratio (dotted)."""
    path = Path(path)
    fig, axes = _grid(len(LAYERWISE_PANELS), width=3.6, height=2.9)
    for ax, (metric, label) in zip(axes, LAYERWISE_PANELS, strict=True):
        for i, (name, r) in enumerate(results.items()):
            rows = r["layers"]
            xs = [k for k, row in enumerate(rows) if row.get(metric) is not None]
            ys = [rows[k][metric] for k in xs]
            err = (errors or {}).get(name, {}).get(metric)
            colour = f"C{i % 10}"
            if err is not None:
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[err[k] for k in xs],
                    fmt="-o",
                    ms=3,
                    color=colour,
                    capsize=2,
                    label=name,
                )
            else:
                ax.plot(xs, ys, "-o", ms=3, color=colour, label=name)
            if metric == "norm_ratio":
                pred = [
                    (k, row["lewc_norm_ratio"])
                    for k, row in enumerate(rows)
                    if row.get("lewc_norm_ratio") is not None
                ]
                ax.plot([k for k, _ in pred], [v for _, v in pred], ":", color=colour)
        names = [row["name"] for row in next(iter(results.values()))["layers"]]
        step = max(1, len(names) // 8)
        ax.set_xticks(
            range(0, len(names), step), names[::step], fontsize=6, rotation=45, ha="right"
        )
        ax.set_title(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if metric == "norm_ratio":
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=6)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_moment_histograms(
    moments: Mapping[str, Mapping[str, list]],
    path: str | Path,
    *,
    small: float = 0.01,
    bins: int = 50,
    title: str = "",
) -> Path:
    """Per layer, histograms of the per-unit ``√E[z̃²]`` of the ReLU inputs of A and B (log
    counts; the width study's Fig. 5/21), with the small-moment cut marked: a second moment
    ``small`` × the largest, a root ``√small`` × the largest root."""
    path = Path(path)
    fig, axes = _grid(len(moments), width=3.2, height=2.6)
    for ax, (layer, m) in zip(axes, moments.items(), strict=True):
        top = max(max(m["a"]), max(m["b"]))
        for key, colour in (("a", "C0"), ("b", "C1")):
            ax.hist(m[key], bins=bins, range=(0, top), alpha=0.5, color=colour, label=key.upper())
        ax.axvline(math.sqrt(small) * top, color="k", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_title(layer, fontsize=8)
        ax.set_xlabel("√E[z̃²]", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_flatness(result: Mapping, path: str | Path, *, title: str = "") -> Path:
    """The flatness proxy (width study Fig. 12–13): loss and accuracy of
    ``θ_A + λ d u/‖u‖`` along λ, and each layer's activation cosine to θ_A."""
    path = Path(path)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    lams = result["lambdas"]
    axes[0].plot(lams, result["loss"], "-o", ms=3)
    axes[0].set_ylabel("test loss")
    axes[1].plot(lams, [100 * a for a in result["accuracy"]], "-o", ms=3)
    axes[1].set_ylabel("test accuracy (%)")
    for layer, values in result["cosine"].items():
        axes[2].plot(lams, values, "-o", ms=3, label=layer)
    axes[2].set_ylabel("cos(f(θ_A), f(θ_A + λdu/‖u‖))")
    axes[2].legend(fontsize=6)
    for ax in axes:
        ax.set_xlabel("λ")
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"random direction at distance d = {result['distance']:.2f}")
    return _save(fig, path)
