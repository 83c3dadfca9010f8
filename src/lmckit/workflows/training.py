"""Train one model per seed into a folder of checkpoints, resumably.

Each seed's checkpoint is written atomically when its training ends, so an interrupted run
loses only the seed in progress; running the same command again skips finished seeds.
A finished checkpoint trained with *different* settings is never silently reused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lmckit.budget import Budget, check_budget, forward_seconds
from lmckit.checkpoint import checkpoint_paths, save_checkpoint, verify_checkpoint
from lmckit.data import Dataset, Split, canonical_name, load_dataset
from lmckit.data.datasets import INPUT_SHAPES
from lmckit.errors import CheckpointError, ModelConfigError, ParamsError
from lmckit.files import prepare_output_dir, writes_folder
from lmckit.models import ALIASES, MODELS, build_model
from lmckit.models import model_config as config_of
from lmckit.models.norms import scaled_width
from lmckit.options import Count, Positive, check_value
from lmckit.progress import ProgressCallback
from lmckit.resume import save_interval
from lmckit.store import make_key
from lmckit.train import (
    TrainConfig,
    TrainingDiverged,
    init_model,
    split_record,
    train,
    train_examples,
)

CONV_MIN_SIZE = 32
LANGUAGE_MODELS = ("gpt", "llama")  # the zoo's models of token ids


def model_name_key(name: str) -> str:
    """The registry key of ``name``; :class:`ModelConfigError` if unknown."""
    key = name.lower()
    if key not in MODELS and key not in ALIASES and key != "custom":
        raise ModelConfigError(
            f"unknown model {name!r}; available: {sorted([*MODELS, *ALIASES, 'custom'])}"
        )
    return key


def needs_padding(model_name: str, input_shape: Sequence[int]) -> int | None:
    """Conv nets take 32×32 images: smaller ones (28×28 MNIST) are padded, as in the papers.
    MLPs and transformers take the images as they are."""
    if model_name_key(model_name) in ("mlp", "vit", "transformer", *LANGUAGE_MODELS, "custom"):
        return None
    if len(input_shape) != 3:
        return None
    return CONV_MIN_SIZE if max(input_shape[-2:]) < CONV_MIN_SIZE else None


def model_config_for(
    model_name: str,
    data: Dataset,
    *,
    width_multiplier: float | None = None,
    hidden: Sequence[int] | None = None,
    norm: str | None = "default",
    skip: bool | None = None,
    **custom: Any,
) -> dict[str, Any]:
    """A zoo configuration whose input/output sizes fit ``data``.

    For the MLP, ``hidden`` lists the hidden widths, or ``width_multiplier`` (default 1)
    scales three layers of 512 — not both. ``skip`` (residual connections) is the MLP's
    alone; ``width_multiplier`` scales the conv nets' channels and the transformers'
    widths. ``norm="default"`` keeps each model's own default (none for MLPs, BatchNorm for
    conv nets); ``"none"`` is no normalisation. A user's class (``model_name="custom"``)
    takes ``class`` (``MODULE:CLASS``) and ``args`` (its keyword arguments, which must fit
    the data themselves) and gets the data's example shape as its ``input_shape``; the
    zoo's options do not apply to it. An option that does not apply to the model, or a value
    of the wrong type, is a :class:`ModelConfigError` naming it.
    """
    key = model_name_key(model_name)
    given = {
        "width_multiplier": width_multiplier is not None,
        "hidden": hidden is not None,
        "norm": norm != "default",
        "skip": skip is not None,
    }
    if key == "custom":
        unknown = [k for k, g in given.items() if g] + sorted(set(custom) - {"class", "args"})
        if unknown or "class" not in custom:
            raise ModelConfigError(
                'a custom model takes class = "MODULE:CLASS" and args = {...} (its keyword '
                f"arguments) and no other option; got {sorted([*custom, *unknown])}"
            )
        check_model_option("class", custom["class"], str)
        check_model_option("args", custom.get("args") or {}, Mapping[str, Any])
        return {
            "class": custom["class"],
            "args": dict(custom.get("args") or {}),
            "input_shape": list(data.input_shape),
        }
    if custom:
        raise ModelConfigError(f"{model_name} got unknown option(s) {sorted(custom)}")
    family = ALIASES[key][0] if key in ALIASES else key
    if family not in LANGUAGE_MODELS and data.next_token:
        raise ModelConfigError(
            f"{model_name} takes real-valued inputs; {data.name} holds token ids "
            f"{tuple(data.train_x.shape[1:])} (a language model's data: train gpt or llama "
            "on it)"
        )
    inapplicable = [k for k in ("hidden", "skip") if given[k] and family != "mlp"]
    if inapplicable:
        raise ModelConfigError(
            f"{model_name} takes no {' or '.join(inapplicable)} (MLP options); its width is "
            "set by width_multiplier"
        )
    if given["hidden"] and given["width_multiplier"]:
        raise ModelConfigError(
            "give the MLP's hidden widths or a width_multiplier of its 3×512 layers, not both"
        )
    if width_multiplier is None:
        width_multiplier = 1.0
    check_model_option("width_multiplier", width_multiplier, Positive)
    if norm != "default":
        check_model_option("norm", norm, Literal["batch", "layer"] | None)
    extra: dict[str, Any] = {} if norm == "default" else {"norm": norm}
    if family == "mlp":
        if hidden is not None:
            check_model_option("hidden", hidden, Sequence[Count])
            if not hidden:
                raise ModelConfigError("hidden must list at least one width")
        check_model_option("skip", bool(skip) if skip is None else skip, bool)
        widths = list(hidden) if hidden else [scaled_width(512, width_multiplier)] * 3
        return {
            "in_dim": math.prod(data.input_shape),
            "hidden": widths,
            "out_dim": data.num_classes,
            "skip": bool(skip),
            **extra,
        }
    if family in LANGUAGE_MODELS:
        # width_multiplier scales the stream (128 at ×1, a multiple of the 4 heads of even
        # size) and the MLP: 4 × the stream for GPT-2's GELU MLP, ⅔ of that rounded up to a
        # multiple of 8 for Llama's SwiGLU (the same parameters: it has three matrices); the
        # context is the data's window
        dim = (
            4 * scaled_width(32, width_multiplier)
            if family == "gpt"
            else 8 * scaled_width(16, width_multiplier)
        )
        shape = data.input_shape
        if not data.next_token:
            raise ModelConfigError(
                f"{family} takes token ids (N, length); {data.name} has inputs {shape} of "
                f"{data.train_x.dtype} (a language model needs a text dataset: python-stdlib)"
            )
        mlp_dim = 4 * dim if family == "gpt" else 8 * math.ceil(8 * dim / 3 / 8)
        return {
            "vocab_size": data.num_classes,
            "context": shape[0],
            "dim": dim,
            "mlp_dim": mlp_dim,
        }
    if family in ("vit", "transformer"):
        # width_multiplier scales the residual stream (64 at ×1, a multiple of the 4 heads)
        # and the MLP (2 × the stream)
        dim = 4 * scaled_width(16, width_multiplier)
        shape = data.input_shape
        if family == "transformer":
            return {
                "in_dim": shape[-1],
                "length": math.prod(shape[:-1]),
                "num_classes": data.num_classes,
                "dim": dim,
                "mlp_dim": 2 * dim,
            }
        if len(shape) != 3 or shape[1] != shape[2] or shape[1] % 7:
            raise ModelConfigError(
                f"vit takes square images whose side is a multiple of 7 (patch 7); "
                f"{data.name} has shape {shape}"
            )
        return {
            "image_size": shape[1],
            "patch_size": 7,
            "in_channels": shape[0],
            "num_classes": data.num_classes,
            "dim": dim,
            "mlp_dim": 2 * dim,
        }
    if len(data.input_shape) != 3:
        raise ModelConfigError(
            f"{model_name} needs image data; {data.name} has shape {data.input_shape}"
        )
    return {
        "width_multiplier": width_multiplier,
        "in_channels": data.input_shape[0],
        "num_classes": data.num_classes,
        **extra,
    }


def check_model_option(name: str, value: Any, hint: Any) -> None:
    """:func:`lmckit.options.check_value` for a model option (a :class:`ModelConfigError`)."""
    try:
        check_value(name, value, hint)
    except ParamsError as exc:
        raise ModelConfigError(str(exc)) from None


@dataclass(frozen=True)
class SeedOutcome:
    """What happened to one seed: trained (with its time) or skipped, and its metrics."""

    seed: int
    path: Path
    skipped: bool
    metrics: dict[str, float]
    seconds: float
    diverged: dict[str, Any] | None = None  # kept although it diverged (keep_diverged)


def checkpoint_stem(
    out: Path, model_name: str, dataset: str, seed: int, split: Split | None = None
) -> Path:
    """``out/<model>-<dataset>-seed<N>`` (no suffix), and ``-<kind>-part<k>`` after it for
    a model trained on one part of a split (``parta``/``partb`` for the class-imbalanced
    halves)."""
    stem = f"{model_name_key(model_name)}-{dataset}-seed{seed}"
    if split is not None:
        part = "ab"[split.part] if split.kind == "class-imbalanced" else str(split.part)
        stem += f"-{split.kind}-part{part}"
    return out / stem


def _differences(found: Any, wanted: Any, prefix: str = "") -> list[str]:
    if isinstance(found, dict) and isinstance(wanted, dict):
        out = []
        for key in sorted(set(found) | set(wanted)):
            out += _differences(found.get(key), wanted.get(key), f"{prefix}{key}.")
        return out
    return [] if found == wanted else [f"{prefix.rstrip('.')}: found {found!r}, wanted {wanted!r}"]


def training_key(
    model_name: str, model_config: dict[str, Any], config: TrainConfig, data: Dataset
) -> tuple[str, dict[str, Any]]:
    """``(key, document)`` of a trained checkpoint: the full model configuration, the
    training configuration (seed included), the dataset's fingerprint and lmckit's
    version. The key is recorded in the checkpoint's sidecar."""
    with torch.device("meta"):  # validates the configuration without allocating weights
        full_model_config = config_of(build_model(model_name, **model_config))
    return make_key(
        "checkpoint",
        {"model": full_model_config, "train": config.to_dict()},
        dataset=data.fingerprint,
    )


