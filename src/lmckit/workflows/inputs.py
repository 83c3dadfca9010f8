"""The inputs of a workflow, as a user names them: lmckit checkpoints, a user's state dicts
of their own class (``MODULE:CLASS``), Hugging Face model folders, the dataset a checkpoint
records and the example input its graph is read with.

Every function raises :class:`~lmckit.errors.UsageError` (the command line's exit status 2)
for inputs that do not fit what was asked and :class:`~lmckit.errors.LmcError` for files that
cannot be read, naming the file; nothing prints except through ``log``.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmckit.errors import LmcError, ModelConfigError, UsageError

Log = Callable[[str], None]


def model_from_class_path(target: str, model_args: str | None = None) -> Any:
    """An instance of ``package.module:Class`` (the current folder is importable, as with
    ``python -m``), built with the JSON object ``model_args`` as keyword arguments."""
    from lmckit.models.custom import import_model_class

    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise UsageError(f"{target!r} is neither a checkpoint nor MODULE:CLASS")
    try:
        cls = import_model_class(target)
    except ModelConfigError as exc:  # a bad argument of the command line: usage error
        raise UsageError(str(exc)) from None
    try:
        kwargs = json.loads(model_args) if model_args else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--model-args is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise UsageError("--model-args must be a JSON object of keyword arguments")
    try:
        return cls(**kwargs)
    except Exception as exc:  # the user's constructor
        raise UsageError(f"{target}({kwargs}) failed: {type(exc).__name__}: {exc}") from None


def source_files(model: Any) -> list[str]:
    """The file defining ``type(model)``, where it has one (an input of what is traced
    from it, for the output guards); empty for a class defined in a string."""
    try:
        return [inspect.getfile(type(model))]
    except (TypeError, OSError):
        return []


def input_from_sidecar(path: str | Path) -> tuple[list[int], int | None, str] | None:
    """``(shape, tokens, dataset)``: one example's shape (without the batch axis), the
    vocabulary of token inputs (``None`` for float inputs) and the dataset they come from,
    read from the dataset an lmckit checkpoint's sidecar records; ``None`` when it records
    none that lmckit knows (a user's weight file, synthetic data of another size)."""
    from lmckit.checkpoint import read_meta
    from lmckit.data.datasets import INPUT_SHAPES

    try:
        meta = read_meta(path)
    except LmcError:
        return None
    dataset, model = meta.get("dataset"), meta["model"]
    if dataset not in INPUT_SHAPES or dataset == "synthetic":
        return None
    if dataset == "python-stdlib":
        context, vocab = model.get("context"), model.get("vocab_size")
        if not (isinstance(context, int) and isinstance(vocab, int)):
            return None
        return [context], vocab, dataset
    return list(INPUT_SHAPES[dataset]), None, dataset


def example_input(input_shape: Sequence[int], tokens: int | None = None, batch: int = 4):
    """A batch of ``batch`` examples of shape ``input_shape``: token ids below ``tokens``,
    or Gaussian floats; refused up front when it would not fit in memory."""
    from lmckit.budget import check_budget
    from lmckit.models.custom import example_batch

    shape = list(input_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise UsageError(f"an example's shape must be positive integers, got {shape}")
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
    ):
        raise UsageError(f"tokens (the vocabulary size) must be a positive integer, got {tokens!r}")
    check_budget(
        f"an example batch of shape {(batch, *input_shape)}",
        memory=8 * batch * math.prod(input_shape),
        detail="the tracer's example input",
    )
    return example_batch(list(input_shape), tokens, batch)


def load_inputs(
    paths: Sequence[str | Path],
    *,
    device: str = "cpu",
    model_class: str | None = None,
    model_args: str | None = None,
    input_shape: Sequence[int] | None = None,
    tokens: int | None = None,
    max_memory: int | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> list:
    """Checkpoints as a command names them (:class:`~lmckit.checkpoint.Checkpoint` each):
    lmckit checkpoints; with ``model_class`` a user's weight files loaded into that class,
    its spec traced once on an example of ``input_shape``; or Hugging Face model folders
    (all of one kind: folders and checkpoints do not mix). ``log`` hears what a folder load
    reads, ``warn`` which of its tensors the trace leaves frozen."""
    from lmckit.checkpoint import checkpoint_paths, load_checkpoint, load_foreign
    from lmckit.files import special_kind
    from lmckit.tracing import trace

    folders = [p for p in paths if Path(p).is_dir()]
    if folders:
        from lmckit.model_folder import is_model_folder

        plain = next((p for p in folders if not is_model_folder(p)), None)
        if plain is not None:
            raise UsageError(
                f"{plain} is a folder, not a checkpoint, and no Hugging Face model folder (it "
                "holds no config.json, model.safetensors or shard index)"
            )
        if len(folders) != len(paths):
            raise UsageError(
                f"{folders[0]} is a model folder and {next(p for p in paths if p not in folders)} "
                "is not: give model folders or checkpoints, not both"
            )
        if model_class is not None:
            raise UsageError(
                "--model-class is for plain state dicts; a model folder names its class in "
                "its config.json"
            )
        return load_folders(paths, device=device, max_memory=max_memory, log=log, warn=warn)
    if model_class is None:
        for path in paths:
            weights, sidecar = checkpoint_paths(path)
            for part in (weights, sidecar):
                if special_kind(part) is not None:
                    raise UsageError(f"checkpoint {path}: {part} is {special_kind(part)}")
            missing = [str(p) for p in (weights, sidecar) if not p.is_file()]
            if missing:
                raise UsageError(
                    f"checkpoint {path}: {', '.join(missing)} not found (a plain state dict "
                    "needs --model-class and --input-shape)"
                )
        return [load_checkpoint(p, device=device) for p in paths]
    if input_shape is None:
        raise UsageError("--model-class needs --input-shape (one example's shape)")
    description = {"name": "custom", "class": model_class, "args": model_args or ""}
    models = [model_from_class_path(model_class, model_args) for _ in paths]
    spec = trace(models[0], example_input(input_shape, tokens))
    return [
        load_foreign(path, model, spec, description=description, device=device)
        for path, model in zip(paths, models, strict=True)
    ]


def load_pair(a: str | Path, b: str | Path, **options: Any) -> list:
    """Checkpoints A and B (:func:`load_inputs` with ``options``): two different models."""
    from lmckit.workflows.matching import check_distinct

    pair = load_inputs([a, b], **options)
    check_distinct(pair)
    return pair


def load_folders(
    paths: Sequence[str | Path],
    *,
    device: str = "cpu",
    max_memory: int | None = None,
    log: Log | None = None,
    warn: Log | None = None,
) -> list:
    """:func:`lmckit.model_folder.load_model_folders`, telling ``log`` what it reads and
    ``warn`` the tensors the trace leaves frozen (before any long work)."""
    from lmckit.model_folder import frozen_summary, load_model_folders

    ckpts = load_model_folders(paths, device=device, max_memory=max_memory, progress=log)
    note = frozen_summary(ckpts[0])
    if note and warn is not None:
        warn(f"note: {note}")
    return ckpts


def folder_without_data(path: object) -> UsageError:
    """The error for work on data asked of a model folder (which records no dataset)."""
    return UsageError(
        f"{path} is a model folder: lmckit aligns and merges model folders by their weights "
        "(wm, wm-fast, the weight-based merges, analyze --no-data); evaluating them on a "
        "dataset is not supported"
    )


def refuse_folders_for_data(paths: Sequence[object]) -> None:
    """Before any folder is hashed, loaded and traced: work that needs data refuses model
    folders."""
    from lmckit.model_folder import is_model_folder

    folder = next((p for p in paths if p is not None and is_model_folder(p)), None)
    if folder is not None:
        raise folder_without_data(folder)


def data_for(
    ckpt,
    *,
    dataset: str | None = None,
    data_dir: str | Path | None = None,
    download: bool = True,
    input_shape: Sequence[int] | None = None,
):
    """The dataset ``ckpt`` is evaluated on: ``dataset``, or the one its sidecar records,
    checked to fit the model; a user's class traced at ``input_shape`` gets smaller images
    padded to it (28 → 32)."""
    from lmckit.data import load_dataset
    from lmckit.data.datasets import INPUT_SHAPES
    from lmckit.workflows.matching import check_data_fits
    from lmckit.workflows.training import load_for_model

    if ckpt.folder:
        raise folder_without_data(ckpt.path)
    name = dataset or ckpt.meta.get("dataset")
    if not name:
        raise UsageError(f"{ckpt.path} does not record its dataset; pass --dataset")
    if ckpt.meta.get("foreign"):
        shape = INPUT_SHAPES.get(name)
        wanted = tuple(input_shape or ())
        pad = wanted[-1] if shape and len(wanted) == 3 and wanted[-1] > shape[-1] else None
        data = load_dataset(name, data_dir, download=download, pad_to=pad)
    else:
        data = load_for_model(ckpt.meta["model"]["name"], name, data_dir, download=download)
    check_data_fits(ckpt, data)
    return data


def graph_example(
    ckpt,
    data=None,
    *,
    input_shape: Sequence[int] | None = None,
    tokens: int | None = None,
) -> tuple[Any, dict[str, Any]]:
    """``(inputs, keyword inputs)`` to read ``ckpt``'s graph with (the tracer, the transform
    methods): the model's own ``example_input()``, a model folder's from its config, eight
    training examples of ``data``, an example of ``input_shape``, or Gaussian inputs of the
    shape of the dataset the checkpoint records — the first that exists."""
    example = getattr(ckpt.model, "example_input", None)
    if callable(example):
        return example(), {}
    if ckpt.folder:
        from lmckit.model_folder import example_inputs

        return example_inputs(ckpt.model, ckpt.layout.config)
    if data is not None:
        return data.train_x[:8], {}
    if input_shape is not None:
        return example_input(input_shape, tokens), {}
    from lmckit.data.datasets import INPUT_SHAPES

    shape = INPUT_SHAPES.get(ckpt.meta.get("dataset", ""))
    if shape is None:
        raise UsageError(
            f"{ckpt.path}: no example input to read the model's graph with; pass "
            "--input-shape (or --dataset)"
        )
    import torch

    return torch.randn(4, *shape), {}
