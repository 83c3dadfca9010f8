"""Experiments over parts of the data: ``[train.split]`` gives the k-th seed's model part k
(mod the number of parts) of one partition, recorded in each checkpoint; a changed split
is another key, so it trains again."""

import pytest
import torch

from lmckit.checkpoint import load_checkpoint
from lmckit.data import Split
from lmckit.experiments.dag import build_jobs
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment, model_configs
from lmckit.store import Store

TOML = """
name = "halves"
description = "split test"
seeds = [0, 1, 2]
threads = 1
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [16]
[train]
epochs = 1
batch_size = 128
init_seed = 9
[train.split]
{split}
[grid]
{grid}
[[compare]]
pairs = [[0, 1], [0, 2]]
methods = ["none", "wm-fast"]
lambdas = 3
ensemble = true
[[merge]]
methods = ["average", "star-wm"]
n = [2]
"""


def _experiment(tmp_path, split, grid='"train.lr" = [1e-3]'):
    path = tmp_path / "e.toml"
    path.write_text(TOML.format(split=split, grid=grid))
    return load_experiment(path)


def _train_jobs(exp, digits):
    return [
        j for j in build_jobs(exp, model_configs(exp, lambda _name: digits)) if j.kind == "train"
    ]


def test_the_kth_seed_trains_on_part_k_modulo_the_parts(tmp_path, digits):
    exp = _experiment(tmp_path, 'kind = "class-imbalanced"\nfraction = 0.2')
    jobs = _train_jobs(exp, digits)
    assert [j.labels["part"] for j in jobs] == [0, 1, 0]
    configs = [j.settings["train_config"] for j in jobs]
    assert [c["split"]["part"] for c in configs] == [0, 1, 0]
    assert all(c["init_seed"] == 9 and c["split"]["fraction"] == 0.2 for c in configs)
    fed = _experiment(
        tmp_path, 'kind = "dirichlet"\nclients = 3', '"train.split.alpha" = [0.1, 10]'
    )
    jobs = _train_jobs(fed, digits)
    assert [(j.labels["train.split.alpha"], j.labels["part"]) for j in jobs] == [
        (0.1, 0), (0.1, 1), (0.1, 2), (10, 0), (10, 1), (10, 2)
    ]  # fmt: skip
    assert jobs[4].settings["train_config"]["split"] == {
        "kind": "dirichlet", "part": 1, "seed": 0, "clients": 3, "alpha": 10
    }  # fmt: skip


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ('kind = "dirichlet"\nclients = 3\npart = 1', "train.split takes no part"),
        ('kind = "shards"', "split kind must be one of"),
        ('kind = "random"\nclients = 0', "clients must be ≥ 1"),
    ],
)
def test_bad_splits_in_a_file_are_named(tmp_path, split, message):
    with pytest.raises(ExperimentError, match=message):
        _experiment(tmp_path, split)


def test_checkpoints_record_their_part_and_a_changed_split_trains_again(tmp_path, digits):
    exp = _experiment(tmp_path, 'kind = "dirichlet"\nclients = 2\nalpha = 0.5')
    out = tmp_path / "run"
    assert run_experiment(exp, out, log=lambda _: None).complete
    first = _ledger_keys(out / "ledger.sqlite")
    store = Store(out / "store")
    for seed, part in ((0, 0), (1, 1), (2, 0)):
        ckpt = load_checkpoint(store.folder("checkpoint", first[f"train/c0/seed{seed}"]) / "model")
        recorded = ckpt.meta["split"]
        assert recorded["part"] == part and recorded["kind"] == "dirichlet"
        expected = Split("dirichlet", part, clients=2, alpha=0.5).indices(digits.train_y)
        assert recorded["examples"] == len(expected)
    metrics = _ledger_metrics(out)
    curve = metrics["curve/b0/c0/0-1/none"]
    assert {"test.accuracy[part 0].midpoint", "test.accuracy[part 1].midpoint"} <= set(curve)
    merged = metrics["merge/b0/c0/average/n2"]
    assert {"merged_ece", "ensemble_accuracy", "merged_accuracy_part_0"} <= set(merged)
    from lmckit.experiments.report import write_report

    page = write_report(out).read_text()
    assert "models trained on parts: block 0" in page  # loss, per-part accuracy, ECE
    again = _experiment(tmp_path, 'kind = "dirichlet"\nclients = 2\nalpha = 0.5\nseed = 1')
    summary = run_experiment(again, tmp_path / "run2", log=lambda _: None)
    second = _ledger_keys(tmp_path / "run2" / "ledger.sqlite")
    assert summary.complete and all(first[k] != second[k] for k in first)


