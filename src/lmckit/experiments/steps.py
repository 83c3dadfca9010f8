"""The steps an experiment is made of, as jobs: train, match, curve, merge, analysis,
triplet, spectra.

A :class:`Job` names its step kind, the settings it runs with and the jobs it depends on.
Each kind has two functions:

* ``key(job, deps, ctx)`` — on the driver, once the dependencies are done: the result
  store's key of the job's artifact, computed from the settings and the dependencies'
  *content* hashes (so the driver can tell, before running anything, whether the result is
  stored or failed before);
* ``run(payload)`` — anywhere (this process, a worker process, a Ray task): load the
  inputs from the store, compute, store the artifact, return its record. Everything it
  needs is in the payload, which is plain data.

Step kinds are registered in :data:`STEPS` with the resources a job of that kind declares
to a scheduler (``num_cpus``, ``num_gpus``).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.data import Dataset, Split
from lmckit.evaluate.parts import part_groups
from lmckit.files import atomic_write_json
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation
from lmckit.progress import ProgressCallback
from lmckit.store import Store, content_hash, make_key
from lmckit.train import TrainConfig, init_model, split_record, train, train_examples
from lmckit.workflows.interpolation import curve_key, stored_curve
from lmckit.workflows.matching import (
    load_alignment,
    load_permutation,
    match_key,
    spec_digest,
    stored_match,
)
from lmckit.workflows.merging import merge_key, server_subset, stored_merge_metrics
from lmckit.workflows.training import load_for_model

__all__ = ["STEPS", "Job", "StepKind", "execute", "job_key"]


@dataclass(frozen=True)
class Job:
    """One unit of an experiment: ``kind`` with ``settings``, after the jobs in ``deps``.

    ``name`` is unique within the experiment and readable (``train/c0/seed1``); ``labels``
    say what the job is for in reports (grid cell values, seeds, method).
    """

    name: str
    kind: str
    settings: Mapping[str, Any]
    deps: tuple[str, ...] = ()
    labels: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepKind:
    """A registered step kind: its key and run functions and declared resources."""

    name: str
    key: Callable[[Job, Mapping[str, dict[str, Any]], Dataset], tuple[str, dict[str, Any]]]
    run: Callable[[dict[str, Any], ProgressCallback | None], dict[str, Any]]
    num_cpus: float = 1.0
    num_gpus: float = 0.0


# -- data, loaded once per process ---------------------------------------------------------
@lru_cache(maxsize=4)
def dataset_for(model_name: str, dataset: str, data_dir: str | None, download: bool) -> Dataset:
    """The dataset shaped for a model family (conv nets pad 28×28 to 32×32), cached."""
    return load_for_model(model_name, dataset, data_dir, download=download)


def _data(payload: Mapping[str, Any]) -> Dataset:
    return dataset_for(
        payload["settings"]["model_name"],
        payload["dataset"],
        payload.get("data_dir"),
        payload.get("download", True),
    )


def _store(payload: Mapping[str, Any]) -> Store:
    """The run's store, reading missing artifacts from the stores of ``--reuse-from``."""
    return Store(payload["store"], reuse_from=payload.get("reuse_from", ()))


def _checkpoint(payload: Mapping[str, Any], dep: str):
    info = payload["deps"][dep]
    store = _store(payload)
    folder = store.folder(info["kind"], info["key"])
    return load_checkpoint(
        folder / "model", device=payload.get("device", "cpu"), classes=_user_classes(payload)
    )


def _user_classes(payload: Mapping[str, Any]) -> tuple[str, ...]:
    """The user class the experiment file names (``[model] name = "custom"``), which its
    stored checkpoints may be built from."""
    config = payload["settings"].get("model_config") or {}
    return (config["class"],) if "class" in config else ()


# -- train -----------------------------------------------------------------------------------
def _train_settings(job: Job) -> dict[str, Any]:
    s = job.settings
    return {"model": s["model_config_full"], "train": s["train_config"]}


def _train_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    return make_key("checkpoint", _train_settings(job), dataset=data.fingerprint)


