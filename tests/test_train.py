"""Training: configuration checks, schedules, learning, determinism."""

import itertools
import math

import pytest
import torch

from lmckit.data import load_dataset
from lmckit.errors import TrainConfigError
from lmckit.train import TrainConfig, TrainingDiverged, init_model, lr_factor, train


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("synthetic")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"epochs": 0}, "epochs must be"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of"),
        ({"schedule": "cosine"}, "schedule must be one of"),
        ({"lr": float("nan")}, "lr must be a positive"),
        ({"epochs": 3, "warmup_epochs": 3}, "warmup_epochs must be in"),
        ({"label_smoothing": 1.0}, "label_smoothing"),
    ],
)
def test_config_validation(options, message):
    with pytest.raises(TrainConfigError, match=message):
        TrainConfig(**options)
    with pytest.raises(TrainConfigError, match="unknown training option"):
        TrainConfig.from_dict({"epochs": 2, "lr_decay": 0.1})


def test_warmup_linear_schedule_matches_stemm_appendix():
    cfg = TrainConfig(epochs=20, schedule="warmup_linear")  # warm-up 4 epochs (a fifth)
    steps = 10
    f = [lr_factor(cfg, s, steps) for s in range(200)]
    assert f[0] == pytest.approx(1 / 40) and f[39] == pytest.approx(1.0)
    assert max(f) == pytest.approx(1.0) and f[-1] == pytest.approx(0.0)
    assert all(a <= b for a, b in itertools.pairwise(f[:40]))
    assert all(a >= b for a, b in itertools.pairwise(f[39:]))
    long = TrainConfig(epochs=100, schedule="warmup_linear")
    assert long.effective_warmup_epochs() == 5.0  # np.interp(t, [0, 5, epochs], [0, 1, 0])
    assert lr_factor(TrainConfig(), 123, 10) == 1.0


def test_mlp_learns_synthetic_data_and_reports_progress(synthetic):
    events = []
    model = init_model("mlp", {"in_dim": 32, "hidden": [64, 64], "out_dim": 4}, seed=0)
    cfg = TrainConfig(epochs=3, batch_size=128, lr=3e-3)
    result = train(model, synthetic, cfg, progress=events.append)
    assert len(result.history) == 3 and result.history[-1].test_accuracy is not None
    assert result.test.accuracy > 0.9 and result.train.count == 4000
    assert result.history[-1].train_loss < result.history[0].train_loss
    steps = 3 * (4000 // 128)
    done = [e for e in events if e.metrics.get("epoch_done")]
    assert [e.metrics["epoch"] for e in done] == [1, 2, 3]
    assert done[-1].metrics["test_accuracy"] == result.history[-1].test_accuracy
    assert len(events) == steps + 3 and all(e.total == steps for e in events)
    assert [e.step for e in events if not e.metrics.get("epoch_done")] == list(range(1, steps + 1))


def state_equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("name", "config", "train_options"),
    [
        ("mlp", {"in_dim": 64, "hidden": [32, 32], "norm": "batch"}, {"optimizer": "adam"}),
        (
            "resnet20",
            {"width_multiplier": 0.5, "in_channels": 1},
            {
                "optimizer": "sgd",
                "lr": 0.05,
                "nesterov": True,
                "weight_decay": 5e-4,
                "schedule": "warmup_linear",
                "augment": True,
            },
        ),
    ],
)
def test_same_seed_gives_bit_identical_weights(digits, name, config, train_options):
    cfg = TrainConfig(epochs=2, batch_size=128, seed=3, **train_options)
    runs = []
    for _ in range(2):
        model = init_model(name, config, seed=3)
        train(model, digits, cfg, evaluate_each_epoch=False)
        runs.append(model.state_dict())
    assert state_equal(runs[0], runs[1])
    other = init_model(name, config, seed=4)
    train(other, digits, TrainConfig(epochs=2, batch_size=128, seed=4, **train_options))
    assert not state_equal(runs[0], other.state_dict())


