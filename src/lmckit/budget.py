"""Time and memory estimates, checked before long or large work starts.

A command that would run for years or cannot fit in memory is refused in a second, with
its estimate, instead of running for hours or dying of ``MemoryError`` half-way. Estimates
are *lower bounds* built from a measured unit — one forward pass over a batch —
times a count the request fixes (points of a landscape,
λ values, restarts, epochs): a refusal is certain to be right, never a guess about a run
that would have fit. The limits: ``Budget.seconds`` (``--max-hours`` on the command line,
24 h by default) and the memory the machine has available now.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit.errors import ParamsError, UsageError

__all__ = [
    "DEFAULT_HOURS",
    "Budget",
    "ResourceError",
    "available_memory",
    "check_budget",
    "forward_seconds",
    "human_bytes",
    "human_seconds",
]

DEFAULT_HOURS = 24.0


class ResourceError(UsageError):
    """A request whose estimated time or memory exceeds what it is allowed."""


def available_memory(meminfo: str | os.PathLike = "/proc/meminfo") -> int:
    """Bytes of memory available to a new allocation now (Linux ``MemAvailable`` of
    ``meminfo``, which the kernel gives in KiB — not ``MemFree``, which leaves out the page
    cache it can reclaim; the free physical pages elsewhere; a very large number where
    neither can be read)."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 1 << 62


@dataclass(frozen=True)
class Budget:
    """What one request may take: ``seconds`` of wall-clock time and ``memory`` bytes
    (``None``: what the machine has available when checked)."""

    seconds: float = DEFAULT_HOURS * 3600
    memory: int | None = None

    @classmethod
    def hours(cls, hours: float | None) -> Budget:
        """A budget of ``hours`` (the default when ``None``)."""
        return cls() if hours is None else cls(seconds=float(hours) * 3600)

    def memory_limit(self) -> int:
        """The memory limit in bytes."""
        return available_memory() if self.memory is None else self.memory


def human_seconds(seconds: float) -> str:
    """``seconds`` in the largest sensible unit: "12 s", "4.2 min", "5.1 h", "3.2 days",
    "1.4e+04 years"."""
    if not math.isfinite(seconds):
        return "forever"
    for size, unit in ((365.25 * 86400, "years"), (86400, "days"), (3600, "h"), (60, "min")):
        if seconds >= 2 * size or (unit in ("h", "min") and seconds >= size):
            value = seconds / size
            return f"{value:.3g} {unit}" if value < 1e4 else f"{value:.2g} {unit}"
    return f"{seconds:.2g} s"


def human_bytes(n: float) -> str:
    """``n`` bytes as "512 MiB", "3.5 GiB", "1.2e+03 TiB"."""
    for size, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 1e4 else f"{value:.2g} {unit}"
    return f"{int(n)} B"


def check_budget(
    what: str,
    *,
    seconds: float = 0.0,
    memory: float = 0.0,
    detail: str = "",
    budget: Budget | None = None,
) -> None:
    """Refuse ``what`` if it would take at least ``seconds`` beyond the budget or at least
    ``memory`` bytes beyond what is available.

    Raises:
        ResourceError: naming ``what``, the estimate, how it was made (``detail``) and the
            limit (and how to raise the time limit).
    """
    budget = budget or Budget()
    how = f" ({detail})" if detail else ""
    if seconds > budget.seconds:
        raise ResourceError(
            f"{what} would take at least {human_seconds(seconds)}{how}, more than the "
            f"{human_seconds(budget.seconds)} allowed; ask for less, or raise the limit "
            "with --max-hours"
        )
    limit = budget.memory_limit()
    if memory > limit:
        raise ResourceError(
            f"{what} would need at least {human_bytes(memory)} of memory{how}; "
            f"{human_bytes(limit)} is available"
        )


def forward_seconds(
    model: nn.Module,
    params: dict[str, Tensor] | None,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    forward: Callable[..., Tensor] | None = None,
) -> tuple[float, int]:
    """``(seconds, examples)`` of one forward pass (no gradients, eval mode, the best of
    two) over the first batch of ``batches``: the unit of evaluation work."""
    from lmckit.functional import forward as default_forward
    from lmckit.functional import module_mode

    run = forward or default_forward
    x, _ = next(iter(batches))
    device = next(iter(params.values())).device if params else next(model.parameters()).device
    x = x.to(device)
    best = math.inf
    with torch.no_grad(), module_mode(model, False):
        for _ in range(2):
            start = time.perf_counter()
            run(model, params, x)
            best = min(best, time.perf_counter() - start)
    return best, len(x)


def check_max_memory(max_memory: object, error: type[Exception] = ParamsError) -> None:
    """Refuse (``error``, naming the value) a ``max_memory`` that is not None or a positive
    whole number of bytes."""
    if max_memory is not None and (
        isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 1
    ):
        raise error(f"max_memory must be a positive number of bytes or None, got {max_memory!r}")
