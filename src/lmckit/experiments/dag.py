"""An experiment expanded into its jobs: one per trained model, match, curve, analysis,
triplet, spectra and merge."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any

import torch

from lmckit.data.splits import Split
from lmckit.experiments.schema import Experiment, ExperimentError, train_options
from lmckit.experiments.steps import Job
from lmckit.models import build_model, model_config
from lmckit.params import has_batchnorm
from lmckit.train import TrainConfig

__all__ = ["build_jobs", "select_jobs"]


def _full_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    with torch.device("meta"):
        return model_config(build_model(name, **config))


def _uses_batchnorm(name: str, config: dict[str, Any]) -> bool:
    with torch.device("meta"):
        return has_batchnorm(build_model(name, **config).state_dict())


def _snapshot_sources(
    cells: list, bases: list[TrainConfig]
) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Cells that differ only in ``train.epochs`` under the constant schedule: the longest
    run saves snapshots at the others' epochs, which *are* those shorter runs (see
    :func:`lmckit.train.train`), so they are trained once. Returns ``{short cell: source
    cell}`` and ``{source cell: [snapshot epochs]}``."""
    groups: dict[str, list[int]] = {}
    for c, ((_, (name, config)), base) in enumerate(zip(cells, bases, strict=True)):
        if base.schedule != "constant":
            continue
        rest = {**base.to_dict(), "epochs": None}
        groups.setdefault(json.dumps([name, config, rest], sort_keys=True), []).append(c)
    source: dict[int, int] = {}
    snapshots: dict[int, list[int]] = {}
    for members in groups.values():
        longest = max(members, key=lambda c: (bases[c].epochs, -c))
        shorter = [c for c in members if bases[c].epochs < bases[longest].epochs]
        if shorter:
            snapshots[longest] = sorted({bases[c].epochs for c in shorter})
            source.update({c: longest for c in shorter})
    return source, snapshots


def _match_job(
    jobs: list[Job],
    train_names: list[str],
    seeds: tuple[int, ...],
    cell: int,
    common: dict[str, Any],
    i: int,
    j: int,
    method: str,
    options: Any,
    suffix: str,
    labels: dict[str, Any],
    server_examples: int | None = None,
) -> str:
    """The name of the job matching seed index ``j`` onto ``i`` with ``method`` and
    ``options`` in grid cell ``cell``: an earlier job with the same settings, else a new
    one appended to ``jobs``."""
    pair = (seeds[i], seeds[j])
    settings = {**common, "method": method, "seed": 0, "options": dict(options)}
    if server_examples is not None:  # absent otherwise: earlier files keep their settings
        settings["server_examples"] = server_examples
    name = f"match/c{cell}/{pair[0]}-{pair[1]}/{method}"
    earlier = next((job for job in jobs if job.name == name), None)
    if earlier is not None and earlier.settings != settings:
        name += f"/{suffix}"  # the same method with other options
        earlier = next((job for job in jobs if job.name == name), None)
    if earlier is None:
        jobs.append(Job(name, "match", settings, (train_names[i], train_names[j]), labels))
    return name


def _used_seed_indices(experiment: Experiment, base: TrainConfig) -> set[int]:
    """The seeds whose models a cell needs: all of them, except in a cell trained on parts
    of the data, where only those some pair, triple, spectrum or merge uses are trained —
    a federated cell with 2 clients need not train the 8 models of its 8-client twin."""
    count = len(experiment.seeds)
    if base.split is None or experiment.spectra:
        return set(range(count))
    used: set[int] = set()
    for block in experiment.compare:
        used.update(i for pair in block.pair_list(count) for i in pair)
    for block in experiment.triplets:
        used.update(i for triple in block.triple_list(count) for i in triple)
    for block in experiment.merge:
        used.update(range(block.seeds_needed(base.split.parts_count)))
    return used


def _parts_of(train: dict[str, Any], indices: tuple[int, ...]) -> dict[str, Any]:
    """``{"parts": [split of each model]}`` for a cell trained on parts of the data (the
    curve then reports accuracy on each part's majority classes), else nothing."""
    if "split" not in train:
        return {}
    return {"parts": [train_options(train, i)["split"] for i in indices]}


