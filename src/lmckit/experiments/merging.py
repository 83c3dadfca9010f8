"""Merging checkpoints by method name, and the resumable "metric vs n" sweep."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmckit._io import atomic_write_json
from lmckit.analysis import multi_model_metrics
from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset
from lmckit.errors import LmcError
from lmckit.experiments.matching import check_same_architecture
from lmckit.merge import MergeResult, ccmm, merge_many, star, ste_mm

METHODS = ("star-wm", "star-ste", "merge-many", "ste-mm", "ccmm")


def merge_checkpoints(
    ckpts: Sequence[Checkpoint],
    method: str,
    data: Dataset | None,
    *,
    epochs: int = 10,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
    progress=None,
) -> MergeResult:
    """Merge checkpoints (the last one is the reference) with ``method`` (see ``METHODS``)."""
    if method not in METHODS:
        raise LmcError(f"method must be one of {METHODS}, got {method!r}")
    for c in ckpts[1:]:
        check_same_architecture(ckpts[0], c)
    spec = ckpts[0].spec
    params = [c.params for c in ckpts]
    model = ckpts[0].model
    if method in ("star-ste", "ste-mm") and data is None:
        raise LmcError(f"{method} needs data")
    if method == "star-wm":
        return star(spec, params, seed=seed)
    if method == "star-ste":
        return star(
            spec,
            params,
            method="ste",
            model=model,
            loader=data,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
        )
    if method == "merge-many":
        return merge_many(spec, params, seed=seed)
    if method == "ccmm":
        return ccmm(spec, params, seed=seed)
    return ste_mm(
        model,
        params,
        data,
        spec=spec,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
    )


def bn_loader_for(ckpt: Checkpoint, data: Dataset):
    """A training loader for BN reset when the model has BatchNorm, else ``None``."""
    uses_bn = any(k.endswith("running_mean") for k in ckpt.params)
    return data.loader("train", batch_size=500, shuffle=True) if uses_bn else None


def sweep(
    ckpts: Sequence[Checkpoint],
    methods: Sequence[str],
    ns: Sequence[int],
    data: Dataset,
    out: Path,
    *,
    epochs: int = 10,
    log: Callable[[str], None] = print,
    progress: Callable[[str], Callable | None] | None = None,
) -> dict[str, dict[int, dict[str, Any]]]:
    """For each ``n`` and method, merge the first ``n`` checkpoints and measure the merged
    model on the test set. Each finished (method, n) is stored in ``out/sweep/`` at once and
    reused on a rerun. ``progress(label)`` may return a per-step callback for STE-MM."""
    results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in methods}
    test = data.loader("test", batch_size=1000)
    for n in ns:
        if n > len(ckpts):
            raise LmcError(f"--sweep-n asks for {n} models but {len(ckpts)} checkpoints were given")
        for method in methods:
            path = out / "sweep" / f"{method}-n{n}.json"
            if path.exists():
                results[method][n] = json.loads(path.read_text())
                log(f"n={n} {method:<10} cached")
                continue
            result = merge_checkpoints(
                ckpts[:n],
                method,
                data,
                epochs=epochs,
                progress=progress(f"{method} n={n}") if progress else None,
            )
            m = multi_model_metrics(
                ckpts[0].model,
                [c.params for c in ckpts[:n]],
                result.perms,
                test,
                bn_reset_loader=bn_loader_for(ckpts[0], data),
                merged=result.merged if method == "ste-mm" else None,
            )
            entry = {**m.to_dict(), "seconds": result.seconds}
            atomic_write_json(path, entry)
            results[method][n] = entry
            log(
                f"n={n} {method:<10} merged test acc {100 * m.merged_accuracy:.2f} %, loss gap "
                f"{m.loss_gap:+.4f}, pairwise gap {m.pairwise_gap:+.4f} ({result.seconds:.1f} s)"
            )
    return results