def check_training_budget(
    model_name: str,
    model_config: dict[str, Any],
    data: Dataset,
    config: TrainConfig,
    budget: Budget | None,
) -> None:
    """Refuse a model whose weights, gradients and optimiser state would not fit in memory
    (counted on the meta device: nothing is allocated) — a width multiplier of 10⁴ is an
    error in a second, not a ``MemoryError`` after minutes."""
    if budget is None:
        return
    with torch.device("meta"):
        skeleton = build_model(model_name, **model_config)
    numel = sum(t.numel() for t in skeleton.state_dict().values())
    # θ, ∇ and the optimiser's moments
    copies = 4 if config.optimizer in ("adam", "adamw", "sophia", "sophia-l2") else 3
    check_budget(
        f"{model_name} with {numel:,} parameters",
        memory=numel * 4 * copies,
        detail=f"{copies} float32 copies: weights, gradients and {config.optimizer}'s state",
        budget=budget,
    )


def check_training_time(
    model: nn.Module, data: Dataset, config: TrainConfig, what: str, budget: Budget
) -> None:
    """Refuse a training whose epochs cannot finish in the budget: one forward pass of
    ``model`` is timed and scaled to the epochs' examples (a lower bound: training also
    runs the backward pass)."""
    seconds, n = forward_seconds(model, None, data.loader("test", batch_size=256))
    examples = train_examples(config, data)
    per_epoch = examples * seconds / max(n, 1)
    check_budget(
        f"{what} for {config.epochs} epoch(s)",
        seconds=config.epochs * per_epoch,
        detail=f"each epoch ≥ a forward pass over {examples} examples, {per_epoch:.2g} s measured",
        budget=budget,
    )


