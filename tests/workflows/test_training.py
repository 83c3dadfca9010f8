"""Training one checkpoint per seed: resumable, bit-identical, checked before training."""

import pytest

from lmckit.checkpoint import read_meta
from lmckit.errors import CheckpointError, ModelConfigError, OutputPathError
from lmckit.train import TrainConfig
from lmckit.workflows.training import model_config_for, train_seeds


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
    assert sorted(p.name for p in (tmp_path / "a").glob("[!.]*")) == [
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


def test_bad_settings_fail_before_any_training(tmp_path, digits):
    cfg = TrainConfig(epochs=1, batch_size=256)
    (tmp_path / "file").write_text("x")
    trained = []

    def progress(seed):
        return trained.append

    model_cfg = model_config_for("mlp", digits, hidden=[8])
    with pytest.raises(OutputPathError, match="is a file"):
        train_seeds("mlp", model_cfg, digits, cfg, [0], tmp_path / "file", progress=progress)
    with pytest.raises(OutputPathError, match="is under a file"):
        train_seeds("mlp", model_cfg, digits, cfg, [0], tmp_path / "file" / "x", progress=progress)
    with pytest.raises(ModelConfigError, match="MLP got unknown option"):
        train_seeds("mlp", {**model_cfg, "depth": 3}, digits, cfg, [0], tmp_path / "o")
    for bad in (float("nan"), 0.0, -1.0):
        with pytest.raises(ModelConfigError, match="width_multiplier must be a positive"):
            model_config_for("mlp", digits, width_multiplier=bad)
    assert trained == []


def test_an_interrupted_seed_goes_on_from_its_last_epoch(tmp_path, digits, monkeypatch):
    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")
    cfg = TrainConfig(epochs=3, batch_size=256)
    model_cfg = model_config_for("mlp", digits, hidden=[32, 32])
    epochs_seen = []

    class Interrupt(Exception):
        pass

    def stop_in_epoch_3(seed):
        def cb(event):
            epochs_seen.append(event.metrics["epoch"])
            if event.metrics["epoch"] == 3:
                raise Interrupt

        return cb

    with pytest.raises(Interrupt):
        train_seeds("mlp", model_cfg, digits, cfg, [1], tmp_path / "a", progress=stop_in_epoch_3)
    resume = tmp_path / "a" / "mlp-digits-seed1.resume"
    assert resume.exists() and not (tmp_path / "a" / "mlp-digits-seed1.safetensors").exists()
    epochs_seen.clear()
    record = lambda seed: lambda event: epochs_seen.append(event.metrics["epoch"])  # noqa: E731
    [resumed] = train_seeds("mlp", model_cfg, digits, cfg, [1], tmp_path / "a", progress=record)
    assert set(epochs_seen) == {3} and not resume.exists()
    [straight] = train_seeds("mlp", model_cfg, digits, cfg, [1], tmp_path / "b")
    assert resumed.path.read_bytes() == straight.path.read_bytes()