def build_jobs(experiment: Experiment, configs: list[tuple[str, dict[str, Any]]]) -> list[Job]:
    """The jobs of ``experiment``, dependencies first. ``configs`` holds each grid cell's
    ``(model name, zoo configuration)`` (:func:`lmckit.experiments.schema.model_configs`):
    every training job, then per cell its compare, triplet, spectra and merge jobs (a
    matching job just before the first job that needs it)."""
    cells = list(zip(experiment.cells(), configs, strict=True))
    bases = [
        TrainConfig.paper_defaults(name, experiment.dataset, **train_options(cell["train"], 0))
        for cell, (name, _) in cells
    ]
    jobs = _train_jobs(experiment, cells, bases)
    for c, (cell, (name, config)) in enumerate(cells):
        common = {"model_name": name, "model_config": config}
        train_names = [f"train/c{c}/seed{seed}" for seed in experiment.seeds]
        match_job = partial(_match_job, jobs, train_names, experiment.seeds, c, common)
        cell_jobs = _CellJobs(experiment, c, cell, common, train_names, match_job, jobs)
        cell_jobs.compare()
        cell_jobs.triplets()
        cell_jobs.spectra()
        parts = bases[c].split.parts_count if bases[c].split is not None else None
        cell_jobs.merges(parts)
    return jobs


def _train_jobs(experiment: Experiment, cells: list, bases: list[TrainConfig]) -> list[Job]:
    """One training job per cell and used seed, each snapshot source before the cells it
    stands in for."""
    jobs: list[Job] = []
    source, snapshots = _snapshot_sources(cells, bases)
    order = sorted(range(len(cells)), key=lambda c: (c in source, c))
    for c in order:
        cell, (name, config) = cells[c]
        common = {"model_name": name, "model_config": config}
        full = _full_config(name, config)
        used = _used_seed_indices(experiment, bases[c])
        for index, seed in enumerate(experiment.seeds):
            if index not in used:
                continue
            config = replace(bases[c], seed=int(seed))
            labels = {"cell": c, **cell["values"], "seed": seed}
            if config.split is not None:
                split = train_options(cell["train"], index)["split"]
                config = replace(config, split=Split.from_dict(split))
                labels["part"] = config.split.part
            settings = {
                **common,
                "model_config_full": full,
                "train_config": config.to_dict(),
            }
            if c in snapshots:
                settings["snapshots"] = snapshots[c]
            jobs.append(
                Job(
                    name=f"train/c{c}/seed{seed}",
                    kind="train",
                    settings=settings,
                    deps=(f"train/c{source[c]}/seed{seed}",) if c in source else (),
                    labels=labels,
                )
            )
    return jobs