def _ledger_metrics(out):
    """``{job name: {metric: value}}`` from a run's ledger."""
    ledger = Ledger(out / "ledger.sqlite")
    try:
        rows = ledger.metrics()
    finally:
        ledger.close()
    found = {}
    for row in rows:
        found.setdefault(row["name"], {})[row["metric"]] = row["value"]
    return found


def test_merge_n_parts_takes_one_model_per_client_and_the_server_sees_a_subset(tmp_path, digits):
    path = tmp_path / "fed.toml"
    text = TOML.format(split='kind = "random"\nclients = 2', grid='"train.split.clients" = [2, 3]')
    path.write_text(
        text.replace("pairs = [[0, 1], [0, 2]]", "pairs = [[0, 1]]")
        .replace("n = [2]", 'n = ["parts"]\nserver_examples = 100')
        .replace('methods = ["average", "star-wm"]', 'methods = ["average", "ste-mm"]')
        + "[merge.options]\nste-mm = { epochs = 1 }\n"
    )
    exp = load_experiment(path)
    jobs = {j.name: j for j in build_jobs(exp, model_configs(exp, lambda _name: digits))}
    assert jobs["merge/b0/c0/average/n2"].deps == ("train/c0/seed0", "train/c0/seed1")
    assert len(jobs["merge/b0/c1/ste-mm/n3"].deps) == 3
    assert jobs["merge/b0/c1/ste-mm/n3"].settings["server_examples"] == 100
    # the 2-client cell trains the two models it uses (pairs [0, 1], merges of 2), not 3
    trained = sorted(n for n in jobs if n.startswith("train/"))
    assert trained == ["train/c0/seed0", "train/c0/seed1", *(f"train/c1/seed{s}" for s in range(3))]
    out = tmp_path / "run"
    assert run_experiment(exp, out, log=lambda _: None).complete
    assert "ensemble_accuracy" in _ledger_metrics(out)["merge/b0/c1/ste-mm/n3"]
    bad = tmp_path / "bad.toml"
    bad.write_text(
        path.read_text().replace('"train.split.clients" = [2, 3]', '"train.split.clients" = [2, 4]')
    )
    with pytest.raises(ExperimentError, match="asks for 4 models \\(one per part\\); 3 seeds"):
        load_experiment(bad)


def test_the_server_subset_is_seeded_and_sized(digits):
    from lmckit.workflows.merging import server_subset

    one, again = server_subset(digits, 100, seed=3), server_subset(digits, 100, seed=3)
    assert len(one.train_y) == 100 and torch.equal(one.train_x, again.train_x)
    assert len(one.test_y) == len(digits.test_y)
    assert not torch.equal(server_subset(digits, 100, seed=4).train_x, one.train_x)


def test_per_model_partitions_give_each_model_its_own_random_half(tmp_path, digits):
    exp = _experiment(tmp_path, 'kind = "random"\nclients = 2\nper_model = true\nseed = 5')
    assert not exp.merge[0].train_metrics
    configs = [j.settings["train_config"]["split"] for j in _train_jobs(exp, digits)]
    assert [(c["seed"], c["part"]) for c in configs] == [(5, 0), (6, 1), (7, 0)]
    halves = [Split.from_dict(c).indices(digits.train_y) for c in configs]
    assert all(abs(len(h) - len(digits.train_y) / 2) <= 1 for h in halves)
    assert not torch.equal(halves[0], halves[2])  # same part index, another partition
    with pytest.raises(ExperimentError, match="per_model must be true or false"):
        _experiment(tmp_path, 'kind = "random"\nclients = 2\nper_model = 1')


