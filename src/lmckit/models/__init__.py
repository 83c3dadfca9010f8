"""The model zoo. Every model builds its own :class:`~lmckit.perm.PermutationSpec` from its
configuration (``model.permutation_spec()``) and records that configuration in
``model.config`` so that :func:`build_model` can rebuild it from a checkpoint."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from lmckit.errors import LmcError, ModelConfigError, ParamsError
from lmckit.models.custom import build_custom
from lmckit.models.llama import Llama
from lmckit.models.mlp import MLP
from lmckit.models.resnet import ResNet20
from lmckit.models.transformer import GPT, TransformerClassifier, ViT
from lmckit.models.vgg import VGG
from lmckit.options import check_options, checked
from lmckit.perm import PermutationSpec

__all__ = [
    "GPT",
    "MLP",
    "MODELS",
    "VGG",
    "Llama",
    "ResNet20",
    "TransformerClassifier",
    "ViT",
    "build_custom",
    "build_model",
    "model_config",
    "permutation_spec",
]

MODELS: dict[str, type[nn.Module]] = {
    "mlp": MLP,
    "vgg": VGG,
    "resnet20": ResNet20,
    "vit": ViT,
    "transformer": TransformerClassifier,
    "gpt": GPT,
    "llama": Llama,
}
# Convenience names that fix part of a configuration.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "vgg11": ("vgg", {"depth": 11}),
    "vgg16": ("vgg", {"depth": 16}),
}


@checked
def build_model(name: str, /, **config: Any) -> nn.Module:
    """Build a zoo model by registry name (``mlp``, ``vgg``, ``vgg11``, ``vgg16``, ``resnet20``,
    ``vit``, ``transformer``, ``gpt``, ``llama``), or a user's class with ``name="custom"`` and the
    configuration ``class``, ``args``, ``input_shape`` (and ``tokens``) of
    :func:`~lmckit.models.custom.build_custom`.

    ``config`` holds the model's constructor arguments; a ``name`` entry (as written by
    :func:`model_config`) is ignored if it agrees with ``name``.

    Raises:
        ModelConfigError: unknown name, unknown or invalid configuration keys.
    """
    key = name.lower()
    if key == "custom":
        config = dict(config)
        given = config.pop("name", key)
        if given != key:
            raise ModelConfigError(f"config names model {given!r} but {name!r} was requested")
        config.pop("source_sha256", None)  # recorded, not chosen: the code is what it is now
        unknown = sorted(set(config) - {"class", "args", "input_shape", "tokens"})
        if unknown or "class" not in config or "input_shape" not in config:
            raise ModelConfigError(
                "a custom model takes class (MODULE:CLASS), args, input_shape and tokens; "
                f"got {sorted(config)}"
            )
        return build_custom(
            config["class"], config.get("args"), config["input_shape"], config.get("tokens")
        )
    if key in ALIASES:
        key, fixed = ALIASES[key]
        config = {**fixed, **config}
    if key not in MODELS:
        raise ModelConfigError(f"unknown model {name!r}; available: {sorted([*MODELS, *ALIASES])}")
    config = dict(config)
    given = config.pop("name", key)
    if given != key:
        raise ModelConfigError(f"config names model {given!r} but {name!r} was requested")
    cls = MODELS[key]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise ModelConfigError(
            f"{cls.__name__} got unknown option(s) {unknown}; accepted: {accepted}"
        )
    try:
        check_options(cls, config, where=f"{cls.__name__}: ")
    except ParamsError as exc:
        raise ModelConfigError(str(exc)) from None
    try:
        return cls(**config)
    except LmcError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. hidden="wide"
        raise ModelConfigError(f"{cls.__name__}: invalid configuration {config}: {exc}") from None


@checked
def model_config(model: nn.Module) -> dict[str, Any]:
    """The JSON-ready configuration that :func:`build_model` turns back into ``model``."""
    config = getattr(model, "config", None)
    if not isinstance(config, Mapping) or "name" not in config:
        raise ModelConfigError(f"{type(model).__name__} is not a zoo model (no .config)")
    return dict(config)


@checked
def permutation_spec(model: nn.Module) -> PermutationSpec:
    """The model's permutation spec (``model.permutation_spec()``)."""
    fn = getattr(model, "permutation_spec", None)
    if fn is None:
        raise ModelConfigError(
            f"{type(model).__name__} has no permutation_spec(); build a PermutationSpec by hand"
        )
    return fn()
