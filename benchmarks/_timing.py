"""Shared by the benchmark scripts: alternate the variants, report medians."""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each variant over ``repeats`` rounds, after one warm-up call each;
    the variants alternate within a round so drift in the machine hits all alike."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: median(v) for k, v in times.items()}
