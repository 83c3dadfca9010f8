"""The figures of an experiment's report (:mod:`lmckit.experiments.report`): barriers and
curves per grid cell, values along a grid axis, merges, analyses, the width study's
layerwise diagnostics, ranks and spectra — each drawn from the report's rows (the ledger's
jobs and metrics) or the curves and spectra in a run's store, returned as ``(caption, PNG
as base64)`` pairs for the self-contained page."""

from __future__ import annotations

import base64
import io
import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from lmckit.plots import grouped_bars
from lmckit.store import Store

VARIANT_KEY = "variant.name"
"""The label key of a grid variant's name: the experiment schema's
(``lmckit.experiments.schema.VARIANT_KEY``; spelled again here, below the engine, and kept
equal by a test)."""


def job_labels(job: Mapping[str, Any]) -> dict[str, Any]:
    return dict(job["settings"].get("labels", {}))


def png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def cell_label(grid: Mapping[str, Any]) -> str:
    """The grid cell's values, e.g. ``width_multiplier=2``; empty for an experiment without
    a grid (captions then leave the cell out)."""
    return ", ".join(
        str(v) if k == VARIANT_KEY else f"{k.split('.', 1)[1]}={v}" for k, v in grid.items()
    )


def with_cell(text: str, grid: Mapping[str, Any]) -> str:
    """``text, <cell>`` — or ``text`` alone when there is no grid."""
    label = cell_label(grid)
    return f"{text}, {label}" if label else text


