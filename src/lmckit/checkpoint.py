"""Checkpoints: safetensors weights plus a JSON sidecar that rebuilds the model.

``save_checkpoint(path, model, meta)`` writes ``<stem>.safetensors`` and ``<stem>.json``,
each to a temporary file renamed into place; the sidecar is written last, so a checkpoint
whose sidecar exists is complete. The sidecar holds the SHA-256 of the weights file
(``weights_sha256``, as ``sha256sum`` prints it) and of each of its 1 MiB chunks
(``weights_sha256_chunks``, format version 2); ``load_checkpoint`` verifies the chunks in
parallel while reading the file once: a truncated or modified file is an error naming it,
never a result. It then
checks the sidecar's model config against the file's header (no allocation for a config
that does not match), rebuilds the zoo model and checks every tensor (names, shapes,
finiteness).

Foreign PyTorch files (``.pt``/``.pth``) are read with ``torch.load(weights_only=True)`` only:
a file that needs arbitrary unpickling is refused, never executed.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import queue
import re
import struct
import sys
import threading
import warnings
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from torch import Tensor, nn

from lmckit import __version__
from lmckit._checks import check_device
from lmckit.errors import CheckpointError, LmcError, ParamsError
from lmckit.files import atomic_write_bytes, atomic_write_json, refuse_special, require_regular_file
from lmckit.functional import check_model_fits
from lmckit.models import build_model, model_config, permutation_spec
from lmckit.models.custom import class_source_digest
from lmckit.options import checked
from lmckit.params import check_finite, short_list
from lmckit.perm import PermutationSpec

FORMAT = "lmckit-checkpoint"
FORMAT_VERSION = 2  # 2: the sidecar holds the weights file's SHA-256
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def _load_failure(exc: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` failed: the unpickler's own
    reason where there is one (torch's paragraph around it recommends ``weights_only=False``,
    which is exactly what must not be done with a file of unknown origin)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\n|$)", text, re.S)
    if found:
        reason = " ".join(found.group(1).split())
        reason = reason.split(" was not an allowed global")[0]
        return f"not a plain file of tensors (the weights-only unpickler: {reason})"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if isinstance(exc, (KeyError, IndexError, EOFError)) or not lines or len(lines[0]) < 12:
        # torch.load's answer to bytes that are no pickle at all (KeyError: 105, ...)
        said = f": {lines[0]}" if lines else ""
        return f"it is not a PyTorch file (torch.load raised {type(exc).__name__}{said})"
    return lines[0]


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, sidecar)`` for a checkpoint named by its stem, weights file or sidecar."""
    path = Path(path)
    if not path.name:
        raise CheckpointError(f"{path} names no checkpoint (a folder, not a file)")
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


@checked
def save_checkpoint(
    path: str | os.PathLike, model: nn.Module, meta: Mapping[str, Any] | None = None
) -> Path:
    """Save a zoo model's ``state_dict`` and metadata; returns the weights path.

    ``meta`` is merged into the sidecar next to ``format``, ``lmckit_version``,
    ``torch_version``, ``created`` and ``model`` (the config :func:`build_model` needs).
    """
    weights, sidecar = checkpoint_paths(path)
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    data = save_tensors(tensors, metadata={"format": FORMAT})
    atomic_write_bytes(weights, data)
    info = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        "weights_sha256_chunks": {"bytes": CHUNK_BYTES, "digests": chunk_digests(data)},
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
    traced_spec: PermutationSpec | None = None  # a user's model: the spec traced for it
    weights_sha256: str = ""  # of the bytes read, computed on load (never the sidecar's word)
    code_sha256: str | None = None  # a user's class: the digest of its source
    foreign: bool = False  # a user's plain weights file, without an lmckit sidecar
    # a Hugging Face model folder (lmckit.model_folder): its layout and trace report
    layout: Any = None
    trace_report: Any = None

    @property
    def folder(self) -> bool:
        """Whether this is a Hugging Face model folder (:mod:`lmckit.model_folder`)."""
        return self.layout is not None

    @property
    def content_hash(self) -> str:
        """What results computed from this checkpoint are keyed on: the SHA-256 of the
        weights file as it was read — and, for a user's class, of that class's source too
        (the same weights under changed code are another model)."""
        if not self.weights_sha256:
            raise CheckpointError(f"{self.path}: the checkpoint was not read by lmckit's loader")
        if self.code_sha256 is None:
            return self.weights_sha256
        return hashlib.sha256(f"{self.weights_sha256}:{self.code_sha256}".encode()).hexdigest()

    @property
    def files(self) -> tuple[Path, ...]:
        """The files this checkpoint was read from: ``(weights, sidecar)``, the user's
        weights file alone, or a model folder's config, shards and index."""
        if self.foreign:
            return (self.path,)
        if self.layout is not None:
            return (self.path / "config.json", *self.layout.weight_files)
        return checkpoint_paths(self.path)

    @property
    def spec(self) -> PermutationSpec:
        """The model's permutation spec (traced, for a user's model)."""
        if self.traced_spec is not None:
            return self.traced_spec
        return permutation_spec(self.model)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The sidecar of a checkpoint, validated as lmckit's."""
    _, sidecar = checkpoint_paths(path)
    refuse_special(sidecar, "checkpoint sidecar", CheckpointError)
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
    _check_key_record(meta, sidecar)
    return meta


