"""One progress-event type for every long computation.

Matchers, mergers, interpolation and training accept ``progress=`` — a callable that
receives a :class:`Progress` after each unit of work — and never print. ``step`` counts
units done so far (from 1); ``total`` is the number of units when it is known in advance
(``None`` for methods that stop on convergence); ``metrics`` carries what the unit
measured (a loss, an objective). The command line turns the events into progress bars
with one helper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Progress", "ProgressCallback", "notify"]


@dataclass(frozen=True)
class Progress:
    """A unit of work finished: ``step`` of ``total`` (``None``: unknown), with ``metrics``."""

    step: int
    total: int | None
    metrics: Mapping[str, Any] = field(default_factory=dict)


ProgressCallback = Callable[[Progress], None]


def notify(progress: ProgressCallback | None, step: int, total: int | None, **metrics: Any) -> None:
    """Send ``Progress(step, total, metrics)`` to ``progress`` if there is one."""
    if progress is not None:
        progress(Progress(step, total, metrics))
