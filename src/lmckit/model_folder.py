"""Hugging Face model folders: read one as a :class:`~lmckit.checkpoint.Checkpoint`, write
an aligned or merged model back as a folder of the same architecture and sharding.

A model folder is what ``save_pretrained`` writes: ``config.json`` beside its weights,
either ``model.safetensors`` or shards ``model-0000i-of-0000n.safetensors`` listed by
``model.safetensors.index.json``. :func:`load_model_folder` checks the folder's layout from
the files' headers alone (every shard the index names is there, every tensor is in the
shard the index says, no tensor twice), hashes every file, and builds the model with
``transformers`` from the folder's own config (``from_pretrained`` with
``local_files_only=True``: never a download; the weights memory-mapped, not copied). Every
tensor of the model must come from the folder — a missing or extra tensor, a shape that
does not fit, a NaN is an error naming it, never a silently re-initialised weight. The
permutation spec is traced on the loaded model (:func:`lmckit.tracing.trace_report`; verified
in float32 where the float64 copies would not fit in memory) and its report kept, so that
a folder the tracer cannot cover completely is announced before any long work.

:func:`write_model_folder` writes a model shard by shard, tensor by tensor (one tensor in
memory at a time; each tensor in its stored dtype), into the source folder's shard files
and index; ``config.json`` and the folder's other small files (generation config,
tokenizer) are copied byte for byte; ``lmckit.json`` beside them records the inputs, the
method and the SHA-256 of every file written. ``from_pretrained(folder)`` loads the result.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmckit import __version__
from lmckit._checks import check_device
from lmckit.budget import check_max_memory
from lmckit.checkpoint import (
    SAFETENSORS_DTYPES,
    Checkpoint,
    check_dtype_kinds,
    parse_safetensors_header,
)
from lmckit.errors import CheckpointError, ParamsError, UsageError
from lmckit.files import (
    atomic_path,
    atomic_write_json,
    check_not_inputs,
    describe_path,
    held_inputs,
    input_at,
    leading_format,
    refuse_special,
)
from lmckit.options import checked
from lmckit.params import check_finite
from lmckit.perm import Permutation, PermutationSpec, permute_tensor

__all__ = [
    "FOLDER_FORMAT",
    "SIDECAR",
    "FolderLayout",
    "example_inputs",
    "frozen_summary",
    "is_model_folder",
    "load_model_folder",
    "load_model_folders",
    "output_names",
    "provenance",
    "read_layout",
    "write_model_folder",
]

FOLDER_FORMAT = "lmckit-model-folder"
SIDECAR = "lmckit.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# config fields that describe how a folder was saved, not the architecture
VOLATILE_CONFIG = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")
_DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a folder, as its shard's header says."""

    shard: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offsets in the shard file
    end: int


@dataclass(frozen=True)
class FolderLayout:
    """A model folder as read from its files' headers (no tensor data read).

    Attributes:
        folder: the folder.
        config: ``config.json`` as parsed.
        shards: ``{file name: [tensor names in the order of their bytes]}``.
        tensors: ``{tensor name: TensorEntry}``.
        index: ``model.safetensors.index.json`` as parsed, or ``None`` for a single file.
        module_names: ``{tensor name in the folder: name in the loaded model's
            state_dict}`` where the two differ (``transformers`` renames some architectures'
            tensors as it loads them: a ViT folder's ``…attention.attention.key.weight`` is
            the model's ``…attention.k_proj.weight``); empty where they agree. Set by
            :func:`load_model_folder`.
        unwritable: why the model cannot be written back in the folder's layout (its
            tensors are converted on load, not only renamed), or ``None``.
    """

    folder: Path
    config: dict[str, Any]
    shards: dict[str, list[str]]
    tensors: dict[str, TensorEntry]
    index: dict[str, Any] | None
    module_names: Mapping[str, str] = field(default_factory=dict)
    unwritable: str | None = None

    def module_name(self, name: str) -> str:
        """The loaded model's name for the folder's tensor ``name``."""
        return self.module_names.get(name, name)

    @property
    def weight_files(self) -> list[Path]:
        """The weight files, and the index if there is one."""
        files = [self.folder / s for s in self.shards]
        return files + ([self.folder / INDEX] if self.index is not None else [])

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in the folder."""
        return sum(e.end - e.start for e in self.tensors.values())

    def architecture(self) -> dict[str, Any]:
        """The config without the fields that say how it was saved (path, versions, dtype):
        two folders with equal architectures hold interchangeable models."""
        return {k: v for k, v in self.config.items() if k not in VOLATILE_CONFIG}


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding ``config.json``, ``model.safetensors`` or a shard
    index — what a model folder holds (:func:`read_layout` says what is wrong with it); a
    folder of lmckit checkpoints is none."""
    path = Path(path)
    return path.is_dir() and any((path / n).is_file() for n in ("config.json", SINGLE, INDEX))


