"""``lmckit demo``: the papers' headline experiment end to end, on this machine, in minutes.

The demo is a built-in experiment file (``demo.toml``, also in the repository's
``experiments/``) plus its table: train three 3×512 MLPs on Fashion-MNIST (digits when
Fashion-MNIST is absent), align seed 1 to seed 0 with every matcher, evaluate the linear
paths naively and after matching, and compare naive and weight-matching barriers for every
pair. It runs through the experiment engine, so every finished piece is kept in the output
folder under a key of everything that determines it: a rerun — or a run after an
interruption — reuses exactly what still applies and recomputes the rest (another dataset,
other epochs, another lmckit version).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmckit.budget import Budget
from lmckit.data import Dataset, fashion_mnist_available, load_dataset
from lmckit.errors import LmcError
from lmckit.evaluate import Curve, save_curves
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import Experiment, load_experiment
from lmckit.files import atomic_write_bytes, atomic_write_json, writes_folder
from lmckit.plots import plot_barriers, plot_interpolation
from lmckit.progress import ProgressCallback
from lmckit.store import Store

DEMO = Path(__file__).with_name("demo.toml")
LABELS = {"none": "naive", "wm-fast": "WM", "am": "AM", "ste": "STE", "sinkhorn": "Sinkhorn"}


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


def demo_experiment(
    dataset: str | None = None,
    epochs: int | None = None,
    ste_epochs: int = 1,
    log: Callable[[str], None] = print,
) -> Experiment:
    """The built-in demo experiment (``demo.toml``), on ``dataset`` (default: Fashion-MNIST
    when installed, else the bundled digits, saying so) for ``epochs`` (default 5, or 40 on
    the 1,437 digits images: the same order of optimisation steps)."""
    name = choose_dataset(dataset, log).name
    overrides: dict[str, Any] = {"data.dataset": name}
    if epochs is not None or name == "digits":
        overrides["train.epochs"] = epochs if epochs is not None else 40
    overrides["compare.0.options.ste.epochs"] = ste_epochs
    return load_experiment(DEMO, overrides)


@writes_folder("out")
def run_demo(
    out: str | Path,
    *,
    dataset: str | None = None,
    epochs: int | None = None,
    ste_epochs: int = 1,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """Run the demo experiment into ``out`` and assemble its table; returns the summary that
    is also written to ``out/results.json`` (rows of the table, pairwise barriers, paths of
    the figures). Everything computed is kept in ``out/store`` under keys of everything that
    determines it, so a rerun reuses exactly what still applies."""
    out = Path(out)
    experiment = demo_experiment(dataset, epochs, ste_epochs, log)
    log(f"data: {experiment.dataset}; {experiment.train['epochs']} epochs per model")
    run = run_experiment(
        experiment,
        out,
        log=log,
        overall=progress("jobs") if progress else None,
        job_progress=progress,
        budget=budget,
    )
    if not run.complete:
        raise LmcError(f"the demo did not finish: {run.failed} failed; see lmckit status {out}")
    log(f"{len(run.done)} jobs run, {len(run.reused)} reused from the store ({run.seconds:.1f} s)")
    return _assemble(experiment, out)


def _assemble(experiment: Experiment, out: Path) -> dict[str, Any]:
    """The demo's table, figures and pairwise barriers from the run's ledger and store."""
    with Ledger(out / "ledger.sqlite") as ledger:
        jobs = {j["name"]: j for j in ledger.jobs()}
        metrics: dict[str, dict[str, float]] = {}
        for m in ledger.metrics():
            metrics.setdefault(m["name"], {})[m["metric"]] = m["value"]
    store = Store(out / "store")
    s0, s1 = experiment.seeds[:2]
    distance = metrics[f"match/c0/{s0}-{s1}/wm-fast"]["distance_before"]
    curves: dict[str, Curve] = {}
    rows = []
    for method, label in LABELS.items():
        curve_job = jobs[f"curve/b0/c0/{s0}-{s1}/{method}"]
        curve = Curve.from_dict(
            json.loads(store.folder("curve", curve_job["key"]).joinpath("curve.json").read_text())
        )
        curves[label] = curve
        match = f"match/c0/{s0}-{s1}/{method}"
        test = curve.barriers["test"]
        rows.append(
            DemoRow(
                method=label,
                seconds=jobs[match]["seconds"] if match in jobs else 0.0,
                l2_before=distance,
                l2_after=metrics[match]["distance_after"] if match in jobs else distance,
                loss_barrier=test["loss"]["rebasin"],
                accuracy_barrier=test["accuracy"]["rebasin"],
                merged_accuracy=curve.midpoint("test", "accuracy"),
                merged_loss=curve.midpoint("test", "loss"),
            )
        )
    save_curves(curves, out / "interpolation")
    bars = {r.method: {"loss": r.loss_barrier, "accuracy": r.accuracy_barrier} for r in rows}
    atomic_write_json(out / "barriers.json", bars)
    figures = {
        "interpolation": str(
            plot_interpolation(
                curves,
                out / "interpolation.png",
                title=f"MLP 3×512 on {experiment.dataset}: seed {s0} → seed {s1}",
            )
        ),
        "barriers": str(
            plot_barriers(
                bars, out / "barriers.png", title="test barriers (Git Re-Basin definition)"
            )
        ),
    }
    pairwise = []
    for i, j in itertools.combinations(experiment.seeds, 2):
        barrier = {
            m: metrics[f"curve/b1/c0/{i}-{j}/{m}"]["test.loss.barrier.rebasin"]
            for m in ("none", "wm-fast")
        }
        pairwise.append(
            {
                "pair": [i, j],
                "naive_loss_barrier": barrier["none"],
                "wm_loss_barrier": barrier["wm-fast"],
            }
        )
    summary = {
        "dataset": experiment.dataset,
        "epochs": experiment.train["epochs"],
        "seeds": list(experiment.seeds),
        "endpoints": {
            "A": metrics[f"train/c0/seed{s0}"],
            "B": metrics[f"train/c0/seed{s1}"],
        },
        "rows": [vars(r) for r in rows],
        "pairwise_wm": pairwise,
        "figures": figures,
    }
    atomic_write_json(out / "results.json", summary)
    atomic_write_bytes(out / "results.md", (format_table(rows) + "\n").encode())
    return summary


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
