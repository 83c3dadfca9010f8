"""Checkpoints: round trip, atomic resumable runs, refusal of unsafe or broken files."""

import hashlib
import json
import os

import pytest
import torch

from lmckit.checkpoint import (
    CHUNK_BYTES,
    chunk_digests,
    import_state_dict,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    verify_checkpoint,
)
from lmckit.errors import CheckpointError
from lmckit.models import build_model
from tests.zoo import PickledCode


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


def rehash(stem):
    """Make a sidecar vouch for whatever its weights file now holds."""
    sidecar = stem.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    data = stem.with_suffix(".safetensors").read_bytes()
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    meta["weights_sha256_chunks"] = {"bytes": CHUNK_BYTES, "digests": chunk_digests(data)}
    sidecar.write_text(json.dumps(meta))


def meta_digests(sidecar):
    return json.loads(sidecar.read_text())["weights_sha256_chunks"]["digests"]


def test_truncated_or_flipped_weights_are_errors_naming_the_file(tmp_path):
    model = build_model("mlp", in_dim=64, hidden=[64, 64], out_dim=10)
    save_checkpoint(tmp_path / "m", model)
    weights = tmp_path / "m.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"m\.safetensors does not match the SHA-256"):
        load_checkpoint(weights)
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        verify_checkpoint(weights)
    flipped = bytearray(good)
    start = len(good) - 20_000  # in the data region, past the header
    for i in range(start, start + 1000):
        flipped[i] ^= 0xFF
    weights.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="does not match the SHA-256"):
        load_checkpoint(weights)
    weights.write_bytes(good)
    assert verify_checkpoint(weights)["weights_sha256"] == hashlib.sha256(good).hexdigest()
    assert len(meta_digests(tmp_path / "m.json")) == -(-len(good) // CHUNK_BYTES)
    meta = json.loads((tmp_path / "m.json").read_text())
    unhashed = {k: v for k, v in meta.items() if not k.startswith("weights_sha256")}
    (tmp_path / "m.json").write_text(json.dumps(unhashed))
    with pytest.raises(CheckpointError, match="lacks the weights_sha256"):
        load_checkpoint(weights)
    (tmp_path / "m.json").write_text(json.dumps({**unhashed, "format_version": 1}))
    assert load_checkpoint(weights).meta["format_version"] == 1  # version 1 carried no hash


def test_broken_checkpoints_are_refused_with_reasons(tmp_path):
    model = build_model("mlp", in_dim=8, hidden=[4], out_dim=3)
    save_checkpoint(tmp_path / "m", model)
    weights = tmp_path / "m.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])
    rehash(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"cannot read .* as safetensors"):
        load_checkpoint(weights)
    bad = model.state_dict()
    bad["layers.0.weight"][0, 0] = float("nan")
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in bad.items()}, weights)
    rehash(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"'layers.0.weight' has 1 NaN/infinite"):
        load_checkpoint(weights)
    save_file({"layers.0.weight": torch.zeros(4, 8)}, weights)
    rehash(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"missing \['layers.0.bias'"):
        load_checkpoint(weights)
    (tmp_path / "m.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not an lmckit checkpoint sidecar"):
        read_meta(tmp_path / "m")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "absent")


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
    torch.save({"w": torch.zeros(2), "x": PickledCode(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only=True") as exc:
        import_state_dict(tmp_path / "evil.pt")
    assert not marker.exists()
    # one line, the unpickler's reason, and never torch's advice to turn the check off
    message = str(exc.value)
    assert "\n" not in message
    assert "not a plain file of tensors (the weights-only unpickler: Unsupported global" in message
    assert "weights_only` set to `False`" not in message
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="not a plain file of tensors") as exc:
        import_state_dict(tmp_path / "junk.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"not a PyTorch file \(torch.load raised EOFError"):
        import_state_dict(tmp_path / "empty.pt")


def test_checkpoint_params_do_not_alias_the_module(tmp_path):
    model = build_model("mlp", in_dim=8, hidden=[4], out_dim=3)
    save_checkpoint(tmp_path / "m", model)
    ckpt = load_checkpoint(tmp_path / "m")
    before = {k: v.clone() for k, v in ckpt.params.items()}
    ckpt.model.load_state_dict({k: torch.zeros_like(v) for k, v in ckpt.params.items()})
    assert all(torch.equal(ckpt.params[k], before[k]) for k in before)


def test_the_sidecar_is_checked_against_the_weights_before_anything_is_built(tmp_path):
    model = build_model("mlp", in_dim=8, hidden=[4], out_dim=3)
    save_checkpoint(tmp_path / "m", model)
    sidecar = tmp_path / "m.json"
    meta = json.loads(sidecar.read_text())
    huge = dict(meta, model={**meta["model"], "hidden": [3_000_000]})
    sidecar.write_text(json.dumps(huge))
    with pytest.raises(CheckpointError, match=r"'layers.0.weight' has shape \(4, 8\), the model"):
        load_checkpoint(tmp_path / "m")
    for version, message in ((99, "newer lmckit"), ("1", "not a version"), (None, "not a version")):
        sidecar.write_text(json.dumps(dict(meta, format_version=version)))
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(tmp_path / "m")
    sidecar.write_text(json.dumps(dict(meta, model={**meta["model"], "name": "alexnet"})))
    with pytest.raises(CheckpointError, match="cannot rebuild the model"):
        load_checkpoint(tmp_path / "m")
    sidecar.write_text(json.dumps(dict(meta, model={**meta["model"], "hidden": "wide"})))
    with pytest.raises(CheckpointError, match="cannot rebuild the model"):
        load_checkpoint(tmp_path / "m")


def test_weights_stored_as_integers_or_complex_numbers_are_refused_on_every_path(tmp_path):
    """int64 weights with a consistent sidecar were cast on load (a trained weight's values
    |w| < 1 all became 0) and matched from the command line as zeros, objective 0, exit 0.
    Refused by lmckit checkpoints, foreign weight files and model folders alike, naming the
    tensor and both dtypes."""
    import hashlib
    import json

    from safetensors.torch import save_file

    from lmckit.checkpoint import (
        CHUNK_BYTES,
        chunk_digests,
        load_checkpoint,
        load_foreign,
        save_checkpoint,
    )
    from lmckit.errors import CheckpointError
    from lmckit.models import build_model

    model = build_model("mlp", in_dim=4, hidden=[3], out_dim=2)
    weights = save_checkpoint(tmp_path / "ck", model, {"dataset": "digits"})
    meta = json.loads(weights.with_suffix(".json").read_text())
    for dtype in (torch.int64, torch.bool, torch.complex64):
        state = {k: v.to(dtype) for k, v in model.state_dict().items()}
        path = tmp_path / f"{dtype}".replace("torch.", "")
        save_file(state, path.with_suffix(".safetensors"))
        data = path.with_suffix(".safetensors").read_bytes()
        hashes = {
            "weights_sha256": hashlib.sha256(data).hexdigest(),
            "weights_sha256_chunks": {"bytes": CHUNK_BYTES, "digests": chunk_digests(data)},
        }
        path.with_suffix(".json").write_text(json.dumps({**meta, **hashes}))
        name = str(dtype).replace("torch.", "")
        said = rf"stored as 'C64'|another kind.*\(torch.{name}, the"
        with pytest.raises(CheckpointError, match=said):
            load_checkpoint(path)
        with pytest.raises(CheckpointError, match=said):
            fresh = build_model("mlp", in_dim=4, hidden=[3], out_dim=2)
            load_foreign(path.with_suffix(".safetensors"), fresh, None, description={})