def barrier_figures(
    rows: list[dict[str, Any]], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    return _grid_figures(
        rows,
        "curve",
        (
            ("test.loss.barrier.rebasin", "test loss barrier"),
            ("test.accuracy.barrier.rebasin", "test accuracy barrier"),
        ),
        colours=colours,
    )


def _mean_std(ax, points: Sequence[tuple[Any, Mapping[str, Any]]], scale: float = 1.0,
              **style: Any) -> None:  # fmt: skip
    """One line of ``(x, row)`` points: the rows' means ± their std (none for a single
    value), scaled (100 for accuracies in %); ``style`` overrides the markers and caps."""
    ax.errorbar(
        [x for x, _ in points],
        [scale * r["mean"] for _, r in points],
        yerr=[scale * (r["std"] or 0.0) for _, r in points],
        **{"marker": "o", "capsize": 3, **style},
    )


def _grid_figures(
    rows: list[dict[str, Any]],
    kind: str,
    metrics: Sequence[tuple[str, str]],
    min_cells: int = 1,
    colours: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """One figure per metric and block: the metric against the grid cells, one line per
    method, mean ± std over pairs; with a single cell, one bar per method."""
    colours = colours or {}
    figures = []
    for metric, title in metrics:
        chosen = [r for r in rows if r["kind"] == kind and r["metric"] == metric]
        if len({r["group"]["cell"] for r in chosen}) < min_cells:
            continue
        for block in sorted({r["group"].get("block") for r in chosen}):
            part = [r for r in chosen if r["group"].get("block") == block]
            cells = sorted({r["group"]["cell"] for r in part})
            labels = {r["group"]["cell"]: cell_label(r["grid"]) for r in part}
            fig, ax = plt.subplots(figsize=(5.8, 3.4))
            scale = 100 if "accuracy" in metric else 1
            methods = sorted({r["group"]["method"] for r in part}, key=_naive_first)
            if len(cells) == 1:  # one cell: a bar per method, the methods on the axis
                found = {r["group"]["method"]: r for r in part}
                ax.bar(
                    range(len(methods)),
                    [scale * found[m]["mean"] for m in methods],
                    yerr=[scale * (found[m]["std"] or 0.0) for m in methods],
                    capsize=3,
                    color=[colours.get(m) for m in methods],
                )
                ax.set_xticks(range(len(methods)), [_method_label(m) for m in methods], fontsize=8)
                ax.set_xlabel("method" + (f" ({labels[cells[0]]})" if labels[cells[0]] else ""))
                ax.axhline(0, color="k", lw=0.6)
            else:
                for method in methods:
                    points = {r["group"]["cell"]: r for r in part if r["group"]["method"] == method}
                    xs = [c for c in cells if c in points]
                    _mean_std(
                        ax,
                        [(c, points[c]) for c in xs],
                        scale,
                        color=colours.get(method),
                        label=_method_label(method),
                    )
                ticks = [labels[c] for c in cells]
                ax.set_xticks(cells, ticks, rotation=20, ha="right", fontsize=8)
                ax.set_xlabel("grid cell")
                ax.legend(fontsize=8)
            ax.set_ylabel(title + (" (pp)" if "accuracy" in metric else ""))
            ax.grid(alpha=0.3)
            figures.append((f"{title}, compare block {block} (mean ± std over pairs)", png(fig)))
    return figures


def grid_axes(rows: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]] | None:
    """For rows whose grid varies two or more keys: the key to put on a figure's x axis —
    the one with the most values (of a tie, the later key) — and the others, one line per
    combination of their values; ``None`` for a grid of fewer varying keys (the figures
    against the grid cells already read as one line each then)."""
    values = _grid_values(rows)
    varying = [k for k in sorted(values) if len(values[k]) > 1]
    if len(varying) < 2:
        return None
    x_key = max(reversed(varying), key=lambda k: len(values[k]))
    return x_key, [k for k in varying if k != x_key]


def _grid_values(rows: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Each grid key's distinct values among ``rows`` (as JSON text)."""
    values: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        for k, v in r["grid"].items():
            values[k].add(json.dumps(v, sort_keys=True))
    return values


def _value_order(value: Any, first_cell: int = 0) -> tuple[int, float, str]:
    """Numbers by value, before anything else (lists, variant names) in the order of the
    experiment file — the first grid cell holding it —, then by its JSON text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, float(first_cell), json.dumps(value, sort_keys=True))


def _layer_order(name: str) -> list[tuple[int, int | str]]:
    """Natural order of parameter names: ``layers.2.weight`` before ``layers.10.weight``."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in name.split(".")]


def _axis_name(key: str) -> str:
    return "variant" if key == VARIANT_KEY else key.split(".", 1)[-1]


def _axis_tick(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def axis_lines(
    rows: Sequence[Mapping[str, Any]], x_key: str, line_keys: Sequence[str]
) -> tuple[list[Any], dict[str, list[tuple[int, Mapping[str, Any]]]]]:
    """Rows of one quantity regrouped for a plot against the grid key ``x_key``: its values
    in order (numbers ascending) and, per line — labelled by the ``line_keys``' values, e.g.
    ``width_multiplier=2`` —, the line's points as (index into those values, row)."""
    first: dict[str, float] = {}
    for r in rows:
        text = json.dumps(r["grid"][x_key], sort_keys=True)
        first[text] = min(first.get(text, math.inf), r["group"].get("cell", 0))
    xs = sorted(first, key=lambda text: _value_order(json.loads(text), first[text]))
    position = {text: i for i, text in enumerate(xs)}
    lines: dict[str, list[tuple[int, Mapping[str, Any]]]] = defaultdict(list)

    def line_order(r: Mapping[str, Any]) -> list[tuple[int, float, str]]:
        return [_value_order(r["grid"].get(k), r["group"].get("cell", 0)) for k in line_keys]

    for r in sorted(rows, key=line_order):  # lines: numbers ascending, names as in the file
        label = ", ".join(
            str(r["grid"].get(k)) if k == VARIANT_KEY else f"{_axis_name(k)}={r['grid'].get(k)}"
            for k in line_keys
        )
        lines[label].append((position[json.dumps(r["grid"][x_key], sort_keys=True)], r))
    for points in lines.values():
        points.sort(key=lambda p: p[0])
    return [json.loads(text) for text in xs], dict(lines)


def _axis_figure(
    panels: Sequence[tuple[str, float, Sequence[Mapping[str, Any]]]],
    x_key: str,
    line_keys: Sequence[str],
):
    """One panel per (title, scale, rows): the rows' means ± std against ``x_key``, one line
    per value of the other grid keys; the figure, not yet encoded."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (title, scale, rows) in zip(axes[0], panels, strict=True):
        xs, lines = axis_lines(rows, x_key, line_keys)
        for label, points in lines.items():
            _mean_std(ax, points, scale, label=label)
        ticks = [_axis_tick(v) for v in xs]
        if max(map(len, ticks)) > 6:  # names and lists: slanted, so they do not overlap
            ax.set_xticks(range(len(xs)), ticks, fontsize=8, rotation=20, ha="right")
        else:
            ax.set_xticks(range(len(xs)), ticks, fontsize=8)
        ax.set_xlabel(_axis_name(x_key))
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


AXIS_PANELS = (
    ("test.loss.barrier.rebasin", "test loss barrier", 1),
    ("test.accuracy.barrier.rebasin", "test accuracy barrier (pp)", 100),
    ("test.calibrated_loss.barrier.rebasin", "calibrated test loss barrier", 1),
)


def axis_figures(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """For a grid of two or more keys (the width study's F.9: width × weight decay), the
    barriers against one key, one line per value of the others — per compare block and
    method, mean ± std over pairs; and the relative effective rank likewise, per layer."""
    figures = []
    curves = [r for r in rows if r["kind"] == "curve"]
    axes = grid_axes(curves)
    for block, method in sorted(
        {(r["group"].get("block"), r["group"].get("method")) for r in curves} if axes else (),
        key=lambda bm: (bm[0] is None, bm[0] or 0, _naive_first(bm[1] or "")),
    ):
        mine = [
            r for r in curves if r["group"].get("block") == block
            and r["group"].get("method") == method
        ]  # fmt: skip
        panels = [
            (title, scale, chosen)
            for metric, title, scale in AXIS_PANELS
            if (chosen := [r for r in mine if r["metric"] == metric])
        ]
        if panels:
            x_key, line_keys = axes
            fig = _axis_figure(panels, x_key, line_keys)
            figures.append(
                (
                    f"barriers against {_axis_name(x_key)}, one line per "
                    f"{', '.join(_axis_name(k) for k in line_keys)}: compare block {block}, "
                    f"{_method_label(method or '')} (mean ± std over pairs)",
                    png(fig),
                )
            )
    ranks = [
        r
        for r in rows
        if r["kind"] == "spectra" and r["metric"].startswith("relative_effective_rank.")
    ]
    axes = grid_axes(ranks)
    if axes:
        layers = sorted({r["metric"].split(".", 1)[1] for r in ranks}, key=_layer_order)
        shown = layers if len(layers) <= 4 else [layers[round(i * (len(layers) - 1) / 3)]
                                                 for i in range(4)]  # fmt: skip
        x_key, line_keys = axes
        panels = [
            (layer, 1, [r for r in ranks if r["metric"].split(".", 1)[1] == layer])
            for layer in shown
        ]
        fig = _axis_figure(panels, x_key, line_keys)
        fig.axes[0].set_ylabel("effective rank / min(out, in)")
        figures.append(
            (
                f"relative effective rank (Roy & Vetterli) against {_axis_name(x_key)}, one "
                f"line per {', '.join(_axis_name(k) for k in line_keys)}"
                + ("" if shown == layers else f"; {len(shown)} of {len(layers)} layers"),
                png(fig),
            )
        )
    return figures


CURVE_PANELS = (
    ("accuracy", "test accuracy (%)", 100),
    ("loss", "test loss", 1),
    ("calibrated_loss", "calibrated test loss", 1),
)


def _stored_curves(out: Path, jobs: Sequence[Mapping]):
    """Every finished curve's test metrics: ``({(block, grid JSON): {method: {metric:
    [values per pair]}}}, {(block, grid JSON): λ grid})``."""
    store = Store(out / "store")
    curves: dict[tuple, dict[str, dict[str, list]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    lambdas: dict[tuple, list[float]] = {}
    for job in jobs:
        if job["kind"] != "curve" or job["status"] != "done":
            continue
        artifact = store.get("curve", job["key"])
        if artifact is None:
            continue
        data = json.loads(artifact.file("curve.json").read_text())
        labels = job_labels(job)
        grid = json.dumps({k: v for k, v in labels.items() if "." in k}, sort_keys=True)
        where = (labels.get("block"), grid)
        for metric, values in data["splits"]["test"].items():
            curves[where][labels.get("method")][metric].append(values)
        lambdas[where] = data["lambdas"]
    return curves, lambdas


def _mean_line(runs: list[list[float | None]], scale: float = 1.0) -> list[float]:
    """The mean over pairs at every λ (NaN where a pair has no value)."""
    return [
        scale * statistics.fmean(v) if all(x is not None for x in v) else math.nan
        for v in zip(*runs, strict=True)
    ]


def _naive_first(method: str) -> tuple[bool, str]:
    """Sort key: the naive path ("none") first, then the methods by name."""
    return method != "none", method


def _method_label(method: str) -> str:
    return "naive" if method == "none" else method


def part_figures(
    out: Path, jobs: Sequence[Mapping], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Pairs trained on parts of the data (Git Re-Basin Figs. 5, 10): per compare block and
    grid cell, test loss (with the logit ensemble), accuracy on each part's majority
    classes (one line style per part) and ECE along λ, one colour per method."""
    curves, lambdas = _stored_curves(out, jobs)
    figures = []
    for where, methods in curves.items():
        groups = sorted(
            {
                m[len("accuracy[") : -1]
                for per in methods.values()
                for m in per
                if m.startswith("accuracy[")
            }
        )
        if not groups:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(13.2, 3.4))
        lam = lambdas[where]
        for index, (method, per) in enumerate(sorted(methods.items())):
            name = "naive" if method == "none" else method
            colour = colours.get(method, f"C{index}")
            axes[0].plot(lam, _mean_line(per["loss"]), color=colour, marker=".", label=name)
            for style, group in zip(("-", "--", ":", "-."), groups, strict=False):
                runs = per.get(f"accuracy[{group}]")
                if runs:
                    axes[1].plot(
                        lam, _mean_line(runs, 100), color=colour, ls=style, label=f"{name}, {group}"
                    )
            axes[2].plot(lam, _mean_line(per["ece"]), color=colour, marker=".", label=name)
            if index == 0 and "ensemble_loss" in per:
                axes[0].plot(
                    lam, _mean_line(per["ensemble_loss"]), color="k", ls=":", label="ensemble"
                )
        labels = ("test loss", "accuracy on the part's majority classes (%)", "ECE (test)")
        for ax, ylabel in zip(axes, labels, strict=True):
            ax.set_xlabel("λ")
            ax.set_ylabel(ylabel + " (mean over pairs)", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        fig.tight_layout()
        caption = with_cell(f"models trained on parts: block {where[0]}", json.loads(where[1]))
        figures.append((caption, png(fig)))
    return figures


def curve_figures(
    out: Path, jobs: Sequence[Mapping], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Test accuracy, loss and (when computed) calibrated loss along λ, means over pairs:
    per compare block and method one line per grid cell (the width study's Figs. 1–2) when
    the block has several cells, else one line per method."""
    curves, lambdas = _stored_curves(out, jobs)
    figures = []
    blocks = sorted({b for b, _ in curves}, key=str)
    for block in blocks:
        cells = [w for w in curves if w[0] == block]
        lines: dict[str, dict[str, tuple]] = defaultdict(dict)  # figure -> line -> (where, method)
        for where in cells:
            for method in curves[where]:
                name = "naive" if method == "none" else method
                cell = cell_label(json.loads(where[1]))
                if len(cells) > 1:
                    lines[f"{name}, compare block {block}"][cell] = (where, method)
                else:
                    caption = with_cell(f"compare block {block}", json.loads(where[1]))
                    lines[caption][name] = (where, method)
        for caption, members in lines.items():
            metrics = [
                p for p in CURVE_PANELS if any(p[0] in curves[w][m] for w, m in members.values())
            ]
            fig, axes = plt.subplots(
                1, len(metrics), figsize=(4.4 * len(metrics), 3.3), squeeze=False
            )
            for ax, (metric, ylabel, scale) in zip(axes[0], metrics, strict=True):
                for label, (where, method) in members.items():
                    runs = curves[where][method].get(metric)
                    if runs:
                        mean = [scale * statistics.fmean(v) for v in zip(*runs, strict=True)]
                        colour = colours.get(method) if len(cells) == 1 else None
                        ax.plot(lambdas[where], mean, marker=".", color=colour, label=label)
                ax.set_xlabel("λ")
                ax.set_ylabel(ylabel + " (mean over pairs)", fontsize=8)
                ax.grid(alpha=0.3)
            axes[0][0].legend(fontsize=7)
            fig.tight_layout()
            figures.append((f"along the linear path: {caption}", png(fig)))
    return figures


MERGE_PANELS = (
    ("merged_accuracy", "merged test accuracy (%)", 100),
    ("loss_gap", "loss gap: merged − inputs' mean test loss", 1),
    ("pairwise_gap", "pairwise gap: pairs' midpoints − inputs' mean", 1),
    ("sharpness_merged", "sharpness tr(H ⊙ θθᵀ) of the merge (dashed: inputs' mean)", 1),
)


def merge_figures(rows: list[dict[str, Any]], colours: Mapping[str, str]) -> list[tuple[str, str]]:
    """Per merge block, one panel per quantity of STE-MM's Figs. 3a, 3b and 4 (merged test
    accuracy, loss gap, pairwise gap; mean ± std over seed sets where a block repeats on
    several): against the number of models n, one line per method and grid cell — or, for
    a block of one n over a grid, against its key (of several, the one with most values),
    one line per method and value of the other keys (Fig. 5: the gap of the ten-model merge
    against width)."""
    merges = [r for r in rows if r["kind"] == "merge"]
    figures = []
    for block in sorted({r["group"].get("block") for r in merges}, key=lambda b: b or 0):
        part = [r for r in merges if r["group"].get("block") == block]
        panels = [
            (metric, title, scale)
            for metric, title, scale in MERGE_PANELS
            if any(r["metric"] == metric for r in part)
        ]
        if not panels:
            continue
        counts = {r["group"].get("n") for r in part}
        values = _grid_values(part)
        varying = [k for k in sorted(values) if len(values[k]) > 1]
        against_key = len(counts) == 1 and len(varying) >= 1
        x_key, line_keys = (varying[0], []) if len(varying) == 1 else grid_axes(part) or ("", [])
        fig, axs = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.4), squeeze=False)
        methods = sorted({r["group"]["method"] for r in part}, key=_naive_first)
        for ax, (metric, title, scale) in zip(axs[0], panels, strict=True):
            chosen = [r for r in part if r["metric"] == metric]
            if against_key:  # Fig. 5: the single n's merge against a grid key
                for method in methods:
                    mine = [r for r in chosen if r["group"]["method"] == method]
                    lines = axis_lines(mine, x_key, line_keys)[1]
                    styles = itertools.cycle(("-", "--", ":", "-."))
                    for (label, points), style in zip(lines.items(), styles, strict=False):
                        _mean_std(
                            ax, points, scale, color=colours.get(method), ls=style,
                            label=_method_label(method) + (f", {label}" if label else ""),
                        )  # fmt: skip
                xs = axis_lines(chosen, x_key, [])[0]
                ax.set_xticks(range(len(xs)), [_axis_tick(v) for v in xs], fontsize=8)
                ax.set_xlabel(f"{_axis_name(x_key)} (n = {next(iter(counts))})")
            else:
                cells = sorted({r["group"]["cell"] for r in chosen})
                styles = dict(zip(cells, itertools.cycle(("-", "--", ":", "-.")), strict=False))
                for method in methods:
                    for cell in cells:
                        points = sorted(
                            ((r["group"]["n"], r) for r in chosen
                             if r["group"]["method"] == method and r["group"]["cell"] == cell),
                            key=lambda p: p[0],
                        )  # fmt: skip
                        if not points:
                            continue
                        grid = next(r["grid"] for r in chosen if r["group"]["cell"] == cell)
                        _mean_std(  # std over seed sets where a block repeats on several
                            ax,
                            points,
                            scale,
                            ls=styles[cell],
                            color=colours.get(method),
                            label=with_cell(_method_label(method), grid),
                        )
                if metric == "sharpness_merged":  # Fig. 8's "Baseline": the same inputs
                    for cell in cells:  # for every method, so one line per cell
                        baseline = {
                            r["group"]["n"]: r for r in part
                            if r["metric"] == "sharpness_models_mean" and r["group"]["cell"] == cell
                        }  # fmt: skip
                        if baseline:
                            _mean_std(
                                ax, sorted(baseline.items(), key=lambda p: p[0]), scale,
                                color="k", ls="--", marker="x", label=None,
                            )  # fmt: skip
                ax.set_xticks(sorted(n for n in counts if n is not None))  # whole models
                ax.set_xlabel("number of models n")
            if metric != "merged_accuracy":
                ax.axhline(0, color="k", lw=0.6)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
        axs[0][0].legend(fontsize=7)
        fig.tight_layout()
        figures.append(
            (
                f"merging, block {block}: "
                + ", ".join(title for _, title, _ in panels)
                + " (STE-MM Figs. 3a, 3b, 4"
                + (", 5" if against_key else "")
                + (", 8" if any(m == "sharpness_merged" for m, _, _ in panels) else "")
                + "; mean ± std over seed sets where the block has several)",
                png(fig),
            )
        )
    return figures


GEOMETRY_PANELS = (
    ("pair_distances", "‖π_iθ_i − π_jθ_j‖ of every pair"),
    ("distance_ratios", "pair distance / mean pair distance"),
    ("triplet_angles", "angles of every triangle (°)"),
)


def merge_geometry_figures(
    out: Path, jobs: Sequence[Mapping], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    """STE-MM Figs. 6, 7, 9, 10: per merge block and grid cell, histograms of the aligned
    models' pair distances, distance ratios and triangle angles at the block's largest n
    (the first seed set), one outline per method, from the merges' stored metrics (a
    regular simplex has every ratio 1 and every angle 60°)."""
    store = Store(out / "store")
    found: dict[tuple, dict[str, tuple[int, dict]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] != "merge" or job["status"] != "done":
            continue
        labels = job_labels(job)
        if labels.get("set", 0):
            continue
        artifact = store.get("merge-metrics", job["key"])
        if artifact is None:
            continue
        grid = json.dumps({k: v for k, v in labels.items() if "." in k}, sort_keys=True)
        where, method, n = (labels.get("block"), grid), labels["method"], labels.get("n", 0)
        if n > found[where].get(method, (0, {}))[0]:
            data = json.loads(artifact.file("metrics.json").read_text())
            found[where][method] = (n, data)
    figures = []
    for (block, grid), methods in sorted(found.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        panels = [
            (key, title)
            for key, title in GEOMETRY_PANELS
            if any(_finite(d.get(key)) for _, d in methods.values())
        ]
        if not panels or all(n < 3 for n, _ in methods.values()):
            continue
        fig, axs = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.2), squeeze=False)
        for ax, (key, title) in zip(axs[0], panels, strict=True):
            pooled = [v for _, d in methods.values() for v in _finite(d.get(key))]
            low, high = min(pooled), max(pooled)
            width = (high - low) / 24 or 1e-3  # one shared set of bins: methods compare
            bins = [low + width * k for k in range(25)] if high > low else 24
            for method in sorted(methods, key=_naive_first):
                n, data = methods[method]
                values = _finite(data.get(key))
                if values:
                    ax.hist(
                        values, bins=bins, histtype="step", lw=1.5, color=colours.get(method),
                        label=f"{_method_label(method)} (n = {n})",
                    )  # fmt: skip
            if key == "distance_ratios":
                ax.axvline(1.0, color="k", lw=0.6)
            if key == "triplet_angles":
                ax.axvline(60.0, color="k", lw=0.6)
            ax.set_title(title, fontsize=9)
            ax.set_ylabel("count")
            ax.grid(alpha=0.3)
        axs[0][0].legend(fontsize=7)
        fig.tight_layout()
        figures.append(
            (
                with_cell(f"aligned models' geometry, merge block {block}", json.loads(grid))
                + ": pair distances, distance ratios and triangle angles at the largest n"
                " (STE-MM Figs. 6, 9, 7/10; a regular simplex: ratios 1, angles 60°)",
                png(fig),
            )
        )
    return figures


def triplet_landscape_figures(out: Path, jobs: Sequence[Mapping]) -> list[tuple[str, str]]:
    """Ito et al. Fig. 5: per triplets block and grid cell, the test accuracy on the plane
    through θ_A, π_B(θ_B) and π_C(θ_C) of the block's first triple, one panel per method
    (one colour scale for all), from the triplets' stored landscapes."""
    store = Store(out / "store")
    found: dict[tuple, dict[str, dict]] = defaultdict(dict)
    first: dict[tuple, list] = {}
    for job in jobs:
        if job["kind"] != "triplet" or job["status"] != "done":
            continue
        labels = job_labels(job)
        grid = json.dumps({k: v for k, v in labels.items() if "." in k}, sort_keys=True)
        where = (labels.get("block"), grid)
        triple = list(labels.get("triple", []))
        if where in first and triple != first[where]:
            continue
        artifact = store.get("triplet", job["key"])
        if artifact is None or not (artifact.folder / "landscape.json").is_file():
            continue
        first.setdefault(where, triple)
        found[where][labels["method"]] = json.loads(
            (artifact.folder / "landscape.json").read_text()
        )
    figures = []
    for (block, grid), methods in sorted(found.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        names = sorted(methods, key=_naive_first)
        values = [100 * a for m in names for row in methods[m]["accuracy"] for a in row]
        levels = [min(values) + (max(values) - min(values)) * k / 20 for k in range(21)]
        if levels[0] == levels[-1]:
            levels = 20
        fig, axs = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.9), squeeze=False)
        for ax, method in zip(axs[0], names, strict=True):
            land = methods[method]
            grid_pct = [[100 * a for a in row] for row in land["accuracy"]]
            cs = ax.contourf(land["xs"], land["ys"], grid_pct, levels=levels, cmap="viridis")
            right = max(x for x, _ in land["points"])
            for (x, y), label in zip(land["points"], ("θ_A", "π_B(θ_B)", "π_C(θ_C)"), strict=True):
                ax.plot(x, y, "o", color="white", mec="black")
                side = "right" if x == right else "left"  # labels stay inside the panel
                ax.annotate(
                    label, (x, y), textcoords="offset points", color="w", ha=side,
                    xytext=(-4 if side == "right" else 4, 5),
                )  # fmt: skip
            ax.set_title(f"{_method_label(method)}: test accuracy (%)", fontsize=9)
            ax.set_aspect("equal")
        fig.colorbar(cs, ax=list(axs[0]))
        triple = "-".join(map(str, first[(block, grid)]))
        figures.append(
            (
                with_cell(f"triplets, block {block}", json.loads(grid))
                + f": test accuracy on the plane through the three aligned models (seeds {triple};"
                " Ito et al. Fig. 5)",
                png(fig),
            )
        )
    return figures