def _read_header(path: Path) -> dict[str, TensorEntry]:
    """``{name: TensorEntry}`` from a safetensors file's header alone, checked against the
    file's size (offsets within the file, each tensor's byte count its shape's)."""
    refuse_special(path, "weights file", CheckpointError)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            start = fh.read(8)
            (length,) = struct.unpack("<Q", start) if len(start) == 8 else (size,)
            data = start + fh.read(min(length, size))
    except FileNotFoundError:
        raise CheckpointError(f"weights file {path} not found") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    header = parse_safetensors_header(data, path, file_size=size)
    return {name: TensorEntry(path.name, *entry) for name, entry in header.items()}


def _read_json(path: Path, what: str) -> dict[str, Any]:
    refuse_special(path, what, CheckpointError)
    try:
        value = json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path} not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{what} {path} is not a JSON object")
    return value


@checked
def read_layout(folder: str | os.PathLike) -> FolderLayout:
    """Read and check a model folder's layout from its config and its shards' headers.

    Raises:
        CheckpointError: not a folder; no ``config.json`` (or one without ``model_type``);
            no safetensors weights (a folder of ``pytorch_model.bin`` only is refused: it is
            a pickle); an index naming a shard that is missing, a tensor not in the shard
            it names, or a shard file the index leaves out; a tensor stored twice.
    """
    folder = Path(folder)
    if not folder.is_dir():
        if folder.exists():
            raise CheckpointError(
                f"{folder} is {describe_path(folder)}, not a model folder (a Hugging Face "
                "model folder holds config.json beside its weights)"
            )
        raise CheckpointError(f"model folder {folder} not found")
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{folder} has no config.json; a Hugging Face model folder holds config.json "
            "beside its weights (model.safetensors or shards and their index)"
        )
    config = _read_json(folder / "config.json", "model config")
    if "model_type" not in config:
        raise CheckpointError(f"{folder / 'config.json'} names no model_type")
    index = None
    if (folder / INDEX).is_file():
        index = _read_json(folder / INDEX, "shard index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{folder / INDEX} has no weight_map")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(
                f"{folder}: shard {missing[0]} named by {INDEX} is missing"
                + (f" ({len(missing)} shards missing)" if len(missing) > 1 else "")
            )
    elif (folder / SINGLE).is_file():
        weight_map, names = None, [SINGLE]
    else:
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        extra = (
            f"; it holds {', '.join(found)}, which are pickles lmckit does not load — save "
            "the model with save_pretrained(..., safe_serialization=True)"
            if found
            else ""
        )
        raise CheckpointError(f"{folder} has no {SINGLE} and no {INDEX}{extra}")
    tensors: dict[str, TensorEntry] = {}
    shards: dict[str, list[str]] = {}
    for shard in names:
        header = _read_header(folder / shard)
        shards[shard] = sorted(header, key=lambda k: header[k].start)
        for name, entry in header.items():
            if name in tensors:
                raise CheckpointError(
                    f"{folder}: tensor {name!r} is stored twice ({tensors[name].shard} and {shard})"
                )
            tensors[name] = entry
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in tensors or tensors[name].shard != shard:
                where = f"in {tensors[name].shard}" if name in tensors else "in no shard"
                raise CheckpointError(
                    f"{folder}: {INDEX} puts tensor {name!r} in {shard}, but it is {where}"
                )
        unlisted = sorted(set(tensors) - set(weight_map))
        if unlisted:
            raise CheckpointError(
                f"{folder}: tensor {unlisted[0]!r} ({tensors[unlisted[0]].shard}) is not in "
                f"{INDEX}'s weight_map"
            )
    return FolderLayout(folder, config, shards, tensors, index)


