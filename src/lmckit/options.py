"""Keyword options checked against the signature that declares them.

A public function's keyword options are its schema: their type hints say what a value
must be, and ``Annotated[...]`` adds a range where one matters::

    def ste_matching(..., epochs: Annotated[int, AtLeast(1)] = 1, lr: Positive = 1e-3)

:func:`check_options` reads that schema to check options *before* they reach the
function — an experiment file's ``[compare.options]``, the command line's method options,
a zoo model's configuration, a training configuration — so that an unknown name, a value
of the wrong type (``epochs = true``, ``hidden = "64"``) or one out of range is an error
naming it, up front. Types: ``int`` (not ``bool``), ``float`` (any finite real number,
not ``bool``), ``bool``, ``str``, ``None``, unions, ``Literal``, ``list``/``tuple``/
``Sequence`` of a type (not a string), ``Mapping``/``dict``; other classes by
``isinstance``.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import os
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from lmckit.errors import LmcError, ParamsError

__all__ = [
    "RENAMED_OPTIONS",
    "AtLeast",
    "Between",
    "Count",
    "Fraction",
    "NonNegative",
    "Positive",
    "Range",
    "check_arguments",
    "check_options",
    "check_value",
    "checked",
    "describe",
    "option_hints",
    "renamed_options",
]


@dataclass(frozen=True)
class Range:
    """A closed (or, where ``*_open``, open) interval a number must lie in."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is in the interval."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high >= 2**62 and self.low != -math.inf:  # no upper bound worth naming
            return f"{'>' if self.low_open else '≥'} {_number(self.low)}"
        lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {lo}{_number(self.low)}, {_number(self.high)}{hi}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def AtLeast(low: float) -> Range:
    """``value ≥ low``."""
    return Range(low)


def Between(low: float, high: float) -> Range:
    """``low ≤ value ≤ high``."""
    return Range(low, high)


PositiveRange = Range(0.0, low_open=True)
Positive = Annotated[float, PositiveRange]
"""A finite number > 0."""
NonNegative = Annotated[float, Range(0.0)]
"""A finite number ≥ 0."""
Fraction = Annotated[float, Range(0.0, 1.0, low_open=True, high_open=True)]
"""A number strictly between 0 and 1."""
Count = Annotated[int, Range(1)]
"""An integer ≥ 1 (epochs, steps, batch sizes, iterations)."""


@functools.lru_cache(maxsize=256)
def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    target = fn.__init__ if isinstance(fn, type) else fn
    try:
        return typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError):  # a hint naming what the module never imports
        return {}


def option_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The type hints of ``fn``'s parameters (a class: its ``__init__``'s), with
    ``Annotated`` ranges kept."""
    return dict(_hints(fn))


def describe(hint: Any) -> str:
    """``hint`` in words, for error messages."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        base, *extra = args
        ranges = [r for r in extra if isinstance(r, Range)]
        if base is float and ranges == [PositiveRange]:
            return "a positive number"
        return describe(base) + "".join(f" {r}" for r in ranges)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint is type(None) or hint is None:
        return "none"
    if origin in (list, tuple, collections.abc.Sequence):
        item = args[0] if args else Any
        return f"a list of {_plural(describe(item))}" if item is not Any else "a list"
    if origin is collections.abc.Iterable:
        return "an iterable of (inputs, labels) batches"
    if origin is collections.abc.Callable:
        return "a function"
    if hint is os.PathLike:
        return "a path"
    if origin in (dict, collections.abc.Mapping):
        value = args[1] if len(args) == 2 else Any
        return "a table" if value is Any else f"a table of {_plural(describe(value))}"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if hint in names:
        return names[hint]
    return getattr(hint, "__name__", str(hint))


def _plural(text: str) -> str:
    """ "an integer ≥ 1" → "integers ≥ 1"."""
    for article in ("an ", "a "):
        if text.startswith(article):
            noun, _, rest = text[len(article) :].partition(" ")
            return f"{noun}s {rest}".rstrip()
    return text


def _base(hint: Any) -> Any:
    """``int`` for ``Annotated[int, …]``, the hint itself otherwise."""
    return get_args(hint)[0] if get_origin(hint) is Annotated else hint


