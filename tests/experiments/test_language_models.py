"""The shipped language-model experiment (`experiments/gpt-python-stdlib.toml`) run end to
end at a tiny size on a source tree the test writes: training, WM, AM and STE, curves scored
per token, perplexities in the records equal to exp of the stored per-token losses."""

import math
from pathlib import Path

import pytest

from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.data.test_text import write_tree

FILE = Path(__file__).parents[2] / "experiments" / "gpt-python-stdlib.toml"
TINY = {
    "seeds": [0, 1],
    "train.epochs": 1,
    "train.batch_size": 16,
    "model.width_multiplier": 0.125,
    "compare.0.server_examples": 64,
    "compare.0.lambdas": 3,
    "compare.0.splits": {"test": 40},
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The file at a tiny size: two seeds, 1 epoch, width 16, 3 λ, 40 test windows."""
    corpus = tmp_path_factory.mktemp("corpus")
    write_tree(corpus)
    out = tmp_path_factory.mktemp("run")
    experiment = load_experiment(FILE, TINY)
    summary = run_experiment(experiment, out, data_dir=corpus, log=lambda _: None)
    assert summary.complete and not summary.failed
    ledger = Ledger(out / "ledger.sqlite")
    try:
        return ledger.metrics()
    finally:
        ledger.close()


def test_every_method_gives_a_curve_of_per_token_losses_and_perplexities(tiny_run):
    metrics = tiny_run
    curves = {}
    for row in metrics:
        if row["kind"] == "curve":
            curves.setdefault(row["name"], {})[row["metric"]] = row["value"]
    methods = {name.rsplit("/", 1)[1] for name in curves}
    assert methods == {"none", "wm-fast", "am", "ste"} and len(curves) == 4
    for record in curves.values():
        midpoint = record["test.loss.midpoint"]
        assert math.isclose(record["test.perplexity.midpoint"], math.exp(midpoint))
        for key in ("calibrated_perplexity", "ensemble_perplexity"):
            assert record[f"test.{key}.midpoint"] >= 1 and record[f"test.{key}.endpoints"] >= 1
        assert 0 < record["test.loss.midpoint"] < math.log(256) + 1  # nats per byte
        assert record["test.calibrated_loss.barrier.rebasin"] is not None