def moment_figures(out: Path, jobs: Sequence[Mapping]) -> list[tuple[str, str]]:
    """The width study's Figs. 5 and 21: per layer (rows) and grid cell (columns), the
    histogram of model A's per-unit ``√E[z̃²]`` of the ReLU inputs over the largest (log
    counts), with the "small" line at 1/100 of the largest second moment (Fig. 6's cut), for
    the first pair of each cell's unpermuted layerwise analysis, from the stored analyses."""
    store = Store(out / "store")
    cells: dict[str, dict] = {}
    for job in jobs:
        if job["kind"] != "analysis" or job["status"] != "done":
            continue
        labels = job_labels(job)
        if labels.get("method") != "none":
            continue
        grid = json.dumps({k: v for k, v in labels.items() if "." in k}, sort_keys=True)
        if grid in cells:
            continue
        artifact = store.get("analysis", job["key"])
        if artifact is None or not (artifact.folder / "analysis.json").is_file():
            continue
        result = json.loads((artifact.folder / "analysis.json").read_text())
        layerwise = (result.get("layerwise") or {}).get("layerwise") or {}
        if layerwise.get("moments"):
            cells[grid] = layerwise
    if not cells:
        return []
    order = sorted(cells, key=lambda g: [_value_order(v) for v in json.loads(g).values()])
    layers = list(cells[order[0]]["moments"])
    fig, axes = plt.subplots(
        len(layers), len(order), figsize=(2.6 * len(order), 2.0 * len(layers)), squeeze=False
    )
    for col, grid in enumerate(order):
        lw = cells[grid]
        for row, layer in enumerate(layers):
            ax = axes[row][col]
            values = lw["moments"].get(layer, {}).get("a") or []
            top = max(values, default=0.0)
            if top > 0:  # √E[z̃²] over the largest: widths compare on one axis
                ax.hist([v / top for v in values], bins=40, range=(0, 1), color="C0")
                ax.axvline(math.sqrt(lw.get("small", 0.01)), color="k", lw=0.6, ls=":")
            ax.set_yscale("log")
            ax.tick_params(labelsize=6)
            if row == 0:
                ax.set_title(cell_label(json.loads(grid)) or "", fontsize=8)
            if col == 0:
                ax.set_ylabel(f"{layer}\nunits", fontsize=7)
            if row == len(layers) - 1:
                ax.set_xlabel("√E[z̃²] / largest", fontsize=7)
    fig.tight_layout()
    return [
        (
            "second moments of the ReLU inputs, model A of each cell's first pair: per unit "
            "√E[z̃²] over the layer's largest (dotted: the 'small' cut, a second moment "
            "1/100 of the largest; width study Figs. 5, 21)",
            png(fig),
        )
    ]


