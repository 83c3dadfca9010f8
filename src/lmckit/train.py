"""Training any zoo model from a configuration dataclass.

``train`` never prints: it reports progress through an optional callback (the CLI turns it
into a progress bar) and returns the per-epoch history. On CPU, the same model
initialisation, data and ``TrainConfig`` (whose ``seed`` fixes the data order and the
augmentation draws) give bit-identical weights.
"""

from __future__ import annotations

import math
import os
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.data.datasets import Dataset
from lmckit.data.splits import Split, indices_digest
from lmckit.errors import DataError, ParamsError, TrainConfigError
from lmckit.functional import check_labels, forward, per_token
from lmckit.metrics import Metrics, evaluate
from lmckit.models import build_model
from lmckit.optim import HESSIAN_INTERVAL, SophiaG
from lmckit.options import Count, NonNegative, Positive, Range, check_value, checked
from lmckit.progress import ProgressCallback, notify
from lmckit.resume import (
    ResumeError,
    check_resume_every,
    load_resume_state,
    optimizer_state,
    prefixed,
    restore_optimizer,
    save_interval,
    save_resume_state,
    tensors_digest,
)

OPTIMIZERS = ("adam", "adamw", "sgd", "sophia", "sophia-l2")
NONFINITE_CHECK_EVERY = 16  # batches between checks of the loss (each check syncs a GPU)
SCHEDULES = ("constant", "warmup_linear")


