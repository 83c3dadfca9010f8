"""Merging checkpoints by method name, ``lmckit merge``'s report, and the resumable
"metric vs n" sweep."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_tensors

from lmckit.analysis import multi_model_metrics, plane_landscape, sharpness
from lmckit.checkpoint import Checkpoint, save_checkpoint
from lmckit.data import Dataset, Split, indices_digest
from lmckit.errors import ParamsError, UsageError
from lmckit.evaluate.parts import ENSEMBLE, part_groups, parts_report
from lmckit.files import (
    atomic_write_bytes,
    atomic_write_json,
    check_outputs,
    prepare_output_dir,
    writes_folder,
)
from lmckit.merge import METHODS, MergeResult
from lmckit.models import build_model
from lmckit.params import check_products_finite, has_batchnorm
from lmckit.plots import plot_geometry, plot_landscape, plot_sweep
from lmckit.progress import ProgressCallback
from lmckit.store import Store, content_hash, make_key
from lmckit.transform import align
from lmckit.workflows.matching import check_data_fits, check_distinct, check_same_architecture


def check_checkpoints(ckpts: Sequence[Checkpoint], data: Dataset | None = None) -> None:
    """At least two checkpoints of one architecture, no checkpoint given twice (by path or
    by identical weights), and ``data`` (if given) fitting them. :class:`UsageError` if not."""
    if len(ckpts) < 2:
        raise UsageError(f"merging needs at least two checkpoints, got {len(ckpts)}")
    for c in ckpts[1:]:
        check_same_architecture(ckpts[0], c)
    check_distinct(ckpts)
    if data is not None:
        check_data_fits(ckpts[0], data)


def check_folder_merge_method(method: str) -> None:
    """Refuse a merge method for model folders that needs what they do not record (data,
    the models' training-set sizes) — callable before any folder is read.

    Raises:
        UsageError: naming the method, what it needs and the methods that can merge folders.
    """
    merger = METHODS.get(method)
    if merger is not None and (merger.needs_data or merger.needs_sizes):
        usable = sorted(m for m, x in METHODS.items() if not (x.needs_data or x.needs_sizes))
        what = "data" if merger.needs_data else "the models' training-set sizes"
        raise UsageError(
            f"merge method {method} needs {what}, which model folders do not record; merge "
            f"them by their weights with {', '.join(usable)}"
        )


def merge_checkpoints(
    ckpts: Sequence[Checkpoint],
    method: str,
    data: Dataset | None,
    *,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    sizes: Sequence[int] | None = None,
    resume: Path | None = None,
    **options: Any,
) -> MergeResult:
    """Merge checkpoints (the last one is the reference) with the merger ``method`` of
    :data:`lmckit.merge.METHODS` and its keyword ``options`` (``None``: its default; an
    option it does not take is a :class:`UsageError`). The merged model is BN-reset on
    ``data`` when it has BatchNorm. ``sizes``: the models' training-set sizes for FedAvg
    (default: :func:`training_examples` of each, with ``data``). ``resume``: the resume
    file of a merger that saves its state between epochs (:func:`~lmckit.merge.ste_mm`);
    ignored by the others."""
    if method not in METHODS:
        raise UsageError(f"unknown merging method {method!r}; choose from {sorted(METHODS)}")
    merger = METHODS[method]
    if merger.needs_data and data is None:
        raise UsageError(f"{method} needs data")
    for other in ckpts[:-1]:  # each is matched to the reference (the last)
        check_products_finite(
            ckpts[-1].params, other.params, (str(ckpts[-1].path), str(other.path))
        )
    kwargs = {k: v for k, v in options.items() if v is not None}
    try:
        kwargs = merger.check_options(kwargs)
    except ParamsError as exc:
        raise UsageError(str(exc)) from None
    if merger.needs_sizes:
        kwargs["sizes"] = list(sizes or [training_examples(c, data) for c in ckpts])
    if resume is not None and "resume" in inspect.signature(merger.fn).parameters:
        kwargs["resume"] = resume
    first = ckpts[0]
    return merger(
        first.spec,
        [c.params for c in ckpts],
        model=first.model,
        data=data,
        reference=-1,
        seed=seed,
        progress=progress,
        **kwargs,
    )


def training_examples(ckpt: Checkpoint, data: Dataset | None = None) -> int:
    """How many examples ``ckpt`` was trained on (FedAvg's client size): its sidecar's
    ``train_examples``, or the size of the part of a split it records; a model trained on a
    whole dataset without a record of its size counts that dataset's training set (``data``,
    the same dataset — not a server's subset of it).

    Raises:
        UsageError: the checkpoint records neither and ``data`` cannot stand in.
    """
    meta = ckpt.meta
    if isinstance(meta.get("train_examples"), int):
        return int(meta["train_examples"])
    split = meta.get("split")
    if isinstance(split, dict) and isinstance(split.get("examples"), int):
        return int(split["examples"])
    if split is None and data is not None and meta.get("dataset") == data.name:
        return len(data.train_y)
    raise UsageError(
        f"{ckpt.path} does not record how many examples it was trained on, which FedAvg "
        "weights by; use method 'average' for the uniform mean"
    )


def _bn_data(ckpt: Checkpoint, data: Dataset):
    """Training batches for BN resets when the model has BatchNorm, else ``None``."""
    return (
        data.loader("train", batch_size=500, shuffle=True) if has_batchnorm(ckpt.params) else None
    )


@writes_folder("out", replaces=("landscape.json", "landscape.png"))
def run_merge(
    ckpts: Sequence[Checkpoint],
    method: str,
    data: Dataset,
    out: str | Path,
    *,
    seed: int = 0,
    sharpness_probes: int = 0,
    landscape: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``lmckit merge``: merge, evaluate and write the merged checkpoint, ``permutations.json``,
    ``metrics.json`` (multi-model metrics, optional sharpness) and plots into ``out``.

    A merger that saves its state between epochs (STE-MM) keeps it in ``out/<method>.resume``
    until the merged checkpoint is written: the same command after a kill goes on from there.
    An earlier call's ``landscape.json``/``.png`` that this one does not compute is removed
    (named to ``log``): it was another merge's plane.

    Returns the report written to ``metrics.json``.
    """
    check_checkpoints(ckpts, data)
    names = ("merged.safetensors", "merged.json", "permutations.json", "metrics.json")
    names += (f"{method}.resume",)
    names += ("geometry.png", "landscape.json", "landscape.png")
    check_outputs([Path(out) / n for n in names], [f for c in ckpts for f in c.files])
    if sharpness_probes and sharpness_probes < 2:
        raise UsageError(f"sharpness needs at least 2 probes, got {sharpness_probes}")
    if landscape and landscape < 2:
        raise UsageError(f"the landscape needs a resolution of at least 2, got {landscape}")
    if landscape and len(ckpts) < 3:
        raise UsageError(
            f"the landscape is the plane through three aligned models; {len(ckpts)} were given"
        )
    out = prepare_output_dir(out, "--out")
    result = merge_checkpoints(
        ckpts,
        method,
        data,
        seed=seed,
        progress=progress(method) if progress else None,
        resume=out / f"{method}.resume",
        **options,
    )
    model = ckpts[0].model
    test = data.loader("test", batch_size=1000)
    metrics = multi_model_metrics(
        model,
        [c.params for c in ckpts],
        result.perms,
        test,
        bn_reset_data=_bn_data(ckpts[0], data),
        merged=result.merged,
    )
    report: dict[str, Any] = {
        "method": result.method,
        "seconds": result.seconds,
        "checkpoints": [str(c.path) for c in ckpts],
        **metrics.to_dict(),
        **models_report(ckpts, result.merged, data),
    }
    report.update(_sharpness_report(ckpts, result.merged, data, sharpness_probes, seed))
    about = {
        "merged_from": [str(c.path) for c in ckpts],
        "merge_method": result.method,
        "dataset": ckpts[0].meta.get("dataset"),
        "metrics": {"test_loss": metrics.merged_loss, "test_accuracy": metrics.merged_accuracy},
    }
    if ckpts[0].meta.get("foreign"):
        # a user's class: a plain state dict it loads, and what it is beside it
        merged = {k: v.detach().cpu().contiguous() for k, v in result.merged.items()}
        atomic_write_bytes(out / "merged.safetensors", save_tensors(merged))
        atomic_write_json(out / "merged.json", {"model": ckpts[0].meta["model"], **about})
    else:
        merged_model = build_model(ckpts[0].meta["model"]["name"], **ckpts[0].meta["model"])
        merged_model.load_state_dict(result.merged)
        save_checkpoint(out / "merged", merged_model, about)
    atomic_write_json(
        out / "permutations.json",
        {"groups": dict(ckpts[0].spec.groups), "perms": [p.to_dict() for p in result.perms]},
    )
    atomic_write_json(out / "metrics.json", report)
    (out / f"{method}.resume").unlink(missing_ok=True)
    plot_geometry(
        metrics.distance_ratios,
        metrics.triplet_angles,
        out / "geometry.png",
        title=f"{result.method}: aligned models",
    )
    if landscape:
        aligned = [align(p, c.params) for p, c in zip(result.perms, ckpts, strict=True)][:3]
        land = plane_landscape(
            model,
            aligned,
            test,
            resolution=landscape,
            bn_reset_data=_bn_data(ckpts[0], data),
            progress=progress("landscape") if progress else None,
        )
        atomic_write_json(out / "landscape.json", land.to_dict())
        plot_landscape(land, out / "landscape.png")
    return report


@writes_folder("out")
def run_merge_folders(
    ckpts: Sequence[Checkpoint],
    method: str,
    out: str | Path,
    *,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``lmckit merge`` of Hugging Face model folders (:mod:`lmckit.model_folder`), by their
    weights alone: the merged model is written as the model folder ``out/merged`` — the
    reference's (last folder's) architecture, config and sharding — beside
    ``permutations.json`` and ``metrics.json`` (each model's L2 distance to the merged one,
    before and after alignment). Methods that need data are refused: a model folder records
    no dataset. Over an earlier merge, ``out/merged`` keeps none of its files that this one
    does not write (:func:`lmckit.model_folder.write_model_folder`).

    Returns the report written to ``metrics.json``."""
    from lmckit.model_folder import check_writable, output_names, provenance, write_model_folder
    from lmckit.params import params_distance

    check_checkpoints(ckpts)
    check_folder_merge_method(method)
    reference = ckpts[-1]
    check_writable(reference)  # before the merge, not after it
    names = [f"merged/{n}" for n in output_names(reference.layout)]
    outputs = [Path(out) / n for n in (*names, "permutations.json", "metrics.json")]
    check_outputs(outputs, [f for c in ckpts for f in c.files])
    result = merge_checkpoints(
        ckpts, method, None, seed=seed, progress=progress(method) if progress else None, **options
    )
    report: dict[str, Any] = {
        "method": result.method,
        "seconds": result.seconds,
        "checkpoints": [str(c.path) for c in ckpts],
        "distance_to_merged": {
            str(c.path): {
                "before_alignment": params_distance(c.params, result.merged),
                "after_alignment": p.distance(result.merged, c.params),
            }
            for c, p in zip(ckpts, result.perms, strict=True)
        },
        "bn_reset": False,
    }
    about = {
        "method": result.method,
        "inputs": provenance({str(i): c for i, c in enumerate(ckpts)}),
        "reference": str(reference.path),
    }
    write_model_folder(Path(out) / "merged", reference, params=result.merged, about=about, log=log)
    atomic_write_json(
        Path(out) / "permutations.json",
        {"groups": dict(reference.spec.groups), "perms": [p.to_dict() for p in result.perms]},
    )
    atomic_write_json(Path(out) / "metrics.json", report)
    return report


def checkpoint_split(ckpt: Checkpoint, data: Dataset) -> Split | None:
    """The split ``ckpt`` was trained on (None: all the data), checked against ``data``:
    the recorded hash of its indices must be that of the same part of ``data``'s training
    set, else per-part numbers would describe other examples."""
    recorded = ckpt.meta.get("split")
    if not recorded:
        return None
    split = Split.from_dict({k: v for k, v in recorded.items() if k in SPLIT_FIELDS})
    digest = indices_digest(split.indices(data.train_y, data.num_classes))
    if recorded.get("indices_sha256") not in (None, digest):
        raise UsageError(
            f"{ckpt.path} was trained on {split.describe()} of another training set than "
            f"{data.name}'s here (the indices differ); per-part accuracy would be wrong"
        )
    return split


SPLIT_FIELDS = ("kind", "part", "fraction", "clients", "alpha", "seed")


def models_report(
    ckpts: Sequence[Checkpoint], merged: Mapping[str, Any], data: Dataset
) -> dict[str, Any]:
    """The merged model, every input and their logit ensemble on the test set — loss,
    accuracy, ECE and, for inputs trained on parts of the data, accuracy on each part's
    majority classes (:mod:`lmckit.evaluate.parts`) — as ``{"groups": {part: classes},
    "models": {name: ...}}`` plus flat ``merged_ece`` and ``ensemble_*`` numbers."""
    splits = [checkpoint_split(c, data) for c in ckpts]
    groups = part_groups(splits, data.train_y, data.num_classes)
    inputs = {f"input {i}": c.params for i, c in enumerate(ckpts)}
    models = parts_report(
        ckpts[0].model,
        {"merged": merged, **inputs},
        data.loader("test", batch_size=1000),
        groups=groups,
        ensemble_of=list(inputs),
    )
    flat = {"merged_ece": models["merged"]["ece"]}
    flat.update({f"ensemble_{k}": models[ENSEMBLE][k] for k in ("loss", "accuracy", "ece")})
    for group, acc in models["merged"]["groups"].items():
        flat[f"merged_accuracy_{group.replace(' ', '_')}"] = acc
    return {"groups": groups, "models": models, **flat}


MERGE_REPORT_VERSION = 2
"""Part of every merge's key: 2 added ECE, the ensemble and per-part accuracy to the
stored metrics, so results stored without them are recomputed rather than shown blank."""


def train_report(ckpts: Sequence[Checkpoint], merged: Mapping[str, Any], data: Dataset):
    """The merged model, the inputs' mean and their logit ensemble on the whole *training*
    set (Git Re-Basin Table 2: a merge's train and test metrics): flat ``merged_train_*``,
    ``mean_train_*`` and ``ensemble_train_*`` loss, accuracy and ECE."""
    inputs = {f"input {i}": c.params for i, c in enumerate(ckpts)}
    rows = parts_report(
        ckpts[0].model,
        {"merged": merged, **inputs},
        data.loader("train", batch_size=1000, shuffle=False),
        ensemble_of=list(inputs),
    )
    flat: dict[str, float] = {}
    for metric in ("loss", "accuracy", "ece"):
        flat[f"merged_train_{metric}"] = rows["merged"][metric]
        flat[f"ensemble_train_{metric}"] = rows[ENSEMBLE][metric]
        flat[f"mean_train_{metric}"] = sum(rows[n][metric] for n in inputs) / len(inputs)
    return flat


def merge_key(
    method: str,
    seed: int,
    options: Mapping[str, Any],
    contents: Sequence[str],
    data: Dataset,
    server_examples: int | None = None,
    train_metrics: bool = False,
    sharpness_probes: int = 0,
) -> tuple[str, dict[str, Any]]:
    """``(key, document)`` of a merge and its test-set metrics: the method, the options it
    takes, the seed, every model's weight hash in order (the last is the reference), the
    dataset's fingerprint and — when set — the size of the server's subset and the number
    of sharpness probes."""
    if method not in METHODS:
        raise UsageError(f"unknown merging method {method!r}; choose from {sorted(METHODS)}")
    accepted = set(METHODS[method].options())
    used = {k: v for k, v in options.items() if k in accepted and v is not None}
    settings = {
        "method": method,
        "seed": seed,
        "options": used,
        "evaluation": {"test": "all"},
        "report": MERGE_REPORT_VERSION,
    }
    if server_examples is not None:
        settings["server_examples"] = int(server_examples)
    if train_metrics:
        settings["train_metrics"] = True
    if sharpness_probes:
        settings["sharpness_probes"] = int(sharpness_probes)
    return make_key(
        "merge-metrics",
        settings,
        {f"model{i}": c for i, c in enumerate(contents)},
        data.fingerprint,
    )


def server_subset(data: Dataset, examples: int, seed: int = 0) -> Dataset:
    """``data`` with its training set cut to a seeded random ``examples`` of it (the test
    set whole): what a federated server holds for data-driven merging and BN resets."""
    n = len(data.train_y)
    if not 1 <= examples <= n:
        raise UsageError(f"server_examples must be in [1, {n}], got {examples}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    return data.subset(train_idx=order[:examples].sort().values)


def stored_merge_metrics(
    store: Store,
    ckpts: Sequence[Checkpoint],
    method: str,
    data: Dataset,
    *,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    server_examples: int | None = None,
    train_metrics: bool = False,
    sharpness_probes: int = 0,
    **options: Any,
) -> tuple[dict[str, Any], bool]:
    """Merge ``ckpts`` with ``method`` and measure the merged model on the test split,
    through the result store: ``(multi-model metrics and seconds, reused)``. The key holds
    the method, its options and seed, every checkpoint's weight hash (in order: the last is
    the reference), the dataset's fingerprint and ``server_examples``: if set, the merger
    and BN resets see only that many training examples (:func:`server_subset`).
    ``train_metrics`` adds the training set's metrics (:func:`train_report`);
    ``sharpness_probes`` (≥ 2) the sharpness ``tr(H ⊙ θθᵀ)`` of the merged model and the
    mean over the inputs (STE-MM Fig. 8, :func:`lmckit.analysis.sharpness`, seeded by
    ``seed``). The entry read back also holds the geometry's summary
    (:func:`with_geometry_summary`)."""
    if sharpness_probes and sharpness_probes < 2:
        raise UsageError(f"sharpness needs at least 2 probes, got {sharpness_probes}")
    contents = [c.content_hash for c in ckpts]
    key, document = merge_key(
        method, seed, options, contents, data, server_examples, train_metrics, sharpness_probes
    )
    used = document["settings"]["options"]
    server = data if server_examples is None else server_subset(data, server_examples, seed)

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        sizes = [training_examples(c, data) for c in ckpts] if METHODS[method].needs_sizes else None
        result = merge_checkpoints(
            ckpts, method, server, seed=seed, progress=progress, sizes=sizes, resume=resume,
            **used,
        )  # fmt: skip
        metrics = multi_model_metrics(
            ckpts[0].model,
            [c.params for c in ckpts],
            result.perms,
            data.loader("test", batch_size=1000),
            bn_reset_data=_bn_data(ckpts[0], server),
            merged=result.merged,
        )
        entry = {
            **metrics.to_dict(),
            **models_report(ckpts, result.merged, data),
            **(train_report(ckpts, result.merged, data) if train_metrics else {}),
            **(_sharpness_report(ckpts, result.merged, data, sharpness_probes, seed)),
            "seconds": result.seconds,
        }
        atomic_write_json(folder / "metrics.json", entry)
        atomic_write_json(folder / "permutations.json", [p.to_dict() for p in result.perms])
        return content_hash(entry), {}

    # A merge killed half-way (STE-MM's epochs) goes on from its last save.
    resume = store.resume_file(key)
    artifact, reused = store.get_or_put("merge-metrics", key, document, write)
    resume.unlink(missing_ok=True)
    entry = json.loads(artifact.file("metrics.json").read_text())
    return with_geometry_summary(with_input_calibration(entry)), reused


def _sharpness_report(
    ckpts: Sequence[Checkpoint], merged: Mapping[str, Any], data: Dataset, probes: int, seed: int
) -> dict[str, Any]:
    """``sharpness_merged`` (and its standard error) and ``sharpness_models_mean`` on the
    test set with ``probes`` probes, the same probes for every model; ``{}`` for 0."""
    if not probes:
        return {}
    test = data.loader("test", batch_size=1000)
    model = ckpts[0].model
    of_merge = sharpness(model, merged, test, probes=probes, seed=seed)
    of_inputs = [sharpness(model, c.params, test, probes=probes, seed=seed).value for c in ckpts]
    return {
        "sharpness_merged": of_merge.value,
        "sharpness_merged_stderr": of_merge.stderr,
        "sharpness_models_mean": sum(of_inputs) / len(of_inputs),
        "sharpness_models": of_inputs,
    }


def with_geometry_summary(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the numbers that summarise its aligned models' geometry (STE-MM §6.1):
    ``distance_mean`` (the mean pair distance, Fig. 6), ``distance_ratio_min`` /
    ``distance_ratio_max`` (Fig. 9; both 1 for a regular simplex) and ``angle_min`` /
    ``angle_max`` / ``angle_std`` (population) of every triangle's angles in degrees (Figs.
    7/10; 60, 60 and 0 for a regular simplex; from three models — their mean is 60 for any
    set of triangles, so it is not listed). Derived on reading, so entries stored before
    they were listed show them where their lists allow; NaN values are left out."""
    out = dict(entry)

    def finite(name: str) -> list[float]:
        return [float(v) for v in entry.get(name) or () if v is not None and math.isfinite(v)]

    distances, ratios, angles = (
        finite(k) for k in ("pair_distances", "distance_ratios", "triplet_angles")
    )
    if distances:
        out["distance_mean"] = sum(distances) / len(distances)
    if ratios:
        out["distance_ratio_min"], out["distance_ratio_max"] = min(ratios), max(ratios)
    if angles:
        mean = sum(angles) / len(angles)
        out["angle_std"] = math.sqrt(sum((a - mean) ** 2 for a in angles) / len(angles))
        out["angle_min"], out["angle_max"] = min(angles), max(angles)
    return out


def with_input_calibration(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with ``mean_ece`` and ``max_input_ece``: the inputs' test-set ECE (mean and
    worst), beside ``merged_ece`` — Git Re-Basin Fig. 12's comparison. Derived from the
    per-model report on reading, so results stored before these were listed show them too."""
    inputs = [m["ece"] for name, m in entry.get("models", {}).items() if name.startswith("input ")]
    if inputs and "mean_ece" not in entry:
        entry = {**entry, "mean_ece": sum(inputs) / len(inputs), "max_input_ece": max(inputs)}
    return entry


MAX_MODELS = 10_000


def parse_range(text: str) -> list[int]:
    """``"2..5"`` -> [2, 3, 4, 5]; ``"4"`` -> [2, 3, 4]. :class:`UsageError` otherwise."""
    try:
        lo, hi = (int(x) for x in text.split("..")) if ".." in text else (2, int(text))
    except ValueError:
        raise UsageError(f"expected a range like 2..5 or a count like 4, got {text!r}") from None
    if lo < 2 or hi < lo:
        raise UsageError(f"expected a range of model counts from 2 up, like 2..5; got {text!r}")
    if hi > MAX_MODELS:
        raise UsageError(f"a sweep of up to {hi} models: lmckit merges at most {MAX_MODELS}")
    return list(range(lo, hi + 1))


SWEEP_METHODS = ("star-wm", "merge-many", "ccmm", "ste-mm")
"""The methods a sweep over the number of models compares when none are named."""


@writes_folder("out", replaces=("sweep/*.json",))
def sweep(
    ckpts: Sequence[Checkpoint],
    methods: Sequence[str],
    ns: Sequence[int],
    data: Dataset,
    out: str | Path,
    *,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
    **options: Any,
) -> dict[str, dict[int, dict[str, Any]]]:
    """For each ``n`` and method, merge the first ``n`` checkpoints and measure the merged
    model on the test set. Each finished (method, n) is kept in ``out/store`` at once, keyed
    by everything that determines it (:func:`stored_merge_metrics`), and reused on a rerun
    only when that key matches; ``out/sweep/<method>-n<n>.json``, ``out/sweep.json`` and
    ``out/sweep.png`` are written from the results (an earlier call's ``out/sweep/*.json`` of
    a method or ``n`` not in this one is removed)."""
    check_checkpoints(ckpts, data)
    outputs = [Path(out) / n for n in ("sweep.json", "sweep.png")]
    outputs += [Path(out) / "sweep" / f"{m}-n{n}.json" for m in methods for n in ns]
    check_outputs([*outputs, Path(out) / "store"], [f for c in ckpts for f in c.files])
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown merging method(s) {unknown}; choose from {sorted(METHODS)}")
    if max(ns) > len(ckpts):
        raise UsageError(f"--sweep-n asks for {max(ns)} models but {len(ckpts)} were given")
    given = {k: v for k, v in options.items() if v is not None}
    for name in given:  # shared by the sweep's methods: each must serve at least one
        if not any(name in METHODS[m].options() for m in methods):
            raise UsageError(
                f"option {name!r} applies to none of the swept methods {list(methods)}"
            )
    out = prepare_output_dir(out, "--out")
    results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in methods}
    store = Store(out / "store")
    for n in ns:
        for method in methods:
            entry, reused = stored_merge_metrics(
                store,
                ckpts[:n],
                method,
                data,
                seed=seed,
                progress=progress(f"{method} n={n}") if progress else None,
                **{k: v for k, v in given.items() if k in METHODS[method].options()},
            )
            atomic_write_json(out / "sweep" / f"{method}-n{n}.json", entry)
            results[method][n] = entry
            log(
                f"n={n} {method:<10} merged test acc {100 * entry['merged_accuracy']:.2f} %, "
                f"loss gap {entry['loss_gap']:+.4f}, pairwise gap {entry['pairwise_gap']:+.4f} "
                f"({entry['seconds']:.1f} s{', stored result reused' if reused else ''})"
            )
    atomic_write_json(out / "sweep.json", results)
    plot_sweep(
        results,
        out / "sweep.png",
        title=f"merging {ckpts[0].meta['model']['name']} on {data.name}",
    )
    return results
