"""Checks of scalar options shared by the library's public functions: each raises
:class:`~lmckit.errors.ParamsError` naming the option, what it needs and what it got."""

from __future__ import annotations

import math
from numbers import Real

from lmckit.errors import ParamsError

MAX_SEED = 2**63 - 1


def check_int(name: str, value: object, *, minimum: int = 1, where: str = "") -> int:
    """``value`` is an integer ≥ ``minimum`` (booleans are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParamsError(f"{where}{name} must be an integer ≥ {minimum}, got {value!r}")
    return value


def check_seed(value: object) -> int:
    """``value`` is a seed: an integer in ``[0, 2**63)``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ParamsError(f"seed must be an integer in [0, 2**63), got {value!r}")
    return value


def check_number(
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    where: str = "",
) -> float:
    """``value`` is a finite real number in ``[low, high]`` (an end is excluded where
    ``low_open``/``high_open``)."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high
        )
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ParamsError(f"{where}{name} must be a number in {lo}{low}, {high}{hi}, got {value!r}")
    return float(value)


def check_positive(name: str, value: object, *, where: str = "") -> float:
    """``value`` is a finite number > 0."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise ParamsError(f"{where}{name} must be a positive number, got {value!r}")
    return float(value)


def check_device(device: object, name: str = "device") -> str:
    """``device`` (a string or ``torch.device``) names a device this machine has: ``cpu``,
    an available ``cuda`` / ``cuda:N`` or ``mps``; returns it as a string."""
    import torch

    try:
        parsed = torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, ValueError, TypeError):
        raise ParamsError(f"unknown {name} {device!r}; use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ParamsError(f"{name} {device!r}: CUDA is not available on this machine")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ParamsError(
                f"{name} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ParamsError(f"{name} {device!r}: MPS is not available on this machine")
    elif parsed.type != "cpu":
        raise ParamsError(f"{name} type {parsed.type!r} is not supported")
    return str(parsed)
