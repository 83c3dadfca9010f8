"""Checkpoints: safetensors weights plus a JSON sidecar that rebuilds the model.

``save_checkpoint(path, model, meta)`` writes ``<stem>.safetensors`` and ``<stem>.json``,
each to a temporary file renamed into place; the sidecar is written last, so a checkpoint
whose sidecar exists is complete. ``load_checkpoint`` rebuilds the zoo model from the
sidecar's ``model`` entry and checks every tensor (names, shapes, finiteness).

Foreign PyTorch files (``.pt``/``.pth``) are read with ``torch.load(weights_only=True)`` only:
a file that needs arbitrary unpickling is refused, never executed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lmckit import __version__
from lmckit._io import atomic_path, atomic_write_json
from lmckit.errors import CheckpointError, LmcError
from lmckit.models import build_model, model_config, permutation_spec
from lmckit.params import check_finite, short_list
from lmckit.perm import PermutationSpec

FORMAT = "lmckit-checkpoint"
FORMAT_VERSION = 1
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, sidecar)`` for a checkpoint named by its stem, weights file or sidecar."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save_checkpoint(
    path: str | os.PathLike, model: nn.Module, meta: Mapping[str, Any] | None = None
) -> Path:
    """Save a zoo model's ``state_dict`` and metadata; returns the weights path.

    ``meta`` is merged into the sidecar next to ``format``, ``lmckit_version``,
    ``torch_version``, ``created`` and ``model`` (the config :func:`build_model` needs).
    """
    weights, sidecar = checkpoint_paths(path)
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(weights) as tmp:
        save_file(tensors, tmp, metadata={"format": FORMAT})
    info = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "lmckit_version": __version__,
        "torch_version": torch.__version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": model_config(model),
        **(meta or {}),
    }
    atomic_write_json(sidecar, info)
    return weights


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the rebuilt ``model`` (weights loaded), its ``params`` dict and
    the sidecar ``meta``."""

    model: nn.Module
    params: dict[str, Tensor]
    meta: dict[str, Any]
    path: Path

    @property
    def spec(self) -> PermutationSpec:
        """The model's permutation spec."""
        return permutation_spec(self.model)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The sidecar of a checkpoint, validated as lmckit's."""
    _, sidecar = checkpoint_paths(path)
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint sidecar {sidecar} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read checkpoint sidecar {sidecar}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "model" not in meta:
        raise CheckpointError(f"{sidecar} is not an lmckit checkpoint sidecar")
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{sidecar}: format_version {version!r} is not a version number")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{sidecar}: format_version {version} was written by a newer lmckit; this one "
            f"({__version__}) reads versions up to {FORMAT_VERSION}"
        )
    if not isinstance(meta["model"], dict) or not isinstance(meta["model"].get("name"), str):
        raise CheckpointError(f"{sidecar}: 'model' must be a configuration with a 'name'")
    return meta


def fit_shapes(shapes: Mapping[str, torch.Size], model: nn.Module, what: str) -> None:
    """Raise :class:`CheckpointError` naming every name or shape of ``shapes`` that does
    not match ``model.state_dict()``."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{what} does not fit {type(model).__name__}: missing {short_list(missing)}, "
            f"unexpected {short_list(unexpected)}"
        )
    for k, ref in expected.items():
        if tuple(shapes[k]) != tuple(ref.shape):
            raise CheckpointError(
                f"{what}: {k!r} has shape {tuple(shapes[k])}, the model expects {tuple(ref.shape)}"
            )


def fit_state_dict(model: nn.Module, params: Mapping[str, Tensor], what: str) -> dict[str, Tensor]:
    """Check ``params`` against ``model.state_dict()`` (names, shapes, finiteness) and cast
    to the model's dtypes; raises :class:`CheckpointError` naming every mismatch."""
    fit_shapes({k: v.shape for k, v in params.items()}, model, what)
    check_finite(params, what, error=CheckpointError)
    expected = model.state_dict()
    return {k: params[k].to(dtype=expected[k].dtype) for k in expected}


def load_checkpoint(path: str | os.PathLike, *, device: torch.device | str = "cpu") -> Checkpoint:
    """Load an lmckit checkpoint (by stem, ``.safetensors`` or ``.json`` path).

    Raises:
        CheckpointError: missing or unreadable files, a sidecar that is not lmckit's, a model
            config that no longer builds, tensors that do not fit the model or are not finite.
    """
    weights, _ = checkpoint_paths(path)
    meta = read_meta(path)
    # The sidecar says what to build: check it against the weights file's header on the
    # meta device first, so an absurd or tampered config allocates nothing.
    header = read_safetensors_header(weights)
    with torch.device("meta"):
        skeleton = _build_from_sidecar(meta, weights)
    fit_shapes({k: torch.Size(v) for k, v in header.items()}, skeleton, str(weights))
    model = _build_from_sidecar(meta, weights)
    params = read_safetensors(weights)
    params = fit_state_dict(model, params, str(weights))
    model.load_state_dict(params)
    model.to(device)
    # `params` does not share storage with the module, so loading other weights into the
    # module later (e.g. a merged model) never changes this checkpoint's parameters.
    params = {k: v.to(device) for k, v in params.items()}
    return Checkpoint(model, params, meta, weights)


def _build_from_sidecar(meta: dict[str, Any], weights: Path) -> nn.Module:
    try:
        return build_model(meta["model"]["name"], **meta["model"])
    except (LmcError, TypeError, KeyError, ValueError) as exc:
        raise CheckpointError(
            f"{weights}: cannot rebuild the model from its sidecar: {exc}"
        ) from None


def read_safetensors_header(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a safetensors file, from its header (no data is read).

    Raises:
        CheckpointError: missing file or unreadable header.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} not found")
    try:
        with safe_open(path, framework="pt") as fh:
            return {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None


def read_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a safetensors file into a tensor dict; :class:`CheckpointError` if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} not found")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None


def import_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a foreign weights file into a flat ``{name: tensor}`` dict, safely.

    ``.safetensors`` is read directly; anything else with ``torch.load(weights_only=True)``,
    which refuses pickled code. A top-level ``state_dict``/``model``/``model_state_dict`` entry
    is unwrapped and a DataParallel ``module.`` prefix stripped.

    Raises:
        CheckpointError: unreadable file, unsafe pickle, or content that is not tensors.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, zip errors ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"refusing or unable to load {path} with weights_only=True: {first}. lmckit never "
            "unpickles arbitrary objects; save a plain state_dict (torch.save(model.state_dict()))"
            " or safetensors instead"
        ) from None
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model_state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj:
        raise CheckpointError(f"{path} does not hold a state_dict (found {type(obj).__name__})")
    not_tensors = [k for k, v in obj.items() if not isinstance(v, Tensor)]
    if not_tensors:
        raise CheckpointError(f"{path}: entries {not_tensors[:5]} are not tensors")
    params = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in params):
        params = {k[len("module.") :]: v for k, v in params.items()}
    return params