def _fits(value: Any, hint: Any, strict: bool = True) -> bool:
    """Whether ``value`` has the type ``hint`` says, with its ``Annotated`` ranges and
    floats finite — or, not ``strict``, the structure alone (any real number a float)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin is Annotated:
        return _fits(value, args[0], strict) and (
            not strict or all(r.holds(value) for r in args[1:] if isinstance(r, Range))
        )
    if origin in (Union, types.UnionType):
        return any(_fits(value, a, strict) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        real = isinstance(value, Real) and not isinstance(value, bool)
        return real and (not strict or math.isfinite(value))
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence):
        item = args[0] if args else Any
        numbers = _base(item) in (float, int)
        if not strict and numbers and type(value).__name__ in ("Tensor", "ndarray"):
            return True  # an array stands for a sequence of numbers; its items are not walked
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(
                _fits(v, a, strict) for v, a in zip(value, args, strict=True)
            )
        item = args[0] if args else Any
        return all(_fits(v, item, strict) for v in value)
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            return False
        item = args[1] if len(args) == 2 else Any
        return all(_fits(v, item, strict) for v in value.values())
    if origin is collections.abc.Callable:
        return callable(value)
    if origin is collections.abc.Iterable:  # batches: iterable, and not a lone tensor/table
        return (
            isinstance(value, collections.abc.Iterable)
            and not isinstance(value, str | bytes | Mapping)
            and type(value).__name__ != "Tensor"
        )
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a typing construct this checker does not know: trust the function


def check_value(name: str, value: Any, hint: Any, *, where: str = "") -> Any:
    """Return ``value`` if it fits ``hint`` (type and range), else raise
    :class:`~lmckit.errors.ParamsError` naming ``name`` and what it must be."""
    if not _fits(value, hint):
        raise ParamsError(f"{where}{name} must be {describe(hint)}, got {value!r}")
    return value


def check_options(
    fn: Callable[..., Any],
    options: Mapping[str, Any],
    *,
    allowed: Iterable[str] | None = None,
    where: str = "",
) -> dict[str, Any]:
    """Check ``options`` against ``fn``'s signature: every name must be one of
    ``allowed`` (default: ``fn``'s keyword parameters) and every value must fit its hint.

    Raises:
        ParamsError: an unknown or inapplicable name (the message lists the known ones) or
            a value of the wrong type or out of range (the message says what it must be).
    """
    if not isinstance(options, Mapping):
        raise ParamsError(f"{where}options must be a table, got {options!r}")
    parameters = inspect.signature(fn).parameters
    if allowed is None:
        allowed = [
            n
            for n, p in parameters.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"
        ]
    allowed = list(allowed)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        known = ", ".join(allowed) if allowed else "none"
        raise ParamsError(f"{where}unknown option(s) {unknown}; known: {known}")
    hints = _hints(fn)
    for name, value in options.items():
        if name in hints:
            check_value(name, value, hints[name], where=where)
    return dict(options)


RENAMED_OPTIONS: dict[str, str] = {"variant": "recipe"}
"""Keyword options renamed, old name → new name: the old spelling is still accepted, with a
``DeprecationWarning``, for one release (``variant=`` also named the grid variants of an
experiment file; the ``"lmckit"``/``"paper"`` switch is now ``recipe=``)."""


def renamed_options(
    options: Mapping[str, Any], takes: Iterable[str], *, where: str = ""
) -> dict[str, Any]:
    """``options`` with each old name of :data:`RENAMED_OPTIONS` whose new name is in
    ``takes`` replaced by the new name, warning once per call (``DeprecationWarning``);
    every other name unchanged. Both spellings at once is a :class:`ParamsError`."""
    takes = set(takes)
    old = [o for o in options if o in RENAMED_OPTIONS and RENAMED_OPTIONS[o] in takes]
    if not old:
        return dict(options)
    for name in old:
        if RENAMED_OPTIONS[name] in options:
            raise ParamsError(
                f"{where}{name}= and {RENAMED_OPTIONS[name]}= both given; {name} is the old "
                f"name of {RENAMED_OPTIONS[name]}: give only {RENAMED_OPTIONS[name]}"
            )
    warnings.warn(
        f"{where}option(s) {', '.join(f'{o}= is now {RENAMED_OPTIONS[o]}=' for o in old)}; "
        "the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return {RENAMED_OPTIONS.get(k, k) if k in old else k: v for k, v in options.items()}


COMMON = frozenset({"model", "data", "init", "seed", "progress", "reference"})
"""The family signature's shared arguments, which each function checks itself (with
messages about what they must hold, beyond their type)."""


def _got(value: Any) -> str:
    """A value as an error message shows it: small values by ``repr``, the rest by type."""
    if value is None or isinstance(value, bool | int | float | str):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a public function so that its arguments answer to its own hints: every
    keyword option a caller passes is checked up front by type, range and finiteness
    (:func:`check_value` — the schema the command line and experiment files are checked
    against); the other arguments keep the function's own checks, and where the function
    fails with a Python error (``TypeError``, ``AttributeError``, ``KeyError`` …) while an
    argument does not have the structure its hint asks for (a dict of tensors where
    ``Params`` is asked for, a module where ``nn.Module`` is), the failure becomes a
    :class:`~lmckit.errors.ParamsError` naming that argument."""
    signature = inspect.signature(fn)
    options = {
        n for n, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY and n not in COMMON
    }

    def misfit(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        hints = _hints(fn)
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return None
        for name, value in bound.items():
            hint = hints.get(name)
            if hint is not None and not _fits(value, hint, strict=False):
                return f"{fn.__name__}: {name} must be {describe(hint)}, got {_got(value)}"
        return None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if RENAMED_OPTIONS.keys() & kwargs.keys():
            kwargs = renamed_options(kwargs, options, where=f"{fn.__name__}: ")
        if options & set(kwargs):
            hints = _hints(fn)
            for name in options & set(kwargs):
                # a function-valued option keeps its function's own message (what it is
                # called with); a misfit one is still named below if the call fails
                if name in hints and not _takes_callable(hints[name]):
                    check_value(name, kwargs[name], hints[name], where=f"{fn.__name__}: ")
        try:
            return fn(*args, **kwargs)
        except LmcError:
            raise
        except (TypeError, AttributeError, KeyError, IndexError, ValueError, RuntimeError) as exc:
            message = misfit(args, kwargs)
            if message is None:
                raise
            raise ParamsError(message) from exc

    return wrapper


def _takes_callable(hint: Any) -> bool:
    """Whether ``hint`` is, or is a union with, a ``Callable``."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_takes_callable(a) for a in args)
    return origin is collections.abc.Callable


def check_arguments(fn: Callable[..., Any], values: Mapping[str, Any], *, where: str = "") -> None:
    """Check a call's arguments (a constructor's ``locals()`` at its start) against
    ``fn``'s hints; ``self`` and names without a hint are skipped."""
    hints = _hints(fn)
    for name, value in values.items():
        if name != "self" and name in hints:
            check_value(name, value, hints[name], where=where)
