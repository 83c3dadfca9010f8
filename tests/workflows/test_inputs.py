"""The commands' inputs, called from Python (`lmckit.workflows.inputs`): what each form of
input loads, the example input a graph is read with, and the refusals that name the input."""

import pytest
import torch

from lmckit.checkpoint import save_checkpoint
from lmckit.errors import UsageError
from lmckit.models import build_model
from lmckit.workflows.inputs import (
    data_for,
    graph_example,
    input_from_sidecar,
    load_inputs,
    load_pair,
    model_from_class_path,
)

CONFIG = {"in_dim": 64, "hidden": [8], "out_dim": 10}


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    for seed in (0, 1):
        save_checkpoint(tmp_path / f"m{seed}", build_model("mlp", **CONFIG), {"dataset": "digits"})
    return tmp_path


def test_lmckit_checkpoints_load_with_their_spec_and_a_pair_must_differ(saved):
    a, b = load_inputs([saved / "m0", saved / "m1"])
    assert set(a.params) == set(build_model("mlp", **CONFIG).state_dict())
    assert not torch.equal(a.params["layers.0.weight"], b.params["layers.0.weight"])
    assert a.spec.groups == {"hidden0": 8}
    with pytest.raises(UsageError, match="given twice"):
        load_pair(saved / "m0", saved / "m0.json")


def test_a_plain_state_dict_loads_into_a_users_class_traced_on_its_example(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    save_file(net.state_dict(), tmp_path / "w.safetensors")
    ckpt = load_inputs(
        [tmp_path / "w.safetensors"],
        model_class=f"{__name__}:TwoLayers",
        input_shape=[5],
    )[0]
    assert ckpt.spec.groups == {next(iter(ckpt.spec.groups)): 7}
    assert torch.equal(ckpt.params["0.weight"], net.state_dict()["0.weight"])
    with pytest.raises(UsageError, match="--model-class needs --input-shape"):
        load_inputs(
            [tmp_path / "w.safetensors"], model_class="tests.workflows.test_inputs:TwoLayers"
        )
    with pytest.raises(UsageError, match="needs --model-class and --input-shape"):
        load_inputs([tmp_path / "w.safetensors"])


class TwoLayers(torch.nn.Sequential):
    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))


def test_a_class_path_is_built_with_its_json_arguments_or_named_when_it_cannot_be():
    linear = model_from_class_path("torch.nn:Linear", '{"in_features": 3, "out_features": 2}')
    assert isinstance(linear, torch.nn.Linear) and linear.weight.shape == (2, 3)
    for target, args, message in (
        ("torch.nn", None, "neither a checkpoint nor MODULE:CLASS"),
        ("torch.nn:Linear", "{", "not JSON"),
        ("torch.nn:Linear", "[1]", "JSON object"),
        ("torch.nn:Linear", '{"k": 1}', r"torch.nn:Linear\(\{'k': 1\}\) failed: TypeError"),
    ):
        with pytest.raises(UsageError, match=message):
            model_from_class_path(target, args)


def test_the_sidecars_dataset_gives_the_example_shape(saved):
    assert input_from_sidecar(saved / "m0") == ([1, 8, 8], None, "digits")  # 8×8 images
    assert input_from_sidecar(saved / "nothing-here") is None


def test_the_graph_is_read_on_the_first_input_that_exists(saved, digits):
    a = load_inputs([saved / "m0"])[0]
    x, kwargs = graph_example(a, digits)
    assert torch.equal(x, digits.train_x[:8]) and kwargs == {}
    x, _ = graph_example(a, None, input_shape=[3, 4])
    assert x.shape == (4, 3, 4) and x.dtype.is_floating_point
    x, _ = graph_example(a, None, input_shape=[6], tokens=11)
    assert x.shape == (4, 6) and int(x.max()) < 11 and not x.dtype.is_floating_point
    x, _ = graph_example(a)  # the dataset its sidecar records: digits, 8×8 images
    assert x.shape == (4, 1, 8, 8)


def test_data_is_the_recorded_dataset_checked_to_fit(saved, digits):
    a = load_inputs([saved / "m0"])[0]
    data = data_for(a)
    assert data.name == "digits" and data.input_shape == (1, 8, 8)
    with pytest.raises(UsageError, match="does not fit"):
        data_for(a, dataset="synthetic")


def test_a_bad_example_shape_or_a_plain_folder_is_named(saved, tmp_path):
    from lmckit.workflows.inputs import example_input

    for shape, tokens in (([-3], None), ([], None), ([2.5], None), ([4], 0), ([4], True)):
        with pytest.raises(UsageError, match=r"shape|tokens"):
            example_input(shape, tokens)
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="plain is a folder, not a checkpoint"):
        load_inputs([tmp_path / "plain", saved / "m0"])
