"""Barrier against training time: cells that differ only in ``train.epochs`` (constant
schedule) are snapshots of one run, and a snapshot is exactly the shorter run."""

import torch

from lmckit.checkpoint import load_checkpoint
from lmckit.experiments.dag import build_jobs
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment, model_configs
from lmckit.store import Store
from lmckit.train import TrainConfig, init_model, train

TOML = """
name = "epochs"
description = "snapshots"
seeds = [0, 1]
threads = 1
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [16, 16]
[train]
batch_size = 128
schedule = "{schedule}"
[grid]
"train.epochs" = [3, 1, 2]
[[compare]]
pairs = "first"
methods = ["none", "wm-fast"]
lambdas = 3
"""


def _experiment(tmp_path, schedule):
    path = tmp_path / f"{schedule}.toml"
    path.write_text(TOML.format(schedule=schedule))
    return load_experiment(path)


def test_shorter_cells_are_snapshots_of_the_longest_run(tmp_path, digits):
    exp = _experiment(tmp_path, "constant")
    jobs = {j.name: j for j in build_jobs(exp, model_configs(exp, lambda _name: digits))}
    assert jobs["train/c0/seed0"].settings["snapshots"] == [1, 2]
    assert jobs["train/c1/seed0"].deps == ("train/c0/seed0",)
    assert jobs["train/c2/seed1"].deps == ("train/c0/seed1",)
    names = list(jobs)
    assert names.index("train/c0/seed1") < names.index("train/c1/seed1")
    out = tmp_path / "run"
    summary = run_experiment(exp, out, log=lambda _: None)
    assert summary.complete and not summary.failed
    assert {"train/c1/seed0", "train/c2/seed1"} <= set(summary.reused)  # stored by c0's run
    ledger = Ledger(out / "ledger.sqlite")
    try:
        by_name = {j["name"]: j for j in ledger.jobs()}
    finally:
        ledger.close()
    folder = Store(out / "store").folder("checkpoint", by_name["train/c2/seed1"]["key"])
    snap = load_checkpoint(folder / "model")
    cfg = TrainConfig.from_dict(snap.meta["train"])
    assert cfg.epochs == 2 and cfg.seed == 1
    direct = init_model("mlp", {k: v for k, v in snap.meta["model"].items() if k != "name"}, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the experiment's jobs ran: reductions depend on it
    try:
        result = train(direct, digits, cfg)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(direct.state_dict()[k], v) for k, v in snap.params.items())
    assert snap.meta["metrics"] == result.metrics_dict()


def test_schedules_that_depend_on_the_run_length_train_every_cell(tmp_path, digits):
    exp = _experiment(tmp_path, "warmup_linear")
    jobs = {j.name: j for j in build_jobs(exp, model_configs(exp, lambda _name: digits))}
    assert "snapshots" not in jobs["train/c0/seed0"].settings
    assert jobs["train/c1/seed0"].deps == ()
