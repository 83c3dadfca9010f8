"""Maps beyond permutations through the experiment files: a compare block with wm-orth,
wm-full and am-full runs the language-model file at a tiny size, and each transform's
path ends where B is — the aligned, norm-folded B computes B's function, so the curve's
λ = 1 loss equals the naive path's."""

import json
import math
from pathlib import Path

import pytest

from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment
from tests.data.test_text import write_tree

FILE = Path(__file__).parents[2] / "experiments" / "gpt-python-stdlib.toml"
METHODS = ["none", "wm-fast", "wm-orth", "wm-full", "am-full"]
TINY = {
    "seeds": [0, 1],
    "train.epochs": 1,
    "train.batch_size": 16,
    "model.width_multiplier": 0.125,
    "compare.0.server_examples": 64,
    "compare.0.lambdas": 3,
    "compare.0.splits": {"test": 40},
    "compare.0.methods": METHODS,
    # a few sweeps and rounds: the ends are B's whatever the maps (the descents' own tests
    # check convergence; run to it, they took most of this file's 30-40 s)
    "compare.0.options": {
        "wm-orth": {"max_iter": 5},
        "wm-full": {"n_batches": 2, "max_iter": 5},
        "am-full": {"n_batches": 2},
    },
    "merge": [
        {
            "methods": ["merge-many", "merge-many-orth"],
            "n": [2],
            "server_examples": 64,
            "options": {"merge-many-orth": {"max_rounds": 2}},
        }
    ],
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
        return out, ledger.metrics()
    finally:
        ledger.close()


def test_transform_paths_end_at_b(tiny_run):
    out, metrics = tiny_run
    curves = {
        row["job"]: row["name"].rsplit("/", 1)[1] for row in metrics if row["kind"] == "curve"
    }
    assert sorted(set(curves.values())) == sorted(METHODS)
    ends = {}
    for key, method in curves.items():
        files = list((out / "store").glob(f"curve/*/{key}*/*.json")) or list(
            (out / "store").rglob(f"*{key}*/curve.json")
        )
        assert files, key
        curve = json.loads(files[0].read_text())
        ends[method] = curve["splits"]["test"]["loss"][-1]
        starts = curve["splits"]["test"]["loss"][0]
        ends[method + "@0"] = starts
    for method in METHODS[1:]:
        assert math.isclose(ends[method], ends["none"], rel_tol=1e-4), (method, ends)
        assert math.isclose(ends[method + "@0"], ends["none@0"], rel_tol=1e-4), (method, ends)
    records = {}
    for row in metrics:
        if row["kind"] == "curve":
            records.setdefault(row["name"].rsplit("/", 1)[1], {})[row["metric"]] = row["value"]
    for method in ("wm-orth", "wm-full", "am-full"):
        assert records[method]["test.loss.barrier.rebasin"] is not None
        # the same ends, another path between them
        midpoint = records[method]["test.loss.midpoint"]
        assert not math.isclose(midpoint, records["none"]["test.loss.midpoint"], rel_tol=1e-6)


def test_merge_many_over_orthogonal_maps_runs_from_the_file(tiny_run):
    _, metrics = tiny_run
    merged = {}
    for row in metrics:
        if row["kind"] == "merge":
            merged.setdefault(row["name"], {})[row["metric"]] = row["value"]
    methods = {name.split("/")[-2] for name in merged}
    assert methods == {"merge-many", "merge-many-orth"}, list(merged)
    for values in merged.values():
        assert 0 < values["merged_loss"] < math.log(256) + 1


def test_analyses_of_a_transform_method_are_refused():
    with pytest.raises(ExperimentError, match="beyond permutations"):
        load_experiment(FILE, {**TINY, "compare.0.analyses": ["spectral"]})
