"""``lmckit demo``: the papers' headline experiment end to end, on this machine, in minutes.

Train three 3×512 MLPs on Fashion-MNIST (digits when Fashion-MNIST is absent), align model
B to model A with every matcher, evaluate the linear paths naively and after matching, and
write a table and figures. Every finished piece (checkpoints, permutations, curves) is kept
in the output folder under a key of everything that determines it, so a rerun — or a run
after an interruption — reuses exactly what still applies and recomputes the rest (another
dataset, other epochs, another lmckit version).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmckit._io import atomic_write_bytes, atomic_write_json, prepare_output_dir, writes_folder
from lmckit.checkpoint import load_checkpoint
from lmckit.data import Dataset, fashion_mnist_available, load_dataset
from lmckit.evaluate import Curve, save_curves
from lmckit.experiments.interpolation import stored_curve
from lmckit.experiments.matching import stored_match
from lmckit.experiments.store import Store
from lmckit.experiments.training import model_config_for, train_seeds
from lmckit.params import params_distance
from lmckit.perm import Permutation
from lmckit.plots import plot_barriers, plot_interpolation
from lmckit.progress import ProgressCallback
from lmckit.train import TrainConfig

METHODS = {"wm": "wm-fast", "am": "am", "ste": "ste", "sinkhorn": "sinkhorn"}
LABELS = {"naive": "naive", "wm": "WM", "am": "AM", "ste": "STE", "sinkhorn": "Sinkhorn"}
TRAIN_SUBSET = 10_000


@dataclass
class DemoRow:
    """One line of the demo's table (test-set barriers, Git Re-Basin definition)."""

    method: str
    seconds: float
    l2_before: float
    l2_after: float
    loss_barrier: float
    accuracy_barrier: float
    merged_accuracy: float
    merged_loss: float


def choose_dataset(preferred: str | None, log: Callable[[str], None]) -> Dataset:
    """``preferred`` if given, else Fashion-MNIST when installed, else digits (saying so)."""
    if preferred:
        return load_dataset(preferred)
    if fashion_mnist_available():
        return load_dataset("fashion-mnist", download=False)
    log(
        "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist); "
        "using scikit-learn's bundled 8×8 digits instead."
    )
    return load_dataset("digits")


