"""``lmckit interpolate``: two checkpoints, naive and matched linear paths, curves and plots."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset
from lmckit.errors import UsageError
from lmckit.evaluate import Curve, interpolate, lambda_grid, save_curves
from lmckit.files import atomic_write_json, check_outputs, prepare_output_dir, writes_folder
from lmckit.match import METHODS
from lmckit.params import has_batchnorm
from lmckit.perm import Permutation
from lmckit.plots import plot_barriers, plot_interpolation
from lmckit.progress import ProgressCallback
from lmckit.store import Artifact, Store, content_hash, make_key
from lmckit.transform import Transform, align_pair
from lmckit.workflows.matching import (
    check_data_fits,
    check_pair_record,
    check_same_architecture,
    load_alignment,
    permutation_content,
    stored_matches,
)

NAIVE = "none"


def curve_key(
    a_content: str,
    b_content: str,
    perm_content: str,
    data: Dataset,
    *,
    evaluation: Mapping[str, str],
    lambdas: int | Sequence[float],
    bn_reset_batches: int | None,
    repair: bool,
    calibrated: bool,
    ensemble: bool,
    seed: int,
    class_groups: Mapping[str, Sequence[int]] | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(key, document)`` of an interpolation curve from A to π(B): the weight hashes of A
    and B, π's content (:func:`~lmckit.workflows.matching.permutation_content`), the
    dataset's fingerprint, what each split covers and every setting of the curve (class
    groups only when given, so that keys without them stay as they were)."""
    settings = {
        "evaluation": dict(evaluation),
        "lambdas": lambda_grid(lambdas),
        "bn_reset_batches": bn_reset_batches,
        "repair": repair,
        "calibrated": calibrated,
        "ensemble": ensemble,
        "seed": seed,
    }
    if class_groups:
        settings["class_groups"] = {g: list(c) for g, c in class_groups.items()}
    inputs = {"a": a_content, "b": b_content, "perm": perm_content}
    return make_key("curve", settings, inputs, data.fingerprint)


def stored_curve(
    store: Store,
    a: Checkpoint,
    b: Checkpoint,
    perm: Permutation | Transform,
    *,
    data: Dataset,
    loaders: Mapping[str, Any],
    evaluation: Mapping[str, str],
    lambdas: int | Sequence[float] = 25,
    bn_reset_data: Any = None,
    bn_reset_batches: int | None = None,
    repair_data: Any = None,
    calibrated: bool = False,
    ensemble: bool = False,
    seed: int = 0,
    class_groups: Mapping[str, Sequence[int]] | None = None,
    progress: ProgressCallback | None = None,
) -> tuple[Curve, Artifact, bool]:
    """:func:`~lmckit.evaluate.interpolate` from A to π(B) through the result store:
    ``(curve, artifact, reused)``. ``evaluation`` describes what each loader covers (it is
    part of the key, with the dataset's fingerprint, the settings and the hashes of A, B
    and π)."""
    key, document = curve_key(
        a.content_hash,
        b.content_hash,
        permutation_content(perm),
        data,
        evaluation=evaluation,
        lambdas=lambdas,
        bn_reset_batches=bn_reset_batches if bn_reset_data is not None else None,
        repair=repair_data is not None,
        calibrated=calibrated,
        ensemble=ensemble,
        seed=seed,
        class_groups=class_groups,
    )

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        params_a, params_b = align_pair(perm, a.params, b.params)
        curve = interpolate(
            a.model,
            params_a,
            params_b,
            loaders,
            lambdas=lambdas,
            bn_reset_data=bn_reset_data,
            bn_reset_batches=bn_reset_batches if bn_reset_data is not None else None,
            repair_data=repair_data,
            calibrated=calibrated,
            ensemble=ensemble,
            class_groups=class_groups,
            seed=seed,
            progress=progress,
            resume=resume,
        )
        atomic_write_json(folder / "curve.json", curve.to_dict())
        record = {"barriers": curve.barriers, "seconds": time.perf_counter() - started}
        return content_hash(curve.to_dict()), record

    # a curve killed half-way (minutes per point with a BN reset on a training set) goes on
    # from its last saved point
    resume = store.resume_file(key)
    artifact, reused = store.get_or_put("curve", key, document, write)
    resume.unlink(missing_ok=True)
    curve = Curve.from_dict(json.loads(artifact.file("curve.json").read_text()))
    return curve, artifact, reused


