"""Resuming an interrupted training run from its resume file (lmckit.resume)."""

import pytest
import torch

from lmckit.resume import ResumeError, load_resume_state
from lmckit.train import TrainConfig, TrainingDiverged, init_model, train

MLP = ("mlp", {"in_dim": 64, "hidden": [32, 32], "out_dim": 10})
MLP_BN = ("mlp", {"in_dim": 64, "hidden": [32, 32], "out_dim": 10, "norm": "batch"})


class Killed(Exception):
    """Stands for the process being killed in the middle of an epoch."""


def kill_in_epoch(epoch):
    def progress(event):
        if event.metrics.get("epoch") == epoch and not event.metrics.get("epoch_done"):
            raise Killed

    return progress


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("model_def", "options"),
    [
        # the warm-up schedule depends on the step count: a scheduler restarted from 0
        # gives other learning rates; Adam's moments and step counts are state too
        (MLP, {"optimizer": "adam", "lr": 3e-3, "schedule": "warmup_linear"}),
        # Sophia's Hessian EMA, SGD-style decay, BatchNorm buffers
        (MLP_BN, {"optimizer": "sophia", "lr": 1e-3, "weight_decay": 0.1}),
        (MLP_BN, {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "augment": False}),
    ],
)
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(
    digits, tmp_path, model_def, options
):
    name, config = model_def
    cfg = TrainConfig(epochs=5, batch_size=128, seed=2, **options)
    straight = init_model(name, config, seed=2)
    expected = train(straight, digits, cfg)

    path = tmp_path / "run.resume.safetensors"
    killed = init_model(name, config, seed=2)
    train_until_killed(killed, digits, cfg, path, kill_in_epoch(4))
    _, info = load_resume_state(path, _fingerprint_of(path))
    assert info["epoch"] == 3  # epochs 1-3 were kept; the 4th was lost with the kill

    # lmckit status's pace
    assert info["resumed_from"] == {"epoch": 0, "step_in_epoch": 0, "seconds": 0.0}
    resumed_model = init_model(name, config, seed=2)
    seen_epochs = []
    resumed = train(
        resumed_model,
        digits,
        cfg,
        resume=path,
        resume_every=0,
        progress=lambda e: seen_epochs.append(e.metrics["epoch"]),
    )
    assert set(seen_epochs) == {4, 5}  # epochs 1-3 were not trained again
    assert all(torch.equal(v, straight.state_dict()[k]) for k, v in weights(resumed_model).items())
    assert resumed.metrics_dict() == expected.metrics_dict()
    assert [(h.epoch, h.train_loss, h.test_loss) for h in resumed.history] == [
        (h.epoch, h.train_loss, h.test_loss) for h in expected.history
    ]


