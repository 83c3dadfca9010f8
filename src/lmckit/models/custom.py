"""A user's own ``nn.Module`` class as a model of the pipeline (``name = "custom"``).

``build_custom("mynet:Net", {"width": 64}, input_shape=(1, 28, 28))`` imports the class,
builds it with those keyword arguments and returns the user's module itself (its state
dict keys are the class's own), with what the zoo's models have:

* ``model.config`` — ``{"name": "custom", "class": ..., "args": ..., "input_shape": ...,
  "source_sha256": ...}`` (JSON-ready), from which :func:`lmckit.models.build_model` builds
  it again; ``source_sha256`` (:func:`class_source_digest`) is the digest of the class's
  code as it is *now*, so that keys of results change when the code does;
* ``model.permutation_spec()`` — traced from the model's graph on an example input of
  ``input_shape`` and verified (:func:`lmckit.tracing.trace`), once per model.

Importing a class runs its module's code, so a checkpoint whose sidecar names a user class
is built only when the caller names that class (see :func:`lmckit.checkpoint.load_checkpoint`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmckit.errors import ModelConfigError
from lmckit.options import checked
from lmckit.perm import PermutationSpec

__all__ = ["build_custom", "class_source_digest", "example_batch", "import_model_class"]


def import_model_class(target: str) -> type[nn.Module]:
    """The ``nn.Module`` subclass ``package.module:Class`` (the current folder is
    importable, as with ``python -m``).

    Raises:
        ModelConfigError: not of the form ``MODULE:CLASS``, a module that does not import
            (its error quoted), no such class, or a class that is not an ``nn.Module``.
    """
    module_name, _, class_name = str(target).partition(":")
    if not module_name or not class_name:
        raise ModelConfigError(f"a model class is written MODULE:CLASS, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error while importing the user's module
        raise ModelConfigError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelConfigError(f"{module_name!r} has no torch.nn.Module class {class_name!r}")
    return cls


MAX_PACKAGE_FILES = 500


def class_source_digest(cls: type) -> str | None:
    """SHA-256 over the source files a user's class runs: its module's file, and — when the
    module is part of a package — every ``.py`` file of that top-level package (helpers the
    class imports from its own package count; installed libraries do not, and a package of
    more than :data:`MAX_PACKAGE_FILES` files counts by the module alone). ``None`` for a
    class without a source file (built in, or defined interactively)."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    top = sys.modules.get(cls.__module__.split(".")[0])
    paths = getattr(top, "__path__", None)
    root = Path(next(iter(paths))) if paths and "." in cls.__module__ else None
    files = sorted(root.rglob("*.py")) if root is not None else [Path(file)]
    if len(files) > MAX_PACKAGE_FILES:  # an installed library, not a user's own package
        root, files = None, [Path(file)]
    digest = hashlib.sha256()
    for path in files:
        try:
            content = path.read_bytes()
        except OSError:
            continue
        name = str(path.relative_to(root)) if root is not None else path.name
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


@checked
def build_custom(
    class_path: str,
    args: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] = (),
    tokens: int | None = None,
) -> nn.Module:
    """Build ``class_path(**args)`` as a pipeline model (see the module docstring).

    Args:
        class_path: ``package.module:Class``.
        args: the constructor's keyword arguments (JSON-ready values).
        input_shape: one example's shape without the batch axis (for tokens: the length).
        tokens: the vocabulary size when the model reads token ids.

    Raises:
        ModelConfigError: the class does not import, ``args`` is not a table of JSON values,
            the shape is empty or not positive integers, or the constructor fails.
    """
    args = {} if args is None else args
    if not isinstance(args, Mapping):
        raise ModelConfigError(f"model args must be a table of keyword arguments, got {args!r}")
    try:
        args = json.loads(json.dumps(dict(args)))
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"model args must be JSON values: {exc}") from None
    shape = tuple(input_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ModelConfigError(
            f"input_shape must be positive integers (one example, no batch axis), got {shape}"
        )
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
    ):
        raise ModelConfigError(f"tokens must be a positive integer, got {tokens!r}")
    cls = import_model_class(class_path)
    try:
        model = cls(**args)
    except Exception as exc:  # the user's constructor
        failure = f"{type(exc).__name__}: {exc}"
        raise ModelConfigError(f"{class_path}({args}) failed: {failure}") from None
    config: dict[str, Any] = {
        "name": "custom",
        "class": class_path,
        "args": args,
        "input_shape": list(shape),
    }
    if tokens is not None:
        config["tokens"] = tokens
    source = class_source_digest(cls)
    if source is not None:  # the code is part of what the model is (and of every key)
        config["source_sha256"] = source
    # plain attributes (nn.Module keeps non-tensor values in __dict__); the state dict stays
    # the class's own
    object.__setattr__(model, "config", config)
    cache: list[PermutationSpec] = []

    def permutation_spec() -> PermutationSpec:
        """Traced from the model's graph on an example input (and verified), once."""
        if not cache:
            from lmckit.tracing import trace

            parameter = next(model.parameters(), None)
            device = parameter.device if parameter is not None else torch.device("cpu")
            example = example_batch(config["input_shape"], config.get("tokens")).to(device)
            cache.append(trace(model, example))
        return cache[0]

    object.__setattr__(model, "permutation_spec", permutation_spec)
    return model


def example_batch(
    input_shape: Sequence[int], tokens: int | None = None, batch: int = 2
) -> torch.Tensor:
    """A seeded example batch of ``input_shape`` (token ids below ``tokens`` when given) —
    what a traced spec is read from."""
    generator = torch.Generator().manual_seed(0)
    shape = (batch, *input_shape)
    if tokens is not None:
        return torch.randint(0, tokens, shape, generator=generator)
    return torch.randn(shape, generator=generator)
