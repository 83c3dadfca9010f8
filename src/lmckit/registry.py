"""Method registries: every family (matchers, mergers) lists its methods by name.

The command line and the experiment engine read their choices from a registry instead of
typing method names out, and learn from it what a method needs (a model to run, data to
run it on) before any expensive work starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from lmckit.errors import ParamsError
from lmckit.options import check_options, renamed_options

__all__ = ["Method", "signature_mismatches"]


def signature_mismatches(fn: Callable[..., Any], protocol: type) -> list[str]:
    """How ``fn``'s signature departs from the family ``protocol``'s
    (:class:`lmckit.match.Matcher`, :class:`lmckit.merge.Merger`): each of the protocol's
    named parameters must be ``fn``'s, in the same place for the positional ones, of the
    same kind and default, and ``fn`` must return the protocol's result type (compared by
    name); an empty list when it fits. ``fn``'s further keyword-only parameters are its
    options."""
    wanted = inspect.signature(protocol.__call__)
    found = inspect.signature(fn)
    params = [p for p in wanted.parameters.values() if p.name != "self"]
    have = found.parameters
    problems = []
    positional = [p.name for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    positional = [p for p in positional if p != "options"]
    fn_positional = [
        p.name
        for p in have.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if fn_positional != positional:
        problems.append(f"positional parameters {fn_positional}, wanted {positional}")
    for p in params:
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        q = have.get(p.name)
        if q is None:
            problems.append(f"no keyword {p.name!r}")
        elif q.kind is not inspect.Parameter.KEYWORD_ONLY:
            problems.append(f"{p.name!r} is not keyword-only")
        elif q.default != p.default:
            problems.append(f"{p.name!r} defaults to {q.default!r}, wanted {p.default!r}")
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in have.values()):
        problems.append("takes *args")
    result = str(found.return_annotation).rsplit(".", 1)[-1].strip("'\"")
    if found.return_annotation is inspect.Signature.empty:
        result = "nothing declared"
    expected = str(wanted.return_annotation).rsplit(".", 1)[-1].strip("'\"")
    if result != expected:
        problems.append(f"returns {result}, wanted {expected}")
    return problems


@dataclass(frozen=True)
class Method:
    """A named method of a family: ``fn`` called with some options fixed.

    Attributes:
        name: the registry key (also the CLI's spelling).
        fn: the library function, with the family's signature.
        needs_model: ``model=`` must be given (the method runs the network).
        needs_data: ``data=`` must be given (the method looks at examples).
        fixed: keyword options this entry fixes (``{"warm_start": False}`` for ``wm``).
        summary: one line for help texts.
        unused: keyword options of ``fn`` that do nothing under ``fixed`` (Sinkhorn's
            ``epochs`` when its objective is the weight distance): not offered, and an
            error if passed.
        passes_to: the method ``fn`` hands its remaining options to (star-STE's matcher):
            its options are this method's too.
        needs_sizes: ``sizes=`` must be given — how many examples each model trained on
            (FedAvg's weights); callers that hold checkpoints read them from the sidecars.
        check_combination: refuses options that are valid alone but not together (a
            :class:`~lmckit.errors.ParamsError`), so that :meth:`check_options` catches them
            before a run starts rather than when the job reaches ``fn``.
        check_count: refuses options that do not fit a merge of ``n`` models (STE-MM's
            fixed ``weights`` must be ``n`` numbers): an experiment checks each of its
            blocks' counts with it before a run starts.
    """

    name: str
    fn: Callable[..., Any]
    needs_model: bool
    needs_data: bool
    summary: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    unused: tuple[str, ...] = ()
    passes_to: Method | None = None
    needs_sizes: bool = False
    check_combination: Callable[[Mapping[str, Any]], None] | None = None
    check_count: Callable[[Mapping[str, Any], int], None] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))

    def own_options(self) -> tuple[str, ...]:
        """``fn``'s own keyword options the caller may set (its keyword-only parameters,
        less the family's common ones, those this entry fixes and those it does not use)."""
        # the family's common arguments, and an example batch (the caller's to supply from
        # the model: a model folder's own inputs, say), are not options
        common = {"model", "data", "init", "seed", "progress", "reference"}
        common |= {"example_inputs", "example_kwargs"}
        common |= {"resume", "resume_every"}  # where a run saves its state: not a result option
        if self.needs_sizes:
            common.add("sizes")  # supplied by the caller from the models, not an option
        return tuple(
            name
            for name, p in inspect.signature(self.fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
            and name not in common
            and name not in self.fixed
            and name not in self.unused
        )

    def options(self) -> tuple[str, ...]:
        """Every keyword option the caller may set: :meth:`own_options`, then those of
        :attr:`passes_to`."""
        passed = self.passes_to.options() if self.passes_to is not None else ()
        own = self.own_options()
        return own + tuple(o for o in passed if o not in own)

    def check_options(self, options: Mapping[str, Any], where: str = "") -> dict[str, Any]:
        """``options`` checked against the signatures that declare them: a name this
        method does not take, or a value of the wrong type or out of range, is a
        :class:`~lmckit.errors.ParamsError` naming it (and the method). Returns the options
        with any renamed one under its new name (:data:`~lmckit.options.RENAMED_OPTIONS`,
        with a ``DeprecationWarning``): callers run and key what it returns."""
        if not isinstance(options, Mapping):
            raise ParamsError(f"{where}options of {self.name!r} must be a table, got {options!r}")
        allowed = self.options()
        options = renamed_options(options, allowed, where=where)
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            known = ", ".join(allowed) if allowed else "none"
            raise ParamsError(
                f"{where}method {self.name!r} takes no option(s) {unknown}; its options: {known}"
            )
        own = set(self.own_options())
        check_options(self.fn, {k: v for k, v in options.items() if k in own}, where=where)
        if self.passes_to is not None:
            self.passes_to.check_options(
                {k: v for k, v in options.items() if k not in own}, where=where
            )
        if self.check_combination is not None:
            try:
                self.check_combination(options)
            except ParamsError as exc:
                raise ParamsError(f"{where}{exc}") from None
        return dict(options)

    def check_count_options(self, options: Mapping[str, Any], n: int, where: str = "") -> None:
        """Refuse ``options`` that cannot merge ``n`` models (a
        :class:`~lmckit.errors.ParamsError` prefixed with ``where``); nothing to check for a
        method without ``check_count``."""
        if self.check_count is not None:
            try:
                self.check_count(options, n)
            except ParamsError as exc:
                raise ParamsError(f"{where}{exc}") from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` with the fixed options; a fixed or unused option passed again is an
        error."""
        clash = sorted(set(kwargs) & set(self.fixed))
        if clash:
            raise ParamsError(f"method {self.name!r} fixes {clash}; do not pass them")
        unused = sorted(set(kwargs) & set(self.unused))
        if unused:
            raise ParamsError(f"method {self.name!r} does not use {unused}; do not pass them")
        if self.needs_model and kwargs.get("model") is None:
            raise ParamsError(f"method {self.name!r} needs model= (the network to run)")
        if self.needs_data and kwargs.get("data") is None:
            raise ParamsError(f"method {self.name!r} needs data= (a Dataset or batches)")
        if self.needs_sizes and kwargs.get("sizes") is None:
            raise ParamsError(
                f"method {self.name!r} needs sizes= (the number of training examples of each model)"
            )
        return self.fn(*args, **kwargs, **self.fixed)