def _fingerprint_of(path):
    """The fingerprint stored in a resume file (read raw, to inspect the saved state)."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["fingerprint"])


def train_until_killed(model, digits, cfg, path, progress, **options):
    """Train with a resume file saved at every chance until ``progress`` raises Killed."""
    with pytest.raises(Killed):
        train(model, digits, cfg, resume=path, resume_every=0, progress=progress, **options)


def test_resuming_without_the_optimizer_state_would_differ(digits, tmp_path):
    """The check above can fail: a resume that rebuilt Adam afresh gives other weights."""
    name, config = MLP
    cfg = TrainConfig(epochs=4, batch_size=128, seed=1)
    straight = init_model(name, config, seed=1)
    train(straight, digits, cfg)
    path = tmp_path / "r.safetensors"
    train_until_killed(init_model(name, config, seed=1), digits, cfg, path, kill_in_epoch(3))
    tensors, _ = load_resume_state(path, _fingerprint_of(path))
    naive = init_model(name, config, seed=1)
    naive.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
    train(naive, digits, TrainConfig(epochs=2, batch_size=128, seed=1))  # fresh Adam
    assert not all(torch.equal(v, straight.state_dict()[k]) for k, v in naive.state_dict().items())


def test_a_resume_file_of_another_run_is_refused(digits, tmp_path):
    name, config = MLP
    path = tmp_path / "r.safetensors"
    cfg = TrainConfig(epochs=3, batch_size=128, seed=0)
    train_until_killed(init_model(name, config, seed=0), digits, cfg, path, kill_in_epoch(3))
    before = path.read_bytes()
    longer = TrainConfig(epochs=4, batch_size=128, seed=0)
    with pytest.raises(ResumeError, match=r"another run \(train\.epochs: 3 → 4\)"):
        train(init_model(name, config, seed=0), digits, longer, resume=path)
    with pytest.raises(ResumeError, match="initial_weights"):  # another start, same options
        train(init_model(name, config, seed=7), digits, cfg, resume=path)
    wider = {**config, "hidden": [48, 32]}
    with pytest.raises(ResumeError, match="tensors"):
        train(init_model(name, wider, seed=0), digits, cfg, resume=path)
    assert path.read_bytes() == before  # a refused file is left for its own run


def test_a_damaged_resume_file_is_an_error_naming_it(digits, tmp_path):
    path = tmp_path / "r.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    name, config = MLP
    with pytest.raises(ResumeError, match=r"r\.safetensors is unreadable.*delete it"):
        train(init_model(name, config, seed=0), digits, TrainConfig(epochs=2), resume=path)
    with pytest.raises(ResumeError, match="is a directory; give the path of a file"):
        train(init_model(name, config, seed=0), digits, TrainConfig(epochs=2), resume=tmp_path)


def test_saves_are_spaced_by_resume_every_and_the_last_epoch_saves_none(digits, tmp_path):
    name, config = MLP
    cfg = TrainConfig(epochs=3, batch_size=128, seed=0)
    path = tmp_path / "r.safetensors"
    train(init_model(name, config, seed=0), digits, cfg, resume=path, resume_every=3600)
    assert not path.exists()  # no save due within an hour
    train(init_model(name, config, seed=0), digits, cfg, resume=path, resume_every=0)
    _, info = load_resume_state(path, _fingerprint_of(path))
    assert info["epoch"] == 2  # saved after epochs 1 and 2, not after the last


def test_a_resumed_run_keeps_the_last_good_state_of_before_the_kill(digits, tmp_path):
    """SGD warmed up to lr 20 (kept past its rise in epoch 3): the last good state is the
    model after epoch 2. Killed in epoch 5 and resumed, a run whose loss then turns
    non-finite (its weights poisoned in epoch 6) must hand back that epoch-2 state — not
    the state it resumed from."""
    config = {"in_dim": 64, "hidden": [32], "out_dim": 10}
    recipe = TrainConfig(
        epochs=6, lr=20.0, optimizer="sgd", batch_size=64,
        schedule="warmup_linear", warmup_epochs=2.9,
    )  # fmt: skip
    epoch2 = {}

    def poison_in_epoch_6(model, also=None):
        def progress(event):
            if also is not None:
                also(event)
            if event.metrics.get("epoch") == 6 and not event.metrics.get("epoch_done"):
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float("nan"))

        return progress

    model = init_model("mlp", config, seed=0)
    with pytest.raises(TrainingDiverged) as straight:
        train(model, digits, recipe, keep_diverged=True, progress=poison_in_epoch_6(model),
              snapshots=[2], on_snapshot=lambda e, r: epoch2.update(weights(model)))  # fmt: skip
    assert straight.value.last_good_epoch == 2

    path = tmp_path / "r.safetensors"
    train_until_killed(
        init_model("mlp", config, seed=0),
        digits,
        recipe,
        path,
        kill_in_epoch(5),
        keep_diverged=True,
    )
    resumed = init_model("mlp", config, seed=0)
    with pytest.raises(TrainingDiverged) as again:
        train(resumed, digits, recipe, keep_diverged=True, resume=path,
              progress=poison_in_epoch_6(resumed))  # fmt: skip
    assert again.value.last_good_epoch == 2 and again.value.epoch == 6
    for k, v in epoch2.items():
        assert torch.equal(again.value.last_good[k], v), k


def test_the_save_interval_comes_from_the_environment_and_is_checked(digits, tmp_path, monkeypatch):
    name, config = MLP
    cfg = TrainConfig(epochs=2, batch_size=128, seed=0)
    path = tmp_path / "r.safetensors"
    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")
    train(init_model(name, config, seed=0), digits, cfg, resume=path)
    assert path.exists()
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("LMCKIT_RESUME_EVERY", bad)
        with pytest.raises(ResumeError, match="LMCKIT_RESUME_EVERY must be a number"):
            train(init_model(name, config, seed=0), digits, cfg, resume=tmp_path / "x")
    train(init_model(name, config, seed=0), digits, cfg)  # read only for a run that saves


def test_the_tensor_digest_tells_names_values_and_dtypes_apart():
    from lmckit.resume import tensors_digest

    t = torch.arange(6.0)
    base = tensors_digest({"w": t.reshape(2, 3)})
    assert tensors_digest({"w": t.reshape(2, 3).clone()}) == base
    assert tensors_digest({"w": t.reshape(2, 3) + 1}) != base
    assert tensors_digest({"v": t.reshape(2, 3)}) != base
    assert tensors_digest({"w": t.reshape(2, 3).double()}) != base


def test_a_resumed_run_saves_where_it_began_for_the_estimate_of_time_left(digits, tmp_path):
    """Killed in epoch 3, resumed after epoch 2 and killed in epoch 5: the file the second
    process saved says it began after epoch 2 with the first process's seconds (lmckit
    status estimates the time left at that process's own pace)."""
    name, config = MLP
    cfg = TrainConfig(epochs=5, batch_size=128, seed=0)
    path = tmp_path / "r.safetensors"
    train_until_killed(init_model(name, config, seed=0), digits, cfg, path, kill_in_epoch(3))
    _, first = load_resume_state(path, _fingerprint_of(path))
    train_until_killed(init_model(name, config, seed=0), digits, cfg, path, kill_in_epoch(5))
    _, second = load_resume_state(path, _fingerprint_of(path))
    assert (first["epoch"], second["epoch"]) == (2, 4)
    assert second["resumed_from"] == {"epoch": 2, "step_in_epoch": 0, "seconds": first["seconds"]}
    assert second["seconds"] > first["seconds"]