def train_checkpoint(
    model_name: str,
    model_config: dict[str, Any],
    data: Dataset,
    config: TrainConfig,
    stem: Path,
    *,
    progress: ProgressCallback | None = None,
    device: str = "cpu",
    keep_diverged: bool = False,
    budget: Budget | None = None,
) -> SeedOutcome:
    """Train one model into the checkpoint ``stem`` — or reuse the checkpoint there if it
    records exactly this training's key (and its weights verify). While it trains, its
    state is saved to ``<stem>.resume`` at epoch ends (at most once a minute) and within
    epochs (every ten minutes): a run killed half-way and started again goes on from there
    (:func:`~lmckit.train.train`'s ``resume``); the file is deleted once the checkpoint is
    written.

    A run that diverges (:class:`~lmckit.train.TrainingDiverged`) writes no checkpoint at
    ``stem``: its last good state is saved as ``<stem>-last-good`` (recording the
    divergence, without a training key, so it is never taken for a finished run) and the
    error says where. ``keep_diverged``: a run whose loss rose but stayed finite is trained
    to the end and saved at ``stem``, its sidecar recording the divergence. ``budget``: the
    model's memory and the run's time are estimated first (:func:`check_training_budget`,
    one forward pass timed) and a run beyond it is refused.

    Raises:
        CheckpointError: a checkpoint exists at ``stem`` with another key; the message lists
            what differs (settings, dataset, lmckit version).
        TrainingDiverged: the run diverged (and was not to be kept).
    """
    key, document = training_key(model_name, model_config, config, data)
    weights, sidecar = checkpoint_paths(stem)
    if sidecar.exists() and weights.exists():
        meta = verify_checkpoint(stem)  # a damaged file is an error, never "done"
        if meta.get("key") != key:
            found = meta.get("key_document", {"note": "made by an lmckit without keys"})
            raise CheckpointError(
                f"{weights} exists but was trained otherwise ("
                + "; ".join(_differences(found, document)[:6])
                + "); use another --out folder or remove it"
            )
        return SeedOutcome(
            config.seed, weights, True, meta.get("metrics", {}), 0.0, meta.get("diverged")
        )
    check_training_budget(model_name, model_config, data, config, budget)
    model = init_model(model_name, model_config, config.model_seed).to(device)
    if budget is not None:
        check_training_time(model, data, config, f"training {model_name}", budget)
    resume = stem.with_name(f"{stem.name}.resume")  # a killed run goes on from its last save
    try:
        result = train(
            model, data, config, progress=progress, keep_diverged=keep_diverged, resume=resume
        )
    except TrainingDiverged as exc:
        kept = stem.with_name(f"{stem.name}-last-good")
        record = {"epoch": exc.epoch, "loss": exc.loss, "start_loss": exc.start_loss}
        save_checkpoint(
            kept,
            model,  # train() left it at its last good state
            {
                "train": config.to_dict(),
                "seed": int(config.seed),
                "dataset": data.name,
                "diverged": record,
                "epochs_completed": exc.last_good_epoch,
                "history": [vars(h) for h in exc.history],
            },
        )
        raise TrainingDiverged(
            f"{exc}; no checkpoint written at {weights} — the last good state (after "
            f"{exc.last_good_epoch} epoch(s)) is kept at {checkpoint_paths(kept)[0]}"
            + (" (or pass --keep-diverged to train on)" if math.isfinite(exc.loss) else ""),
            epoch=exc.epoch,
            loss=exc.loss,
            start_loss=exc.start_loss,
            last_good=exc.last_good,
            last_good_epoch=exc.last_good_epoch,
            history=exc.history,
        ) from None
    diverged = result.extra.get("diverged")
    meta = {
        "key": key,
        "key_document": document,
        "train": config.to_dict(),
        "seed": int(config.seed),
        "split": split_record(config, data),
        "dataset": data.name,
        "dataset_source": data.source,
        "train_examples": train_examples(config, data),
        "metrics": result.metrics_dict(),
        "history": [vars(h) for h in result.history],
        "train_seconds": result.seconds,
        **({"diverged": diverged} if diverged else {}),
    }
    save_checkpoint(stem, model, meta)
    resume.unlink(missing_ok=True)
    return SeedOutcome(config.seed, weights, False, result.metrics_dict(), result.seconds, diverged)


