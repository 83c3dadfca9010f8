"""An experiment expanded into its jobs: one per trained model, match, curve and merge."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from lmckit.experiments.spec import Experiment
from lmckit.experiments.steps import Job
from lmckit.models import build_model, model_config
from lmckit.params import has_batchnorm
from lmckit.train import TrainConfig

__all__ = ["build_jobs"]


def _full_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    with torch.device("meta"):
        return model_config(build_model(name, **config))


def _uses_batchnorm(name: str, config: dict[str, Any]) -> bool:
    with torch.device("meta"):
        return has_batchnorm(build_model(name, **config).state_dict())


def build_jobs(experiment: Experiment, configs: list[tuple[str, dict[str, Any]]]) -> list[Job]:
    """The jobs of ``experiment``, dependencies first. ``configs`` holds each grid cell's
    ``(model name, zoo configuration)`` (:func:`lmckit.experiments.spec.model_configs`)."""
    jobs: list[Job] = []
    for c, (cell, (name, config)) in enumerate(zip(experiment.cells(), configs, strict=True)):
        where = {"cell": c, **cell["values"]}
        base = TrainConfig.paper_defaults(name, experiment.dataset, **cell["train"])
        full = _full_config(name, config)
        common = {"model_name": name, "model_config": config}
        train_names = []
        for seed in experiment.seeds:
            job = Job(
                name=f"train/c{c}/seed{seed}",
                kind="train",
                settings={
                    **common,
                    "model_config_full": full,
                    "train_config": replace(base, seed=int(seed)).to_dict(),
                },
                labels={**where, "seed": seed},
            )
            jobs.append(job)
            train_names.append(job.name)
        batchnorm = _uses_batchnorm(name, config)
        for b, block in enumerate(experiment.compare):
            for i, j in block.pair_list(len(experiment.seeds)):
                pair = (experiment.seeds[i], experiment.seeds[j])
                for method in block.methods:
                    labels = {**where, "pair": list(pair), "method": method, "block": b}
                    deps = (train_names[i], train_names[j])
                    if method != "none":
                        settings = {
                            **common,
                            "method": method,
                            "seed": 0,
                            "options": dict(block.options.get(method, {})),
                        }
                        match_name = f"match/c{c}/{pair[0]}-{pair[1]}/{method}"
                        earlier = next((job for job in jobs if job.name == match_name), None)
                        if earlier is not None and earlier.settings != settings:
                            match_name += f"/b{b}"  # the same method with other options
                            earlier = None
                        if earlier is None:
                            jobs.append(Job(match_name, "match", settings, deps, labels))
                        deps = (*deps, match_name)
                    jobs.append(
                        Job(
                            name=f"curve/b{b}/c{c}/{pair[0]}-{pair[1]}/{method}",
                            kind="curve",
                            settings={
                                **common,
                                "splits": dict(block.splits),
                                "lambdas": block.lambdas,
                                "calibrated": block.calibrated,
                                "ensemble": block.ensemble,
                                "batchnorm": batchnorm,
                                "seed": 0,
                            },
                            deps=deps,
                            labels=labels,
                        )
                    )
        for b, block in enumerate(experiment.merge):
            for method in block.methods:
                for n in block.n:
                    jobs.append(
                        Job(
                            name=f"merge/b{b}/c{c}/{method}/n{n}",
                            kind="merge",
                            settings={
                                **common,
                                "method": method,
                                "n": n,
                                "seed": 0,
                                "options": dict(block.options.get(method, {})),
                            },
                            deps=tuple(train_names[:n]),
                            labels={**where, "method": method, "n": n, "block": b},
                        )
                    )
    return jobs
