"""The MNIST twins of the reproduction files run on a user-supplied MNIST (no MNIST here:
the test writes the four IDX files itself)."""

from pathlib import Path

import pytest

from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.data.files import write_tiny_idx
from tests.experiments.conftest import read_ledger

FILES = Path(__file__).resolve().parents[2] / "experiments"
SMALL = {"train.epochs": 1, "model.hidden": [8, 8, 8]}


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        (
            "ito-mnist-mlp.toml",
            {
                "compare.0.options.sinkhorn.steps": 3,
                "compare.0.options.sinkhorn-mid.epochs": 1,
                "compare.1.options.sinkhorn.steps": 3,
                "compare.1.options.sinkhorn-mid.epochs": 1,
                "triplets.0.options.sinkhorn.steps": 3,
                "triplets.0.options.sinkhorn-mid.epochs": 1,
                "compare.0.lambdas": 3,
                "compare.1.lambdas": 3,
            },
        ),
        (
            "stemm-fig3-4-mnist.toml",
            {
                "merge.0.n": [2],
                "merge.1.n": [2],
                "merge.0.options.ste-mm.epochs": 1,
                "merge.1.options.ste-mm.epochs": 1,
            },
        ),
    ],
)
def test_an_mnist_reproduction_runs_on_the_users_idx_files(tmp_path, name, overrides):
    data = tmp_path / "mnist"
    write_tiny_idx(data, n_train=40, n_test=20)
    experiment = load_experiment(FILES / name, {**SMALL, **overrides})
    assert experiment.dataset == "mnist"
    out = tmp_path / "run"
    summary = run_experiment(experiment, out, data_dir=data, download=False, log=lambda _: None)
    assert summary.complete and not summary.failed
    jobs, metrics = read_ledger(out)
    trained = [j for j in jobs.values() if j["kind"] == "train"]
    assert len(trained) == len(experiment.seeds)
    # the merges and curves measured something on the 20 written test images
    measured = ("merged_accuracy", "test.accuracy.midpoint")
    accuracies = [v for (_, metric), v in metrics.items() if metric in measured]
    assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies)
