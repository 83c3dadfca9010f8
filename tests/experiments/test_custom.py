"""A user's own nn.Module class in an experiment file (``[model] name = "custom"``): trained,
matched over its traced spec (WM, and AM through the graph), interpolated and merged; its
checkpoints keep the class's own state dict keys and load only when the class is named."""

import pytest
import torch
from torch import nn

from lmckit.checkpoint import load_checkpoint
from lmckit.errors import CheckpointError
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment, model_configs
from lmckit.models import build_model, model_config, permutation_spec
from lmckit.models.custom import class_source_digest
from lmckit.store import Store
from lmckit.tracing import trace
from tests.experiments.conftest import read_ledger

CLASS = "tests.experiments.test_custom:SmallNet"


class SmallNet(nn.Module):
    """A user's CNN: a convolution, its channels flattened into a linear layer, GroupNorm."""

    def __init__(self, channels: int = 4, hidden: int = 16, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.fc = nn.Linear(channels * 64, hidden)
        self.norm = nn.GroupNorm(2, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.out(torch.relu(self.norm(self.fc(h))))


TOML = """
name = "custom"
description = "a user's class"
seeds = [0, 1]
threads = 1
[data]
dataset = "digits"
[model]
{model}
[train]
epochs = 4
batch_size = 64
[[compare]]
pairs = [[0, 1]]
methods = ["none", "wm-fast", "am"]
lambdas = 3
[[merge]]
methods = ["star-wm"]
n = [2]
"""


def _experiment(tmp_path, model=f'name = "custom"\nclass = "{CLASS}"\nargs = {{ hidden = 12 }}'):
    path = tmp_path / "e.toml"
    path.write_text(TOML.format(model=model))
    return load_experiment(path)


def test_a_users_class_runs_through_an_experiment(tmp_path, digits):
    out = tmp_path / "run"
    summary = run_experiment(_experiment(tmp_path), out, log=lambda _m: None)
    assert summary.complete and len(summary.done) == 2 + 2 + 3 + 1  # train, match, curve, merge
    jobs, metrics = read_ledger(out)
    store = Store(out / "store")
    train = [j for j in jobs.values() if j["kind"] == "train"]
    folder = store.folder("checkpoint", train[0]["key"])
    # the class's own keys: no wrapper, no prefix
    ckpt = load_checkpoint(folder / "model", classes=[CLASS])
    assert set(ckpt.params) == set(SmallNet(hidden=12).state_dict())
    config = model_config(ckpt.model)
    assert config.pop("source_sha256") == class_source_digest(SmallNet)
    assert config == {
        "name": "custom", "class": CLASS, "args": {"hidden": 12}, "input_shape": [1, 8, 8]
    }  # fmt: skip
    # trained for real: well above chance on digits
    assert ckpt.meta["metrics"]["test_accuracy"] > 0.6
    # its spec is the traced one: conv channels (blocks of 64 in fc), GroupNorm's groups
    spec = permutation_spec(ckpt.model)
    assert spec.to_dict() == trace(SmallNet(hidden=12), torch.randn(2, 1, 8, 8)).to_dict()
    assert spec.heads and spec.blocks["fc.weight"] == (1, 64)
    # matched over that spec (AM through the graph's activations), the paths evaluated
    for method in ("wm-fast", "am"):
        match = f"match/c0/0-1/{method}"
        assert metrics[match, "distance_after"] < metrics[match, "distance_before"]
    barrier = {
        m: metrics[f"curve/b0/c0/0-1/{m}", "test.loss.barrier.rebasin"] for m in ("none", "wm-fast")
    }
    assert barrier["wm-fast"] < barrier["none"]
    # the star-WM merge of two models is WM's midpoint
    midpoint = metrics["curve/b0/c0/0-1/wm-fast", "test.loss.midpoint"]
    assert metrics["merge/b0/c0/star-wm/n2", "merged_loss"] == pytest.approx(midpoint, rel=1e-5)
    # a checkpoint naming a user class loads only when the caller names it
    with pytest.raises(CheckpointError, match=r"user class 'tests\.experiments\.test_custom"):
        load_checkpoint(folder / "model")


def test_build_model_rebuilds_a_custom_model_from_its_config():
    torch.manual_seed(0)
    model = build_model("custom", **{"class": CLASS, "args": {}, "input_shape": [1, 8, 8]})
    again = build_model("custom", **model_config(model))
    assert type(again) is SmallNet and model_config(again) == model_config(model)
    assert permutation_spec(model) is permutation_spec(model)  # traced once


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ('name = "custom"', "custom model takes class"),
        (f'name = "custom"\nclass = "{CLASS}"\nwidth_multiplier = 2.0', "width_multiplier"),
        ('name = "custom"\nclass = "no_such_module_xyz:Net"', "cannot import 'no_such_module_xyz'"),
        (
            'name = "custom"\nclass = "tests.experiments.test_custom:Nope"',
            "no torch.nn.Module class",
        ),
        (f'name = "custom"\nclass = "{CLASS}"\nargs = {{ widthh = 3 }}', "unexpected keyword"),
        (f'name = "mlp"\nclass = "{CLASS}"', "unknown option"),
    ],
)
def test_bad_custom_models_are_named_before_anything_runs(tmp_path, digits, model, message):
    with pytest.raises(ExperimentError, match=message) as error:
        model_configs(_experiment(tmp_path, model), lambda _name: digits)
    assert str(error.value).startswith(f"{tmp_path}")  # the file is named, as for every check


USER_MODULE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden: int = 8):
        super().__init__()
        self.fc = nn.Linear(64, hidden)
        self.out = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.out(torch.ACTIVATION(self.fc(x.flatten(1))))
"""


def test_a_change_to_the_users_code_reuses_nothing(tmp_path, monkeypatch, digits):
    """The same class name, arguments and weights under other code are another model: after
    ReLU becomes tanh in the user's file, every job is computed again (none reused)."""
    import importlib
    import sys

    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = package / "nets.py"
    source.write_text(USER_MODULE.replace("ACTIVATION", "relu"))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = 'name = "custom"\nclass = "userpkg.nets:Net"'
    out = tmp_path / "run"
    first = run_experiment(_experiment(tmp_path, model), out, log=lambda _m: None)
    assert first.complete  # (a curve whose permutation another method found too is shared)
    again = run_experiment(_experiment(tmp_path, model), out, log=lambda _m: None)
    assert not again.done and len(again.reused) == len(first.done) + len(first.reused)
    source.write_text(USER_MODULE.replace("ACTIVATION", "tanh"))
    for name in ("userpkg.nets", "userpkg"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    changed = run_experiment(_experiment(tmp_path, model), out, log=lambda _m: None)
    assert changed.complete
    ledger = Ledger(out / "ledger.sqlite")
    keys = [{j["key"] for j in ledger.jobs(run)} for run in (1, 2, 3)]
    ledger.close()
    assert keys[0] == keys[1] and not keys[0] & keys[2]  # every result keyed anew