def test_train_metrics_measure_the_merge_on_the_training_set(tmp_path, digits):
    """With train_metrics the merge record holds train loss/accuracy/ECE of the merge, the
    inputs' mean and their ensemble — equal to a direct evaluation on the training set."""
    from lmckit.evaluate import evaluate

    path = tmp_path / "t.toml"
    path.write_text(
        TOML.format(
            split='kind = "random"\nclients = 2\nper_model = true', grid='"train.lr" = [1e-3]'
        )
        .replace('methods = ["average", "star-wm"]', 'methods = ["average"]')
        .replace("n = [2]", "n = [2]\ntrain_metrics = true")
    )
    out = tmp_path / "run"
    assert run_experiment(load_experiment(path), out, log=lambda _: None).complete
    merged = _ledger_metrics(out)["merge/b0/c0/average/n2"]
    keys = _ledger_keys(out / "ledger.sqlite")
    store = Store(out / "store")
    ckpts = [
        load_checkpoint(store.folder("checkpoint", keys[f"train/c0/seed{s}"]) / "model")
        for s in (0, 1)
    ]
    mean = {k: (ckpts[0].params[k] + ckpts[1].params[k]) / 2 for k in ckpts[0].params}
    direct = evaluate(ckpts[0].model, mean, digits.loader("train", batch_size=500, shuffle=False))
    assert merged["merged_train_accuracy"] == pytest.approx(direct.accuracy)
    assert merged["merged_train_loss"] == pytest.approx(direct.loss, rel=1e-5)
    assert {"mean_train_ece", "ensemble_train_accuracy"} <= set(merged)
    # the inputs' test ECE beside the merge's (Fig. 12 compares them), from a direct count
    from lmckit.evaluate.calibration import calibration_metrics
    from lmckit.metrics import predict

    test = digits.loader("test", batch_size=500)
    eces = [calibration_metrics(*predict(c.model, c.params, test))["ece"] for c in ckpts]
    assert merged["mean_ece"] == pytest.approx(sum(eces) / 2, rel=1e-5)
    assert merged["max_input_ece"] == pytest.approx(max(eces), rel=1e-5)


def _ledger_keys(path):
    """``{job name: key}`` from the ledger at ``path``."""
    ledger = Ledger(path)
    try:
        return {j["name"]: j["key"] for j in ledger.jobs()}
    finally:
        ledger.close()


def test_compare_server_examples_limit_what_data_driven_matchers_see(tmp_path, digits):
    """A data-driven matcher's permutation is keyed on (and computed from) the server's
    subset; a data-free one is untouched."""
    from lmckit.workflows.merging import server_subset

    path = tmp_path / "s.toml"
    path.write_text(
        TOML.format(split='kind = "dirichlet"\nclients = 2', grid='"train.lr" = [1e-3]')
        .replace('methods = ["none", "wm-fast"]', 'methods = ["none", "wm-fast", "am"]')
        .replace("ensemble = true", "ensemble = true\nserver_examples = 100")
    )
    exp = load_experiment(path)
    assert exp.compare[0].server_examples == 100
    out = tmp_path / "run"
    assert run_experiment(exp, out, log=lambda _: None).complete
    keys = _ledger_keys(out / "ledger.sqlite")
    store = Store(out / "store")
    am = store.get("permutation", keys["match/c0/0-1/am"], verify=False)
    wm = store.get("permutation", keys["match/c0/0-1/wm-fast"], verify=False)
    assert am.meta["document"]["dataset"] == server_subset(digits, 100).fingerprint
    assert wm.meta["document"]["dataset"] is None