def _check_key_record(meta: Mapping[str, Any], sidecar: Path) -> None:
    """A sidecar that records the key of its training (``key``, the SHA-256 of the canonical
    JSON of ``key_document``) holds that document unchanged, and its ``model`` and ``train``
    are the document's: an edited sidecar (epochs 99) would be reused as another training's
    result, or describe a training that never ran."""
    key, document = meta.get("key"), meta.get("key_document")
    if key is None and document is None:
        return  # an lmckit without keys, or a checkpoint saved by hand
    if not isinstance(key, str) or not isinstance(document, dict):
        raise CheckpointError(f"{sidecar}: its key or key_document is malformed")
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=True)
    if hashlib.sha256(text.encode()).hexdigest() != key:
        raise CheckpointError(
            f"{sidecar}: its key_document was edited (it no longer hashes to its key); the "
            "sidecar does not describe the training that made these weights"
        )
    settings = document.get("settings")
    for field in ("model", "train"):
        recorded = settings.get(field) if isinstance(settings, dict) else None
        given = meta.get(field)
        if not isinstance(recorded, dict) or not isinstance(given, dict):
            continue
        # the settings both record (a sidecar may carry more, a newer document other fields)
        keys = sorted(k for k in set(recorded) & set(given) if recorded[k] != given[k])
        if keys:
            raise CheckpointError(
                f"{sidecar}: its {field!r} differs from the training its key records (in "
                f"{', '.join(keys[:4])}): the sidecar was edited"
            )


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
    """Check ``params`` against ``model.state_dict()`` (names, shapes, dtype kinds,
    finiteness) and cast to the model's dtypes; raises :class:`CheckpointError` naming
    every mismatch."""
    fit_shapes({k: v.shape for k, v in params.items()}, model, what)
    expected = model.state_dict()
    check_dtype_kinds({k: v.dtype for k, v in params.items()}, expected, what)
    check_finite(params, what, error=CheckpointError)
    return {k: params[k].to(dtype=expected[k].dtype) for k in expected}


def check_dtype_kinds(
    stored: Mapping[str, torch.dtype], expected: Mapping[str, Tensor], what: str
) -> None:
    """Refuse tensors stored as another kind of number than the model holds them: a
    floating weight stored as integers or booleans (its values cast on load — most of a
    trained weight's become 0, and the match then runs on zeros) or as complex numbers.

    Raises:
        CheckpointError: naming the first such tensors, their stored and expected dtypes.
    """
    bad = [
        f"{k} ({stored[k]}, the model's {expected[k].dtype})"
        for k in sorted(stored)
        if k in expected
        and (
            stored[k].is_complex
            or (expected[k].dtype.is_floating_point and not stored[k].is_floating_point)
        )
    ]
    if bad:
        more = f", … {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckpointError(
            f"{what}: {len(bad)} tensor(s) stored as another kind of number than the model "
            f"holds them, which no match or merge can use: {', '.join(bad[:3])}{more}"
        )