def kill_at_step(n):
    """Stands for a kill right after step ``n`` (counted over the whole run) reported."""

    def progress(event):
        if event.step == n and not event.metrics.get("epoch_done"):
            raise Killed

    return progress


@pytest.mark.parametrize(
    ("model_def", "options"),
    [
        (MLP, {"optimizer": "adam", "lr": 3e-3, "schedule": "warmup_linear"}),
        (MLP_BN, {"optimizer": "sophia", "lr": 1e-3, "weight_decay": 0.1}),
        # the augmentation draws of the batches done must be drawn again
        (MLP_BN, {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "augment": True}),
    ],
)
def test_a_run_killed_within_an_epoch_resumes_from_the_step_saved_to_the_same_result(
    digits, tmp_path, model_def, options
):
    name, config = model_def
    cfg = TrainConfig(epochs=4, batch_size=128, seed=2, **options)
    steps = len(digits.train_y) // 128  # 11: the last incomplete batch is dropped
    straight = init_model(name, config, seed=2)
    expected = train(straight, digits, cfg)

    path = tmp_path / "run.resume"
    train_until_killed(
        init_model(name, config, seed=2), digits, cfg, path, kill_at_step(2 * steps + 6)
    )
    _, info = load_resume_state(path, _fingerprint_of(path))
    # saved after step 5 of epoch 3 (resume_every=0: after every step)
    assert (info["epoch"], info["step_in_epoch"], info["steps_per_epoch"]) == (2, 5, steps)
    assert info["epoch_sums"]["seen"] == 5 * 128

    resumed_model = init_model(name, config, seed=2)
    seen_steps = []
    resumed = train(resumed_model, digits, cfg, resume=path, resume_every=0,
                    progress=lambda e: seen_steps.append(e.step))  # fmt: skip
    assert seen_steps[0] == 2 * steps + 6  # nothing done before was trained again
    assert all(torch.equal(v, straight.state_dict()[k]) for k, v in weights(resumed_model).items())
    assert resumed.metrics_dict() == expected.metrics_dict()
    # the third epoch's mean loss and accuracy go on from the sums saved within it
    assert [(h.epoch, h.train_loss, h.train_accuracy) for h in resumed.history] == [
        (h.epoch, h.train_loss, h.train_accuracy) for h in expected.history
    ]
    _, info = load_resume_state(path, _fingerprint_of(path))
    assert info["resumed_from"]["step_in_epoch"] == 5


def test_a_save_within_an_epoch_keeps_the_last_good_state_of_the_epoch_before(digits, tmp_path):
    """Killed within epoch 3 of a healthy run, resumed and poisoned at once: the last good
    state handed back is the model after epoch 2, not the one saved within epoch 3."""
    name, config = MLP
    cfg = TrainConfig(epochs=4, batch_size=128, seed=0)
    steps = len(digits.train_y) // 128
    epoch2 = {}
    straight = init_model(name, config, seed=0)
    train(straight, digits, cfg, snapshots=[2],
          on_snapshot=lambda e, r: epoch2.update(weights(straight)))  # fmt: skip

    path = tmp_path / "run.resume"
    train_until_killed(
        init_model(name, config, seed=0), digits, cfg, path, kill_at_step(2 * steps + 4)
    )
    resumed = init_model(name, config, seed=0)

    def poison(event):
        with torch.no_grad():
            for p in resumed.parameters():
                p.fill_(float("nan"))

    with pytest.raises(TrainingDiverged) as caught:
        train(resumed, digits, cfg, resume=path, progress=poison)
    assert caught.value.last_good_epoch == 2
    for k, v in epoch2.items():
        assert torch.equal(caught.value.last_good[k], v), k


@pytest.mark.parametrize(
    "change", [{"epoch_sums": None}, {"step_in_epoch": 99}, {"step_in_epoch": "3"}]
)
def test_a_resume_file_whose_step_within_an_epoch_is_not_ours_is_an_error_naming_it(
    digits, tmp_path, change
):
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    name, config = MLP
    cfg = TrainConfig(epochs=3, batch_size=128, seed=0)
    path = tmp_path / "run.resume"
    train_until_killed(init_model(name, config, seed=0), digits, cfg, path, kill_at_step(15))
    with safe_open(str(path), framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    info = json.loads(metadata["info"])
    assert info["step_in_epoch"] == 3  # step 14 of the run: the third of epoch 2
    edited = tmp_path / "edited.resume"
    save_file(tensors, str(edited), metadata={**metadata, "info": json.dumps({**info, **change})})
    with pytest.raises(ResumeError, match=r"edited\.resume records step .*delete it"):
        train(init_model(name, config, seed=0), digits, cfg, resume=edited)
