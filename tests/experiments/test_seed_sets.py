"""Merges repeated on disjoint sets of seeds (STE-MM Figs. 3-4's three seed sets)."""

import pytest

from lmckit.checkpoint import load_checkpoint
from lmckit.data import load_dataset
from lmckit.experiments.dag import build_jobs
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.report import metric_groups
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment, model_configs
from lmckit.metrics import evaluate
from lmckit.params import average_params
from lmckit.store import Store
from tests.experiments.conftest import read_ledger

TOML = """
name = "sets"
seeds = [0, 1, 2, 3, 4, 5]
threads = 1
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [16]
[train]
epochs = 1
batch_size = 128
[[merge]]
methods = ["average"]
n = [2, 3]
seed_sets = {sets}
"""


def _load(tmp_path, sets):
    path = tmp_path / "e.toml"
    path.write_text(TOML.format(sets=sets))
    return load_experiment(path)


def test_each_set_merges_its_own_seeds_and_the_report_averages_over_sets(tmp_path, digits):
    exp = _load(tmp_path, 2)
    jobs = {j.name: j for j in build_jobs(exp, model_configs(exp, lambda _name: digits))}
    assert jobs["merge/b0/c0/average/n2"].deps == ("train/c0/seed0", "train/c0/seed1")
    assert jobs["merge/b0/c0/average/n2/s1"].deps == ("train/c0/seed3", "train/c0/seed4")
    assert jobs["merge/b0/c0/average/n3/s1"].deps == tuple(f"train/c0/seed{s}" for s in (3, 4, 5))
    assert jobs["merge/b0/c0/average/n3/s1"].labels["set"] == 1
    out = tmp_path / "run"
    assert run_experiment(exp, out, log=lambda _: None).complete
    ledger_jobs, metrics = read_ledger(out)
    # the naive version: the plain average of seeds 3 and 4, evaluated directly
    store = Store(out / "store")

    def key(seed):
        return ledger_jobs[f"train/c0/seed{seed}"]["key"]

    ckpts = [
        load_checkpoint(
            store.folder("checkpoint", ledger_jobs[f"train/c0/seed{s}"]["key"]) / "model"
        )
        for s in (3, 4)
    ]
    data = load_dataset("digits")
    merged = average_params([c.params for c in ckpts])
    expected = evaluate(ckpts[0].model, merged, data.loader("test", batch_size=500)).accuracy
    got = metrics["merge/b0/c0/average/n2/s1", "merged_accuracy"]
    assert got == pytest.approx(expected, abs=1e-6)
    first = metrics["merge/b0/c0/average/n2", "merged_accuracy"]
    ledger = Ledger(out / "ledger.sqlite")
    try:
        rows = metric_groups(ledger.jobs(), ledger.metrics())
    finally:
        ledger.close()
    row = next(
        r for r in rows
        if r["kind"] == "merge" and r["group"]["n"] == 2 and r["metric"] == "merged_accuracy"
    )  # fmt: skip
    assert sorted(row["values"]) == sorted([first, got]) and row["std"] is not None


def test_seed_sets_need_enough_seeds(tmp_path):
    with pytest.raises(
        ExperimentError, match=r"3 models in each of 3 seed sets; 6 seeds \(needs 9\)"
    ):
        _load(tmp_path, 3)
    with pytest.raises(ExperimentError, match="seed_sets must be at least 1"):
        _load(tmp_path, 0)
    with pytest.raises(ExperimentError, match="seed_sets must be an integer"):
        _load(tmp_path, '"three"')


def test_split_experiments_train_every_set_and_each_set_covers_every_part(tmp_path, digits):
    """Over parts of the data, seed k trains on part k mod parts: with two seed sets of a
    two-part split, four models train (not the first set's two only) and each set merges
    one model of each part."""
    text = TOML.format(sets=2).replace("n = [2, 3]", 'n = ["parts"]')
    text = text.replace("seeds = [0, 1, 2, 3, 4, 5]", "seeds = [0, 1, 2, 3]")
    text = text.replace(
        "batch_size = 128", 'batch_size = 128\nsplit = { kind = "random", clients = 2 }'
    )
    path = tmp_path / "e.toml"
    path.write_text(text)
    exp = load_experiment(path)
    jobs = {j.name: j for j in build_jobs(exp, model_configs(exp, lambda _name: digits))}
    trained = sorted(n for n, j in jobs.items() if j.kind == "train")
    assert trained == [f"train/c0/seed{s}" for s in range(4)]
    sets = [jobs["merge/b0/c0/average/n2"], jobs["merge/b0/c0/average/n2/s1"]]
    assert [s.deps for s in sets] == [
        ("train/c0/seed0", "train/c0/seed1"),
        ("train/c0/seed2", "train/c0/seed3"),
    ]
    for merge in sets:
        assert sorted(jobs[d].labels["part"] for d in merge.deps) == [0, 1]


def test_the_spread_over_sets_is_the_sample_standard_deviation():
    """Two values 1 and 3: sample standard deviation √2 (n − 1), not the population's 1;
    three values 1, 2, 6: √7, not √(14/3)."""
    for values, std in (([1.0, 3.0], 2**0.5), ([1.0, 2.0, 6.0], 7**0.5)):
        jobs = [
            {"key": f"k{i}", "kind": "merge", "status": "done", "settings": {"labels": {
                "method": "average", "n": 2, "block": 0, "set": i
            }}}
            for i in range(len(values))
        ]  # fmt: skip
        metrics = [
            {"job": f"k{i}", "metric": "merged_accuracy", "value": v} for i, v in enumerate(values)
        ]
        (row,) = metric_groups(jobs, metrics)
        assert row["values"] == values and row["std"] == pytest.approx(std, rel=1e-12)