@checked
def load_checkpoint(
    path: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    classes: Collection[str] = (),
) -> Checkpoint:
    """Load an lmckit checkpoint (by stem, ``.safetensors`` or ``.json`` path).

    Args:
        classes: the user classes (``MODULE:CLASS``) a sidecar may name (``name =
            "custom"``): building one imports its module, which runs that module's code, so
            a checkpoint is never allowed to choose it — the caller names it.

    Raises:
        CheckpointError: missing or unreadable files, weights that do not match the SHA-256
            in the sidecar, a sidecar that is not lmckit's, a model config that no longer
            builds or does not fit the weights, tensors that are not finite, a user class
            not in ``classes``.
    """
    check_device(device)
    weights, _ = checkpoint_paths(path)
    meta = read_meta(path)
    model_meta = meta.get("model") if isinstance(meta.get("model"), Mapping) else {}
    custom = str(model_meta.get("name", "")).lower() == "custom"
    if custom and model_meta.get("class") not in set(classes):
        raise CheckpointError(
            f"{weights}: the checkpoint is of the user class {model_meta.get('class')!r}; "
            "importing it runs its code, so name it to load it (lmckit: --model-class "
            "MODULE:CLASS --input-shape …; Python: load_checkpoint(..., classes=[...]))"
        )
    buffer, sha256 = read_checked(weights, meta)
    header = parse_safetensors_header(buffer, weights)
    # The sidecar says what to build: check it against the file's header on the meta
    # device first, so an absurd or tampered config allocates nothing.
    with torch.device("meta"):
        skeleton = _build_from_sidecar(meta, weights)
    fit_shapes({k: torch.Size(v[1]) for k, v in header.items()}, skeleton, str(weights))
    # Every tensor of the module is about to be overwritten from the file, so its storage
    # is allocated without the random initialisation a fresh build would spend time on.
    state = set(skeleton.state_dict())
    names = [n for n, _ in skeleton.named_parameters()] + [n for n, _ in skeleton.named_buffers()]
    model = (
        skeleton.to_empty(device="cpu")
        if all(n in state for n in names)
        else _build_from_sidecar(meta, weights)
    )
    params = fit_state_dict(model, _tensors_from_buffer(buffer, header, weights), str(weights))
    model.load_state_dict(params)
    model.to(device)
    # `params` does not share storage with the module, so loading other weights into the
    # module later (e.g. a merged model) never changes this checkpoint's parameters.
    params = {k: v.to(device) for k, v in params.items()}
    code = model.config.get("source_sha256") if custom else None
    return Checkpoint(model, params, meta, weights, weights_sha256=sha256, code_sha256=code)


CHUNK_BYTES = 1 << 20


def chunk_digests(data: bytes | bytearray | memoryview, chunk: int = CHUNK_BYTES) -> list[str]:
    """SHA-256 of every ``chunk``-byte piece of ``data`` (the last may be shorter)."""
    view = memoryview(data)
    return [hashlib.sha256(view[i : i + chunk]).hexdigest() for i in range(0, len(view), chunk)]


def _sha256(piece: memoryview) -> str:
    return hashlib.sha256(piece).hexdigest()


_HASHERS: ThreadPoolExecutor | None = None
_STREAM_FROM = 32 << 20  # files at least this large are hashed while they are being read


def _hashers() -> ThreadPoolExecutor:
    """One pool of hashing threads (one per core) for the whole process."""
    global _HASHERS
    if _HASHERS is None:
        _HASHERS = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="sha")
    return _HASHERS