def _sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _file_digests(paths: Sequence[Path]) -> dict[str, str]:
    """``{file name: SHA-256}``, files hashed in parallel (hashlib releases the GIL)."""
    workers = max(1, min(len(paths), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip((p.name for p in paths), pool.map(_sha256_file, paths), strict=True))


def _combined_digest(digests: Mapping[str, str]) -> str:
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(digests.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def _model_class(layout: FolderLayout) -> type[nn.Module]:
    """The ``transformers`` class the config names in ``architectures`` (else ``AutoModel``)."""
    try:
        import transformers
    except ImportError:
        raise CheckpointError(
            f"{layout.folder} is a Hugging Face model folder; reading it needs the "
            "transformers package (pip install transformers)"
        ) from None
    names = layout.config.get("architectures") or []
    for name in names:
        cls = getattr(transformers, str(name), None)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            return cls
    if names:
        raise CheckpointError(
            f"{layout.folder}: transformers {transformers.__version__} has no model class "
            f"{names[0]!r} (the config's architectures)"
        )
    return transformers.AutoModel


def _load_dtype(layout: FolderLayout) -> torch.dtype:
    """float64 for a folder stored in float64; float32 otherwise (matching and merging sum
    many products: half precision is not enough for them)."""
    floats = {e.dtype for e in layout.tensors.values() if e.dtype.is_floating_point}
    return torch.float64 if floats == {torch.float64} else torch.float32


def example_inputs(model: nn.Module, config: Mapping[str, Any]) -> tuple[tuple, dict]:
    """A seeded example batch for tracing: token ids (batch 2, length 8) for text models —
    and decoder ids for encoder–decoders — or images of the config's size for vision
    models.

    Raises:
        CheckpointError: a model whose main input is neither ``input_ids`` nor
            ``pixel_values``.
    """
    generator = torch.Generator().manual_seed(0)
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids":
        text = config.get("text_config") or config
        vocab = int(text.get("vocab_size") or 2)
        ids = torch.randint(0, vocab, (2, 8), generator=generator)
        kwargs = {}
        if config.get("is_encoder_decoder"):
            kwargs["decoder_input_ids"] = torch.randint(0, vocab, (2, 8), generator=generator)
        return (ids,), kwargs
    if main == "pixel_values":
        size = config.get("image_size") or 64
        size = size if isinstance(size, int) else int(size[0])
        channels = int(config.get("num_channels") or 3)
        return (torch.randn(2, channels, size, size, generator=generator),), {}
    raise CheckpointError(
        f"cannot make an example input for {type(model).__name__}, whose main input is "
        f"{main!r} (lmckit traces models reading input_ids or pixel_values)"
    )


@checked
def load_model_folder(
    folder: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    spec: PermutationSpec | None = None,
    precision: str | None = None,
    trace: bool = True,
    max_memory: int | None = None,
) -> Checkpoint:
    """A Hugging Face model folder as a :class:`~lmckit.checkpoint.Checkpoint` (see the
    module docstring).

    Args:
        folder: the model folder.
        device: where the parameters go (``"cpu"`` keeps them memory-mapped).
        spec: a spec traced for the same architecture already (a second folder of a pair);
            it is checked against this folder's tensors instead of tracing again.
        precision: the tracer's verification dtype (:func:`lmckit.tracing.trace_report`). By
            default float64 where its copies fit beside the model in the memory available
            and in ``max_memory``, else float32.
        trace: ``False`` skips tracing (the checkpoint's ``spec`` is then unavailable).
        max_memory: bytes the caller allows in all (see ``precision``).

    The checkpoint's ``meta["model"]`` is ``{"name": "hf", "class": ..., "config": ...}``
    (the config without :data:`VOLATILE_CONFIG`): two folders count as one architecture
    when these agree. ``meta["files"]`` maps each file read to its SHA-256 and
    ``trace_report`` holds the trace report (:class:`~lmckit.tracing.TraceReport`).

    Raises:
        CheckpointError: see :func:`read_layout`; the model cannot be built from the config;
            tensors the model has that the folder lacks (or the other way round), shapes
            that do not fit, non-finite weights.
        SpecError: the tracer cannot export the model.
    """
    check_max_memory(max_memory)
    check_device(device)
    layout = read_layout(folder)
    cls = _model_class(layout)
    files = [layout.folder / "config.json", *layout.weight_files]
    digests = _file_digests(files)
    import transformers

    verbosity = transformers.logging.get_verbosity()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # its load report is ours to give
    transformers.utils.logging.disable_progress_bar()
    try:
        model, info = cls.from_pretrained(
            layout.folder,
            local_files_only=True,
            output_loading_info=True,
            dtype=_load_dtype(layout),
            ignore_mismatched_sizes=True,  # reported as mismatched_keys, refused below
        )
    except Exception as exc:  # transformers raises many kinds; all mean "cannot build"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(
            f"cannot build {cls.__name__} from {layout.folder}: {type(exc).__name__}: {first}"
        ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    problems = [
        (what, sorted(info.get(key) or []))
        for key, what in (
            ("missing_keys", "tensors the model has that the folder lacks"),
            ("unexpected_keys", "tensors in the folder that the model does not have"),
            ("mismatched_keys", "tensors whose shapes do not fit the model"),
        )
    ]
    for what, keys in problems:
        if keys:
            more = f", … {len(keys) - 3} more" if len(keys) > 3 else ""
            shown = ", ".join(map(str, keys[:3])) + more
            raise CheckpointError(f"{layout.folder}: {what}: {shown}")
    model.eval()
    model.to(device)
    params = dict(model.state_dict())
    layout = _with_module_names(layout, model, params)
    stored = {layout.module_name(n): e.dtype for n, e in layout.tensors.items()}
    check_dtype_kinds(stored, params, str(layout.folder))
    try:
        check_finite(params, str(layout.folder))
    except ParamsError as exc:
        raise CheckpointError(str(exc)) from None
    report = None
    if spec is not None:
        try:
            spec.validate(params, what=str(layout.folder))
        except Exception as exc:  # a spec of another architecture
            raise CheckpointError(f"{layout.folder}: the given spec does not fit: {exc}") from None
    elif trace:
        from lmckit.tracing import trace_report

        args, kwargs = example_inputs(model, layout.config)
        if precision is None:
            from lmckit.budget import available_memory
            from lmckit.tracing.trace import verification_bytes

            limit = (
                available_memory() if max_memory is None else min(max_memory, available_memory())
            )
            model_bytes = sum(t.numel() * t.element_size() for t in params.values())
            fits = model_bytes + verification_bytes(params, "float64") <= 0.8 * limit
            precision = "float64" if fits else "float32"
        report = trace_report(
            model,
            tuple(a.to(device) for a in args),
            example_kwargs={k: v.to(device) for k, v in kwargs.items()},
            precision=precision,
        )
        spec = report.spec
    _return_freed_memory()  # the loader's and the verification's copies, before more is read
    meta = {
        "format": FOLDER_FORMAT,
        "model": {"name": "hf", "class": type(model).__name__, "config": layout.architecture()},
        "files": digests,
    }
    return Checkpoint(
        model=model,
        params=params,
        meta=meta,
        path=layout.folder,
        traced_spec=spec,
        weights_sha256=_combined_digest(digests),
        layout=layout,
        trace_report=report,
    )


@checked
def load_model_folders(
    paths: Sequence[str | os.PathLike],
    *,
    device: torch.device | str = "cpu",
    max_memory: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Checkpoint]:
    """Model folders of one architecture (a pair to match, models to merge): every layout
    checked first from the headers, then each folder loaded (:func:`load_model_folder`), the
    spec traced on the first and checked on the others.

    Args:
        paths: the folders.
        device: where the parameters go.
        max_memory: bytes the caller allows: refused up front if the models alone, in
            float32, take more; also passed to the trace (its verification's precision).
        progress: receives one line before each folder is read.

    Raises:
        CheckpointError: see :func:`load_model_folder`.
        UsageError: folders of different architectures (the differing config fields named).
        ResourceError: the models alone exceed ``max_memory``.
    """
    from lmckit.budget import ResourceError, human_bytes

    check_max_memory(max_memory)
    check_device(device)
    layouts = [read_layout(p) for p in paths]
    first = layouts[0].architecture()
    for path, layout in zip(paths[1:], layouts[1:], strict=True):
        other = layout.architecture()
        if other != first:
            keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            shown = ", ".join(f"{k} {first.get(k)!r} vs {other.get(k)!r}" for k in keys[:3])
            raise UsageError(
                f"model folders of different architectures: {paths[0]} and {path} differ in "
                f"their config ({shown})"
            )
    need = sum(4 * sum(math.prod(e.shape) for e in lay.tensors.values()) for lay in layouts)
    if max_memory is not None and need > max_memory:
        raise ResourceError(
            f"the {len(paths)} models alone take {human_bytes(need)} in float32, more than "
            f"--max-memory {human_bytes(max_memory)}"
        )
    ckpts: list[Checkpoint] = []
    spec = None
    for path, layout in zip(paths, layouts, strict=True):
        if progress is not None:
            doing = "hashing, loading" + (" and tracing" if spec is None else "")
            progress(
                f"{doing} {path} ({human_bytes(layout.nbytes)} in {len(layout.shards)} "
                "weight file(s))"
            )
        ckpt = load_model_folder(path, device=device, spec=spec, max_memory=max_memory)
        spec = ckpt.spec
        ckpts.append(ckpt)
    return ckpts


def provenance(inputs: Mapping[str, Checkpoint]) -> dict[str, Any]:
    """What a written folder's ``lmckit.json`` records of the folders it was made from:
    ``{role: {"path", "sha256", "files_sha256"}}``."""
    return {
        role: {"path": str(c.path), "sha256": c.content_hash, "files_sha256": c.meta["files"]}
        for role, c in inputs.items()
    }


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc keeps freed blocks below its
    adaptive mmap threshold — up to 32 MiB each, a model's worth in all — for reuse; a
    billion-parameter match needs that memory for the other model)."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim this way
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def frozen_summary(ckpt: Checkpoint, limit: int = 6) -> str | None:
    """One paragraph naming the tensors of a traced folder that no group permutes and why
    (``None`` when every parameter sits in a permuted tensor)."""
    report = ckpt.trace_report
    if report is None or report.permuted_fraction >= 1.0:
        return None
    frozen = [
        (name, next(r for r in reasons if r is not None))
        for name, reasons in report.frozen.items()
        if name not in report.aliases
        and all(g is None for g in report.spec.axes[name])
        and any(r is not None for r in reasons)
    ]
    shown = "; ".join(f"{n} ({why})" for n, why in frozen[:limit])
    more = f"; … {len(frozen) - limit} more" if len(frozen) > limit else ""
    return (
        f"{ckpt.path}: {report.permuted_fraction:.1%} of the parameters are in permuted "
        f"tensors; {len(frozen)} tensor(s) stay as they are: {shown}{more}"
    )


def _with_module_names(
    layout: FolderLayout, model: nn.Module, params: Mapping[str, Tensor]
) -> FolderLayout:
    """``layout`` with :attr:`FolderLayout.module_names` read from ``transformers``' own map
    between the names it loads and the names it saves (``revert_weight_conversion``, what
    ``save_pretrained`` applies), run on markers that stand for the model's tensors: a
    folder tensor whose marker comes back is that model tensor under another name. A
    conversion that is more than a renaming (tensors fused or split on load) leaves the
    model unwritable in the folder's layout, and says so."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers that loads every tensor under its folder name
        return layout
    names = sorted(params)
    markers = {k: torch.tensor(float(i)) for i, k in enumerate(names)}
    try:
        reverted = revert_weight_conversion(model, markers)
    except Exception as exc:  # a converter that needs the real tensors: not a renaming
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        return replace(layout, unwritable=f"transformers converts its tensors on load ({why})")
    found: dict[str, str] = {}
    for name, marker in reverted.items():
        value = marker[0] if isinstance(marker, list) else marker
        if (
            isinstance(value, Tensor)
            and value.ndim == 0
            and float(value) == int(value)
            and 0 <= int(value) < len(names)
        ):
            found[name] = names[int(value)]
    lacking = sorted(n for n in layout.tensors if n not in found and n not in params)
    if lacking:
        return replace(
            layout,
            unwritable=(
                f"transformers converts {len(lacking)} of its tensors on load, not only renames "
                f"them ({lacking[0]!r} has no one tensor of the loaded model)"
            ),
        )
    module_names = {n: found.get(n, n) for n in layout.tensors if found.get(n, n) != n}
    return replace(layout, module_names=module_names)


def _check_fits_spec(perm: object, source: Checkpoint) -> None:
    """``perm`` is a permutation or transform of ``source``'s own spec (its groups and sizes)."""
    from lmckit.transform import Transform

    if not isinstance(perm, Permutation | Transform):
        raise ParamsError(f"perm must be a Permutation or a Transform, got {type(perm).__name__}")
    mine, theirs = dict(source.spec.groups), dict(perm.spec.groups)
    if mine != theirs:
        differ = sorted(set(mine) ^ set(theirs)) or sorted(g for g in mine if mine[g] != theirs[g])
        raise ParamsError(
            f"the permutation is of another spec than {source.path}'s ({len(theirs)} groups, "
            f"the folder's model {len(mine)}; first differing group {differ[0]!r}): it was "
            "found for another architecture"
        )


def check_writable(source: Checkpoint) -> FolderLayout:
    """``source``'s layout if :func:`write_model_folder` can write its model back in it —
    called before the work whose result is written.

    Raises:
        CheckpointError: ``source`` is not a model folder, or its tensors are converted on
            load beyond renaming (the layout they would be written in is unknown).
    """
    if not isinstance(source, Checkpoint):
        raise ParamsError(
            f"the source must be a Checkpoint of a model folder (load_model_folder(path)), got "
            f"{type(source).__name__} {source!r}"[:200]
        )
    layout = source.layout
    if layout is None:
        raise CheckpointError(f"{source.path} is not a model folder")
    if layout.unwritable is not None:
        raise CheckpointError(
            f"{layout.folder}: cannot be written back as a model folder: {layout.unwritable}"
        )
    return layout


def _output_tensor(
    name: str,
    entry: TensorEntry,
    source: Callable[[str], Tensor],
    spec: PermutationSpec,
    perm: Permutation | None,
) -> Tensor:
    try:
        t = source(name)
    except KeyError:
        raise ParamsError(f"no tensor {name!r} to write (the folder stores it)") from None
    if tuple(t.shape) != entry.shape:
        raise ParamsError(f"tensor {name!r} has shape {tuple(t.shape)}, the folder {entry.shape}")
    if perm is not None and name in spec.axes:
        t = permute_tensor(t, spec, name, perm)
    return t.detach().to("cpu", entry.dtype).contiguous()


def _write_shard(
    path: Path, names: Sequence[str], layout: FolderLayout, make: Callable[[str], Tensor]
) -> str:
    """Write one safetensors shard tensor by tensor (its header first: the sizes are known
    from ``layout``), to a scratch file renamed into place; returns its SHA-256."""
    offsets, position = {}, 0
    for name in names:
        entry = layout.tensors[name]
        size = entry.end - entry.start
        offsets[name] = {
            "dtype": _DTYPE_NAMES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [position, position + size],
        }
        position += size
    header = json.dumps({"__metadata__": {"format": "pt"}, **offsets}, separators=(",", ":"))
    raw = header.encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    digest = hashlib.sha256()
    with atomic_path(path) as scratch, open(scratch, "wb") as fh:
        for piece in (struct.pack("<Q", len(raw)), raw):
            fh.write(piece)
            digest.update(piece)
        for name in names:
            t = make(name)
            data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
            fh.write(data)
            digest.update(data)
    return digest.hexdigest()


COPIED = ("*.json", "merges.txt", "vocab.txt", "*.model", "*.tiktoken", "*.jinja", "LICENSE*")
"""The files of a source folder that a written folder copies (glob patterns): the configs,
the tokenizer's and processor's files and chat templates that ``transformers`` reads
beside the weights, and the licence the model comes under. A user's other files (notes,
the model card of the source model) are not the written model's."""


def _copied(layout: FolderLayout) -> list[Path]:
    """The source folder's files a written folder copies (:data:`COPIED`) — never weights,
    the index or lmckit's own files."""
    skipped = {SIDECAR, *layout.shards, INDEX}
    return [
        p
        for p in sorted(layout.folder.iterdir())
        if p.is_file()
        and p.name not in skipped
        and not p.name.startswith(".")
        and any(fnmatch.fnmatchcase(p.name, pattern) for pattern in COPIED)
    ]


def output_names(layout: FolderLayout) -> list[str]:
    """The names of the files :func:`write_model_folder` writes for a source of ``layout``."""
    index = [INDEX] if layout.index is not None else []
    return [*layout.shards, *(p.name for p in _copied(layout)), *index, SIDECAR]


@checked
def write_model_folder(
    out: str | os.PathLike,
    source: Checkpoint,
    *,
    perm: Permutation | None = None,
    params: Mapping[str, Tensor] | None = None,
    about: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Write ``source``'s model — permuted by ``perm``, or the tensors ``params`` instead
    (a merge) — as a model folder ``out`` of the same files: config and small files copied,
    each shard of the source written anew with the same tensors, dtypes and order.

    Tensors are produced one at a time: ``perm`` applied to the source's tensor (memory-
    mapped), or ``params[name]`` cast to the stored dtype. ``about`` goes into
    ``lmckit.json`` beside the SHA-256 of every file written; returns those digests.
    Written over an earlier lmckit model folder, the files its ``lmckit.json`` lists and this
    one does not write (another model's shards or index) are removed — never an input of
    the command — and named to ``log``: a loader must not find the earlier model's files.

    Raises:
        CheckpointError: ``source`` is not a model folder.
        OutputPathError: ``out`` would write over one of the source's files.
        ParamsError: ``params`` lacks a tensor of the folder or has one of another shape.
    """
    layout = check_writable(source)
    if perm is not None and params is not None:
        raise ParamsError(
            "write_model_folder takes perm= (align the source) or params= (a merge), not both"
        )
    if perm is not None:
        _check_fits_spec(perm, source)
    out = Path(out)
    if params is not None:
        missing = sorted({layout.module_name(n) for n in layout.tensors} - set(params))
        if missing:
            raise ParamsError(f"the merged parameters lack {missing[0]!r} (of {len(missing)})")
        take: Callable[[str], Tensor] = params.__getitem__
    else:
        take = source.params.__getitem__
    spec = source.spec if perm is not None else PermutationSpec({}, {})
    # the source's shards are read (memory-mapped) while the new ones are written
    check_not_inputs([out / n for n in output_names(layout)], source.files, "out")
    earlier = _earlier_files(out)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    done, total = 0, len(layout.tensors)

    def make(name: str) -> Tensor:
        nonlocal done
        t = _output_tensor(layout.module_name(name), layout.tensors[name], take, spec, perm)
        done += 1
        if progress is not None:
            progress(done, total)
        return t

    for shard, names in layout.shards.items():
        written[shard] = _write_shard(out / shard, names, layout, make)
    for path in _copied(layout):
        with atomic_path(out / path.name) as scratch:
            shutil.copyfile(path, scratch)
        written[path.name] = _sha256_file(out / path.name)
    if layout.index is not None:
        atomic_write_json(out / INDEX, layout.index)
        written[INDEX] = _sha256_file(out / INDEX)
    atomic_write_json(
        out / SIDECAR,
        {
            "format": FOLDER_FORMAT,
            "lmckit_version": __version__,
            "torch_version": torch.__version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            **dict(about or {}),
            "files_sha256": written,
        },
    )
    inputs = [*source.files, *held_inputs(out)]
    stale = []
    for name in sorted(earlier - set(written)):
        path = out / name
        ours = path.is_file() and not path.is_symlink()
        if ours and input_at(path, inputs) is None:
            path.unlink()
            stale.append(name)
    if stale and log is not None:
        log(f"removed from {out} the earlier model's files this one does not have: {stale}")
    return written


def _earlier_files(out: Path) -> set[str]:
    """The files an earlier :func:`write_model_folder` wrote into ``out`` (its sidecar's
    list; plain names only), or none."""
    if leading_format(out / SIDECAR) != FOLDER_FORMAT:  # its head only: never a FIFO's wait
        return set()
    try:
        meta = json.loads((out / SIDECAR).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    if not isinstance(meta, dict) or meta.get("format") != FOLDER_FORMAT:
        return set()
    listed = meta.get("files_sha256")
    if not isinstance(listed, dict):
        return set()
    plain = {n for n in listed if isinstance(n, str) and n and n == Path(n).name}
    return {n for n in plain if not n.startswith(".")} - {SIDECAR}