def cosine_figures(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The width study's Figs. 13–14 side by side: per layer, the cosine of hidden
    activations between θ_A and θ_A moved the pair's distance in a random direction
    (``flatness.cosine``) and between θ_A and θ_B (``layerwise.activation_cosine``), one
    line per grid cell, mean ± std over pairs (the unpermuted analyses)."""
    chosen = [r for r in rows if r["kind"] == "analysis" and r["group"].get("method") == "none"]
    panels = (
        ("flatness.cosine.", "θ_A vs θ_A + d·u/‖u‖ (random direction; Fig. 13)"),
        ("layerwise.activation_cosine.", "θ_A vs θ_B (Fig. 14)"),
    )
    if not all(any(r["metric"].startswith(p) for r in chosen) for p, _ in panels):
        return []
    depth = {
        r["metric"].split(".", 2)[2]: r["mean"]
        for r in chosen
        if r["metric"].startswith("layerwise.depth.")
    }
    layers = sorted(
        {r["metric"].split(".", 2)[2] for r in chosen if r["metric"].startswith(panels[0][0])},
        key=lambda name: (depth.get(name, 0), name),
    )
    cells = sorted({r["group"]["cell"] for r in chosen})
    labels = {r["group"]["cell"]: cell_label(r["grid"]) for r in chosen}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, (prefix, title) in zip(axes, panels, strict=True):
        for i, cell in enumerate(cells):
            found = {r["metric"]: r for r in chosen if r["group"]["cell"] == cell}
            points = [(k, found[prefix + n]) for k, n in enumerate(layers) if prefix + n in found]
            _mean_std(ax, points, ms=3, capsize=2, color=f"C{i % 10}", label=labels[cell])
        ax.set_xticks(range(len(layers)), layers, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine of activations")
    if len(cells) > 1:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    return [
        (
            "cosine of hidden activations: a random move of the pair's distance against the "
            "other model (width study Figs. 13–14; mean ± std over pairs)",
            png(fig),
        )
    ]


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values or () if v is not None and math.isfinite(v)]


def analysis_figures(
    rows: list[dict[str, Any]], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    """Ito et al. Fig. 2 (R(θ_A, π(θ_B)) per γ and method), Fig. 3 (R to the merged model)
    and Fig. 4 (R of the three pairs of a triplet), per grid cell, mean ± std."""
    figures = _grid_figures(
        rows,
        "analysis",
        (("R.0", "R(θ_A, π(θ_B)) at γ = 0"), ("R.0.3", "R(θ_A, π(θ_B)) at γ = 0.3")),
        min_cells=2,
        colours=colours,
    )
    analysis = [r for r in rows if r["kind"] == "analysis"]
    for cell in sorted({r["group"]["cell"] for r in analysis}):
        part = [r for r in analysis if r["group"]["cell"] == cell]
        methods = sorted({r["group"]["method"] for r in part})
        find = {(r["group"]["method"], r["metric"]): r for r in part}

        def point(method: str, metric: str, find=find) -> tuple[float, float]:
            r = find.get((method, metric))
            return (r["mean"], r["std"] or 0.0) if r else (math.nan, 0.0)

        gammas = sorted({r["metric"][2:] for r in part if r["metric"].startswith("R.")}, key=float)
        if gammas:
            fig, ax = plt.subplots(figsize=(5.4, 3.3))
            grouped_bars(
                ax,
                [f"γ = {g}" for g in gammas],
                {m: [point(m, f"R.{g}") for g in gammas] for m in methods},
                colors=colours,
            )
            ax.set_ylabel("R(θ_A, π(θ_B))")
            caption = with_cell("singular-vector alignment R (Ito et al. Fig. 2)", part[0]["grid"])
            figures.append((caption, png(fig)))
            fig, ax = plt.subplots(figsize=(6.4, 3.3))
            groups = [f"{m}, γ = {g}" for m in methods for g in gammas]
            grouped_bars(
                ax,
                groups,
                {
                    end: [point(m, f"R_merged.{end}.{g}") for m in methods for g in gammas]
                    for end in ("a", "b")
                },
            )
            ax.set_ylabel("R(θ_A or π(θ_B), merged)")
            figures.append(
                (
                    with_cell(
                        "singular-vector alignment to the merged model (Ito et al. Fig. 3),"
                        " a = θ_A, b = π(θ_B)",
                        part[0]["grid"],
                    ),
                    png(fig),
                )
            )
    triplets = [r for r in rows if r["kind"] == "triplet" and r["metric"].startswith("R.")]
    for cell in sorted({r["group"]["cell"] for r in triplets}):
        part = [r for r in triplets if r["group"]["cell"] == cell]
        methods = sorted({r["group"]["method"] for r in part})
        pairs = ["a-b", "a-c", "b-c"]
        find = {(r["group"]["method"], r["metric"]): r for r in part}
        fig, ax = plt.subplots(figsize=(5.4, 3.3))
        grouped_bars(
            ax,
            methods,
            {
                p: [
                    (find[(m, f"R.{p}")]["mean"], find[(m, f"R.{p}")]["std"] or 0.0)
                    if (m, f"R.{p}") in find
                    else (math.nan, 0.0)
                    for m in methods
                ]
                for p in pairs
            },
        )
        ax.set_ylabel("R between aligned models")
        figures.append(
            (
                with_cell(
                    "three models, B and C matched to A (Ito et al. Fig. 4)", part[0]["grid"]
                ),
                png(fig),
            )
        )
    return figures


LAYERWISE_FIGURE = (
    ("lewc", "LEWC cosine (Fig. 3)"),
    ("weak_additivity", "ReLU weak additivity (Fig. 4)"),
    ("non_overlap", "non-overlap of large-moment units (Fig. 6)"),
    ("reciprocal_ab", "E‖W_A z_B‖ / E‖W_A z_A‖ (Fig. 7)"),
    ("merged_cosine", "cos(W_A z_C, W_A z_A) (Fig. 8)"),
    ("commutativity", "commutativity distance (Fig. 11)"),
    ("activation_cosine", "cos(f_A, f_B) (Fig. 14)"),
    ("norm_ratio", "E‖f_C‖ / E‖f_A + f_B‖ (Fig. 20)"),
)


def layerwise_figures(
    rows: list[dict[str, Any]], colours: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The width study's per-layer diagnostics at λ = ½: per compare block and method, one
    panel per metric against the layer, one line per grid cell, mean ± std over pairs
    (Thm. 5.4's Gaussian value dashed beside weak additivity; LEWC's predicted norm ratio
    dotted); the flatness proxy per cell (Fig. 12); and, across cells, the unpermuted
    merge's accuracy and calibrated barrier with random permutations (Fig. 1, 17–19)."""
    chosen = [r for r in rows if r["kind"] == "analysis"]
    depth = {
        r["metric"].split(".", 2)[2]: r["mean"]
        for r in chosen
        if r["metric"].startswith("layerwise.depth.")
    }
    if not depth:
        return []
    layers = sorted(depth, key=lambda name: (depth[name], name))
    figures = []
    find = {
        (r["group"].get("block"), r["group"]["method"], r["group"]["cell"], r["metric"]): r
        for r in chosen
    }
    keys = sorted({(r["group"].get("block"), r["group"]["method"]) for r in chosen}, key=str)
    cells = sorted({r["group"]["cell"] for r in chosen})
    labels = {r["group"]["cell"]: cell_label(r["grid"]) for r in chosen}
    for block, method in keys:
        if not any(k[:2] == (block, method) and k[3].startswith("layerwise.") for k in find):
            continue
        fig, axes = plt.subplots(2, 4, figsize=(15, 6.4), squeeze=False)
        for ax, (metric, title) in zip(axes.flat, LAYERWISE_FIGURE, strict=True):
            for i, cell in enumerate(cells):
                pts = [
                    (k, find[(block, method, cell, f"layerwise.{metric}.{name}")])
                    for k, name in enumerate(layers)
                    if (block, method, cell, f"layerwise.{metric}.{name}") in find
                ]
                if not pts:
                    continue
                colour = f"C{i % 10}"
                _mean_std(ax, pts, ms=3, capsize=2, color=colour, label=labels[cell])
                extra = {
                    "weak_additivity": "gaussian.{}",
                    "norm_ratio": "layerwise.lewc_norm_ratio.{}",
                }
                if metric in extra:
                    ref = [
                        (k, find[(block, method, cell, extra[metric].format(name))]["mean"])
                        for k, name in enumerate(layers)
                        if (block, method, cell, extra[metric].format(name)) in find
                    ]
                    ax.plot([k for k, _ in ref], [v for _, v in ref], ":", color=colour)
            if metric == "norm_ratio":
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
            step = max(1, len(layers) // 8)
            ax.set_xticks(range(0, len(layers), step), layers[::step], fontsize=6, rotation=45)
            ax.set_title(title, fontsize=8)
            ax.grid(alpha=0.3)
        if len(cells) > 1:  # one line per grid cell: name them
            axes.flat[0].legend(fontsize=6)
        fig.tight_layout()
        name = "no permutation" if method == "none" else method
        figures.append(
            (
                f"layerwise diagnostics at λ = ½, {name}, compare block {block} (mean ± std over "
                "pairs; dotted: Thm. 5.4's Gaussian ReLU additivity / LEWC's norm prediction)",
                png(fig),
            )
        )
    flat = [r for r in chosen if r["metric"].startswith("flatness.accuracy.")]
    if flat:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.3))
        for i, cell in enumerate(cells):
            for ax, what, scale in ((axes[0], "accuracy", 100), (axes[1], "loss", 1)):
                pts = sorted(
                    (float(r["metric"].split(".", 2)[2]), r)
                    for r in chosen
                    if r["group"]["cell"] == cell and r["metric"].startswith(f"flatness.{what}.")
                )
                if pts:
                    _mean_std(
                        ax, pts, scale, ms=3, capsize=2, color=f"C{i % 10}", label=labels[cell]
                    )
                ax.set_xlabel("λ  (θ_A + λ·d·u/‖u‖)")
                ax.set_ylabel(f"test {what}" + (" (%)" if scale == 100 else ""))
                ax.grid(alpha=0.3)
        if len(cells) > 1:
            axes[0].legend(fontsize=7)
        figures.append(("flatness proxy (width study Fig. 12), mean ± std over pairs", png(fig)))
    figures += _merge_score_figures(chosen, cells, labels, colours)
    return figures