def _train_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    settings = payload["settings"]
    data = _data(payload)
    store = _store(payload)
    key, document = make_key(
        "checkpoint",
        {"model": settings["model_config_full"], "train": settings["train_config"]},
        dataset=data.fingerprint,
    )
    assert key == payload["key"], "the worker computed another key than the driver"

    def saver(model, config: TrainConfig, result, key: str, document: dict[str, Any]):
        def write(folder: Path) -> tuple[str, dict[str, Any]]:
            meta = {
                "key": key,
                "key_document": document,
                "train": config.to_dict(),
                "seed": config.seed,
                "split": split_record(config, data),
                "train_examples": train_examples(config, data),
                "dataset": data.name,
                "metrics": result.metrics_dict(),
                "train_seconds": result.seconds,
            }
            weights = save_checkpoint(folder / "model", model, meta)
            sha = load_checkpoint(weights, classes=_user_classes(payload)).content_hash
            return sha, {**result.metrics_dict(), "seconds": result.seconds}

        return write

    def snapshot(epoch: int, result) -> None:
        # What a run of `epoch` epochs would store, under that run's own key.
        short = replace(config, epochs=epoch)
        k, doc = make_key(
            "checkpoint",
            {"model": settings["model_config_full"], "train": short.to_dict()},
            dataset=data.fingerprint,
        )
        store.get_or_put("checkpoint", k, doc, saver(model, short, result, k, doc))

    config = TrainConfig.from_dict(settings["train_config"])
    model = None

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        nonlocal model
        model = init_model(settings["model_name"], settings["model_config"], config.model_seed)
        model.to(payload.get("device", "cpu"))
        result = train(
            model,
            data,
            config,
            progress=progress,
            snapshots=settings.get("snapshots", ()),
            on_snapshot=snapshot,
            resume=resume,
        )
        return saver(model, config, result, key, document)(folder)

    # A job killed half-way (a session's end, a crash) goes on from its last epoch save.
    resume = store.resume_file(key)
    artifact, reused = store.get_or_put("checkpoint", key, document, write)
    resume.unlink(missing_ok=True)
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


# -- match -----------------------------------------------------------------------------------
def _server_data(data: Dataset, settings: Mapping[str, Any]) -> Dataset:
    """The training data a data-driven matcher may see: all of it, or the seeded subset a
    compare block's ``server_examples`` names (its fingerprint keys the match)."""
    n = settings.get("server_examples")
    return data if n is None else server_subset(data, n)


def _match_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    data = _server_data(data, s)
    a, b = (deps[name]["content"] for name in job.deps)
    spec = _zoo_spec_digest(s["model_name"], json.dumps(s["model_config"], sort_keys=True))
    return match_key(s["method"], s["seed"], s["options"], a, b, data, spec)


@lru_cache(maxsize=64)
def _zoo_spec_digest(model_name: str, config: str) -> str:
    """The digest of a zoo model's spec, once per configuration (transformers trace it)."""
    return spec_digest(permutation_spec(build_model(model_name, **json.loads(config))))


def _match_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    s = payload["settings"]
    a, b = (_checkpoint(payload, name) for name in payload["dep_order"])
    store = _store(payload)
    data = _server_data(_data(payload), s)
    _, artifact, reused = stored_match(
        store, a, b, s["method"], data, seed=s["seed"], progress=progress, **s["options"]
    )
    assert artifact.key == payload["key"], "the worker computed another key than the driver"
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