def read_checked(path: Path, meta: Mapping[str, Any]) -> tuple[bytearray, str]:
    """The weights file's bytes and their SHA-256, verified against every digest the
    sidecar records: the whole file's ``weights_sha256`` and the per-chunk
    ``weights_sha256_chunks`` (both required from format version 2 on; a version-1 sidecar
    that records either is held to it all the same).

    The chunks are hashed in parallel by a pool of threads (one per core; hashlib and file
    reads release the GIL) while this thread hashes the whole file in order; a large file
    is hashed while a thread is still reading it, so verification costs little beyond the
    read itself.

    Raises:
        CheckpointError: the file is missing, unreadable, or differs from a recorded digest
            (the message names the file and, for chunks, the first differing byte range).
    """
    recorded = meta.get("weights_sha256_chunks")
    whole = meta.get("weights_sha256")
    if meta.get("format_version", 1) >= 2:
        lacking = [
            k
            for k, v in (("weights_sha256_chunks", recorded), ("weights_sha256", whole))
            if v is None
        ]
        if lacking:
            raise CheckpointError(
                f"{path}: its sidecar lacks the {' and '.join(lacking)} it must carry"
            )
    if recorded is not None and not (
        isinstance(recorded, Mapping)
        and isinstance(recorded.get("bytes"), int)
        and not isinstance(recorded.get("bytes"), bool)
        and recorded["bytes"] > 0
        and isinstance(recorded.get("digests"), list)
    ):
        raise CheckpointError(f"{path}: its sidecar's weights_sha256_chunks is malformed")
    if whole is not None and not isinstance(whole, str):
        raise CheckpointError(f"{path}: its sidecar's weights_sha256 is not a digest")
    refuse_special(path, "weights file", CheckpointError)
    try:
        size = path.stat().st_size
        handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the reader below
    except FileNotFoundError:
        raise CheckpointError(f"weights file {path} not found") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    chunk = int(recorded["bytes"]) if recorded else CHUNK_BYTES
    buffer = bytearray(size)
    view = memoryview(buffer)
    pieces: queue.Queue = queue.Queue()

    def read() -> None:
        position = 0
        try:
            with handle:
                while position < size:
                    got = handle.readinto(view[position : position + chunk])
                    if not got:
                        break
                    pieces.put((position, position + got))
                    position += got
        except OSError as exc:
            pieces.put(exc)
        pieces.put(None)

    reader = threading.Thread(target=read, daemon=True) if size >= _STREAM_FROM else None
    if reader is not None:
        reader.start()
    else:
        read()
    digests = []
    sha = hashlib.sha256()
    read_bytes = 0
    while (item := pieces.get()) is not None:
        if isinstance(item, OSError):
            if reader is not None:
                reader.join()
            raise CheckpointError(f"cannot read {path}: {item.strerror or item}")
        if recorded:
            digests.append(_hashers().submit(_sha256, view[item[0] : item[1]]))
        sha.update(view[item[0] : item[1]])
        read_bytes = item[1]
    if reader is not None:
        reader.join()
    if read_bytes != size:
        raise CheckpointError(f"cannot read {path}: it shrank while being read")
    computed = sha.hexdigest()
    if recorded:
        expected = list(recorded["digests"])
        found = [d.result() for d in digests]
        if found != expected:
            first = next(
                (i for i, (x, y) in enumerate(zip(found, expected, strict=False)) if x != y),
                min(len(found), len(expected)),
            )
            raise CheckpointError(
                f"{path} does not match the SHA-256 digests recorded in its sidecar (first "
                f"difference in bytes {first * chunk}..{min((first + 1) * chunk, size)} of "
                f"{size}): the file is truncated, corrupted or was replaced; restore it or "
                "delete the checkpoint"
            )
    if whole is not None and whole != computed:
        raise CheckpointError(
            f"{path} has SHA-256 {computed}, but its sidecar records {whole}: the weights or "
            "the sidecar were changed after the checkpoint was written; restore them or "
            "delete the checkpoint"
        )
    return buffer, computed


