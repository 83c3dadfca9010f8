"""The shipped Llama study (`experiments/llama-python-stdlib.toml`) at a tiny size: every
method of its compare block runs on the zoo's grouped-query rotary decoder, each path ends
where B is (permutations, rotary pair rotations and scaled rotations, value maps all keep
B's function), and the maps beyond permutations take another path between the same ends."""

import json
import math
from pathlib import Path

import pytest

from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.data.test_text import write_tree

FILE = Path(__file__).parents[2] / "experiments" / "llama-python-stdlib.toml"
TINY = {
    "seeds": [0, 1],
    "train.epochs": 1,
    "train.batch_size": 16,
    "model.width_multiplier": 0.125,  # dim 16: 4 query heads of 4 on 2 key/value heads
    "compare.0.server_examples": 32,
    "compare.0.lambdas": 3,
    "compare.0.splits": {"test": 40},
    "compare.0.options": {
        "ste": {"epochs": 1, "batch_size": 16},
        "wm-orth": {"max_iter": 5},
        "ste-orth": {"epochs": 1, "batch_size": 16},
        "ste-full": {"epochs": 1, "batch_size": 16},
    },
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_tree(corpus)
    out = tmp_path_factory.mktemp("run")
    experiment = load_experiment(FILE, TINY)
    summary = run_experiment(experiment, out, data_dir=corpus, log=lambda _: None)
    assert summary.complete and not summary.failed
    ledger = Ledger(out / "ledger.sqlite")
    try:
        return out, experiment, ledger.metrics()
    finally:
        ledger.close()


def test_every_path_of_the_study_ends_at_b(tiny_run):
    out, experiment, metrics = tiny_run
    methods = experiment.compare[0].methods
    assert {"wm-orth", "ste-orth", "ste-full"} <= set(methods)
    ends = {}
    for path in (out / "store").rglob("curve.json"):
        curve = json.loads(path.read_text())
        loss = curve["splits"]["test"]["loss"]
        ends[path.parent.name] = (loss[0], loss[len(loss) // 2], loss[-1])
    by_method = {}
    for row in metrics:
        if row["kind"] == "curve" and row["metric"] == "test.loss.midpoint":
            by_method[row["name"].rsplit("/", 1)[1]] = row["value"]
    assert sorted(by_method) == sorted(methods)
    # curves are stored by content: two methods that find the same permutation share one
    assert len(ends) >= 4, ends
    first, _, last = next(iter(ends.values()))
    for start, _, end in ends.values():
        assert math.isclose(start, first, rel_tol=1e-5) and math.isclose(end, last, rel_tol=1e-5)
    for method in ("wm-orth", "ste-orth", "ste-full"):
        assert not math.isclose(by_method[method], by_method["none"], rel_tol=1e-6)