# -- curve -----------------------------------------------------------------------------------
def _loaders(data: Dataset, splits: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    loaders, evaluation = {}, {}
    for split, size in splits.items():
        if size == "all":
            part = data
            evaluation[split] = "all"
        else:
            n = len(data.train_x) if split == "train" else len(data.test_x)
            g = torch.Generator().manual_seed(0)
            chosen = torch.randperm(n, generator=g)[: min(int(size), n)]
            part = data.subset(**{f"{split}_idx": chosen})
            evaluation[split] = f"{len(chosen)} examples of a permutation seeded 0"
        loaders[split] = part.loader(split, batch_size=1000, shuffle=False)
    return loaders, evaluation


def _curve_options(s: Mapping[str, Any], data: Dataset) -> dict[str, Any]:
    options = {
        "lambdas": s["lambdas"],
        "calibrated": s["calibrated"],
        "ensemble": s["ensemble"],
        "seed": s["seed"],
        "bn_reset_batches": 20 if s["batchnorm"] else None,
    }
    if s.get("parts"):  # A and B trained on parts of the data: accuracy on each part's classes
        splits = [Split.from_dict(p) for p in s["parts"]]
        options["class_groups"] = part_groups(splits, data.train_y, data.num_classes)
    return options


def _curve_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    a, b = (deps[name]["content"] for name in job.deps[:2])
    perm = deps[job.deps[2]]["content"] if len(job.deps) > 2 else "identity"
    _, evaluation = _loaders(data, s["splits"])
    options = _curve_options(s, data)
    return curve_key(a, b, perm, data, evaluation=evaluation, repair=False, **options)


def _curve_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    s = payload["settings"]
    data = _data(payload)
    order = payload["dep_order"]
    a, b = (_checkpoint(payload, name) for name in order[:2])
    if len(order) > 2:
        info = payload["deps"][order[2]]
        folder = _store(payload).folder(info["kind"], info["key"])
        perm = load_alignment(folder / "perm.json", a.spec)
    else:
        perm = Permutation.identity(a.spec)
    loaders, evaluation = _loaders(data, s["splits"])
    options = _curve_options(s, data)
    bn_batches = options.pop("bn_reset_batches")
    curve, artifact, reused = stored_curve(
        _store(payload),
        a,
        b,
        perm,
        data=data,
        loaders=loaders,
        evaluation=evaluation,
        bn_reset_data=data.loader("train", batch_size=500, shuffle=True) if bn_batches else None,
        bn_reset_batches=bn_batches,
        progress=progress,
        **options,
    )
    assert artifact.key == payload["key"], "the worker computed another key than the driver"
    record = {"seconds": artifact.record.get("seconds")}
    for split, metrics in curve.barriers.items():
        for metric, definitions in metrics.items():
            for definition, value in definitions.items():
                record[f"{split}.{metric}.barrier.{definition}"] = value
        for metric in ("loss", "accuracy"):
            record[f"{split}.{metric}.midpoint"] = curve.midpoint(split, metric)
        for metric in curve.splits[split]:
            if metric.startswith(("accuracy[", "ensemble_accuracy[")):
                record[f"{split}.{metric}.midpoint"] = curve.midpoint(split, metric)
        record.update(_curve_points(curve, split))
        if data.next_token:  # the losses are log-perplexities
            record.update({f"{split}.{k}": v for k, v in curve.perplexities(split).items()})
    return {"content": artifact.content, "record": record, "reused": reused}


def _curve_points(curve, split: str) -> dict[str, float]:
    """Every metric of a curve's split at its ends (``.start``: model A, λ = 0; ``.end``:
    model B, λ = 1) and at the λ of least loss (``.least_loss``, that λ as
    ``least_loss.lambda``), and the calibration error at λ ≈ ½ (``ece.midpoint``): the
    numbers a split-data table quotes (Git Re-Basin §5.4), in the results file."""
    values = curve.splits[split]
    best = min(range(len(curve.lambdas)), key=lambda i: values["loss"][i])
    out = {f"{split}.least_loss.lambda": curve.lambdas[best]}
    for metric, series in values.items():
        out[f"{split}.{metric}.start"] = series[0]
        out[f"{split}.{metric}.end"] = series[-1]
        out[f"{split}.{metric}.least_loss"] = series[best]
    if "ece" in values:
        out[f"{split}.ece.midpoint"] = curve.midpoint(split, "ece")
    return out


# -- merge -----------------------------------------------------------------------------------
def _merge_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    contents = [deps[name]["content"] for name in job.deps]
    return merge_key(
        s["method"],
        s["seed"],
        s["options"],
        contents,
        data,
        s.get("server_examples"),
        bool(s.get("train_metrics")),
        int(s.get("sharpness_probes") or 0),
    )


def _merge_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    s = payload["settings"]
    ckpts = [_checkpoint(payload, name) for name in payload["dep_order"]]
    entry, reused = stored_merge_metrics(
        _store(payload),
        ckpts,
        s["method"],
        _data(payload),
        seed=s["seed"],
        progress=progress,
        server_examples=s.get("server_examples"),
        train_metrics=bool(s.get("train_metrics")),
        sharpness_probes=int(s.get("sharpness_probes") or 0),
        **s["options"],
    )
    record = {k: v for k, v in entry.items() if isinstance(v, int | float) and v is not None}
    return {"content": "", "record": record, "reused": reused}


# -- analysis (Ito et al.: L2, R(γ), R to the merge, Taylor barrier) ----------------------------
def _perm_of(payload: Mapping[str, Any], name: str, spec) -> Permutation:
    info = payload["deps"][name]
    folder = _store(payload).folder(info["kind"], info["key"])
    return load_permutation(folder / "perm.json", spec)


def _first_split_loader(data: Dataset, splits: Mapping[str, Any]):
    split = next(iter(splits))
    loaders, evaluation = _loaders(data, {split: splits[split]})
    return loaders[split], {split: evaluation[split]}


def _analysis_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    a, b = (deps[name]["content"] for name in job.deps[:2])
    perm = deps[job.deps[2]]["content"] if len(job.deps) > 2 else "identity"
    _, evaluation = _first_split_loader(data, s["splits"])
    uses_data = bool({"taylor", "layerwise"} & set(s["analyses"]))
    settings = {
        "analyses": s["analyses"],
        "gammas": s["gammas"],
        "taylor_lambdas": s["taylor_lambdas"],
        "evaluation": evaluation if uses_data else None,
    }
    if "layerwise" in s["analyses"]:
        settings["layerwise"] = {
            "version": LAYERWISE_VERSION,
            "bn_reset": bool(s.get("batchnorm")),
            "random_permutations": RANDOM_PERMUTATIONS,
        }
    dataset = data.fingerprint if uses_data else None
    return make_key("analysis", settings, {"a": a, "b": b, "perm": perm}, dataset)


LAYERWISE_VERSION = 1
RANDOM_PERMUTATIONS = 5
LAYERWISE_METRICS = (
    "lewc",
    "weak_additivity",
    "reciprocal_ab",
    "merged_cosine",
    "commutativity",
    "norm_ratio",
    "lewc_norm_ratio",
    "activation_cosine",
    "small_fraction_a",
    "non_overlap",
)


def layerwise_record(result: Mapping[str, Any]) -> dict[str, float]:
    """Ledger metrics of :func:`lmckit.workflows.analysis.layerwise_pair`:
    ``layerwise.<metric>.<layer>`` (``layerwise.depth.<layer>`` orders the layers),
    ``gaussian.<layer>``; the λ = ½ merge's ``none.<score>`` (no permutation) and
    ``given.<score>`` (π); with the pair-level extras ``random.<score>`` (mean over the
    random merges), ``flatness.<accuracy|loss>.<λ>``, ``flatness.distance`` and
    ``flatness.cosine.<layer>`` (at the largest λ)."""
    record: dict[str, float] = {}
    for row in result["layerwise"]["layers"]:
        record[f"layerwise.depth.{row['name']}"] = row["depth"]
        for metric in LAYERWISE_METRICS:
            if row.get(metric) is not None:
                record[f"layerwise.{metric}.{row['name']}"] = row[metric]
    for layer, (mean, _std) in result["gaussian"].items():
        record[f"gaussian.{layer}"] = mean
    if "random_permutations" in result:
        merges = result["random_permutations"]["merges"]
        randoms = [m for k, m in merges.items() if k.startswith("random")]
        for score in ("accuracy", "accuracy_barrier", "calibrated_loss_barrier", "temperature"):
            for label in ("none", "given"):
                if label in merges:
                    record[f"{label}.{score}"] = merges[label][score]
            if randoms:
                record[f"random.{score}"] = sum(m[score] for m in randoms) / len(randoms)
    if "flatness" in result:
        f = result["flatness"]
        for lam, acc, loss in zip(f["lambdas"], f["accuracy"], f["loss"], strict=True):
            record[f"flatness.accuracy.{lam:g}"] = acc
            record[f"flatness.loss.{lam:g}"] = loss
        record["flatness.distance"] = f["distance"]
        for layer, values in f["cosine"].items():
            record[f"flatness.cosine.{layer}"] = values[-1]
    return record


def _analysis_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    from lmckit.workflows.analysis import analyze_pair, layerwise_pair

    s = payload["settings"]
    order = payload["dep_order"]
    a, b = (_checkpoint(payload, name) for name in order[:2])
    perm = _perm_of(payload, order[2], a.spec) if len(order) > 2 else Permutation.identity(a.spec)
    data = _data(payload)
    key, document = _analysis_key(Job("", "analysis", s, tuple(order)), payload["deps"], data)
    assert key == payload["key"], "the worker computed another key than the driver"

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        taylor = "taylor" in s["analyses"]
        loader = _first_split_loader(data, s["splits"])[0] if taylor else None
        result = analyze_pair(
            a.spec,
            a.model,
            a.params,
            b.params,
            perm,
            loader,
            gammas=s["gammas"],
            taylor_lambdas=s["taylor_lambdas"],
        )
        record: dict[str, Any] = {}
        if "spectral" in s["analyses"]:
            record["l2.before"], record["l2.after"] = result["distances"]["parameters"]
            for g, r in result["R"].items():
                record[f"R.{g}"] = r["total"]
            for g, ends in result["R_merged"].items():
                for end, value in ends.items():
                    record[f"R_merged.{end}.{g}"] = value
        if taylor:
            t = result["taylor"]
            for lam, predicted, actual in zip(
                t["lambdas"], t["predicted"], t["actual"], strict=True
            ):
                record[f"taylor.predicted.{lam:g}"] = predicted
                record[f"taylor.actual.{lam:g}"] = actual
            record["taylor.distance"] = t["distance"]
        if "layerwise" in s["analyses"]:
            loader = _first_split_loader(data, s["splits"])[0]
            bn_data = (
                data.loader("train", batch_size=500, shuffle=True) if s.get("batchnorm") else None
            )
            result["layerwise"] = layerwise_pair(
                a.spec,
                a.model,
                a.params,
                b.params,
                perm,
                loader,
                bn_reset_data=bn_data,
                extras=perm.is_identity(),
                random_n=RANDOM_PERMUTATIONS,
            )
            record.update(layerwise_record(result["layerwise"]))
        atomic_write_json(folder / "analysis.json", result)
        record["seconds"] = time.perf_counter() - started
        return content_hash(result), record

    artifact, reused = _store(payload).get_or_put("analysis", key, document, write)
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


# -- triplet (Ito et al. §5.3: B and C matched to A) -------------------------------------------
def _triplet_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    names = ("a", "b", "c", "perm_b", "perm_c")
    inputs = {n: deps[d]["content"] for n, d in zip(names, job.deps, strict=True)}
    _, evaluation = _first_split_loader(data, s["splits"])
    settings = {"gamma": s["gamma"], "evaluation": evaluation, "bn_reset": s["batchnorm"]}
    if s.get("landscape"):
        settings["landscape"] = s["landscape"]
    return make_key("triplet", settings, inputs, data.fingerprint)


def _triplet_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    from lmckit.analysis.triplet import three_models

    s = payload["settings"]
    order = payload["dep_order"]
    a, b, c = (_checkpoint(payload, name) for name in order[:3])
    perm_b, perm_c = (_perm_of(payload, name, a.spec) for name in order[3:])
    data = _data(payload)
    key, document = _triplet_key(Job("", "triplet", s, tuple(order)), payload["deps"], data)
    assert key == payload["key"], "the worker computed another key than the driver"

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        loader, _ = _first_split_loader(data, s["splits"])
        bn_data = data.loader("train", batch_size=500, shuffle=True) if s["batchnorm"] else None
        r = three_models(
            a.spec,
            a.model,
            a.params,
            b.params,
            c.params,
            perm_b,
            perm_c,
            loader,
            gamma=s["gamma"],
            bn_reset_data=bn_data,
        )
        atomic_write_json(folder / "triplet.json", r.to_dict())
        record = {}
        for field_name in ("R", "loss_barrier", "accuracy_barrier"):
            for pair, value in getattr(r, field_name).items():
                record[f"{field_name}.{pair}"] = value
        if s.get("landscape"):
            from lmckit.analysis.landscape import plane_landscape, triangle_summary
            from lmckit.transform import align

            three = [a.params, align(perm_b, b.params), align(perm_c, c.params)]
            land = plane_landscape(
                a.model, three, loader, resolution=s["landscape"], bn_reset_data=bn_data,
                progress=progress,
            )  # fmt: skip
            atomic_write_json(folder / "landscape.json", land.to_dict())
            record.update({f"landscape.{k}": v for k, v in triangle_summary(land).items()})
        record["seconds"] = time.perf_counter() - started
        return content_hash(r.to_dict()), record

    artifact, reused = _store(payload).get_or_put("triplet", key, document, write)
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


# -- spectra (Ito et al. Fig. 1, App. D.2) ----------------------------------------------------
DOMINANT_RATIO = 0.3  # a singular value above 0.3 × the largest counts as dominant (γ = 0.3)


def _spectra_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    inputs = {f"model{i}": deps[d]["content"] for i, d in enumerate(job.deps)}
    return make_key("spectra", {"seeds": job.settings["seeds"]}, inputs)


def _spectra_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    from lmckit.analysis.spectral import dominant_share, effective_rank, singular_values

    s = payload["settings"]
    ckpts = [_checkpoint(payload, name) for name in payload["dep_order"]]
    key, document = _spectra_key(
        Job("", "spectra", s, tuple(payload["dep_order"])), payload["deps"], None
    )
    assert key == payload["key"], "the worker computed another key than the driver"

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        values = [singular_values(ck.params) for ck in ckpts]
        layers = list(values[0])
        result = {layer: [v[layer].tolist() for v in values] for layer in layers}
        atomic_write_json(folder / "spectra.json", {"seeds": s["seeds"], "layers": result})
        record = {}
        for layer in layers:
            stack = torch.stack([v[layer] for v in values])  # (models, k)
            top = stack[:, 0]
            # how much the spectra of independently trained models differ (Fig. 1) ...
            record[f"spread.{layer}"] = float(
                (stack.std(0) / stack.mean(0).clamp_min(1e-12)).mean()
            )
            # ... and whether they differ by one factor per model (App. D.2): spread of the
            # spectra normalised by their largest value
            normalised = stack / top[:, None]
            record[f"normalised_spread.{layer}"] = float(
                (normalised.std(0) / normalised.mean(0).clamp_min(1e-12)).mean()
            )
            # Ito et al. App. D.3: wider models have fewer dominant directions — the share
            # of singular values above DOMINANT_RATIO × the largest (R(γ)'s cut at γ = 0.3)
            record[f"dominant_share.{layer}"] = sum(
                dominant_share(v[layer], DOMINANT_RATIO) for v in values
            ) / len(values)
            # the width study's §5.4: rank falls with width and with weight decay
            ranks = [effective_rank(v[layer]) for v in values]
            record[f"effective_rank.{layer}"] = sum(ranks) / len(ranks)
            record[f"relative_effective_rank.{layer}"] = sum(ranks) / len(ranks) / stack.shape[1]
        record["seconds"] = time.perf_counter() - started
        return content_hash(result), record

    artifact, reused = _store(payload).get_or_put("spectra", key, document, write)
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


STEPS: dict[str, StepKind] = {
    kind.name: kind
    for kind in (
        StepKind("train", _train_key, _train_run),
        StepKind("match", _match_key, _match_run),
        StepKind("curve", _curve_key, _curve_run),
        StepKind("merge", _merge_key, _merge_run),
        StepKind("analysis", _analysis_key, _analysis_run),
        StepKind("triplet", _triplet_key, _triplet_run),
        StepKind("spectra", _spectra_key, _spectra_run),
    )
}
"""Step kinds by name."""


def job_key(job: Job, deps: Mapping[str, dict[str, Any]], data: Dataset) -> tuple[str, dict]:
    """The store key of ``job``'s artifact, given its dependencies' results."""
    return STEPS[job.kind].key(job, deps, data)


ARTIFACT_KIND = {
    "train": "checkpoint",
    "match": "permutation",
    "curve": "curve",
    "merge": "merge-metrics",
    "analysis": "analysis",
    "triplet": "triplet",
    "spectra": "spectra",
}
"""The result store's kind of each step's artifact."""


def execute(payload: dict[str, Any], progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run one job from its payload (see :mod:`lmckit.experiments.runner`); never raises:
    failures come back as ``{"error": traceback}``. A result carries ``created``: when
    its artifact was computed (seconds since the epoch; long ago for a reused one)."""
    start = time.perf_counter()
    threads = payload.get("threads")
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        result = STEPS[payload["kind"]].run(payload, progress)
        result["seconds"] = time.perf_counter() - start
        stored = _store(payload).get(ARTIFACT_KIND[payload["kind"]], payload["key"], verify=False)
        if stored is not None:
            result["created"] = datetime.fromisoformat(stored.meta["created"]).timestamp()
        return result
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"error": traceback.format_exc(), "seconds": time.perf_counter() - start}
    finally:
        torch.set_num_threads(previous)