@writes_folder("out")
def run_demo(
    out: str | Path,
    *,
    dataset: str | None = None,
    epochs: int | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    lambdas: int = 25,
    ste_epochs: int = 1,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
) -> dict[str, Any]:
    """Run the demo into ``out``; returns the summary that is also written to
    ``out/results.json`` (rows of the table, pairwise barriers, paths of the figures).

    ``epochs`` defaults to 5 on Fashion-MNIST and 40 on the 1,437 digits images (the same
    order of optimisation steps is needed either way). ``progress(label)`` may return a
    callback for the :class:`~lmckit.progress.Progress` events of each long step."""
    out = prepare_output_dir(out, "--out")
    data = choose_dataset(dataset, log)
    if epochs is None:
        epochs = 40 if data.name == "digits" else 5
    log(f"data: {data.name} ({len(data.train_x)} train / {len(data.test_x)} test images)")
    model_cfg = model_config_for("mlp", data)
    config = TrainConfig.paper_defaults("mlp", data.name, epochs=epochs)
    outcomes = train_seeds(
        "mlp",
        model_cfg,
        data,
        config,
        seeds,
        out / "models",
        progress=(lambda seed: progress(f"train seed {seed}")) if progress else None,
        on_seed_done=lambda o: log(
            f"  seed {o.seed}: test accuracy {o.metrics['test_accuracy']:.4f}"
            f"{' (cached)' if o.skipped else ''}"
        ),
    )
    ckpts = [load_checkpoint(o.path) for o in outcomes]
    a, b = ckpts[0], ckpts[1]
    g = torch.Generator().manual_seed(0)
    subset = torch.randperm(len(data.train_x), generator=g)[: min(TRAIN_SUBSET, len(data.train_x))]
    loaders = {
        "train": data.subset(train_idx=subset).loader("train", batch_size=2000, shuffle=False),
        "test": data.loader("test", batch_size=2000),
    }
    store = Store(out / "store")
    evaluation = {
        "train": f"{len(subset)} examples chosen by a permutation seeded 0",
        "test": "all",
    }
    perms: dict[str, tuple[Permutation, float]] = {"naive": (Permutation.identity(a.spec), 0.0)}
    for label, method in METHODS.items():
        perm, artifact, reused = stored_match(
            store,
            a,
            b,
            method,
            data,
            epochs=ste_epochs,
            progress=progress(f"match {label}") if progress else None,
        )
        r = artifact.record
        perms[label] = (perm, r["seconds"])
        log(
            f"match {LABELS[label]:8s} {r['seconds']:7.2f} s   L2 {r['distance_before']:.2f}"
            f" -> {r['distance_after']:.2f}{'   (stored result reused)' if reused else ''}"
        )
    curves: dict[str, Curve] = {}
    rows = []
    for label, (perm, seconds) in perms.items():
        curve, _, _ = stored_curve(
            store,
            a,
            b,
            perm,
            data=data,
            loaders=loaders,
            evaluation=evaluation,
            lambdas=lambdas,
            calibrated=True,
            ensemble=label == "naive",
        )
        curves[LABELS[label]] = curve
        test = curve.barriers["test"]
        rows.append(
            DemoRow(
                method=LABELS[label],
                seconds=seconds,
                l2_before=params_distance(a.params, b.params),
                l2_after=params_distance(a.params, perm.apply(b.params)),
                loss_barrier=test["loss"]["rebasin"],
                accuracy_barrier=test["accuracy"]["rebasin"],
                merged_accuracy=curve.midpoint("test", "accuracy"),
                merged_loss=curve.midpoint("test", "loss"),
            )
        )
        log(f"interpolate {LABELS[label]:8s} test loss barrier {rows[-1].loss_barrier:.4f}")
    save_curves(curves, out / "interpolation")
    bars = {r.method: {"loss": r.loss_barrier, "accuracy": r.accuracy_barrier} for r in rows}
    atomic_write_json(out / "barriers.json", bars)
    figures = {
        "interpolation": str(
            plot_interpolation(
                curves,
                out / "interpolation.png",
                title=f"MLP 3×512 on {data.name}: seed {seeds[0]} → seed {seeds[1]}",
            )
        ),
        "barriers": str(
            plot_barriers(
                bars,
                out / "barriers.png",
                title="test barriers (Git Re-Basin definition)",
            )
        ),
    }
    pairwise = _pairwise_wm(ckpts, data, loaders["test"], store)
    summary = {
        "dataset": data.name,
        "epochs": epochs,
        "seeds": list(seeds),
        "endpoints": {"A": a.meta["metrics"], "B": b.meta["metrics"]},
        "rows": [vars(r) for r in rows],
        "pairwise_wm": pairwise,
        "figures": figures,
    }
    atomic_write_json(out / "results.json", summary)
    atomic_write_bytes(out / "results.md", (format_table(rows) + "\n").encode())
    return summary


def _pairwise_wm(ckpts, data, test_loader, store: Store) -> list[dict[str, Any]]:
    """Naive vs weight-matched test-loss barrier for every pair of the trained seeds."""
    rows = []
    for i in range(len(ckpts)):
        for j in range(i + 1, len(ckpts)):
            a, b = ckpts[i], ckpts[j]
            wm, _, _ = stored_match(store, a, b, "wm-fast", data)
            barrier = {}
            for label, perm in (("naive", Permutation.identity(a.spec)), ("wm", wm)):
                curve, _, _ = stored_curve(
                    store,
                    a,
                    b,
                    perm,
                    data=data,
                    loaders={"test": test_loader},
                    evaluation={"test": "all"},
                    lambdas=11,
                )
                barrier[label] = curve.barriers["test"]["loss"]["rebasin"]
            rows.append(
                {
                    "pair": [a.meta["seed"], b.meta["seed"]],
                    "naive_loss_barrier": barrier["naive"],
                    "wm_loss_barrier": barrier["wm"],
                }
            )
    return rows


def format_table(rows: list[DemoRow]) -> str:
    """The demo's table as Markdown."""
    lines = [
        "| method | time (s) | L2 before | L2 after | test loss barrier | test acc barrier (pp) "
        "| merged (λ=½) test acc | merged test loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.seconds:.2f} | {r.l2_before:.2f} | {r.l2_after:.2f} | "
            f"{r.loss_barrier:.4f} | {100 * r.accuracy_barrier:.2f} | "
            f"{100 * r.merged_accuracy:.2f} % | {r.merged_loss:.4f} |"
        )
    return "\n".join(lines)
