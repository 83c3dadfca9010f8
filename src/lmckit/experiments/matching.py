"""Matching two checkpoints by name of method, and permutation files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmckit._io import atomic_write_json
from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset
from lmckit.errors import LmcError, ParamsError, PermutationError
from lmckit.match import (
    MatchResult,
    activation_matching,
    sinkhorn_matching,
    ste_matching,
    weight_matching,
)
from lmckit.perm import Permutation, PermutationSpec

METHODS = ("wm", "wm-fast", "am", "ste", "sinkhorn")
NEEDS_DATA = ("am", "ste")  # sinkhorn here uses the weight-distance objective


def check_same_architecture(a: Checkpoint, b: Checkpoint) -> None:
    """Raise :class:`ParamsError` unless both checkpoints record the same model config."""
    if a.meta["model"] != b.meta["model"]:
        raise ParamsError(
            f"checkpoints have different architectures: {a.path} is {a.meta['model']}, "
            f"{b.path} is {b.meta['model']}"
        )


def match_checkpoints(
    a: Checkpoint,
    b: Checkpoint,
    method: str,
    data: Dataset | None = None,
    *,
    seed: int = 0,
    epochs: int = 1,
    lr: float | None = None,
    batch_size: int = 256,
    progress=None,
) -> MatchResult:
    """Permute checkpoint B onto A with ``method``:

    ``wm`` weight matching with cold LAP solves; ``wm-fast`` weight matching with dual warm
    starts (same optimum, faster); ``am`` activation matching (correlation) on the training
    split; ``ste`` the straight-through estimator (Adam, ``lr`` default 1e-3); ``sinkhorn``
    Sinkhorn re-basin on the weight distance (``lr`` default 0.1).
    """
    if method not in METHODS:
        raise LmcError(f"method must be one of {METHODS}, got {method!r}")
    check_same_architecture(a, b)
    if method in NEEDS_DATA and data is None:
        raise LmcError(f"method {method!r} needs data")
    spec = a.spec
    if method in ("wm", "wm-fast"):
        return weight_matching(spec, a.params, b.params, seed=seed, warm_start=method == "wm-fast")
    if method == "am":
        loader = data.loader("train", batch_size=1000, shuffle=False)
        return activation_matching(a.model, a.params, b.params, loader, spec=spec)
    if method == "ste":
        return ste_matching(
            a.model,
            a.params,
            b.params,
            data,
            spec=spec,
            epochs=epochs,
            lr=lr or 1e-3,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
        )
    return sinkhorn_matching(spec, a.params, b.params, lr=lr or 0.1, seed=seed, progress=progress)


def save_match(path: str | Path, result: MatchResult, **extra: Any) -> None:
    """Write a permutation file: the permutation, its group sizes and the match's summary."""
    atomic_write_json(
        Path(path),
        {
            "format": "lmckit-permutation",
            "method": result.method,
            "groups": dict(result.perm.spec.groups),
            "perm": result.perm.to_dict(),
            "distance_before": result.distance_before,
            "distance_after": result.distance_after,
            "seconds": result.seconds,
            "iterations": result.iterations,
            "history": list(result.history),
            **extra,
        },
    )


def load_permutation(path: str | Path, spec: PermutationSpec) -> Permutation:
    """Read a permutation file written by :func:`save_match` (or ``{group: [indices]}``)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PermutationError(f"cannot read permutation file {path}: {exc}") from None
    perm = data.get("perm", data) if isinstance(data, dict) else data
    groups = data.get("groups") if isinstance(data, dict) else None
    if groups is not None and dict(groups) != dict(spec.groups):
        raise PermutationError(
            f"{path} was made for groups {groups}, this model has {dict(spec.groups)}"
        )
    return Permutation.from_dict(perm, spec)