MERGE_SCORES = (
    ("accuracy_barrier", "accuracy barrier at λ = ½ (pp)", 100),
    ("calibrated_loss_barrier", "calibrated loss barrier at λ = ½", 1),
    ("temperature", "temperature 1/β (the paper's inverse temperature)", 1),
)


def _merge_score_figures(chosen, cells, labels, colours) -> list[tuple[str, str]]:
    """Across grid cells: the λ = ½ merge without permutation, with random permutations and
    with the found one (Table 1, Figs. 17–19), calibrated on 20 % of the test set and
    scored on the rest; mean ± std over pairs."""
    series = {
        "no permutation": ("none", "none."),
        "random permutations": ("none", "random."),
    }
    for method in sorted({r["group"]["method"] for r in chosen} - {"none"}):
        series[f"{method} permutation"] = (method, "given.")
    if len(cells) < 2 or not any(r["metric"].startswith("none.") for r in chosen):
        return []
    find = {(r["group"]["method"], r["group"]["cell"], r["metric"]): r for r in chosen}
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for ax, (score, title, scale) in zip(axes, MERGE_SCORES, strict=True):
        for label, (method, prefix) in series.items():
            pts = [
                (c, find[(method, c, prefix + score)])
                for c in cells
                if (method, c, prefix + score) in find
            ]
            if pts:
                _mean_std(
                    ax,
                    pts,
                    scale,
                    label=label,
                    color=colours.get(method) if prefix != "random." else "#c49c94",
                )
        ax.set_xticks(cells, [labels[c] for c in cells], rotation=20, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        if score == "temperature":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return [
        (
            "merges at λ = ½ without, with random and with found permutations (width study "
            "Table 1, Figs. 17–19; mean ± std over pairs)",
            png(fig),
        )
    ]


def rank_figures(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Effective rank / width of every layer against the grid cells (the width study §5.4:
    lower with width and with weight decay), mean ± std over the models of a cell."""
    chosen = [
        r
        for r in rows
        if r["kind"] == "spectra" and r["metric"].startswith("relative_effective_rank.")
    ]
    cells = sorted({r["group"]["cell"] for r in chosen})
    if len(cells) < 2:
        return []
    labels = {r["group"]["cell"]: cell_label(r["grid"]) for r in chosen}
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for layer in sorted({r["metric"].split(".", 1)[1] for r in chosen}):
        points = {r["group"]["cell"]: r for r in chosen if r["metric"].split(".", 1)[1] == layer}
        xs = [c for c in cells if c in points]
        ax.plot(xs, [points[c]["mean"] for c in xs], marker="o", label=layer)
    ax.set_xticks(cells, [labels[c] for c in cells], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("effective rank / min(out, in)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    return [("relative effective rank of each layer's weights (Roy & Vetterli)", png(fig))]


def spectra_figures(out: Path, jobs: Sequence[Mapping]) -> list[tuple[str, str]]:
    """Ito et al. Fig. 1/6: every model's singular values per layer, overlaid; and App. D.3
    Fig. 7: spectra normalised by their largest value against the relative index, one line
    per grid cell (its first model)."""
    store = Store(out / "store")
    figures = []
    normalised: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for job in jobs:
        if job["kind"] != "spectra" or job["status"] != "done":
            continue
        artifact = store.get("spectra", job["key"])
        if artifact is None:
            continue
        data = json.loads(artifact.file("spectra.json").read_text())
        label = cell_label({k: v for k, v in job_labels(job).items() if "." in k})
        layers = data["layers"]
        cols = min(4, len(layers))
        rows = math.ceil(len(layers) / cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(3.0 * cols, 2.5 * rows), squeeze=False, layout="constrained"
        )
        for ax in axes.flat[len(layers) :]:
            ax.axis("off")
        for ax, (layer, models) in zip(axes.flat, layers.items(), strict=False):
            for seed, values in zip(data["seeds"], models, strict=True):
                ax.plot(range(1, len(values) + 1), values, lw=0.9, label=f"seed {seed}")
            ax.set_title(layer, fontsize=8)
            ax.tick_params(labelsize=7)
            normalised[layer][label] = [v / models[0][0] for v in models[0]]
        axes.flat[0].set_ylabel("singular value", fontsize=8)
        if len(data["seeds"]) <= 10:
            axes.flat[0].legend(fontsize=6)
        figures.append(
            (f"singular values of every model per layer (Ito et al. Fig. 1), {label}", png(fig))
        )
    if any(len(cells) > 1 for cells in normalised.values()):
        cols = min(4, len(normalised))
        rows = math.ceil(len(normalised) / cols)
        fig, axes = plt.subplots(
            rows, cols, figsize=(3.0 * cols, 2.5 * rows), squeeze=False, layout="constrained"
        )
        for ax in axes.flat[len(normalised) :]:
            ax.axis("off")
        for ax, (layer, cells) in zip(axes.flat, normalised.items(), strict=False):
            for label, values in cells.items():
                ax.plot([i / len(values) for i in range(len(values))], values, lw=0.9, label=label)
            ax.set_title(layer, fontsize=8)
            ax.tick_params(labelsize=7)
        axes.flat[0].set_ylabel("s_i / s_1", fontsize=8)
        axes.flat[0].legend(fontsize=6)
        figures.append(
            (
                "normalised singular values against the relative index, per grid cell "
                "(Ito et al. App. D.3 Fig. 7)",
                png(fig),
            )
        )
    return figures