@writes_folder("out")
def train_seeds(
    model_name: str,
    model_config: dict[str, Any],
    data: Dataset,
    config: TrainConfig,
    seeds: Sequence[int],
    out: str | Path,
    *,
    progress: Callable[[int], ProgressCallback | None] | None = None,
    on_seed_done: Callable[[SeedOutcome], None] | None = None,
    device: str = "cpu",
    keep_diverged: bool = False,
    budget: Budget | None = None,
) -> list[SeedOutcome]:
    """Train ``model_name`` once per seed (seed fixes initialisation and data order) into
    ``out/<model>-<dataset>-seed<N>``; a checkpoint already there is reused only if it
    records exactly the same key (:func:`train_checkpoint`).

    Args:
        progress: ``seed -> callback`` for per-step progress of that seed's training.
        on_seed_done: called after each seed (trained or skipped).
        keep_diverged, budget: see :func:`train_checkpoint`.

    Raises:
        CheckpointError: a checkpoint for this model/dataset/seed exists in ``out`` but was
            trained otherwise, or its weights do not verify.
    """
    out = prepare_output_dir(out, "--out")
    training_key(model_name, model_config, config, data)  # a bad configuration fails first
    save_interval()  # and a bad $LMCKIT_RESUME_EVERY
    outcomes = []
    for seed in seeds:
        outcome = train_checkpoint(
            model_name,
            model_config,
            data,
            replace(config, seed=int(seed)),
            checkpoint_stem(out, model_name, data.name, seed, config.split),
            progress=progress(seed) if progress else None,
            device=device,
            keep_diverged=keep_diverged,
            budget=budget,
        )
        outcomes.append(outcome)
        if on_seed_done is not None:
            on_seed_done(outcome)
    return outcomes


def load_for_model(model_name: str, dataset: str, root=None, *, download: bool = True) -> Dataset:
    """Load ``dataset`` shaped for ``model_name`` (28×28 images padded to 32×32 for conv nets)."""
    pad = needs_padding(model_name, INPUT_SHAPES[canonical_name(dataset)])
    return load_dataset(dataset, root, download=download, pad_to=pad)
