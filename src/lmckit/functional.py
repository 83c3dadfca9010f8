"""Running a caller's module with any parameter set, without leaving a trace on it.

lmckit evaluates and trains through the caller's ``nn.Module`` functionally
(``torch.func.functional_call``), so one module serves every interpolated, merged or
re-estimated parameter dict. Two rules hold everywhere:

* the dict must fit the module — :func:`check_model_fits` names any key or shape that
  does not, before a forward pass fails somewhere deep inside;
* a batch that does not fit the module is reported as such (:func:`forward`);
* the module's modes are the caller's — :func:`module_mode` is the one place that
  switches between train and eval mode (BatchNorm batch statistics); it records the mode
  of *every* submodule and restores each on exit, also on errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.errors import DataError, ParamsError
from lmckit.options import checked
from lmckit.params import short_list

__all__ = [
    "check_labels",
    "check_model_fits",
    "forward",
    "logits_of",
    "module_mode",
    "per_token",
    "twice_differentiable",
]


@checked
@contextlib.contextmanager
def module_mode(model: nn.Module, training: bool | None) -> Iterator[nn.Module]:
    """Put ``model`` in train (``True``) or eval (``False``) mode — or leave it (``None``) —
    for the ``with`` block, then restore every submodule's own mode."""
    saved = [(m, m.training) for m in model.modules()]
    if training is not None:
        model.train(training)
    try:
        yield model
    finally:
        for m, mode in saved:
            m.training = mode


@contextlib.contextmanager
def twice_differentiable() -> Iterator[None]:
    """Run ``scaled_dot_product_attention`` with its math kernel inside the block: the fused
    kernels (flash attention on CPU) have no second derivative, which curvatures (Taylor
    barriers, Hessian-vector products) need. Same values, slower attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


@checked
def check_model_fits(model: nn.Module, params: Mapping[str, Tensor], what: str = "params") -> None:
    """Raise :class:`ParamsError` unless ``params`` has exactly the module's ``state_dict``
    keys with the same shapes."""
    if not isinstance(model, nn.Module):
        raise ParamsError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    expected = model.state_dict(keep_vars=True)
    missing = [k for k in expected if k not in params]
    unknown = [k for k in params if k not in expected]
    if missing or unknown:
        raise ParamsError(
            f"{what} do not fit {type(model).__name__}: missing {short_list(missing)}, "
            f"unknown {short_list(unknown)}"
        )
    for k, t in expected.items():
        if params[k].shape != t.shape:
            raise ParamsError(
                f"{what}[{k!r}] has shape {tuple(params[k].shape)}, {type(model).__name__} "
                f"expects {tuple(t.shape)}"
            )


def logits_of(output: Any) -> Any:
    """A model's output as lmckit reads it: a mapping output (Hugging Face's
    ``ModelOutput``) that holds ``logits`` is read as them; anything else as it is."""
    if isinstance(output, Mapping) and "logits" in output:
        return output["logits"]
    return output


@checked
def forward(model: nn.Module, params: Mapping[str, Tensor] | None, x: Tensor) -> Tensor:
    """``model(x)`` with ``params`` substituted (``None``: the module's own weights); a
    Hugging Face model's output is read as its logits (:func:`logits_of`).

    Raises:
        DataError: the batch does not fit the model (a shape error from deep inside the
            network is reported with the batch's shape and the model's name).
    """
    try:
        if params is None:
            return logits_of(model(x))
        return logits_of(torch.func.functional_call(model, params, (x,)))
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"a batch of shape {tuple(x.shape)} does not fit {type(model).__name__}: {first}"
        ) from exc


@checked
def per_token(out: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """A language model's outputs as rows of a classification: logits ``(N, L, C)`` with
    next-token targets ``(N, L)`` become ``(N·L, C)`` and ``(N·L,)``, so every position is one
    prediction and losses, accuracies, temperatures and counts are per token (the mean
    cross-entropy is then log-perplexity). Any other pair is returned unchanged."""
    if out.ndim == 3 and y.ndim == 2 and tuple(out.shape[:2]) == tuple(y.shape):
        return out.reshape(-1, out.shape[-1]), y.reshape(-1)
    return out, y


@checked
def check_labels(out: Tensor, y: Tensor, caller: str) -> None:
    """Raise :class:`DataError` unless ``y`` holds one integer class index in
    ``[0, classes)`` per row of the model's outputs ``out`` (``(N, classes)``)."""
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise DataError(f"{caller}: labels must be integer class indices, got {y.dtype}")
    if y.ndim != 1 or len(y) != len(out):
        raise DataError(f"{caller}: labels of shape {tuple(y.shape)} for {len(out)} outputs")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= out.shape[-1]):
        raise DataError(
            f"{caller}: labels range over [{int(y.min())}, {int(y.max())}] but the model has "
            f"{out.shape[-1]} outputs (classes 0..{out.shape[-1] - 1})"
        )