def verify_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Check a checkpoint's weights against its sidecar's digests without building the
    model; returns the sidecar. Raises :class:`CheckpointError` naming the file."""
    weights, _ = checkpoint_paths(path)
    meta = read_meta(path)
    read_checked(weights, meta)
    return meta


SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def parse_safetensors_header(
    data: bytes | bytearray, path: Path, *, file_size: int | None = None
) -> dict[str, tuple[torch.dtype, tuple[int, ...], int, int]]:
    """``{name: (dtype, shape, start, end)}`` from safetensors ``data`` (an 8-byte
    little-endian header length, that many bytes of JSON, then the tensors' bytes; offsets
    are absolute here), checked for consistency with the file's size: ``file_size``, where
    ``data`` is only the file's beginning (at least its header), else ``len(data)``."""
    size = len(data) if file_size is None else file_size
    try:
        (length,) = struct.unpack("<Q", bytes(data[:8]))
        if length > size - 8 or 8 + length > len(data):
            raise ValueError(f"header of {length} bytes in a file of {size}")
        header = json.loads(bytes(data[8 : 8 + length]))
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(
                    f"tensor {name!r} is stored as {entry['dtype']!r}, which no model of real "
                    f"weights holds (lmckit reads {', '.join(SAFETENSORS_DTYPES)})"
                )
            shape = tuple(int(d) for d in entry["shape"])
            start, end = (8 + length + int(o) for o in entry["data_offsets"])
            itemsize = torch.empty((), dtype=dtype).element_size()
            if end > size or end - start != math.prod(shape) * itemsize:
                raise ValueError(f"tensor {name!r}: offsets do not fit its shape or the file")
            out[name] = (dtype, shape, start, end)
        return out
    except (struct.error, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None


def _tensors_from_buffer(buffer: bytearray, header, path: Path) -> dict[str, Tensor]:
    """Tensors viewing ``buffer`` (no copy; safetensors stores little-endian, as this
    machine does — anything else is refused)."""
    if sys.byteorder != "little":  # pragma: no cover - lmckit runs on little-endian machines
        raise CheckpointError(f"{path}: reading safetensors needs a little-endian machine")
    out = {}
    for name, (dtype, shape, start, end) in header.items():
        if end == start:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            count = math.prod(shape)
            out[name] = torch.frombuffer(buffer, dtype=dtype, count=count, offset=start).view(shape)
    return out


def _build_from_sidecar(meta: dict[str, Any], weights: Path) -> nn.Module:
    try:
        return build_model(meta["model"]["name"], **meta["model"])
    except (LmcError, TypeError, KeyError, ValueError) as exc:
        raise CheckpointError(
            f"{weights}: cannot rebuild the model from its sidecar: {exc}"
        ) from None


def read_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a safetensors file into a tensor dict; :class:`CheckpointError` if unreadable."""
    path = require_regular_file(path, "weights file", CheckpointError)
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None


@checked
def load_foreign(
    path: str | os.PathLike,
    model: nn.Module,
    spec: PermutationSpec,
    *,
    description: Mapping[str, Any],
    device: torch.device | str = "cpu",
) -> Checkpoint:
    """A user's weights file (``.safetensors`` or a ``weights_only`` ``.pt`` state dict,
    see :func:`import_state_dict`) loaded into ``model`` — an instance of the user's class —
    as a :class:`Checkpoint` whose spec is ``spec`` (traced for the class).

    ``description`` becomes ``meta["model"]`` (two checkpoints count as one architecture
    when their descriptions agree).

    Raises:
        CheckpointError: unreadable or unsafe file, tensors that do not fit the model
            (named), tensors that are not finite.
    """
    check_device(device)
    path = Path(path)
    data = _read_bytes(path)
    params = import_state_dict(path, data=data)
    try:
        check_model_fits(model, params, str(path))
        check_dtype_kinds({k: v.dtype for k, v in params.items()}, model.state_dict(), str(path))
        check_finite(params, str(path))
    except ParamsError as exc:
        raise CheckpointError(str(exc)) from None
    model.load_state_dict(params)
    model.to(device)
    params = {k: v.detach().clone().to(device) for k, v in params.items()}
    digest = hashlib.sha256(data).hexdigest()
    meta = {"model": dict(description), "weights_sha256": digest, "foreign": True}
    return Checkpoint(
        model=model,
        params=params,
        meta=meta,
        path=path,
        traced_spec=spec,
        weights_sha256=digest,
        code_sha256=class_source_digest(type(model)),
        foreign=True,
    )


def _read_bytes(path: Path) -> bytes:
    require_regular_file(path, "weights file", CheckpointError)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


def import_state_dict(path: str | os.PathLike, *, data: bytes | None = None) -> dict[str, Tensor]:
    """Read a foreign weights file into a flat ``{name: tensor}`` dict, safely.

    ``data``: the file's bytes, when the caller has read them already (so that what is
    parsed is what was hashed). ``.safetensors`` is read directly; anything else with
    ``torch.load(weights_only=True)``,
    which refuses pickled code. A top-level ``state_dict``/``model``/``model_state_dict`` entry
    is unwrapped and a DataParallel ``module.`` prefix stripped.

    Raises:
        CheckpointError: unreadable file, unsafe pickle, or content that is not tensors.
    """
    path = Path(path)
    if data is None:
        data = _read_bytes(path)
    if path.suffix == ".safetensors":
        try:
            return load_tensors(bytes(data))
        except (SafetensorError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path} as safetensors: {exc}") from None
    try:
        with warnings.catch_warnings():  # torch's pickle-protocol notes are not the user's news
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, zip errors ...
        raise CheckpointError(
            f"refusing or unable to load {path} with weights_only=True: {_load_failure(exc)}. "
            "lmckit never unpickles arbitrary objects; save a plain state_dict "
            "(torch.save(model.state_dict())) or safetensors instead"
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
