"""Checkpoints: round trip, atomic resumable runs, refusal of unsafe or broken files."""

import json
import os

import pytest
import torch

from lmckit.checkpoint import import_state_dict, load_checkpoint, read_meta, save_checkpoint
from lmckit.data import load_dataset
from lmckit.errors import CheckpointError
from lmckit.experiments.training import model_config_for, train_seeds
from lmckit.models import build_model
from lmckit.train import TrainConfig


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def small_vgg():
    return build_model("vgg", depth=11, width_multiplier=0.125, in_channels=1)


def test_round_trip_rebuilds_model_and_outputs(tmp_path):
    model = small_vgg()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
    path = save_checkpoint(tmp_path / "a", model, {"seed": 5, "dataset": "digits"})
    assert path.name == "a.safetensors" and (tmp_path / "a.json").exists()
    ckpt = load_checkpoint(tmp_path / "a.json")
    assert ckpt.meta["seed"] == 5 and ckpt.meta["model"]["name"] == "vgg"
    assert ckpt.meta["lmckit_version"] and ckpt.meta["format"] == "lmckit-checkpoint"
    x = torch.randn(2, 1, 32, 32)
    model.eval()
    ckpt.model.eval()
    assert torch.equal(model(x), ckpt.model(x))
    assert set(ckpt.params) == set(model.state_dict())
    assert ckpt.spec.groups == {f"conv{i}": c.out_channels for i, c in enumerate(model.convs)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0o600


def test_broken_checkpoints_are_refused_with_reasons(tmp_path):
    model = build_model("mlp", in_dim=8, hidden=[4], out_dim=3)
    save_checkpoint(tmp_path / "m", model)
    weights = tmp_path / "m.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:40])
    with pytest.raises(CheckpointError, match=r"cannot read .* as safetensors"):
        load_checkpoint(weights)
    bad = model.state_dict()
    bad["layers.0.weight"][0, 0] = float("nan")
    save_checkpoint(tmp_path / "m", build_model("mlp", in_dim=8, hidden=[4], out_dim=3))
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in bad.items()}, weights)
    with pytest.raises(CheckpointError, match=r"'layers.0.weight' has 1 NaN/infinite"):
        load_checkpoint(weights)
    save_file({"layers.0.weight": torch.zeros(4, 8)}, weights)
    with pytest.raises(CheckpointError, match=r"missing \['layers.0.bias'"):
        load_checkpoint(weights)
    (tmp_path / "m.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not an lmckit checkpoint sidecar"):
        read_meta(tmp_path / "m")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "absent")


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_foreign_pt_files_are_loaded_with_weights_only(tmp_path):
    sd = build_model("mlp", in_dim=8, hidden=[4], out_dim=3).state_dict()
    torch.save(sd, tmp_path / "plain.pt")
    assert set(import_state_dict(tmp_path / "plain.pt")) == set(sd)
    torch.save(
        {"epoch": 3, "state_dict": {f"module.{k}": v for k, v in sd.items()}},
        tmp_path / "wrapped.pth",
    )
    assert set(import_state_dict(tmp_path / "wrapped.pth")) == set(sd)
    marker = tmp_path / "pwned"
    torch.save({"w": torch.zeros(2), "x": Payload(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        import_state_dict(tmp_path / "evil.pt")
    assert not marker.exists()
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="refusing or unable to load"):
        import_state_dict(tmp_path / "junk.pt")


def test_train_seeds_is_resumable_and_bit_identical(tmp_path, digits):
    cfg = TrainConfig(epochs=1, batch_size=256)
    model_cfg = model_config_for("mlp", digits, hidden=[32, 32])

    class Interrupt(Exception):
        pass

    def progress(seed):
        def cb(event):
            if seed == 1 and event.step == 2:
                raise Interrupt

        return cb

    with pytest.raises(Interrupt):
        train_seeds("mlp", model_cfg, digits, cfg, [0, 1], tmp_path / "a", progress=progress)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "mlp-digits-seed0.json",
        "mlp-digits-seed0.safetensors",
    ]  # the interrupted seed left nothing behind
    first = (tmp_path / "a" / "mlp-digits-seed0.safetensors").read_bytes()
    outcomes = train_seeds("mlp", model_cfg, digits, cfg, [0, 1], tmp_path / "a")
    assert [o.skipped for o in outcomes] == [True, False]
    assert (tmp_path / "a" / "mlp-digits-seed0.safetensors").read_bytes() == first
    again = train_seeds("mlp", model_cfg, digits, cfg, [1], tmp_path / "b")
    assert again[0].path.read_bytes() == outcomes[1].path.read_bytes()  # same seed, same bytes
    meta = read_meta(outcomes[1].path)
    assert meta["seed"] == 1 and meta["train"]["seed"] == 1 and meta["dataset"] == "digits"
    assert set(meta["metrics"]) == {"train_loss", "train_accuracy", "test_loss", "test_accuracy"}
    with pytest.raises(CheckpointError, match=r"train\.epochs: found 1, wanted 2"):
        train_seeds(
            "mlp", model_cfg, digits, TrainConfig(epochs=2, batch_size=256), [0], tmp_path / "a"
        )


def test_checkpoint_params_do_not_alias_the_module(tmp_path):
    model = build_model("mlp", in_dim=8, hidden=[4], out_dim=3)
    save_checkpoint(tmp_path / "m", model)
    ckpt = load_checkpoint(tmp_path / "m")
    before = {k: v.clone() for k, v in ckpt.params.items()}
    ckpt.model.load_state_dict({k: torch.zeros_like(v) for k, v in ckpt.params.items()})
    assert all(torch.equal(ckpt.params[k], before[k]) for k in before)