@dataclass
class _CellJobs:
    """The jobs of one grid cell after its training, appended to ``jobs`` in order."""

    experiment: Experiment
    c: int
    cell: dict[str, Any]
    common: dict[str, Any]
    train_names: list[str]
    match_job: Callable[..., str]
    jobs: list[Job]

    @property
    def where(self) -> dict[str, Any]:
        return {"cell": self.c, **self.cell["values"]}

    @cached_property
    def batchnorm(self) -> bool:
        return _uses_batchnorm(self.common["model_name"], self.common["model_config"])

    def compare(self) -> None:
        """Each compare block's curves (and analyses) per pair and method."""
        e, c, seeds, train_names = self.experiment, self.c, self.experiment.seeds, self.train_names
        batchnorm = self.batchnorm
        for b, block in enumerate(e.compare):
            for i, j in block.pair_list(len(seeds)):
                pair = (seeds[i], seeds[j])
                for method in block.methods:
                    labels = {**self.where, "pair": list(pair), "method": method, "block": b}
                    deps = (train_names[i], train_names[j])
                    if method != "none":
                        options = block.options.get(method, {})
                        match = self.match_job(
                            i, j, method, options, f"b{b}", labels, block.server_examples
                        )
                        deps = (*deps, match)
                    self.jobs.append(
                        Job(
                            name=f"curve/b{b}/c{c}/{pair[0]}-{pair[1]}/{method}",
                            kind="curve",
                            settings={
                                **self.common,
                                "splits": dict(block.splits),
                                "lambdas": block.lambdas,
                                "calibrated": block.calibrated,
                                "ensemble": block.ensemble,
                                "batchnorm": batchnorm,
                                "seed": 0,
                                **_parts_of(self.cell["train"], (i, j)),
                            },
                            deps=deps,
                            labels=labels,
                        )
                    )
                    if block.analyses:
                        self.jobs.append(
                            Job(
                                name=f"analysis/b{b}/c{c}/{pair[0]}-{pair[1]}/{method}",
                                kind="analysis",
                                settings={
                                    **self.common,
                                    "analyses": list(block.analyses),
                                    "splits": dict(block.splits),
                                    "gammas": [0.0, 0.3],
                                    "taylor_lambdas": [0.5],
                                    "batchnorm": batchnorm,
                                },
                                deps=deps,
                                labels=labels,
                            )
                        )

    def triplets(self) -> None:
        """Each triplet block's job per triple and method, after its two matches."""
        e, c, train_names = self.experiment, self.c, self.train_names
        for b, block in enumerate(e.triplets):
            for i, j, k in block.triple_list(len(e.seeds)):
                seeds = [e.seeds[t] for t in (i, j, k)]
                for method in block.methods:
                    labels = {**self.where, "triple": seeds, "method": method, "block": b}
                    options = block.options.get(method, {})
                    matches = (
                        self.match_job(i, j, method, options, f"t{b}", labels),
                        self.match_job(i, k, method, options, f"t{b}", labels),
                    )
                    self.jobs.append(
                        Job(
                            name=f"triplet/b{b}/c{c}/{'-'.join(map(str, seeds))}/{method}",
                            kind="triplet",
                            settings={
                                **self.common,
                                "gamma": block.gamma,
                                "splits": dict(block.splits),
                                "batchnorm": self.batchnorm,
                                # absent when 0: earlier files keep their keys
                                **({"landscape": block.landscape} if block.landscape else {}),
                            },
                            deps=(train_names[i], train_names[j], train_names[k], *matches),
                            labels=labels,
                        )
                    )

    def spectra(self) -> None:
        """The cell's spectra job, when the experiment asks for spectra."""
        if self.experiment.spectra:
            self.jobs.append(
                Job(
                    name=f"spectra/c{self.c}",
                    kind="spectra",
                    settings={**self.common, "seeds": list(self.experiment.seeds)},
                    deps=tuple(self.train_names),
                    labels=dict(self.where),
                )
            )

    def merges(self, parts: int | None) -> None:
        """Each merge block's job per method, model count and seed set."""
        for b, block in enumerate(self.experiment.merge):
            for method in block.methods:
                for n in block.counts(parts):
                    for r in range(block.seed_sets):
                        # set 0 keeps the names and labels it had before seed sets existed
                        suffix = f"/s{r}" if r else ""
                        labels = {**self.where, "method": method, "n": n, "block": b}
                        if block.seed_sets > 1:
                            labels["set"] = r
                        indices = block.seed_indices(parts, n, r)
                        self.jobs.append(
                            Job(
                                name=f"merge/b{b}/c{self.c}/{method}/n{n}{suffix}",
                                kind="merge",
                                settings={
                                    **self.common,
                                    "method": method,
                                    "n": n,
                                    "seed": 0,
                                    "options": dict(block.options.get(method, {})),
                                    "server_examples": block.server_examples,
                                    "train_metrics": block.train_metrics,
                                    # absent when 0: earlier files keep their keys
                                    **(
                                        {"sharpness_probes": block.sharpness_probes}
                                        if block.sharpness_probes
                                        else {}
                                    ),
                                },
                                deps=tuple(self.train_names[i] for i in indices),
                                labels=labels,
                            )
                        )


def select_jobs(jobs: Sequence[Job], patterns: Sequence[str]) -> list[Job]:
    """The jobs whose names match one of ``patterns`` and every job they depend on,
    directly or not, in their order in ``jobs``.

    Patterns are shell-style, matched against the whole name (``*`` also crosses ``/``):
    ``merge/b1/*`` is every merge of the second block, ``merge/*/ste-mm/n5*`` STE-MM at
    n = 5 on every seed set, ``train/c0/seed3`` one model.

    Raises:
        ExperimentError: a pattern that matches no job, with a few of the names there are.
    """
    by_name = {job.name: job for job in jobs}
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(by_name, pattern)
        if not hits:
            first = {}  # one name per kind
            for job in jobs:
                first.setdefault(job.kind, job.name)
            raise ExperimentError(
                f"--only {pattern!r} matches none of the {len(by_name)} jobs (names look "
                f"like {', '.join(first.values())}; `*` matches any part, `/` included)"
            )
        chosen.update(hits)
    stack = list(chosen)
    while stack:  # and everything they need
        for dep in by_name[stack.pop()].deps:
            if dep not in chosen:
                chosen.add(dep)
                stack.append(dep)
    return [job for job in jobs if job.name in chosen]
