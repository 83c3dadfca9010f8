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

__all__ = ["Method"]


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
    """

    name: str
    fn: Callable[..., Any]
    needs_model: bool
    needs_data: bool
    summary: str
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))

    def options(self) -> tuple[str, ...]:
        """Keyword options the caller may still set (the function's keyword-only
        parameters, less the family's common ones and those this entry fixes)."""
        common = {"model", "data", "init", "seed", "progress", "reference"}
        return tuple(
            name
            for name, p in inspect.signature(self.fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
            and name not in common
            and name not in self.fixed
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` with the fixed options; a fixed option passed again is an error."""
        clash = sorted(set(kwargs) & set(self.fixed))
        if clash:
            raise ParamsError(f"method {self.name!r} fixes {clash}; do not pass them")
        if self.needs_model and kwargs.get("model") is None:
            raise ParamsError(f"method {self.name!r} needs model= (the network to run)")
        if self.needs_data and kwargs.get("data") is None:
            raise ParamsError(f"method {self.name!r} needs data= (a Dataset or batches)")
        return self.fn(*args, **kwargs, **self.fixed)
