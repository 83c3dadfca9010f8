"""Train one model per seed into a folder of checkpoints, resumably.

Each seed's checkpoint is written atomically when its training ends, so an interrupted run
loses only the seed in progress; running the same command again skips finished seeds.
A finished checkpoint trained with *different* settings is never silently reused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from lmckit._io import prepare_output_dir, writes_folder
from lmckit.checkpoint import checkpoint_paths, save_checkpoint, verify_checkpoint
from lmckit.data import Dataset, canonical_name, load_dataset
from lmckit.data.datasets import INPUT_SHAPES
from lmckit.errors import CheckpointError, ModelConfigError
from lmckit.models import ALIASES, MODELS, build_model
from lmckit.models import model_config as config_of
from lmckit.progress import ProgressCallback
from lmckit.train import TrainConfig, init_model, train

CONV_MIN_SIZE = 32


def model_name_key(name: str) -> str:
    """The registry key of ``name``; :class:`ModelConfigError` if unknown."""
    key = name.lower()
    if key not in MODELS and key not in ALIASES:
        raise ModelConfigError(f"unknown model {name!r}; available: {sorted([*MODELS, *ALIASES])}")
    return key


def needs_padding(model_name: str, input_shape: Sequence[int]) -> int | None:
    """Conv nets take 32×32 images: smaller ones (28×28 MNIST) are padded, as in the papers."""
    if model_name_key(model_name) == "mlp" or len(input_shape) != 3:
        return None
    return CONV_MIN_SIZE if max(input_shape[-2:]) < CONV_MIN_SIZE else None


def model_config_for(
    model_name: str,
    data: Dataset,
    *,
    width_multiplier: float = 1.0,
    hidden: Sequence[int] | None = None,
    norm: str | None = "default",
    skip: bool = False,
) -> dict[str, Any]:
    """A zoo configuration whose input/output sizes fit ``data``.

    For the MLP, ``hidden`` defaults to three layers of ``round(512 × width_multiplier)``.
    ``norm="default"`` keeps each model's own default (none for MLPs, BatchNorm for conv nets).
    """
    key = model_name_key(model_name)
    family = ALIASES[key][0] if key in ALIASES else key
    if not (math.isfinite(width_multiplier) and width_multiplier > 0):
        raise ModelConfigError(
            f"width_multiplier must be a positive number, got {width_multiplier}"
        )
    extra: dict[str, Any] = {} if norm == "default" else {"norm": norm}
    if family == "mlp":
        widths = list(hidden) if hidden else [max(1, round(512 * width_multiplier))] * 3
        return {
            "in_dim": math.prod(data.input_shape),
            "hidden": widths,
            "out_dim": data.num_classes,
            "skip": skip,
            **extra,
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


@dataclass(frozen=True)
class SeedOutcome:
    """What happened to one seed: trained (with its time) or skipped, and its metrics."""

    seed: int
    path: Path
    skipped: bool
    metrics: dict[str, float]
    seconds: float


def checkpoint_stem(out: Path, model_name: str, dataset: str, seed: int) -> Path:
    """``out/<model>-<dataset>-seed<N>`` (no suffix)."""
    return out / f"{model_name_key(model_name)}-{dataset}-seed{seed}"


def _settings(meta: dict[str, Any]) -> dict[str, Any]:
    train_cfg = {k: v for k, v in meta.get("train", {}).items() if k != "seed"}
    return {"model": meta.get("model"), "train": train_cfg, "dataset": meta.get("dataset")}


def _differences(found: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(found) | set(wanted)):
        a, b = found.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: found {a!r}, wanted {b!r}")
    return out


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
) -> list[SeedOutcome]:
    """Train ``model_name`` once per seed (seed fixes initialisation and data order).

    Args:
        progress: ``seed -> callback`` for per-step progress of that seed's training.
        on_seed_done: called after each seed (trained or skipped).

    Raises:
        CheckpointError: a checkpoint for this model/dataset/seed exists in ``out`` but was
            trained with different settings.
    """
    out = prepare_output_dir(out, "--out")
    outcomes = []
    with torch.device("meta"):  # validates the configuration without allocating weights
        full_model_config = config_of(build_model(model_name, **model_config))
    for seed in seeds:
        stem = checkpoint_stem(out, model_name, data.name, seed)
        weights, sidecar = checkpoint_paths(stem)
        seed_config = replace(config, seed=int(seed))
        if sidecar.exists() and weights.exists():
            meta = verify_checkpoint(stem)  # a damaged file is an error, never "done"
            wanted = _settings(
                {"model": full_model_config, "train": seed_config.to_dict(), "dataset": data.name}
            )
            differences = _differences(_settings(meta), wanted)
            if differences:
                raise CheckpointError(
                    f"{weights} exists but was trained with other settings ("
                    + "; ".join(differences)
                    + "); use another --out folder or remove it"
                )
            outcome = SeedOutcome(seed, weights, True, meta.get("metrics", {}), 0.0)
        else:
            model = init_model(model_name, model_config, seed).to(device)
            result = train(model, data, seed_config, progress=progress(seed) if progress else None)
            meta = {
                "train": seed_config.to_dict(),
                "seed": int(seed),
                "dataset": data.name,
                "dataset_source": data.source,
                "metrics": result.metrics_dict(),
                "history": [vars(h) for h in result.history],
                "train_seconds": result.seconds,
            }
            save_checkpoint(stem, model, meta)
            outcome = SeedOutcome(seed, weights, False, result.metrics_dict(), result.seconds)
        outcomes.append(outcome)
        if on_seed_done is not None:
            on_seed_done(outcome)
    return outcomes


def load_for_model(model_name: str, dataset: str, root=None, *, download: bool = True) -> Dataset:
    """Load ``dataset`` shaped for ``model_name`` (28×28 images padded to 32×32 for conv nets)."""
    pad = needs_padding(model_name, INPUT_SHAPES[canonical_name(dataset)])
    return load_dataset(dataset, root, download=download, pad_to=pad)
