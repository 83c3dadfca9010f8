"""Running a caller's module: modes restored exactly, parameter dicts checked against it."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, module_mode
from lmckit.models import build_model


def modes(model):
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("inside", [True, False, None])
def test_module_mode_restores_every_submodule(inside):
    model = build_model("mlp", in_dim=4, hidden=[3, 3], norm="batch")
    model.train()
    model.norms[0].eval()  # a mixed state that model.train(was_training) would destroy
    before = modes(model)
    with module_mode(model, inside):
        if inside is not None:
            assert all(m.training is inside for m in model.modules())
    assert modes(model) == before
    with pytest.raises(RuntimeError), module_mode(model, False):
        raise RuntimeError("fails inside")
    assert modes(model) == before


def test_check_model_fits_names_keys_and_shapes():
    model = build_model("mlp", in_dim=4, hidden=[3])
    params = model.state_dict()
    check_model_fits(model, params)
    with pytest.raises(ParamsError, match=r"missing \['layers.0.bias'\]"):
        check_model_fits(model, {k: v for k, v in params.items() if k != "layers.0.bias"})
    with pytest.raises(ParamsError, match=r"unknown \['extra'\]"):
        check_model_fits(model, {**params, "extra": torch.zeros(1)})
    with pytest.raises(ParamsError, match=r"'layers.0.weight'\] has shape \(3, 5\)"):
        check_model_fits(model, {**params, "layers.0.weight": torch.zeros(3, 5)})
    with pytest.raises(ParamsError, match=r"must be a torch\.nn\.Module"):
        check_model_fits("mlp", params)
