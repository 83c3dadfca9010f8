"""Resume files: the state of a long computation, saved between its steps so that a run
killed half-way goes on from its last saved step instead of from the start.

A resume file is one safetensors file: the tensors of the state (weights, optimiser
moments, random-number-generator states) and, in its metadata, a JSON document with the
state's other values and a **fingerprint** of the run it belongs to (its configuration,
the shapes of its tensors, a hash of its starting weights — whatever the caller names).
A file whose fingerprint differs from the run asking for it is refused with an error that
names what differs: a resumed run is the same run or none. Files are written to a
temporary name and renamed into place, so a kill during a save leaves the previous state.

No pickle is involved: safetensors holds only tensors, the metadata only JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from lmckit.errors import LmcError, ParamsError
from lmckit.files import atomic_path

__all__ = [
    "ResumeError",
    "check_resume_every",
    "load_resume_state",
    "optimizer_state",
    "prefixed",
    "restore_optimizer",
    "save_interval",
    "save_resume_state",
    "saved_progress",
    "tensors_digest",
]

FORMAT = "lmckit-resume"
FORMAT_VERSION = 1


class ResumeError(LmcError):
    """A resume file is unreadable or belongs to another run."""


def check_resume_every(resume: object, resume_every: object, where: str) -> None:
    """A save interval given without a resume file would be ignored: refuse it.

    Raises:
        ParamsError: ``resume_every`` is set and ``resume`` is ``None``.
    """
    if resume is None and resume_every is not None:
        raise ParamsError(f"{where}: resume_every applies only with resume=FILE")


def save_interval(seconds: float | None = None) -> float:
    """Seconds between two saves of a resume file: ``seconds`` if given, else the
    environment variable ``LMCKIT_RESUME_EVERY``, else 60.

    Raises:
        ResumeError: the value is not a finite number ≥ 0.
    """
    text = str(seconds) if seconds is not None else os.environ.get("LMCKIT_RESUME_EVERY", "60")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        what = "resume_every" if seconds is not None else "LMCKIT_RESUME_EVERY"
        raise ResumeError(f"{what} must be a number of seconds ≥ 0, got {text!r}")
    return value


def tensors_digest(tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 over the names, dtypes, element counts and bytes of ``tensors`` (sorted by
    name): equal for equal state, whatever the device. Shapes are not in it (callers that
    need them fingerprint them beside it); changing what it covers would orphan every
    resume file saved before."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous().reshape(-1)  # 0-d views fail
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_resume_state(
    path: str | os.PathLike,
    tensors: Mapping[str, Tensor],
    info: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
) -> None:
    """Write ``tensors`` (any devices; stored on the CPU) and the JSON-able ``info`` to
    ``path`` atomically, under ``fingerprint`` (JSON-able; :func:`load_resume_state`
    compares it)."""
    # copies: entries may share memory (a permutation and the LAP answer it came from),
    # which safetensors refuses
    cpu = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "fingerprint": json.dumps(fingerprint, sort_keys=True),
        "info": json.dumps(info, sort_keys=True, allow_nan=True),
    }
    with atomic_path(path) as tmp:
        save_file(cpu, str(tmp), metadata=metadata)


def load_resume_state(
    path: str | os.PathLike, fingerprint: Mapping[str, Any]
) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """``(tensors, info)`` saved at ``path`` for a run with this ``fingerprint``; ``None``
    when there is no file.

    Raises:
        ResumeError: the file is unreadable or not a resume file, or was saved by a run with
            another fingerprint (the message names the first differing entries).
    """
    path = Path(path)
    if not path.exists():
        return None
    if path.is_dir():
        raise ResumeError(f"resume file {path} is a directory; give the path of a file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
        if metadata.get("format") != FORMAT:
            raise ResumeError(f"{path} is not an lmckit resume file")
        saved = json.loads(metadata["fingerprint"])
        info = json.loads(metadata["info"])
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise ResumeError(
            f"resume file {path} is unreadable ({exc}); delete it to start the run afresh"
        ) from None
    expected = json.loads(json.dumps(fingerprint, sort_keys=True))
    if saved != expected:
        raise ResumeError(
            f"resume file {path} belongs to another run ({_difference(saved, expected)}); "
            "delete it to start afresh, or give this run another resume path"
        )
    return tensors, info


def saved_progress(path: str | os.PathLike) -> dict[str, Any] | None:
    """What a resume file says of its run's progress — ``epoch`` (done), ``epochs`` (in
    all), ``step_in_epoch`` (batches of the next epoch done, 0 or absent at an epoch's
    end), ``steps_per_epoch`` (where the run knows it), ``seconds`` (spent so far),
    ``resumed_from`` (the ``epoch``, ``step_in_epoch`` and ``seconds`` the process that
    saved it started from: its own pace, unlike the whole run's, leaves out earlier
    processes on busier or stopped machines; absent in files of older lmckits), ``unit``
    (what ``epoch`` counts when not epochs: ``"point"`` for an interpolation's λ points) —
    read from its metadata alone; ``None`` for a file that is missing or unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            info = json.loads((f.metadata() or {})["info"])
    except (SafetensorError, OSError, KeyError, ValueError):
        return None
    keys = (
        "epoch",
        "epochs",
        "step_in_epoch",
        "steps_per_epoch",
        "seconds",
        "resumed_from",
        "unit",
    )
    return {k: info.get(k) for k in keys}


def _difference(saved: Any, expected: Any, path: str = "") -> str:
    """The entries of two fingerprints that differ, as ``key.path: saved → now`` (at most
    3), nested tables compared entry by entry."""
    diffs = list(_differences(saved, expected, path))
    return "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")


def _differences(saved: Any, expected: Any, path: str) -> Iterator[str]:
    if isinstance(saved, dict) and isinstance(expected, dict):
        for k in sorted(set(saved) | set(expected)):
            yield from _differences(
                saved.get(k, "(absent)"), expected.get(k, "(absent)"), f"{path}.{k}" if path else k
            )
    elif saved != expected:
        yield f"{path}: {_short(saved)} → {_short(expected)}"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def prefixed(tensors: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``tensors`` whose names start with ``prefix``, the prefix removed."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def optimizer_state(
    optimizer: torch.optim.Optimizer, prefix: str = "optimizer/"
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """An optimiser's ``state_dict()`` split into tensors (keys ``{prefix}{param}/{name}``)
    and a JSON-able rest (its non-tensor per-parameter values and its param groups)."""
    sd = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, Any] = {}
    for index, values in sd["state"].items():
        for name, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"{prefix}{index}/{name}"] = value
            else:
                scalars[f"{index}/{name}"] = value
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    return tensors, {"scalars": scalars, "groups": json.loads(json.dumps(groups))}


def restore_optimizer(
    optimizer: torch.optim.Optimizer,
    tensors: Mapping[str, Tensor],
    rest: Mapping[str, Any],
    prefix: str = "optimizer/",
) -> None:
    """Load into ``optimizer`` (built afresh for the same parameters and options) what
    :func:`optimizer_state` took from one; tensors move to their parameters' devices."""
    fresh = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith(prefix):
            index, name = key[len(prefix) :].split("/", 1)
            state.setdefault(int(index), {})[name] = value
    for key, value in rest["scalars"].items():
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = value
    groups = []
    for current, saved in zip(fresh["param_groups"], rest["groups"], strict=True):
        group = dict(current)
        for k, v in saved.items():  # JSON turned tuples (Adam's betas) into lists
            group[k] = tuple(v) if isinstance(current.get(k), tuple) else v
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