@writes_folder("out", replaces=("perm-*.json",))
def run_interpolate(
    a: Checkpoint,
    b: Checkpoint,
    data: Dataset,
    out: str | Path,
    *,
    methods: Sequence[str] = (NAIVE, "wm-fast"),
    perm_file: str | Path | None = None,
    lambdas: int = 25,
    calibrated: bool = False,
    test_only: bool = False,
    bn_batches: int | None = 20,
    repair: bool = False,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
) -> dict[str, Any]:
    """Match B to A with each of ``methods`` (``"none"`` is the naive path) — or use the
    permutation or transform file ``perm_file`` — and evaluate every linear path on
    ``data`` (a transform's path runs between the norm-folded models).

    BatchNorm networks are BN-reset at every interior λ (``bn_batches`` batches); with
    ``repair`` BN-free networks are REPAIRed instead. Writes ``perm-<method>.json``,
    ``interpolation.json``/``.csv``/``.png`` and ``barriers.json``/``.png`` into ``out``;
    permutations and curves are kept in ``out/store`` under keys of everything that
    determines them, so a rerun reuses exactly the results that still apply. A
    ``perm-<method>.json`` of an earlier call into ``out`` that this one does not write (a
    method or a pair no longer there) is removed, so the folder describes this call only.

    Returns:
        ``{"curves": {label: Curve}, "files": [...]}``.
    """
    unknown = [m for m in methods if m != NAIVE and m not in METHODS]
    if unknown:
        raise UsageError(f"unknown matching method(s) {unknown}; choose from {sorted(METHODS)}")
    check_same_architecture(a, b)
    check_data_fits(a, data)
    uses_bn = has_batchnorm(a.params)
    if repair and uses_bn:
        raise UsageError("--repair is for networks without BatchNorm (BN nets are BN-reset)")
    out = Path(out)
    outputs = [out / f"perm-{m}.json" for m in methods] + [
        out / f"{name}{suffix}"
        for name, suffixes in (
            ("interpolation", (".json", ".csv", ".png")),
            ("barriers", (".json", ".png")),
        )
        for suffix in suffixes
    ]
    inputs = [*a.files, *b.files, *([perm_file] if perm_file else [])]
    check_outputs([*outputs, out / "store"], inputs)
    perms: dict[str, Permutation | Transform] = {}
    if perm_file is not None:
        check_pair_record(perm_file, a, b)
        perms["given"] = load_alignment(perm_file, a.spec)
    out = prepare_output_dir(out, "--out")
    store = Store(out / "store")
    if perm_file is None:
        perms.update(
            stored_matches(
                store, a, b, methods, data, out, seed=seed, naive=NAIVE, log=log, progress=progress
            )
        )
    loaders = {"test": data.loader("test", batch_size=1000)}
    evaluation = {"test": "all"}
    if not test_only:
        loaders = {"train": data.loader("train", batch_size=1000, shuffle=False), **loaders}
        evaluation["train"] = "all"
    curves: dict[str, Curve] = {}
    for label, perm in perms.items():
        curves[label], _, _ = stored_curve(
            store,
            a,
            b,
            perm,
            data=data,
            loaders=loaders,
            evaluation=evaluation,
            lambdas=lambdas,
            bn_reset_data=data.loader("train", batch_size=500, shuffle=True) if uses_bn else None,
            bn_reset_batches=bn_batches,
            repair_data=data.loader("train", batch_size=1000, shuffle=False) if repair else None,
            calibrated=calibrated,
            ensemble=True,
            seed=seed,
            progress=progress(f"interpolate {label}") if progress else None,
        )
    barriers = {
        label: {
            "loss": c.barriers["test"]["loss"]["rebasin"],
            "accuracy": c.barriers["test"]["accuracy"]["rebasin"],
        }
        for label, c in curves.items()
    }
    files = [*save_curves(curves, out / "interpolation")]
    files.append(
        plot_interpolation(
            curves, out / "interpolation.png", title=f"{a.path.stem} → {b.path.stem}"
        )
    )
    atomic_write_json(out / "barriers.json", barriers)
    files += [out / "barriers.json", plot_barriers(barriers, out / "barriers.png")]
    return {"curves": curves, "files": files}