def test_init_model_leaves_global_rng_alone():
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    init_model("mlp", {"in_dim": 4, "hidden": [3], "out_dim": 2}, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_divergence_is_an_error(synthetic):
    model = init_model("mlp", {"in_dim": 32, "hidden": [64], "out_dim": 4}, seed=0)
    with pytest.raises(TrainConfigError, match="diverged"):
        train(model, synthetic, TrainConfig(epochs=1, optimizer="sgd", lr=1e12, momentum=0.9))


def test_a_finite_but_exploding_loss_is_a_divergence_that_keeps_the_last_good_state(digits):
    """SGD warmed up to lr 20 on digits: two epochs learn, the third blows the loss up far
    above its start but keeps it finite — the old check (non-finite only) let such a run
    exit 0. The error carries the state after the last good epoch (what a snapshot there
    holds), and the model is left at it."""
    config = {"in_dim": 64, "hidden": [32], "out_dim": 10}
    recipe = TrainConfig(
        epochs=3, lr=20.0, optimizer="sgd", batch_size=64,
        schedule="warmup_linear", warmup_epochs=2.9,
    )  # fmt: skip
    seen = {}
    model = init_model("mlp", config, seed=0)
    with pytest.raises(TrainingDiverged, match="diverged in epoch 3") as exc:
        train(
            model,
            digits,
            recipe,
            snapshots=[2],
            on_snapshot=lambda epoch, _r: seen.update(
                {k: v.clone() for k, v in model.state_dict().items()}
            ),
        )
    err = exc.value
    assert err.last_good_epoch == 2 and err.epoch == 3 and len(err.history) == 2
    assert math.isfinite(err.loss) and err.loss > err.start_loss + max(1.0, err.start_loss)
    for k, v in seen.items():
        assert torch.equal(err.last_good[k], v), k
        assert torch.equal(model.state_dict()[k], v), k
    kept = init_model("mlp", config, seed=0)
    result = train(kept, digits, recipe, keep_diverged=True)
    assert result.extra["diverged"]["epoch"] == 3 and len(result.history) == 3


def test_a_run_that_learns_is_not_a_divergence(digits):
    model = init_model("mlp", {"in_dim": 64, "hidden": [32], "out_dim": 10}, seed=0)
    result = train(model, digits, TrainConfig(epochs=3, batch_size=64, lr=1e-2))
    losses = [h.train_loss for h in result.history]
    assert "diverged" not in result.extra and losses == sorted(losses, reverse=True)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("mlp", {"in_dim": 64, "hidden": [32, 32], "out_dim": 10}),
        ("resnet20", {"width_multiplier": 0.25, "in_channels": 1}),
    ],
)
def test_a_snapshot_equals_the_shorter_run_under_a_constant_schedule(name, config, digits):
    """Epoch-2 snapshot of a 3-epoch run == a 2-epoch run (weights, BN statistics, metrics),
    and taking it leaves the 3-epoch run unchanged."""
    # the ResNet on 320 of the training images: three batches an epoch, the last one partial
    # (the BN statistics of an uneven batch are in the snapshot too), a sixth of the work
    data = (
        digits
        if name == "mlp"
        else load_dataset("digits", pad_to=32).subset(train_idx=torch.arange(320))
    )
    cfg = TrainConfig(epochs=3, batch_size=128, seed=5, schedule="constant")
    taken = {}

    def keep(epoch, result):
        taken[epoch] = ({k: v.clone() for k, v in model.state_dict().items()}, result)

    model = init_model(name, config, seed=5)
    long_result = train(model, data, cfg, snapshots=[2], on_snapshot=keep)
    short = init_model(name, config, seed=5)
    short_result = train(short, data, TrainConfig(epochs=2, batch_size=128, seed=5))
    state, result = taken[2]
    assert state_equal(state, short.state_dict())
    assert result.metrics_dict() == short_result.metrics_dict()
    assert [h.train_loss for h in result.history] == [h.train_loss for h in short_result.history]
    plain = init_model(name, config, seed=5)
    train(plain, data, cfg)
    assert state_equal(plain.state_dict(), model.state_dict())
    assert len(long_result.history) == 3


def test_snapshot_epochs_are_checked(digits):
    model = init_model("mlp", {"in_dim": 64, "hidden": [8], "out_dim": 10}, seed=0)
    cfg = TrainConfig(epochs=2, batch_size=128)
    with pytest.raises(TrainConfigError, match="snapshot epochs"):
        train(model, digits, cfg, snapshots=[2], on_snapshot=lambda e, r: None)
    with pytest.raises(TrainConfigError, match="on_snapshot"):
        train(model, digits, cfg, snapshots=[1])
