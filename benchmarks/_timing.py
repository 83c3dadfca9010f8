"""Shared by the benchmark scripts: alternate the variants, report medians, pick a device."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from statistics import median

import torch


def synchronize() -> None:
    """Wait for queued GPU work, so a wall-clock interval covers what it launched (a no-op
    on CPU: its kernels run before the call returns)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each variant over ``repeats`` rounds, after one warm-up call each;
    the variants alternate within a round so drift in the machine hits all alike."""
    for fn in variants.values():
        fn()
    synchronize()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            synchronize()
            times[name].append(time.perf_counter() - t)
    return {k: median(v) for k, v in times.items()}


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device`` (default cpu): where models, data and products live."""
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")


def machine(device: str) -> dict:
    """What the numbers were measured on: CPU threads, torch, and the GPU's name if any."""
    import platform

    out = {
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": device,
    }
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out
