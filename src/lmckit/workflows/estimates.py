"""Estimates of the commands' long work, checked before it starts (:mod:`lmckit.budget`):
a measured unit — one forward pass of the checkpoint's model, one weight-matching sweep of
the pair — times the counts the request fixes. Each raises
:class:`~lmckit.budget.ResourceError` naming the request, its estimate and the limit."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from lmckit.budget import Budget, check_budget, forward_seconds
from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset

__all__ = ["check_curves", "check_match", "check_merge", "per_example_seconds", "sweep_seconds"]


def per_example_seconds(ckpt: Checkpoint, data: Dataset) -> float:
    """Seconds of one forward pass per example of ``data`` for ``ckpt``'s model (measured
    on one test batch)."""
    seconds, n = forward_seconds(ckpt.model, ckpt.params, data.loader("test", batch_size=256))
    return seconds / max(n, 1)


def sweep_seconds(a: Checkpoint, b: Checkpoint) -> float:
    """One weight-matching restart of one sweep for ``a`` and ``b``, measured: a call with
    three such restarts (after a warm-up call), divided by three."""
    from lmckit.match import weight_matching

    weight_matching(a.spec, a.params, b.params, max_iter=1)  # compiled kernels, caches
    start = time.perf_counter()
    weight_matching(a.spec, a.params, b.params, restarts=3, max_iter=1)
    return (time.perf_counter() - start) / 3


def check_match(
    a: Checkpoint,
    b: Checkpoint,
    method: str,
    data: Dataset | None,
    *,
    restarts: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    budget: Budget | None = None,
) -> None:
    """Weight matching's restarts (each sweeps at least twice) and a data-driven matcher's
    epochs (each at least a forward pass over the training set; STE also one sweep per
    step)."""
    if method in ("wm", "wm-fast") and (restarts or 1) > 1:
        sweep = sweep_seconds(a, b)
        check_budget(
            f"weight matching with {restarts} restart(s)",
            seconds=restarts * 2 * sweep,
            detail=f"each restart sweeps at least twice; one sweep took {sweep:.2g} s",
            budget=budget,
        )
    if data is not None and epochs:
        per_pass = len(data.train_y) * per_example_seconds(a, data)
        if method == "ste":  # every step projects by weight matching: ≥ one sweep
            per_pass += math.ceil(len(data.train_y) / (batch_size or 256)) * sweep_seconds(a, b)
        check_budget(
            f"{method} for {epochs} epoch(s)",
            seconds=epochs * per_pass,
            detail=f"each epoch ≥ {per_pass:.2g} s: a forward pass over the "
            f"{len(data.train_y)} training examples"
            + (" and a weight-matching sweep per step" if method == "ste" else "")
            + ", measured",
            budget=budget,
        )


def check_curves(
    a: Checkpoint,
    data: Dataset,
    *,
    paths: int,
    lambdas: int,
    test_only: bool,
    budget: Budget | None = None,
) -> None:
    """``paths`` curves of ``lambdas`` points: the evaluations, and the logits every path
    keeps for every λ."""
    examples = len(data.test_y) + (0 if test_only else len(data.train_y))
    count = lambdas * paths
    check_budget(
        f"{paths} path(s) at {lambdas} λ values",
        seconds=count * examples * per_example_seconds(a, data),
        memory=lambdas * examples * data.num_classes * 4,
        detail=f"{count} evaluations of {examples} examples; each path keeps "
        f"{lambdas} × {examples} × {data.num_classes} float32 logits",
        budget=budget,
    )


def check_merge(
    ckpts: Sequence[Checkpoint],
    method: str,
    data: Dataset,
    *,
    landscape: int = 0,
    sharpness_probes: int = 0,
    epochs: int | None = None,
    budget: Budget | None = None,
) -> None:
    """A merge's landscape (``landscape²`` evaluations of the test set), sharpness probes
    (a Hessian-vector product over four batches each) and STE-MM's epochs."""
    per_example = per_example_seconds(ckpts[0], data)
    if landscape:
        points = landscape**2
        check_budget(
            f"a landscape of resolution {landscape}",
            seconds=points * len(data.test_y) * per_example,
            memory=points * 3 * 8,
            detail=f"{points} points, each an evaluation of {len(data.test_y)} test examples",
            budget=budget,
        )
    if sharpness_probes:
        check_budget(
            f"sharpness with {sharpness_probes} probes",
            seconds=sharpness_probes * 4000 * per_example * 2,
            detail="per probe and model, a Hessian-vector product over 4 batches",
            budget=budget,
        )
    if epochs:
        check_budget(
            f"{method} for {epochs} epoch(s)",
            seconds=epochs * len(data.train_y) * per_example,
            detail=f"each epoch ≥ a forward pass over {len(data.train_y)} examples",
            budget=budget,
        )
