"""Experiment files: a paper's figure as data.

An experiment is a TOML file::

    name = "width-fmnist"          # required: the run folder, its report and reuse go by it
    description = "Git Re-Basin Fig. 4 at CPU scale"
    expected_runtime = "about 40 min on 2 CPU cores"
    seeds = [0, 1, 2]              # one trained model per seed and grid cell
    threads = 1                    # torch threads per job (default cores/jobs, ≤ $OMP_NUM_THREADS)
    spectra = true                 # singular values of every model, per cell (Fig. 1)

    [[paper]]                      # a published number, shown beside ours in the report
    step = "analysis"
    block = 0                      # optional: the [[compare]] block it belongs to
    # n = 5                        # optional, for a [[merge]]: the number of models merged
    method = "wm-fast"
    metric = "l2.after"
    value = 100.041
    std = 4.71
    source = "Ito et al. Table 1"

    [data]
    dataset = "fashion-mnist"

    [model]                        # the zoo model and its options
    name = "mlp"                   # or a user's class: name = "custom", class =
                                   # "mynet:Net" (importable), args = { width = 64 };
                                   # its spec is traced, its input is the data's shape

    [train]                        # training options over the paper's recipe
    epochs = 5
    init_seed = 0                  # optional: one initialisation for every seed
    [train.split]                  # optional: the k-th seed's model trains on part k
    kind = "dirichlet"             # (mod the parts) of one partition of the training
    clients = 4                    # set: "class-imbalanced" (fraction), "dirichlet"
    alpha = 0.1                    # (clients, alpha) or "random" (clients); a grid
                                   # key "train.split.alpha" varies one setting

    [grid]                         # every combination is a cell; dotted keys
    "model.width_multiplier" = [0.25, 0.5, 1, 2]

    [[variants]]                   # named settings, each crossed with the grid (for
    name = "adam-lr-1e-2"          # ablations whose cells differ in several options)
    "train.lr" = 1e-2

    [[compare]]                    # match pairs of seeds, interpolate the paths
    pairs = "all"                  # "all", "first" or [[0, 1], [0, 2]]
    methods = ["none", "wm-fast", "am"]
    lambdas = 25
    splits = { test = "all" }      # "all" or a number of examples (seeded subset)
    calibrated = false
    ensemble = false
    server_examples = 1000         # optional: data-driven matchers (AM, STE, Sinkhorn's
                                   # mid loss) see only this many training examples
    [compare.options]              # per-method options
    ste = { epochs = 1 }

    analyses = ["spectral", "taylor"]  # per pair and method: L2, R(γ), R to the merge;
                                   # Taylor barrier on the first split (Ito et al.);
                                   # "layerwise": the width study's LEWC diagnostics at
                                   # λ=½ (and, for "none", flatness and random permutations)

    [[merge]]                      # merge the first n seeds' models
    methods = ["star-wm", "merge-many"]
    n = [2, 3]                     # or "parts": one model per part of train.split
    seed_sets = 3                  # optional: repeat on disjoint seeds — set r merges
                                   # seeds r·max(n) .. r·max(n) + n − 1 (mean ± std over sets)
    server_examples = 1000         # optional: data-driven mergers see only this many
                                   # training examples (a seeded subset)
    train_metrics = true           # optional: the training set's loss/acc/ECE as well
    sharpness_probes = 20          # optional: tr(H ⊙ θθᵀ) of the merge and its inputs
                                   # (STE-MM Fig. 8), Rademacher probes on the test set
    [merge.options]
    ste-mm = { epochs = 10 }

    [[triplets]]                   # B and C matched to A: R and midpoint barriers of all
    methods = ["wm-fast", "ste"]   # three pairs (Ito et al. §5.3, Table 3)
    triples = "disjoint"           # (0,1,2), (3,4,5)...; or [[0, 1, 2], ...]
    landscape = 15                 # optional: the plane through the three aligned models
                                   # on a 15 × 15 grid (Ito et al. Fig. 5)
    gamma = 0.3
    splits = { test = 2000 }       # as in [[compare]]
    [triplets.options]
    ste = { epochs = 1 }

:func:`load_experiment` validates every key and type, naming the key and what it
expected; :meth:`Experiment.cells` expands the grid.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lmckit.errors import UsageError

__all__ = [
    "Compare",
    "Experiment",
    "ExperimentError",
    "MergeBlock",
    "TripletBlock",
    "load_experiment",
    "parse_overrides",
]


class ExperimentError(UsageError):
    """An experiment file with a missing, unknown or ill-typed key."""


TOP_KEYS = {
    "name",
    "description",
    "expected_runtime",
    "seeds",
    "threads",
    "data",
    "model",
    "train",
    "grid",
    "variants",
    "compare",
    "merge",
    "triplets",
    "spectra",
    "paper",
}
PAPER_KEYS = {"step", "method", "metric", "value", "std", "source", "block", "n"}
COMPARE_KEYS = {
    "pairs",
    "methods",
    "lambdas",
    "splits",
    "calibrated",
    "ensemble",
    "options",
    "analyses",
    "server_examples",
}
MERGE_KEYS = {
    "methods",
    "n",
    "options",
    "server_examples",
    "train_metrics",
    "seed_sets",
    "sharpness_probes",
}
TRIPLET_KEYS = {"methods", "triples", "gamma", "splits", "options", "landscape"}
ANALYSES = {"spectral", "taylor", "layerwise"}
TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list"}


def _expect(value: Any, kind: type | tuple[type, ...], key: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))
    if not ok:
        names = " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ExperimentError(f"{key} must be {names}, got {value!r}")
    return value


def _table(value: Any, key: str, known: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ExperimentError(f"{key} must be a table, got {value!r}")
    if known is not None:
        unknown = sorted(set(value) - known)
        if unknown:
            raise ExperimentError(f"{key} has unknown key(s) {unknown}; known: {sorted(known)}")
    return dict(value)


@dataclass(frozen=True)
class Compare:
    """One ``[[compare]]`` block: which pairs, which methods, how to interpolate."""

    pairs: str | tuple[tuple[int, int], ...]
    methods: tuple[str, ...]
    lambdas: int
    splits: Mapping[str, int | str]
    calibrated: bool
    ensemble: bool
    options: Mapping[str, Mapping[str, Any]]
    analyses: tuple[str, ...] = ()
    server_examples: int | None = None  # data-driven matchers see a seeded subset this big

    def pair_list(self, seeds: int) -> list[tuple[int, int]]:
        """Index pairs ``(i, j)`` into the seed list."""
        if self.pairs == "all":
            return list(itertools.combinations(range(seeds), 2))
        if self.pairs == "first":
            return [(0, 1)]
        return list(self.pairs)


@dataclass(frozen=True)
class MergeBlock:
    """One ``[[merge]]`` block: methods and numbers of models (``"parts"``: as many as the
    cell's split has parts — one model per client), and ``server_examples``: the size of the
    seeded subset of the training set that data-driven mergers (STE-MM, star-STE, BN resets)
    may look at — a federated server's small held set — instead of all of it;
    ``train_metrics``: also measure the merge, the inputs and their ensemble on the
    training set; ``seed_sets``: how many disjoint sets of seeds each merge is repeated on
    (set ``r`` merges seed indices ``r·max(n) … r·max(n) + n − 1``); ``sharpness_probes``:
    also estimate ``tr(H ⊙ θθᵀ)`` of the merge and of each input with that many Rademacher
    probes (STE-MM Fig. 8; 0: not measured)."""

    methods: tuple[str, ...]
    n: tuple[int | str, ...]
    options: Mapping[str, Mapping[str, Any]]
    server_examples: int | None = None
    train_metrics: bool = False
    seed_sets: int = 1
    sharpness_probes: int = 0

    def seed_indices(self, parts: int | None, n: int, seed_set: int) -> range:
        """The seed indices the merge of ``n`` models uses in set ``seed_set``."""
        first = seed_set * max(self.counts(parts))
        return range(first, first + n)

    def seeds_needed(self, parts: int | None) -> int:
        """How many seeds the block's largest merge of its last set reaches."""
        return self.seed_sets * max(self.counts(parts))

    def counts(self, parts: int | None) -> tuple[int, ...]:
        """``n`` with ``"parts"`` resolved to ``parts`` (distinct, in order)."""
        out: list[int] = []
        for n in self.n:
            if n == PARTS:
                if parts is None:
                    raise ExperimentError('merge n = "parts" needs a train.split')
                n = parts
            if n not in out:
                out.append(int(n))
        return tuple(out)


PARTS = "parts"


@dataclass(frozen=True)
class TripletBlock:
    """One ``[[triplets]]`` block: B and C matched to A with each method; ``landscape``: also
    evaluate the plane through A, π_B(B) and π_C(C) on a ``landscape × landscape`` grid
    (Ito et al. Fig. 5; 0: not evaluated)."""

    methods: tuple[str, ...]
    triples: str | tuple[tuple[int, int, int], ...]
    gamma: float
    splits: Mapping[str, int | str]
    options: Mapping[str, Mapping[str, Any]]
    landscape: int = 0

    def triple_list(self, seeds: int) -> list[tuple[int, int, int]]:
        """Index triples ``(a, b, c)`` into the seed list."""
        if self.triples == "disjoint":
            return [(i, i + 1, i + 2) for i in range(0, seeds - 2, 3)]
        return list(self.triples)


@dataclass(frozen=True)
class Experiment:
    """A parsed, validated experiment file (see the module docstring)."""

    name: str
    description: str
    expected_runtime: str
    seeds: tuple[int, ...]
    threads: int | None
    dataset: str
    model: Mapping[str, Any]
    train: Mapping[str, Any]
    grid: Mapping[str, tuple[Any, ...]]
    compare: tuple[Compare, ...]
    merge: tuple[MergeBlock, ...]
    triplets: tuple[TripletBlock, ...] = ()
    spectra: bool = False
    paper: tuple[Mapping[str, Any], ...] = ()
    variants: tuple[Mapping[str, Any], ...] = ()
    text: str = field(default="", compare=False)
    overrides: Mapping[str, Any] = field(default_factory=dict, compare=False)
    document: Mapping[str, Any] = field(default_factory=dict, compare=False)
    source: Path | None = field(default=None, compare=False)  # the file it was read from

    def as_run(self) -> str:
        """The experiment file as it runs: its own text, or — with overrides — the
        document with the overrides applied (TOML) under a header naming them."""
        if not self.overrides:
            return self.text
        import tomli_w

        header = ["# lmckit ran this experiment file with these overrides (--set):"]
        header += [f"#   {k} = {v!r}" for k, v in self.overrides.items()]
        return "\n".join(header) + "\n\n" + tomli_w.dumps(_plain_toml(self.document))

    def cells(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, for each variant: ``{"model": ...,
        "train": ..., "values": {grid key: value} (and the variant's name)}``, in order."""
        keys = list(self.grid)
        cells = []
        for variant in self.variants or [None]:
            for combo in itertools.product(*(self.grid[k] for k in keys)) if keys else [()]:
                model, train = copy.deepcopy(dict(self.model)), copy.deepcopy(dict(self.train))
                settings = [(k, v) for k, v in (variant or {}).items() if k != "name"]
                for key, value in [*settings, *zip(keys, combo, strict=True)]:
                    section, option = key.split(".", 1)
                    if section == "train" and option.startswith("split."):
                        train.setdefault("split", {})[option.split(".", 1)[1]] = value
                    else:
                        (model if section == "model" else train)[option] = value
                values = dict(zip(keys, combo, strict=True))
                if variant is not None:
                    values = {VARIANT_KEY: variant["name"], **values}
                cells.append({"model": model, "train": train, "values": values})
        return cells


def _plain_toml(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain_toml(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_toml(v) for v in value]
    return value


VARIANT_KEY = "variant.name"
"""The key of a cell's variant name in ``cell["values"]`` (and the jobs' labels)."""

DEFAULT_NAME = "experiment"
"""The name of an experiment built in Python without one (:func:`parse_experiment`), and
of a run folder's experiment whose recorded file has none (an lmckit that did not require
it); an experiment *file* must name itself (:func:`load_experiment`)."""


def _parse_variant(entry: Any, where: str) -> dict[str, Any]:
    table = _table(entry, where)
    name = _label(table.get("name"), f"{where}.name")
    for key, value in table.items():
        if key == "name":
            continue
        if "." not in key or key.split(".", 1)[0] not in ("model", "train"):
            raise ExperimentError(
                f'{where}: key {key!r} must be "name", "model.<option>" or "train.<option>"'
            )
        if isinstance(value, dict | list) and not (
            key == "model.hidden" and isinstance(value, list)
        ):
            raise ExperimentError(f"{where}.{key} must be a single value")
    return {"name": name, **{k: v for k, v in table.items() if k != "name"}}


def _methods(value: Any, key: str, allowed: set[str]) -> tuple[str, ...]:
    methods = tuple(_expect(value, list, key))
    for m in methods:
        if m not in allowed:
            raise ExperimentError(f"{key}: unknown method {m!r}; choose from {sorted(allowed)}")
    if not methods:
        raise ExperimentError(f"{key} must name at least one method")
    _distinct(methods, key)
    return methods


def _distinct(values: Sequence[Any], key: str) -> None:
    """A value listed twice would run the same jobs twice under one label (or be dropped
    silently): either way the list does not say what the user meant."""
    seen, repeated = set(), []
    for v in values:
        marker = json.dumps(v, sort_keys=True, default=repr)  # TOML dates too
        if marker in seen and v not in repeated:
            repeated.append(v)
        seen.add(marker)
    if repeated:
        raise ExperimentError(f"{key} lists {', '.join(map(repr, repeated))} more than once")


def _label(value: Any, key: str) -> str:
    """A name shown in reports and logs: a non-empty line of printable text."""
    text = _expect(value, str, key)
    if not text.strip() or not text.isprintable() or len(text) > 200:
        raise ExperimentError(
            f"{key} must be a non-empty line of printable text (at most 200 characters), "
            f"got {text!r}"
        )
    return text


def _options(
    value: Any, key: str, methods: tuple[str, ...], registry: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per-method option tables, each checked against the method's signature in
    ``registry`` (names, types and ranges: a typo is an error, never a silent default)."""
    from lmckit.errors import ParamsError

    table = _table(value, key)
    checked: dict[str, dict[str, Any]] = {}
    for method, options in table.items():
        if method not in methods:
            raise ExperimentError(f"{key}.{method}: the block does not use method {method!r}")
        _table(options, f"{key}.{method}")
        if method not in registry:
            raise ExperimentError(f"{key}.{method}: method {method!r} takes no options")
        try:
            # renamed options come back under their new names, which the jobs are keyed by
            checked[method] = registry[method].check_options(options, where=f"{key}.{method}: ")
        except ParamsError as exc:
            raise ExperimentError(str(exc)) from None
    return checked


def _index_tuples(
    value: Any, key: str, keywords: tuple[str, ...], size: int
) -> str | tuple[tuple[int, ...], ...]:
    """One of ``keywords``, or a list of index lists of length ``size`` (seed indices)."""
    shape = "[i, j]" if size == 2 else "[a, b, c]"
    if isinstance(value, str):
        if value not in keywords:
            named = ", ".join(f'"{k}"' for k in keywords)
            raise ExperimentError(f"{key} must be {named} or a list of {shape}")
        return value
    tuples = tuple(tuple(_expect(t, list, f"{key}[]")) for t in _expect(value, list, key))
    if not tuples:
        raise ExperimentError(f"{key} must list at least one {shape}")
    for t in tuples:
        if len(t) != size or not all(isinstance(i, int) and not isinstance(i, bool) for i in t):
            raise ExperimentError(f"{key} must be a list of {shape} index lists, got {list(t)}")
        if min(t) < 0:
            raise ExperimentError(
                f"{key}: {list(t)} holds a negative index; indices count from 0 into seeds"
            )
        if len(set(t)) != size:
            raise ExperimentError(
                f"{key}: {list(t)} pairs a model with itself, which measures nothing"
            )
    if len(set(tuples)) != len(tuples):
        raise ExperimentError(f"{key} lists {[list(t) for t in tuples]} with repeats")
    return tuples


def _parse_compare(raw: Any, where: str) -> Compare:
    from lmckit.match import METHODS as MATCHERS
    from lmckit.match import TRANSFORM_METHODS

    block = _table(raw, where, COMPARE_KEYS)
    pairs = _index_tuples(block.get("pairs", "first"), f"{where}.pairs", ("all", "first"), 2)
    methods = _methods(
        block.get("methods", ["none", "wm-fast"]), f"{where}.methods", {"none", *MATCHERS}
    )
    lambdas = _expect(block.get("lambdas", 25), int, f"{where}.lambdas")
    if not 2 <= lambdas <= MAX_LAMBDAS:
        raise ExperimentError(
            f"{where}.lambdas must be in [2, {MAX_LAMBDAS}] (points along each path), got {lambdas}"
        )
    splits = _splits(block.get("splits", {"test": "all"}), f"{where}.splits")
    analyses = tuple(
        _expect(a, str, f"{where}.analyses[]")
        for a in _expect(block.get("analyses", []), list, f"{where}.analyses")
    )
    unknown = sorted(set(analyses) - ANALYSES)
    if unknown:
        raise ExperimentError(
            f"{where}.analyses: unknown analysis {unknown}; choose from {sorted(ANALYSES)}"
        )
    beyond = [m for m in methods if m in TRANSFORM_METHODS]
    if analyses and beyond:
        raise ExperimentError(
            f"{where}: the analyses work on permutations; {beyond} align with maps beyond "
            "permutations (compare their paths only, or move the analyses to another block)"
        )
    return Compare(
        pairs=pairs,
        methods=methods,
        lambdas=lambdas,
        splits=splits,
        calibrated=_expect(block.get("calibrated", False), bool, f"{where}.calibrated"),
        ensemble=_expect(block.get("ensemble", False), bool, f"{where}.ensemble"),
        options=_options(block.get("options", {}), f"{where}.options", methods, MATCHERS),
        analyses=analyses,
        server_examples=_server_examples(block.get("server_examples"), where),
    )


def _server_examples(value: Any, where: str) -> int | None:
    if value is not None and _expect(value, int, f"{where}.server_examples") < 1:
        raise ExperimentError(f"{where}.server_examples must be at least 1, got {value}")
    return value


def _splits(value: Any, where: str) -> dict[str, int | str]:
    splits = _table(value, where, {"train", "test"})
    if not splits:
        raise ExperimentError(f"{where} must name at least one split")
    for split, size in splits.items():
        if size != "all" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ExperimentError(f'{where}.{split} must be "all" or a positive integer')
    return splits


def _parse_triplets(raw: Any, where: str) -> TripletBlock:
    from lmckit.match import METHODS as MATCHERS
    from lmckit.match import TRANSFORM_METHODS

    block = _table(raw, where, TRIPLET_KEYS)
    methods = _methods(
        block.get("methods", ["wm-fast"]), f"{where}.methods", set(MATCHERS) - TRANSFORM_METHODS
    )
    triples = _index_tuples(block.get("triples", "disjoint"), f"{where}.triples", ("disjoint",), 3)
    gamma = _expect(block.get("gamma", 0.3), (int, float), f"{where}.gamma")
    if isinstance(gamma, bool) or not 0 <= gamma < 1:
        raise ExperimentError(f"{where}.gamma must be a number in [0, 1), got {gamma!r}")
    return TripletBlock(
        methods=methods,
        triples=triples,
        gamma=float(gamma),
        splits=_splits(block.get("splits", {"test": "all"}), f"{where}.splits"),
        options=_options(block.get("options", {}), f"{where}.options", methods, MATCHERS),
        landscape=_landscape(block.get("landscape", 0), where),
    )


MAX_LANDSCAPE = 101
"""The finest landscape grid a triplets block may ask for (``101²`` evaluations of its
split per method and triple)."""


def _landscape(value: Any, where: str) -> int:
    resolution = _expect(value, int, f"{where}.landscape")
    if resolution and not 2 <= resolution <= MAX_LANDSCAPE:
        raise ExperimentError(
            f"{where}.landscape is the grid's points per side, from 2 to {MAX_LANDSCAPE} "
            f"(0: no landscape), got {resolution}"
        )
    return resolution


def _parse_paper(raw: Any, where: str) -> dict[str, Any]:
    """A published number the report shows beside ours: the step kind, method (optional),
    metric, value, standard deviation (optional), where it is from, and ``block`` (optional:
    the index of the ``[[compare]]``/``[[merge]]``/``[[triplets]]`` block it belongs to,
    where several blocks run the same method with different options) and ``n`` (optional:
    the number of models a merge's number is for)."""
    entry = _table(raw, where, PAPER_KEYS)
    if "block" in entry and (
        _expect(entry["block"], int, f"{where}.block") < 0 or isinstance(entry["block"], bool)
    ):
        raise ExperimentError(f"{where}.block must be a block index (0, 1, …)")
    for key in ("step", "metric", "source"):
        _expect(entry.get(key), str, f"{where}.{key}")
    if "method" in entry:
        _expect(entry["method"], str, f"{where}.method")
    count = entry.get("n", 2)
    if isinstance(count, bool) or _expect(count, int, f"{where}.n") < 2:
        raise ExperimentError(f"{where}.n must be a number of models (2 or more)")
    if "n" in entry and entry.get("step") != "merge":
        raise ExperimentError(
            f"{where}.n is the number of models of a merge; it does not apply to step "
            f"{entry.get('step')!r}"
        )
    for key in ("value", "std"):
        if key in entry or key == "value":
            _expect(entry.get(key), (int, float), f"{where}.{key}")
    return entry


def _parse_merge(raw: Any, where: str) -> MergeBlock:
    from lmckit.merge import METHODS as MERGERS

    block = _table(raw, where, MERGE_KEYS)
    methods = _methods(block.get("methods"), f"{where}.methods", set(MERGERS))
    ns = tuple(
        n if n == PARTS else _expect(n, int, f'{where}.n[] (a count or "parts")')
        for n in _expect(block.get("n"), list, f"{where}.n")
    )
    if not ns or min((n for n in ns if n != PARTS), default=2) < 2:
        raise ExperimentError(f'{where}.n must list model counts of at least 2 (or "parts")')
    _distinct(ns, f"{where}.n")
    server = _server_examples(block.get("server_examples"), where)
    options = _options(block.get("options", {}), f"{where}.options", methods, MERGERS)
    train = _expect(block.get("train_metrics", False), bool, f"{where}.train_metrics")
    sets = _expect(block.get("seed_sets", 1), int, f"{where}.seed_sets")
    if sets < 1:
        raise ExperimentError(f"{where}.seed_sets must be at least 1, got {sets}")
    probes = _expect(block.get("sharpness_probes", 0), int, f"{where}.sharpness_probes")
    if probes and probes < 2:
        raise ExperimentError(
            f"{where}.sharpness_probes must be at least 2 (a standard error needs two "
            f"probes; 0 measures no sharpness), got {probes}"
        )
    return MergeBlock(methods, ns, options, server, train, sets, probes)


def _override(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``raw[a][b]...`` for ``dotted = "a.b..."``; a number picks a block of a list
    (``compare.0.lambdas``). A grid key such as ``grid."model.hidden"`` is written
    ``grid.model.hidden``: below ``grid`` the rest of the path is one key."""
    parts = dotted.split(".")
    if not all(parts):
        raise ExperimentError(f"override {dotted!r} has an empty part")
    if parts[0] in ("grid",) and len(parts) > 2:
        parts = [parts[0], ".".join(parts[1:])]
    target: Any = raw
    for i, part in enumerate(parts[:-1]):
        where = ".".join(parts[: i + 1])
        if isinstance(target, list):
            if not part.isdigit():
                raise ExperimentError(
                    f"override {dotted!r}: {'.'.join(parts[:i])} is a list of "
                    f"{len(target)} block(s); name one by its index, e.g. "
                    f"{'.'.join(parts[:i])}.0.{'.'.join(parts[i:])}"
                )
            if int(part) >= len(target):
                raise ExperimentError(
                    f"override {dotted!r}: {'.'.join(parts[:i])} is a list of "
                    f"{len(target)} block(s)"
                    + (f" (indices 0..{len(target) - 1})" if target else "")
                    + f"; there is no block {part}"
                )
            target = target[int(part)]
        elif isinstance(target, dict):
            target = target.setdefault(part, {})
        else:
            raise ExperimentError(f"override {dotted!r}: {where} is a value, not a table")
        if isinstance(target, list) and i == len(parts) - 2:
            raise ExperimentError(
                f"override {dotted!r}: {where} is a list of blocks; name one by its index, "
                f"e.g. {where}.0.{parts[-1]}"
            )
    if not isinstance(target, dict):
        raise ExperimentError(f"override {dotted!r}: {'.'.join(parts[:-1])} is not a table")
    target[parts[-1]] = value


MAX_CELLS = 10_000
MAX_JOBS = 200_000
MAX_LAMBDAS = 10_000  # points along one path: the papers use 25, a fine curve a few hundred


def _check_size(grid, variants, seeds, compare, merge, triplets) -> None:
    """Count the cells and jobs before expanding anything: a grid or seed list so large
    that expanding it would take minutes or all the memory is refused with its count."""
    cells = math.prod(len(v) for v in grid.values()) * max(1, len(variants))
    if cells > MAX_CELLS:
        sizes = " × ".join(str(len(v)) for v in grid.values())
        raise ExperimentError(
            f"the grid has {cells:,} cells ({sizes}"
            + (f" × {len(variants)} variants" if variants else "")
            + f"); lmckit runs at most {MAX_CELLS:,} per experiment — split it into files"
        )
    n = len(seeds)
    per_cell = n
    for block in compare:
        pairs = n * (n - 1) // 2 if block.pairs == "all" else len(block.pair_list(n))
        per_cell += pairs * len(block.methods) * (2 + bool(block.analyses))
    for block in triplets:
        per_cell += (
            (n // 3 if block.triples == "disjoint" else len(block.triples)) * len(block.methods) * 3
        )
    for block in merge:
        per_cell += len(block.methods) * len(block.n) * block.seed_sets
    if cells * per_cell > MAX_JOBS:
        raise ExperimentError(
            f"the experiment expands into about {cells * per_cell:,} jobs ({cells:,} cells × "
            f"{per_cell:,}; {n} seeds); lmckit runs at most {MAX_JOBS:,} per experiment — "
            "use fewer seeds or pairs, or split it into files"
        )


def parse_experiment(
    raw: Mapping[str, Any], text: str = "", overrides: Mapping[str, Any] | None = None
) -> Experiment:
    """Validate a parsed TOML document (``overrides``: dotted keys replacing values, e.g.
    ``{"data.dataset": "digits", "train.epochs": 2}``)."""
    raw = copy.deepcopy(dict(raw))
    for dotted, value in (overrides or {}).items():
        _override(raw, dotted, value)
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ExperimentError(f"unknown top-level key(s) {unknown}; known: {sorted(TOP_KEYS)}")
    name = _label(raw.get("name", DEFAULT_NAME), "name")
    seeds = tuple(
        _expect(s, int, "seeds[]") for s in _expect(raw.get("seeds", [0, 1]), list, "seeds")
    )
    if len(seeds) < 1 or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ExperimentError(f"seeds must be distinct non-negative integers, got {list(seeds)}")
    threads = raw.get("threads")
    if threads is not None and not 1 <= _expect(threads, int, "threads") <= 4096:
        raise ExperimentError(f"threads must be at least 1 (and at most 4096), got {threads}")
    data = _table(raw.get("data", {}), "data", {"dataset"})
    dataset = _expect(data.get("dataset"), str, "data.dataset")
    model = _table(raw.get("model", {}), "model")
    _expect(model.get("name"), str, "model.name")
    train = _table(raw.get("train", {}), "train")
    grid = {}
    for key, values in _table(raw.get("grid", {}), "grid").items():
        section = key.split(".", 1)[0]
        if "." not in key or section not in ("model", "train"):
            raise ExperimentError(f'grid key {key!r} must be "model.<option>" or "train.<option>"')
        if not _expect(values, list, f"grid.{key}"):
            raise ExperimentError(f"grid.{key} must list at least one value")
        _distinct(values, f"grid.{key}")
        grid[key] = tuple(values)
    variants = tuple(
        _parse_variant(entry, f"variants[{i}]")
        for i, entry in enumerate(_expect(raw.get("variants", []), list, "variants"))
    )
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise ExperimentError(f"variants need distinct names, got {names}")
    compare = tuple(
        _parse_compare(block, f"compare[{i}]")
        for i, block in enumerate(_expect(raw.get("compare", []), list, "compare"))
    )
    merge = tuple(
        _parse_merge(block, f"merge[{i}]")
        for i, block in enumerate(_expect(raw.get("merge", []), list, "merge"))
    )
    triplets = tuple(
        _parse_triplets(block, f"triplets[{i}]")
        for i, block in enumerate(_expect(raw.get("triplets", []), list, "triplets"))
    )
    _check_size(grid, variants, seeds, compare, merge, triplets)
    for i, block in enumerate(triplets):
        chosen = block.triple_list(len(seeds))
        if not chosen:
            raise ExperimentError(f"triplets[{i}] needs at least three seeds")
        if max(max(t) for t in chosen) >= len(seeds):
            raise ExperimentError(f"triplets[{i}].triples index beyond the {len(seeds)} seeds")
    for i, block in enumerate(compare):
        if not block.pair_list(len(seeds)):
            raise ExperimentError(
                f"compare[{i}].pairs = {block.pairs!r} gives no pair of the {len(seeds)} seed(s): "
                "a pair needs at least two seeds"
            )
        top = max((max(p) for p in block.pair_list(len(seeds))), default=0)
        if top >= len(seeds):
            raise ExperimentError(f"compare[{i}].pairs index {top} but only {len(seeds)} seeds")
    for i, block in enumerate(merge):
        counts = [n for n in block.n if n != PARTS]
        if counts and block.seed_sets * max(counts) > len(seeds):
            sets = f" in each of {block.seed_sets} seed sets" if block.seed_sets > 1 else ""
            raise ExperimentError(
                f"merge[{i}].n asks for {max(counts)} models{sets}; {len(seeds)} seeds"
                + (f" (needs {block.seed_sets * max(counts)})" if sets else "")
            )
    experiment = Experiment(
        name=name,
        description=_expect(raw.get("description", ""), str, "description"),
        expected_runtime=_expect(raw.get("expected_runtime", ""), str, "expected_runtime"),
        seeds=seeds,
        threads=threads,
        dataset=dataset,
        model=model,
        train=train,
        grid=grid,
        variants=variants,
        compare=compare,
        merge=merge,
        triplets=triplets,
        spectra=_expect(raw.get("spectra", False), bool, "spectra"),
        paper=tuple(
            _parse_paper(entry, f"paper[{i}]")
            for i, entry in enumerate(_expect(raw.get("paper", []), list, "paper"))
        ),
        text=text,
        overrides=dict(overrides or {}),
        document=raw,
    )
    _check_configurations(experiment)
    return experiment


MODEL_KEYS = {"name", "width_multiplier", "hidden", "norm", "skip", "class", "args"}


def _check_configurations(experiment: Experiment) -> None:
    """Every cell names a zoo model with known options and valid training options (the
    model itself is built once the dataset is known: :func:`model_configs`)."""
    from lmckit.errors import LmcError, ParamsError
    from lmckit.merge import METHODS as MERGERS
    from lmckit.train import TrainConfig
    from lmckit.workflows.training import model_name_key

    for cell in experiment.cells():
        where = f"cell {cell['values']}" if cell["values"] else "model/train"
        unknown = sorted(set(cell["model"]) - MODEL_KEYS)
        if unknown:
            raise ExperimentError(
                f"{where}: unknown model option(s) {unknown}; known: {sorted(MODEL_KEYS)}"
            )
        if "part" in (cell["train"].get("split") or {}):
            raise ExperimentError(
                f"{where}: train.split takes no part — the model of the k-th seed trains on "
                "part k (modulo the number of parts)"
            )
        try:
            model_name_key(cell["model"]["name"])
            config = TrainConfig.paper_defaults(
                cell["model"]["name"], experiment.dataset, **train_options(cell["train"], 0)
            )
        except (LmcError, TypeError) as exc:
            raise ExperimentError(f"{where}: {exc}") from None
        parts = config.split.parts_count if config.split is not None else None
        for i, block in enumerate(experiment.merge):
            try:
                counts = block.counts(parts)
            except ExperimentError as exc:
                raise ExperimentError(f"{where}: merge[{i}]: {exc}") from None
            if block.seed_sets * max(counts) > len(experiment.seeds):
                raise ExperimentError(
                    f"{where}: merge[{i}] asks for {max(counts)} models (one per part)"
                    + (f" in each of {block.seed_sets} seed sets" if block.seed_sets > 1 else "")
                    + f"; {len(experiment.seeds)} seeds"
                )
            for method, options in block.options.items():
                for n in counts:
                    try:
                        MERGERS[method].check_count_options(
                            options, n, where=f"{where}: merge[{i}].options.{method} (n = {n}): "
                        )
                    except ParamsError as exc:
                        raise ExperimentError(str(exc)) from None


def train_options(train: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A cell's training options for the model of its ``index``-th seed: with a
    ``train.split`` table, that model trains on part ``index`` modulo the number of parts
    (the class-imbalanced halves alternate a, b, a, …; the k-th Dirichlet client is the
    k-th seed's model). With ``per_model = true`` in the table every model cuts its own
    partition (seed ``seed + index``): each its own random half (Git Re-Basin App. A.6)."""
    from lmckit.data.splits import Split
    from lmckit.errors import DataError

    options = dict(train)
    if "split" not in options:
        return options
    table = dict(options["split"]) if isinstance(options["split"], Mapping) else None
    if table is None:
        raise ExperimentError(f"train.split must be a table, got {options['split']!r}")
    per_model = table.pop("per_model", False)
    if not isinstance(per_model, bool):
        raise ExperimentError(f"train.split.per_model must be true or false, got {per_model!r}")
    try:
        parts = Split.from_dict({**table, "part": 0}).parts_count
    except DataError as exc:
        raise ExperimentError(f"train.split: {exc}") from None
    options["split"] = {**table, "part": index % parts}
    if per_model:
        options["split"]["seed"] = int(table.get("seed", 0)) + index
    return options


def model_configs(experiment: Experiment, data_for) -> list[tuple[str, dict[str, Any]]]:
    """``(model name, zoo configuration)`` of every cell, fitted to the dataset
    (``data_for(model name)`` gives it, shaped for that model) and built once on the meta
    device so that a bad option fails before any job runs."""
    import torch

    from lmckit.errors import LmcError
    from lmckit.models import build_model
    from lmckit.workflows.training import model_config_for

    out = []
    for cell in experiment.cells():
        options = dict(cell["model"])
        name = options.pop("name")
        norm = options.pop("norm", "default")
        try:
            config = model_config_for(
                name, data_for(name), norm=None if norm == "none" else norm, **options
            )
            with torch.device("meta"):
                build_model(name, **config)
        except (LmcError, TypeError) as exc:
            where = f"cell {cell['values']}" if cell["values"] else "model"
            source = f"{experiment.source}: " if experiment.source else ""
            raise ExperimentError(f"{source}{where}: {exc}") from None
        out.append((name, config))
    return out


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` overrides (``lmckit run --set``): each value read as TOML (numbers,
    lists, strings …; a bare word is a string), each key once.

    Raises:
        ExperimentError: a pair without ``=`` or a key, a key given twice (the first would
            be dropped without a word), or a key inside another one also given
            (``train`` and ``train.epochs``).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ExperimentError(f"--set needs key=value, got {pair!r}")
        if key in out:
            raise ExperimentError(
                f"--set {key} is given twice ({out[key]!r}, then {text.strip()!r}); give it once"
            )
        inside = next((k for k in out if key.startswith(k + ".") or k.startswith(key + ".")), None)
        if inside is not None:
            raise ExperimentError(f"--set {key} and --set {inside}: one lies inside the other")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text  # a bare word: a string
    return out


def load_experiment(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Experiment:
    """Read and validate an experiment file.

    Raises:
        ExperimentError: unreadable TOML, or a key that is missing, unknown or of the wrong
            type (the message names it and says what was expected).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is no error
        raw = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ExperimentError(
            f"{path} is not UTF-8 text (TOML files are): byte {exc.start} is {byte:#x}"
        ) from None
    except OSError as exc:
        raise ExperimentError(
            f"cannot read experiment file {path}: {exc.strerror or exc}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(f"{path} is not valid TOML: {exc}") from None
    if "name" not in raw and "name" not in (overrides or {}):
        raise ExperimentError(
            f'{path} has no name: add name = "..." at its top (a run folder, its report '
            "and the reuse of its results go by it)"
        )
    try:
        return replace(parse_experiment(raw, text, overrides), source=path)
    except ExperimentError as exc:
        raise ExperimentError(f"{path}: {exc}") from None
