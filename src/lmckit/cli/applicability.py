"""Options that apply only in some cases: the rules each command declares next to its
parser (``APPLIES``: ``(dest, check)`` pairs, ``check(args)`` saying why the option does not
apply, ``None`` when it does; ``NO_REPEATS``: list options whose values must be distinct),
and the one check that reads them before any command runs. An option given where it does not
apply is an error, never silently ignored."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lmckit.errors import UsageError


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def needs(dest: str, why: str) -> Callable[[argparse.Namespace], str | None]:
    """Applies only when ``dest`` was given too."""
    return lambda a: None if dest in a.given else f"it needs {flag(dest)} ({why})"


def excludes(dest: str, why: str) -> Callable[[argparse.Namespace], str | None]:
    """Does not apply together with ``dest``."""
    return lambda a: f"it conflicts with {flag(dest)} ({why})" if dest in a.given else None


def method_option(registry_name: str, dest: str) -> Callable[[argparse.Namespace], str | None]:
    """A method's keyword option: applies when the chosen method (or, for a merge sweep,
    one of the swept methods) takes it — read from the method registry."""

    def check(a: argparse.Namespace) -> str | None:
        from lmckit.workflows.merging import SWEEP_METHODS

        registry = _registry(registry_name)
        swept = getattr(a, "methods", None) or list(SWEEP_METHODS)
        methods = swept if getattr(a, "sweep_n", None) else [a.method]
        if any(dest in registry[m].options() for m in methods):
            return None
        if len(methods) == 1:
            takes = ", ".join(registry[methods[0]].options()) or "none"
            return f"method {methods[0]} takes no {dest} (its options: {takes})"
        return f"none of the methods {', '.join(methods)} takes {dest}"

    return check


def data_needed(a: argparse.Namespace) -> str | None:
    from lmckit.match import METHODS

    if METHODS[a.method].needs_data:
        return None
    return f"method {a.method} does not look at data"


def split_setting(dest: str, kinds: tuple[str, ...]) -> Callable[[argparse.Namespace], str | None]:
    def check(a: argparse.Namespace) -> str | None:
        if a.split is None:
            return "it is a setting of --split"
        if a.split not in kinds:
            return f"--split {a.split} takes no {dest} (it is for {' and '.join(kinds)})"
        return None

    return check


Check = Callable[[argparse.Namespace], str | None]


MODEL_CLASS: list[tuple[str, Check]] = [
    (dest, needs("model_class", "it describes a user's class"))
    for dest in ("model_args", "input_shape", "tokens")
]


def _registry(family: str):
    if family == "match":
        from lmckit.match import METHODS
    else:
        from lmckit.merge import METHODS
    return METHODS


def method_options(family: str, args: argparse.Namespace) -> dict[str, Any]:
    """The command's options that are keyword options of some method of ``family``'s
    registry (``"match"`` or ``"merge"``), with their values (``None``: not given, the
    method's default) — read from the registry, so a method's new option needs no list here."""
    takes = {option for method in _registry(family).values() for option in method.options()}
    return {dest: value for dest, value in vars(args).items() if dest in takes}


def method_rules(family: str, args: argparse.Namespace) -> list[tuple[str, Check]]:
    """:func:`method_option` for every option of :func:`method_options`."""
    return [(dest, method_option(family, dest)) for dest in method_options(family, args)]


def check_applicable(
    args: argparse.Namespace,
    applies: list[tuple[str, Check]],
    no_repeats: tuple[str, ...] = (),
) -> None:
    """Refuse an option given (``args.given``) where it does not apply (``applies``'s
    checks) and a repeated value of the list options ``no_repeats``."""
    for dest in no_repeats:
        values = getattr(args, dest, None) or []
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if dest in args.given and repeated:
            raise UsageError(f"{flag(dest)} lists {repeated} more than once")
    for dest, check in applies:
        if dest in args.given:
            why = check(args)
            if why:
                name = dest.upper() if dest in ("a", "b") else flag(dest)
                raise UsageError(f"{name} does not apply here: {why}")


DATA_OPTIONS = ("dataset", "data_dir", "no_download")
"""The options that say where a command's data comes from."""
