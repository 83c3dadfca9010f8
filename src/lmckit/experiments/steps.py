"""The steps an experiment is made of, as jobs: train, match, curve, merge.

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

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.data import Dataset
from lmckit.experiments.interpolation import curve_key, stored_curve
from lmckit.experiments.matching import load_permutation, match_key, stored_match
from lmckit.experiments.merging import merge_key, stored_merge_metrics
from lmckit.experiments.store import Store, make_key
from lmckit.experiments.training import load_for_model
from lmckit.perm import Permutation
from lmckit.progress import ProgressCallback
from lmckit.train import TrainConfig, init_model, train

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


def _checkpoint(payload: Mapping[str, Any], dep: str):
    info = payload["deps"][dep]
    store = Store(payload["store"])
    folder = store.folder(info["kind"], info["key"])
    return load_checkpoint(folder / "model", device=payload.get("device", "cpu"))


# -- train -----------------------------------------------------------------------------------
def _train_settings(job: Job) -> dict[str, Any]:
    s = job.settings
    return {"model": s["model_config_full"], "train": s["train_config"]}


def _train_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    return make_key("checkpoint", _train_settings(job), dataset=data.fingerprint)


def _train_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    settings = payload["settings"]
    data = _data(payload)
    store = Store(payload["store"])
    key, document = make_key(
        "checkpoint",
        {"model": settings["model_config_full"], "train": settings["train_config"]},
        dataset=data.fingerprint,
    )
    assert key == payload["key"], "the worker computed another key than the driver"

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        config = TrainConfig.from_dict(settings["train_config"])
        model = init_model(settings["model_name"], settings["model_config"], config.seed)
        model.to(payload.get("device", "cpu"))
        result = train(model, data, config, progress=progress)
        meta = {
            "key": key,
            "key_document": document,
            "train": config.to_dict(),
            "seed": config.seed,
            "dataset": data.name,
            "metrics": result.metrics_dict(),
            "train_seconds": result.seconds,
        }
        weights = save_checkpoint(folder / "model", model, meta)
        sha = load_checkpoint(weights).content_hash
        return sha, {**result.metrics_dict(), "seconds": result.seconds}

    artifact, reused = store.get_or_put("checkpoint", key, document, write)
    return {"content": artifact.content, "record": artifact.record, "reused": reused}


# -- match -----------------------------------------------------------------------------------
def _match_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    a, b = (deps[name]["content"] for name in job.deps)
    return match_key(s["method"], s["seed"], s["options"], a, b, data)


def _match_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    s = payload["settings"]
    a, b = (_checkpoint(payload, name) for name in payload["dep_order"])
    store = Store(payload["store"])
    _, artifact, reused = stored_match(
        store, a, b, s["method"], _data(payload), seed=s["seed"], progress=progress, **s["options"]
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
    return {
        "lambdas": s["lambdas"],
        "calibrated": s["calibrated"],
        "ensemble": s["ensemble"],
        "seed": s["seed"],
        "bn_reset_batches": 20 if s["batchnorm"] else None,
    }


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
        folder = Store(payload["store"]).folder(info["kind"], info["key"])
        perm = load_permutation(folder / "perm.json", a.spec)
    else:
        perm = Permutation.identity(a.spec)
    loaders, evaluation = _loaders(data, s["splits"])
    options = _curve_options(s, data)
    bn_batches = options.pop("bn_reset_batches")
    curve, artifact, reused = stored_curve(
        Store(payload["store"]),
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
    return {"content": artifact.content, "record": record, "reused": reused}


# -- merge -----------------------------------------------------------------------------------
def _merge_key(job: Job, deps, data: Dataset) -> tuple[str, dict[str, Any]]:
    s = job.settings
    contents = [deps[name]["content"] for name in job.deps]
    return merge_key(s["method"], s["seed"], s["options"], contents, data)


def _merge_run(payload: dict[str, Any], progress: ProgressCallback | None) -> dict[str, Any]:
    s = payload["settings"]
    ckpts = [_checkpoint(payload, name) for name in payload["dep_order"]]
    entry, reused = stored_merge_metrics(
        Store(payload["store"]),
        ckpts,
        s["method"],
        _data(payload),
        seed=s["seed"],
        progress=progress,
        **s["options"],
    )
    record = {k: v for k, v in entry.items() if isinstance(v, int | float) and v is not None}
    return {"content": "", "record": record, "reused": reused}


STEPS: dict[str, StepKind] = {
    kind.name: kind
    for kind in (
        StepKind("train", _train_key, _train_run),
        StepKind("match", _match_key, _match_run),
        StepKind("curve", _curve_key, _curve_run),
        StepKind("merge", _merge_key, _merge_run),
    )
}
"""Step kinds by name."""


def job_key(job: Job, deps: Mapping[str, dict[str, Any]], data: Dataset) -> tuple[str, dict]:
    """The store key of ``job``'s artifact, given its dependencies' results."""
    return STEPS[job.kind].key(job, deps, data)


def execute(payload: dict[str, Any], progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run one job from its payload (see :mod:`lmckit.experiments.runner`); never raises:
    failures come back as ``{"error": traceback}``."""
    start = time.perf_counter()
    threads = payload.get("threads")
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        result = STEPS[payload["kind"]].run(payload, progress)
        result["seconds"] = time.perf_counter() - start
        return result
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"error": traceback.format_exc(), "seconds": time.perf_counter() - start}
    finally:
        torch.set_num_threads(previous)