@dataclass(frozen=True)
class TrainConfig:
    """How to train.

    Attributes:
        epochs: passes over the training set.
        batch_size: examples per step (the last incomplete batch is dropped).
        optimizer: ``"adam"`` (L2 via ``weight_decay``), ``"adamw"``, ``"sgd"`` or
            ``"sophia"`` (:class:`lmckit.optim.SophiaG`, decoupled weight decay, a GNB
            Hessian estimate every 10 steps from labels sampled with a generator seeded by
            ``seed`` and the step) or ``"sophia-l2"`` (the same with ``weight_decay`` as a
            coupled L2 penalty in the gradient, as Adam's).
        lr: peak learning rate.
        momentum, nesterov: SGD only.
        weight_decay: L2 penalty (decoupled for AdamW).
        schedule: ``"constant"`` or ``"warmup_linear"``: linear warm-up from 0 to ``lr`` over
            ``warmup_epochs``, then linear decay to 0 at the end of training — STE-MM
            appendix B's ``np.interp(t, [0, 5, epochs], [0, 1, 0])``, applied per step.
        warmup_epochs: length of the warm-up; ``None`` means 5 epochs, or a fifth of the run
            when that is shorter.
        label_smoothing: cross-entropy label smoothing (off by default).
        augment: random crop + horizontal flip (image datasets only).
        seed: data order and augmentation; :func:`init_model` uses it for the initialisation
            unless ``init_seed`` is given.
        init_seed: the initialisation's seed when it differs from ``seed`` — clients of a
            federated run that start from one shared initialisation.
        split: train on one part of the training set (:class:`~lmckit.data.splits.Split`,
            or its dict): a class-imbalanced half, a Dirichlet client, a random client.
            Metrics are still computed on the full test set; ``train_*`` metrics are on the
            part trained on.
    """

    epochs: Count = 10
    batch_size: Count = 512
    optimizer: Literal[OPTIMIZERS] = "adam"
    lr: Positive = 1e-3
    momentum: Annotated[float, Range(0.0, 1.0, high_open=True)] = 0.9
    nesterov: bool = False
    weight_decay: NonNegative = 0.0
    schedule: Literal[SCHEDULES] = "constant"
    warmup_epochs: NonNegative | None = None
    label_smoothing: Annotated[float, Range(0.0, 1.0, high_open=True)] = 0.0
    augment: bool = False
    seed: Annotated[int, Range(0, 2**63 - 1)] = 0
    init_seed: Annotated[int, Range(0, 2**63 - 1)] | None = None
    split: Split | None = None

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self), include_extras=True)
        for f in fields(self):
            if f.name != "split":  # a Split or its table, converted below
                value = getattr(self, f.name)
                try:
                    check_value(f.name, value, hints[f.name])
                except ParamsError as exc:
                    raise TrainConfigError(str(exc)) from None
                if (
                    isinstance(value, int)
                    and not isinstance(value, bool)
                    and float
                    in (
                        hints[f.name],
                        *typing.get_args(hints[f.name]),
                    )
                ):  # lr = 1 and lr = 1.0 are one configuration (and one store key)
                    object.__setattr__(self, f.name, float(value))
        if isinstance(self.split, Mapping):
            try:
                object.__setattr__(self, "split", Split.from_dict(self.split))
            except DataError as exc:
                raise TrainConfigError(str(exc)) from None
        elif self.split is not None and not isinstance(self.split, Split):
            raise TrainConfigError(f"split must be a Split or a table, got {self.split!r}")
        if self.init_seed is not None and (
            isinstance(self.init_seed, bool) or not isinstance(self.init_seed, int)
        ):
            raise TrainConfigError(f"init_seed must be an integer, got {self.init_seed!r}")
        if self.epochs < 1:
            raise TrainConfigError(f"epochs must be ≥ 1, got {self.epochs}")
        if self.batch_size < 1:
            raise TrainConfigError(f"batch_size must be ≥ 1, got {self.batch_size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainConfigError(f"lr must be a positive number, got {self.lr}")
        if self.weight_decay < 0 or not 0 <= self.label_smoothing < 1:
            raise TrainConfigError("weight_decay must be ≥ 0 and label_smoothing in [0, 1)")
        if self.warmup_epochs is not None and not 0 <= self.warmup_epochs < self.epochs:
            raise TrainConfigError(
                f"warmup_epochs must be in [0, epochs={self.epochs}), got {self.warmup_epochs}"
            )

    def effective_warmup_epochs(self) -> float:
        """``warmup_epochs``, or its default: 5, or a fifth of the run when shorter."""
        if self.warmup_epochs is not None:
            return float(self.warmup_epochs)
        return min(5.0, self.epochs / 5)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; ``init_seed`` and ``split`` only when set (so the keys of
        runs without them are what they were before these options existed)."""
        out = asdict(self)
        for optional in ("init_seed", "split"):
            if out[optional] is None:
                del out[optional]
        if self.split is not None:
            out["split"] = self.split.to_dict()
        return out

    @property
    def model_seed(self) -> int:
        """The seed of the model's initialisation (``init_seed``, else ``seed``)."""
        return self.seed if self.init_seed is None else self.init_seed

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainConfigError(f"unknown training option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    @classmethod
    def paper_defaults(cls, model_name: str, dataset: str, **overrides: Any) -> TrainConfig:
        """The papers' recipes: MLPs with Adam 1e-3, batch 512, no schedule (Git Re-Basin,
        STE-MM B.1; lmckit's ViT and encoder and users' own classes take the same); the
        byte-level GPT and Llama AdamW 2e-3, weight decay 0.01, batch 64, warm-up over a tenth of an
        epoch then linear decay (no paper trains one; tried here on python-stdlib); conv nets
        with SGD(0.9, Nesterov) lr 0.4, weight decay 5e-4, batch 500, warm-up + linear
        decay, and crop/flip augmentation on CIFAR (STE-MM B.1). ``overrides`` replace them;
        an unknown option, or one that does nothing with the resulting optimiser or schedule
        (``momentum`` for Adam, ``warmup_epochs`` under the constant schedule), is a
        :class:`TrainConfigError`."""
        if model_name.lower().startswith(("mlp", "vit", "transformer", "custom")):
            base: dict[str, Any] = dict(optimizer="adam", lr=1e-3, batch_size=512)
        elif model_name.lower().startswith(("gpt", "llama")):
            # no paper trains one: the recipe of experiments/gpt-python-stdlib.toml
            base = dict(
                optimizer="adamw",
                lr=2e-3,
                weight_decay=0.01,
                batch_size=64,
                schedule="warmup_linear",
                warmup_epochs=0.1,
            )
        else:
            base = dict(
                optimizer="sgd",
                lr=0.4,
                momentum=0.9,
                nesterov=True,
                weight_decay=5e-4,
                batch_size=500,
                schedule="warmup_linear",
                augment=dataset.startswith("cifar"),
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TrainConfigError(f"unknown training option(s) {unknown}; known: {sorted(known)}")
        config = cls(**{**base, **overrides})
        from lmckit.data.datasets import INPUT_SHAPES, canonical_name

        shape = INPUT_SHAPES.get(canonical_name(dataset)) if dataset else None
        for name, applies, why in (
            ("augment", shape is None or len(shape) == 3, f"{dataset} holds no images"),
            ("momentum", config.optimizer == "sgd", f"the optimizer is {config.optimizer}"),
            ("nesterov", config.optimizer == "sgd", f"the optimizer is {config.optimizer}"),
            (
                "warmup_epochs",
                config.schedule == "warmup_linear",
                f"the schedule is {config.schedule} (warm-up belongs to warmup_linear)",
            ),
        ):
            if name in overrides and not applies:
                raise TrainConfigError(f"{name} does not apply: {why}")
        return config


def split_record(config: TrainConfig, data: Dataset) -> dict[str, Any] | None:
    """What a checkpoint's sidecar records of ``config.split``: the split's settings, its
    description, how many examples the part holds and the SHA-256 of their indices (None
    without a split)."""
    if config.split is None:
        return None
    part = config.split.indices(data.train_y, data.num_classes)
    return {
        **config.split.to_dict(),
        "description": config.split.describe(),
        "examples": len(part),
        "indices_sha256": indices_digest(part),
    }


def train_examples(config: TrainConfig, data: Dataset) -> int:
    """How many training examples a run of ``config`` on ``data`` sees: its split's part,
    or the whole training set (what FedAvg weights a client's model by)."""
    if config.split is None:
        return len(data.train_y)
    return len(config.split.indices(data.train_y, data.num_classes))


def lr_factor(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    """Multiplier of ``config.lr`` at optimisation ``step`` (0-based)."""
    if config.schedule == "constant":
        return 1.0
    total = config.epochs * steps_per_epoch
    warm = config.effective_warmup_epochs() * steps_per_epoch
    t = step + 1  # so that the first step does not run at learning rate 0
    if t <= warm:
        return t / warm
    return max(0.0, (total - t) / max(total - warm, 1)) if total > warm else 1.0


@dataclass(frozen=True)
class EpochStats:
    """Per-epoch record: running train loss/accuracy, last learning rate, time, test metrics."""

    epoch: int
    lr: float
    train_loss: float
    train_accuracy: float
    seconds: float
    test_loss: float | None = None
    test_accuracy: float | None = None


@dataclass(frozen=True)
class TrainResult:
    """History and final eval-mode metrics of a training run."""

    history: list[EpochStats]
    train: Metrics
    test: Metrics
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def metrics_dict(self) -> dict[str, float]:
        """Final train/test loss and accuracy, as stored in checkpoint sidecars."""
        return {
            "train_loss": self.train.loss,
            "train_accuracy": self.train.accuracy,
            "test_loss": self.test.loss,
            "test_accuracy": self.test.accuracy,
        }


def init_model(name: str, config: Mapping[str, Any], seed: int) -> nn.Module:
    """Build a zoo model with its initialisation fixed by ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(name, **config)


def _make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            nesterov=config.nesterov,
            weight_decay=config.weight_decay,
        )
    if config.optimizer in ("sophia", "sophia-l2"):
        return SophiaG(
            params,
            lr=config.lr,
            weight_decay=config.weight_decay,
            coupled_weight_decay=config.optimizer == "sophia-l2",
        )
    cls = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def _gnb_estimate(optimizer: SophiaG, logits: Tensor, seed: int, step: int) -> None:
    """Sophia's Gauss–Newton–Bartlett estimate on this batch: the gradient of the loss on
    labels sampled from ``softmax(logits)`` (the batch's graph is reused), squared and
    scaled into the optimiser's Hessian EMA. The loss gradients in ``p.grad`` are kept."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [None if p.grad is None else p.grad.clone() for p in params]
    gen = torch.Generator(device=logits.device).manual_seed(seed * 1_000_003 + step)
    sampled = torch.multinomial(logits.detach().softmax(-1), 1, generator=gen).squeeze(1)
    for p in params:
        p.grad = None
    F.cross_entropy(logits, sampled).backward()
    optimizer.update_hessian(len(sampled))
    for p, g in zip(params, saved, strict=True):
        p.grad = g


DIVERGENCE_MARGIN = 1.0
"""A run has diverged when an epoch's mean training loss exceeds the loss at the start
(the first batch's, before any step) by more than ``max(DIVERGENCE_MARGIN, start)`` —
more than doubled, or up by a nat for a small start — or is not finite."""


class TrainingDiverged(TrainConfigError):
    """Training diverged (see :data:`DIVERGENCE_MARGIN`). ``last_good`` holds the model's
    state (CPU copies) after ``last_good_epoch`` epochs — 0: the initialisation —, the last
    state before the divergence; ``history`` the epochs up to it."""

    def __init__(
        self,
        message: str,
        *,
        epoch: int,
        loss: float,
        start_loss: float,
        last_good: dict[str, Tensor],
        last_good_epoch: int,
        history: list[EpochStats],
    ) -> None:
        super().__init__(message)
        self.epoch, self.loss, self.start_loss = epoch, loss, start_loss
        self.last_good, self.last_good_epoch, self.history = last_good, last_good_epoch, history


def _state_copy(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _training_part(data: Dataset, config: TrainConfig) -> Dataset:
    """``data`` with its training set cut to ``config.split``'s part (the test set whole)."""
    if config.split is None:
        return data
    try:
        part = config.split.indices(data.train_y, data.num_classes)
    except DataError as exc:
        raise TrainConfigError(str(exc)) from None
    return data.subset(train_idx=part)


def _snapshot_epochs(
    snapshots: Sequence[int], config: TrainConfig, on_snapshot: Callable | None
) -> list[int]:
    """The snapshot epochs, sorted and checked: before the last epoch, with a callback."""
    epochs = sorted({int(e) for e in snapshots})
    if epochs and (epochs[0] < 1 or epochs[-1] >= config.epochs):
        raise TrainConfigError(
            f"snapshot epochs must be in [1, {config.epochs - 1}] (before the last epoch), "
            f"got {epochs}"
        )
    if epochs and on_snapshot is None:
        raise TrainConfigError("snapshots need an on_snapshot callback")
    return epochs


@checked
def train(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    *,
    progress: ProgressCallback | None = None,
    evaluate_each_epoch: bool = True,
    eval_batch_size: int = 1000,
    snapshots: Sequence[int] = (),
    on_snapshot: Callable[[int, TrainResult], None] | None = None,
    keep_diverged: bool = False,
    resume: str | os.PathLike | None = None,
    resume_every: NonNegative | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``data.train_*``; returns history and final metrics.

    Final metrics are computed in eval mode on the full train and test sets (with
    ``config.split``: on the part trained on, and the full test set).

    A run that diverges (an epoch's mean training loss above the start's by more than
    :data:`DIVERGENCE_MARGIN`'s rule, or a non-finite batch loss) stops with
    :class:`TrainingDiverged`, which carries the last good state; the model is left as
    it was then. ``keep_diverged``: a run whose loss rose but stayed finite goes on to the
    end instead, and its result records the divergence in ``extra["diverged"]`` (a
    non-finite loss always stops: there are no weights left to keep).

    ``snapshots``: epochs (1 … ``epochs − 1``) after which ``on_snapshot(epoch, result)``
    is called with the model as it is then and the :class:`TrainResult` a run ending there
    would return (history so far, eval-mode train and test metrics). Taking a snapshot
    changes nothing in the run. With the ``"constant"`` schedule the model at a snapshot
    equals a run of that many epochs (the data order of an epoch depends only on the seed
    and the epoch); with a schedule that depends on the run's length it does not.

    ``resume``: a file (:mod:`lmckit.resume`) where the run's state — weights, optimiser
    and scheduler state, random-number-generator state, history — is saved at the end of
    an epoch once ``resume_every`` seconds have passed since the last save (default: the
    environment variable ``LMCKIT_RESUME_EVERY``, else 60; the last epoch saves none: the
    run is over), and after a step within an epoch once ten times that has passed (with
    the epoch's running loss and accuracy sums: an epoch of a large model can take an hour).
    A run given a file that exists goes on from the step saved there, with the same result
    as a run never interrupted (the data order and augmentation draws of an epoch depend
    only on the seed and the epoch: the batches done are drawn again and dropped); the
    file must come from this run — the
    same configuration, data, parameter shapes and *starting* weights — or
    :class:`~lmckit.resume.ResumeError` names what differs. The caller deletes the file
    once the result is kept.

    ``progress`` receives a :class:`~lmckit.progress.Progress` after every step (``metrics``:
    ``epoch``, ``loss``, ``accuracy``, ``lr``) and, at the end of each epoch, one with
    ``epoch_done=True`` and the epoch's :class:`EpochStats` fields.
    """
    check_resume_every(resume, resume_every, "train")
    device = next(model.parameters()).device
    data = _training_part(data, config)
    loader = data.loader(
        "train",
        batch_size=config.batch_size,
        shuffle=True,
        seed=config.seed,
        augment=config.augment,
        drop_last=len(data.train_x) >= config.batch_size,
        device=device,
    )
    test_loader = data.loader("test", batch_size=eval_batch_size, device=device)
    steps = len(loader)
    optimizer = _make_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step, steps)
    )
    snapshots = _snapshot_epochs(snapshots, config, on_snapshot)
    history: list[EpochStats] = []
    start = time.perf_counter()
    last_good, last_good_epoch = _state_copy(model), 0
    start_loss: float | None = None
    diverged: dict[str, Any] | None = None
    first_epoch = 0
    # where this process began: its own pace
    resumed_from = {"epoch": 0, "step_in_epoch": 0, "seconds": 0.0}
    skip, sums = 0, None  # batches of the first epoch done before a save within it
    fingerprint = None if resume is None else _resume_fingerprint(model, data, config)
    loaded = None if resume is None else load_resume_state(resume, fingerprint)
    if loaded is not None:
        tensors, info = loaded
        _restore_training(model, optimizer, scheduler, tensors, info)
        first_epoch, start_loss, diverged = info["epoch"], info["start_loss"], info["diverged"]
        history = [EpochStats(**e) for e in info["history"]]
        start -= info["seconds"]
        skip, sums = _saved_within_epoch(info, steps, resume)
        resumed_from = {"epoch": first_epoch, "step_in_epoch": skip, "seconds": info["seconds"]}
        last_good_epoch = info["last_good_epoch"]
        last_good = (
            _state_copy(model)
            if last_good_epoch == first_epoch and not skip
            else prefixed(tensors, "last_good/")
        )
    last_save = time.perf_counter()
    if resume is not None:
        resume_every = save_interval(resume_every)

    def save_state(
        epochs_done: int, step_in_epoch: int = 0, epoch_sums: dict[str, Any] | None = None
    ) -> None:
        state = {
            "epoch": epochs_done,
            "epochs": config.epochs,
            "step_in_epoch": step_in_epoch,
            "steps_per_epoch": steps,
            "epoch_sums": epoch_sums,
            "start_loss": start_loss,
            "diverged": diverged,
            "history": [vars(e) for e in history],
            "seconds": time.perf_counter() - start,
            "resumed_from": resumed_from,
            "last_good_epoch": last_good_epoch,
        }
        _save_training(resume, fingerprint, model, optimizer, scheduler, last_good, state)

    def stop(epoch: int, loss: float) -> TrainingDiverged:
        model.load_state_dict(last_good)
        return TrainingDiverged(
            f"training diverged in epoch {epoch} (loss {loss:.4g}, at the start "
            f"{start_loss:.4g}); lower the learning rate (lr={config.lr:g})",
            epoch=epoch,
            loss=loss,
            start_loss=float(start_loss or 0.0),
            last_good=last_good,
            last_good_epoch=last_good_epoch,
            history=list(history),
        )

    for epoch in range(first_epoch, config.epochs):
        model.train()
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        seen = 0
        if skip:  # the epoch's sums as saved within it (the float32 sum exactly)
            loss_sum.fill_(sums["loss_sum"])
            correct.fill_(sums["correct"])
            seen, t0 = sums["seen"], t0 - sums["seconds"]
        for step, (x, y) in enumerate(loader):
            if step < skip:  # drawn and dropped: the order and augmentation draws go on alike
                continue
            lr = optimizer.param_groups[0]["lr"]
            logits, y = per_token(forward(model, None, x), y)
            if step == 0:
                check_labels(logits, y, "training")
            loss = F.cross_entropy(logits, y, label_smoothing=config.label_smoothing)
            if start_loss is None:
                start_loss = loss.item()
            if step % NONFINITE_CHECK_EVERY == 0 and not torch.isfinite(loss):
                raise stop(epoch + 1, loss.item())
            optimizer.zero_grad(set_to_none=True)
            global_step = epoch * steps + step
            estimate = isinstance(optimizer, SophiaG) and global_step % HESSIAN_INTERVAL == 0
            loss.backward(retain_graph=estimate)
            if estimate:
                _gnb_estimate(optimizer, logits, config.seed, global_step)
            optimizer.step()
            scheduler.step()
            loss_sum += loss.detach() * len(y)
            correct += (logits.detach().argmax(1) == y).sum()
            seen += len(y)
            if progress is not None:
                notify(
                    progress,
                    epoch * steps + step + 1,
                    config.epochs * steps,
                    epoch=epoch + 1,
                    loss=loss.item(),
                    accuracy=correct.item() / seen,
                    lr=lr,
                )
            if (  # within an epoch too, ten times as seldom (an epoch can take an hour)
                resume is not None
                and step + 1 < steps
                and time.perf_counter() - last_save >= 10 * resume_every
            ):
                sums_now = {
                    "loss_sum": loss_sum.item(),
                    "correct": int(correct.item()),
                    "seen": seen,
                    "seconds": time.perf_counter() - t0,
                }
                save_state(epoch, step + 1, sums_now)
                last_save = time.perf_counter()
        skip = 0
        train_loss = loss_sum.item() / seen
        assert start_loss is not None
        if not math.isfinite(train_loss):
            raise stop(epoch + 1, train_loss)
        if train_loss > start_loss + max(DIVERGENCE_MARGIN, start_loss):
            if not keep_diverged:
                raise stop(epoch + 1, train_loss)
            if diverged is None:
                diverged = {"epoch": epoch + 1, "loss": train_loss, "start_loss": start_loss}
        elif diverged is None:
            last_good, last_good_epoch = _state_copy(model), epoch + 1
        test = evaluate(model, None, test_loader) if evaluate_each_epoch else None
        stats = EpochStats(
            epoch=epoch + 1,
            lr=lr,
            train_loss=train_loss,
            train_accuracy=correct.item() / seen,
            seconds=time.perf_counter() - t0,
            test_loss=test.loss if test else None,
            test_accuracy=test.accuracy if test else None,
        )
        history.append(stats)
        # The epoch's summary, at the step count its last step already reported.
        summary = {k: v for k, v in vars(stats).items() if v is not None}
        notify(progress, (epoch + 1) * steps, config.epochs * steps, epoch_done=True, **summary)
        if epoch + 1 in snapshots:
            on_snapshot(epoch + 1, _final_result(model, data, history, start, eval_batch_size))
        if (
            resume is not None
            and epoch + 1 < config.epochs
            and time.perf_counter() - last_save >= resume_every
        ):
            save_state(epoch + 1)
            last_save = time.perf_counter()
    result = _final_result(model, data, history, start, eval_batch_size)
    if diverged is not None:
        result.extra["diverged"] = diverged
    return result


def _resume_fingerprint(model: nn.Module, data: Dataset, config: TrainConfig) -> dict[str, Any]:
    """What makes a training run this run: its options, data, tensors and starting weights."""
    state = model.state_dict()
    return {
        "train": config.to_dict(),
        "dataset": data.fingerprint,
        "tensors": {k: [str(v.dtype), list(v.shape)] for k, v in state.items()},
        "initial_weights": tensors_digest(state),
    }


def _save_training(path, fingerprint, model, optimizer, scheduler, last_good, state) -> None:
    """The state after ``state["epoch"]`` epochs, into the resume file ``path``."""
    tensors = {f"model/{k}": v for k, v in model.state_dict().items()}
    optimizer_tensors, optimizer_rest = optimizer_state(optimizer)
    tensors.update(optimizer_tensors)
    tensors["rng/cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
    # else it is the model itself (at an epoch's end)
    if state["last_good_epoch"] != state["epoch"] or state["step_in_epoch"]:
        tensors.update({f"last_good/{k}": v for k, v in last_good.items()})
    scheduler_state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    info = {**state, "optimizer": optimizer_rest, "scheduler": scheduler_state}
    save_resume_state(path, tensors, info, fingerprint)


def _saved_within_epoch(
    info: Mapping[str, Any], steps: int, path: str | os.PathLike
) -> tuple[int, dict[str, Any] | None]:
    """``(batches of the epoch done, the epoch's sums)`` a resume file records; ``(0,
    None)`` for one saved at an epoch's end (and every file of older lmckits).

    Raises:
        ResumeError: the two entries are not what a save within an epoch writes.
    """
    skip, sums = info.get("step_in_epoch") or 0, info.get("epoch_sums")
    keys = {"loss_sum", "correct", "seen", "seconds"}
    if skip == 0:
        return 0, None
    if (
        not isinstance(skip, int)
        or isinstance(skip, bool)
        or not 0 < skip < steps
        or not isinstance(sums, dict)
        or set(sums) != keys
        or not all(isinstance(sums[k], int | float) for k in keys)
    ):
        raise ResumeError(
            f"resume file {path} records step {skip!r} of an epoch of {steps} and sums "
            f"{sums!r}, which no save within an epoch writes; delete it to start afresh"
        )
    return skip, dict(sums)


def _restore_training(model, optimizer, scheduler, tensors, info) -> None:
    """Put the state :func:`_save_training` saved back into a freshly built run."""
    model.load_state_dict(prefixed(tensors, "model/"))
    restore_optimizer(optimizer, tensors, info["optimizer"])
    lambdas = [None] * len(scheduler.lr_lambdas)  # functions are not saved; ours is rebuilt
    scheduler.load_state_dict({**info["scheduler"], "lr_lambdas": lambdas})
    torch.set_rng_state(tensors["rng/cpu"])
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])


def _final_result(model, data, history, start: float, eval_batch_size: int) -> TrainResult:
    """Eval-mode train and test metrics of ``model`` as it is now, with ``history``."""
    device = next(model.parameters()).device
    train_eval = evaluate(
        model, None, data.loader("train", batch_size=eval_batch_size, shuffle=False, device=device)
    )
    test_loader = data.loader("test", batch_size=eval_batch_size, device=device)
    test_eval = evaluate(model, None, test_loader)
    return TrainResult(list(history), train_eval, test_eval, time.perf_counter() - start)
