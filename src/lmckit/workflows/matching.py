"""Matching two checkpoints by method name, permutation files, and the checks that come
before any expensive work (same architecture, data that fits the checkpoint)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset
from lmckit.errors import DataError, LmcError, ParamsError, PermutationError, UsageError
from lmckit.files import atomic_write_json, refuse_special
from lmckit.functional import forward, module_mode, per_token
from lmckit.match import METHODS, TRANSFORM_METHODS, MatchResult
from lmckit.params import check_products_finite
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback
from lmckit.store import Artifact, Store, content_hash, make_key
from lmckit.transform import Transform

PERMUTATION_FORMAT = "lmckit-permutation"


def check_same_architecture(a: Checkpoint, b: Checkpoint) -> None:
    """Raise :class:`UsageError` unless both checkpoints record the same model config."""
    if a.meta["model"] != b.meta["model"]:
        raise UsageError(
            f"checkpoints have different architectures: {a.path} is {a.meta['model']}, "
            f"{b.path} is {b.meta['model']}"
        )


def check_distinct(ckpts: Sequence[Checkpoint]) -> None:
    """Raise :class:`UsageError` if one checkpoint is given twice — by path, through a
    symbolic or hard link, or as a copy with identical weights: comparing, matching or
    merging a model with itself measures nothing."""
    for i, c in enumerate(ckpts):
        for other in ckpts[:i]:
            if c.weights_sha256 and c.weights_sha256 == other.weights_sha256:
                if c.path.resolve() == other.path.resolve():
                    how = f"{c.path} is given twice"
                else:
                    how = f"{c.path} is the same file as {other.path}, or a copy of it"
                raise UsageError(
                    f"checkpoint {how} (identical weights); a model compared with itself "
                    "measures nothing"
                )
            if c.params.keys() == other.params.keys() and all(
                torch.equal(c.params[k], other.params[k]) for k in c.params
            ):
                raise UsageError(
                    f"checkpoints {other.path} and {c.path} hold identical weights; a model "
                    "compared with itself measures nothing"
                )


def check_data_fits(ckpt: Checkpoint, data: Dataset) -> None:
    """Raise :class:`UsageError` unless ``data``'s inputs run through the checkpoint's model
    and its classes match the model's outputs (one forward pass on two examples)."""
    model = ckpt.model
    what = (
        f"dataset {data.name} (inputs {data.input_shape}, {data.num_classes} classes) does "
        f"not fit {ckpt.path.name} ({ckpt.meta['model'].get('name')})"
    )
    device = next(iter(ckpt.params.values())).device
    try:
        with torch.no_grad(), module_mode(model, False):
            out = forward(model, ckpt.params, data.test_x[:2].to(device))
    except DataError as exc:
        raise UsageError(f"{what}: {exc}") from None
    out, targets = per_token(out, data.test_y[:2].to(out.device))
    if out.ndim != 2 or out.shape[1] != data.num_classes or len(out) != len(targets):
        raise UsageError(f"{what}: the model has {tuple(out.shape[1:])} outputs")


def match_checkpoints(
    a: Checkpoint,
    b: Checkpoint,
    method: str,
    data: Dataset | None = None,
    *,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    example_inputs: Any = None,
    example_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> MatchResult:
    """Permute checkpoint B onto A with the matcher ``method`` of :data:`lmckit.match.METHODS`.

    ``options`` are the matcher's keyword options (``epochs``, ``lr``, ``restarts`` ...);
    ``None`` values mean "the method's default". An option the matcher does not take, or a
    value of the wrong type or range, is a :class:`UsageError` naming it. Methods of
    :data:`~lmckit.match.TRANSFORM_METHODS` read the model's graph on ``example_inputs``
    (default: the data's first batch) and return a transform of the norm-folded models.
    """
    if method not in METHODS:
        raise UsageError(f"unknown matching method {method!r}; choose from {sorted(METHODS)}")
    matcher = METHODS[method]
    check_same_architecture(a, b)
    check_products_finite(a.params, b.params, (str(a.path), str(b.path)))
    if matcher.needs_data and data is None:
        raise UsageError(f"method {method!r} needs data")
    kwargs = {k: v for k, v in options.items() if v is not None}
    try:
        kwargs = matcher.check_options(kwargs)
    except ParamsError as exc:
        raise UsageError(str(exc)) from None
    if method in TRANSFORM_METHODS and example_inputs is not None:
        kwargs["example_inputs"] = example_inputs
        kwargs["example_kwargs"] = example_kwargs
    try:
        return matcher(
            a.spec, a.params, b.params, model=a.model, seed=seed, progress=progress,
            data=data if matcher.needs_data or method in TRANSFORM_METHODS else None,
            **kwargs,
        )  # fmt: skip
    except ParamsError as exc:
        if method in TRANSFORM_METHODS and "beyond permutations" in str(exc):
            raise UsageError(str(exc)) from None
        raise


TRANSFORM_FORMAT = "lmckit-transform"


def save_transform(path: str | Path, result: MatchResult, **extra: Any) -> None:
    """Write a transform file: the kinds and folds of the spec (what the maps need: fold
    the norms, then apply), each group's index vector or matrix, and the match's summary."""
    spec = result.alignment.spec
    atomic_write_json(
        Path(path),
        {
            "format": TRANSFORM_FORMAT,
            "method": result.method,
            "groups": dict(spec.groups),
            "kinds": dict(spec.kinds),
            "folds": {k: [list(r) for r in v] for k, v in spec.folds.items()},
            "norm_biases": dict(spec.norm_biases),
            "duals": sorted(list(d) for d in spec.duals),
            "rotary": {g: list(v) for g, v in spec.rotary.items()},
            "maps": result.alignment.to_dict(),
            "distance_before": result.distance_before,
            "distance_after": result.distance_after,
            "seconds": result.seconds,
            "iterations": result.iterations,
            "history": list(result.history),
            "stages": list(result.info.get("stages", [])),
            **extra,
        },
    )


def load_transform(path: str | Path, spec: PermutationSpec) -> Transform:
    """Read a transform file written by :func:`save_transform` for a model of ``spec`` (its
    permutation spec): the kinds, folds, duals and rotary layouts it records are laid over
    ``spec`` and the maps validated against them.

    Raises:
        PermutationError: unreadable file, not a transform file, made for other groups, or
            maps that are not of their groups' kinds; the message names the file.
    """
    from dataclasses import replace

    from lmckit.errors import SpecError

    refuse_special(path, "transform file", PermutationError)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PermutationError(f"cannot read transform file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != TRANSFORM_FORMAT:
        raise PermutationError(
            f"{path} is not a transform file (lmckit match --symmetries orth|full writes one)"
        )
    if data.get("groups") != dict(spec.groups):
        raise PermutationError(
            f"{path} was made for groups {data.get('groups')}, this model has {dict(spec.groups)}"
        )
    try:
        full = replace(
            spec,
            kinds=data.get("kinds", {}),
            folds={k: tuple(map(tuple, v)) for k, v in data.get("folds", {}).items()},
            norm_biases=data.get("norm_biases", {}),
            duals=frozenset(tuple(d) for d in data.get("duals", [])),
            rotary={g: tuple(v) for g, v in data.get("rotary", {}).items()},
        )
        return Transform.from_dict(data.get("maps"), full)
    except (SpecError, PermutationError, TypeError, ValueError) as exc:
        raise PermutationError(f"{path}: {exc}") from None


def save_match(path: str | Path, result: MatchResult, **extra: Any) -> None:
    """Write a permutation file: the permutation, its group sizes and the match's summary."""
    atomic_write_json(
        Path(path),
        {
            "format": PERMUTATION_FORMAT,
            "method": result.method,
            "groups": dict(result.alignment.spec.groups),
            "perm": result.alignment.to_dict(),
            "distance_before": result.distance_before,
            "distance_after": result.distance_after,
            "seconds": result.seconds,
            "iterations": result.iterations,
            "history": list(result.history),
            **extra,
        },
    )


def pair_record(a: Checkpoint, b: Checkpoint) -> dict[str, str]:
    """What a permutation or transform file records of the pair it aligns: both paths and,
    where lmckit read them, both content hashes (:attr:`Checkpoint.content_hash`) — so the
    file is never applied to another pair without a word (:func:`check_pair_record`)."""
    record = {"a": str(a.path), "b": str(b.path)}
    for role, ckpt in (("a", a), ("b", b)):
        with contextlib.suppress(LmcError):  # a checkpoint lmckit's loader did not read
            record[f"{role}_sha256"] = ckpt.content_hash
    return record


def check_pair_record(path: str | Path, a: Checkpoint, b: Checkpoint) -> None:
    """Refuse a permutation or transform file that records another pair than ``a`` and
    ``b``: its recorded content hash of A or B differs from theirs (a file without
    hashes — written by another tool, or an older lmckit — is taken as it is).

    Raises:
        UsageError: naming the file, the recorded pair and which model differs.
    """
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
    except (OSError, UnicodeDecodeError, ValueError):
        return  # the loader says what is wrong with it
    if not isinstance(data, dict):
        return
    mine = pair_record(a, b)
    differ = [
        f"{role.upper()} (recorded {data.get(role)!r}, given {mine[role]!r})"
        for role in ("a", "b")
        if isinstance(data.get(f"{role}_sha256"), str)
        and f"{role}_sha256" in mine
        and data[f"{role}_sha256"] != mine[f"{role}_sha256"]
    ]
    if differ:
        raise UsageError(
            f"{path} aligns another pair: its {' and '.join(differ)} hold other weights; "
            "match this pair (lmckit match) or give the file its own pair"
        )


def load_permutation(path: str | Path, spec: PermutationSpec) -> Permutation:
    """Read a permutation file written by :func:`save_match` (or a bare ``{group: [indices]}``
    mapping), validated against ``spec``.

    Raises:
        PermutationError: unreadable file, wrong structure or types, or groups that are not
            the spec's; the message names the file.
    """
    refuse_special(path, "permutation file", PermutationError)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PermutationError(f"cannot read permutation file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise PermutationError(
            f"{path}: expected a JSON object (a permutation file), found {type(data).__name__}"
        )
    if data.get("format") == TRANSFORM_FORMAT:
        raise PermutationError(
            f"{path} holds orthogonal maps (lmckit match --symmetries orth), not a permutation; "
            "apply it with lmckit.transform (fold_norms, then Transform.apply)"
        )
    perm = data.get("perm") if data.get("format") == PERMUTATION_FORMAT else data
    groups = data.get("groups") if data.get("format") == PERMUTATION_FORMAT else None
    if groups is not None and (not isinstance(groups, dict) or dict(groups) != dict(spec.groups)):
        raise PermutationError(
            f"{path} was made for groups {groups}, this model has {dict(spec.groups)}"
        )
    if not isinstance(perm, dict) or not all(
        isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        for v in perm.values()
    ):
        raise PermutationError(f"{path}: 'perm' must map each group to a list of integer indices")
    try:
        return Permutation.from_dict(perm, spec)
    except PermutationError as exc:
        raise PermutationError(f"{path}: {exc}") from None


def stored_match(
    store: Store,
    a: Checkpoint,
    b: Checkpoint,
    method: str,
    data: Dataset | None = None,
    *,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    **options: Any,
) -> tuple[Permutation | Transform, Artifact, bool]:
    """:func:`match_checkpoints` through the result store: ``(permutation or transform,
    artifact, reused)``. The key holds the method, its options and seed, both checkpoints' weight
    hashes, the digest of A's spec and — for methods that look at data — the dataset's
    fingerprint."""
    key, document = match_key(
        method, seed, options, a.content_hash, b.content_hash, data, spec_digest(a.spec)
    )
    used = document["settings"]["options"]

    def write(folder: Path) -> tuple[str, dict[str, Any]]:
        result = match_checkpoints(a, b, method, data, seed=seed, progress=progress, **used)
        if isinstance(result.alignment, Transform):
            save_transform(folder / "perm.json", result)
        else:
            save_match(folder / "perm.json", result)
        record = {
            "method": result.method,
            "seconds": result.seconds,
            "iterations": result.iterations,
            "distance_before": result.distance_before,
            "distance_after": result.distance_after,
        }
        return permutation_content(result.alignment), record

    artifact, reused = store.get_or_put("permutation", key, document, write)
    return load_alignment(artifact.file("perm.json"), a.spec), artifact, reused


def permutation_content(perm: Permutation | Transform) -> str:
    """The content hash downstream artifacts key on: ``"identity"`` for the identity (so a
    naive path needs no permutation to be keyed), else the hash of its index vectors (of a
    transform: its maps with the kinds, folds, duals and rotary layouts they act by)."""
    if isinstance(perm, Transform):
        spec = perm.spec
        return content_hash(
            {
                "maps": perm.to_dict(),
                "kinds": dict(spec.kinds),
                "folds": {k: [list(r) for r in v] for k, v in spec.folds.items()},
                "norm_biases": dict(spec.norm_biases),
                "duals": sorted(list(d) for d in spec.duals),
                **({"rotary": {g: list(v) for g, v in spec.rotary.items()}} if spec.rotary else {}),
            }
        )
    return "identity" if perm.is_identity() else content_hash(perm.to_dict())


def load_alignment(path: str | Path, spec: PermutationSpec) -> Permutation | Transform:
    """A permutation file or a transform file, whichever ``path`` holds (validated against
    ``spec``)."""
    refuse_special(path, "permutation file", PermutationError)
    try:
        head = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PermutationError(f"cannot read permutation file {path}: {exc}") from None
    if isinstance(head, dict) and head.get("format") == TRANSFORM_FORMAT:
        return load_transform(path, spec)
    return load_permutation(path, spec)


def spec_digest(spec: PermutationSpec) -> str:
    """The content hash of a spec: part of every stored permutation's key, so a spec that
    changes — a traced model whose rules grew, a zoo spec fixed — never reuses a
    permutation found over the old one."""
    return content_hash(spec.to_dict())


def match_key(
    method: str,
    seed: int,
    options: Mapping[str, Any],
    a_content: str,
    b_content: str,
    data: Dataset | None,
    spec: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(key, document)`` of the permutation ``method`` finds for B onto A: the method,
    the options it takes (others are dropped), the seed, both checkpoints' weight hashes,
    the spec's digest (:func:`spec_digest`) and — for methods that look at data — the
    dataset's fingerprint."""
    if method not in METHODS:
        raise UsageError(f"unknown matching method {method!r}; choose from {sorted(METHODS)}")
    matcher = METHODS[method]
    accepted = set(matcher.options())
    used = {k: v for k, v in options.items() if k in accepted and v is not None}
    settings: dict[str, Any] = {"method": method, "seed": seed, "options": used}
    if spec is not None:
        settings["spec"] = spec
    return make_key(
        "permutation",
        settings,
        {"a": a_content, "b": b_content},
        data.fingerprint if matcher.needs_data and data is not None else None,
    )


def stored_matches(
    store: Store,
    a: Checkpoint,
    b: Checkpoint,
    methods: Sequence[str],
    data: Dataset | None,
    out: Path,
    *,
    seed: int = 0,
    naive: str = "none",
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
) -> dict[str, Permutation | Transform]:
    """``{label: permutation or transform}`` for each of ``methods`` through the store
    (``naive`` is the identity, labelled ``"naive"``), each copied to
    ``out/perm-<method>.json`` (with the paths of A and B) and logged."""
    perms: dict[str, Permutation | Transform] = {}
    for method in methods:
        if method == naive:
            perms["naive"] = Permutation.identity(a.spec)
            continue
        perm, artifact, reused = stored_match(
            store,
            a,
            b,
            method,
            data,
            seed=seed,
            progress=progress(f"match {method}") if progress else None,
        )
        # the copy names the pair it aligns (as lmckit match's file does); the stored one is
        # keyed by the weights alone, so it names none
        found = json.loads(artifact.file("perm.json").read_text())
        atomic_write_json(out / f"perm-{method}.json", {**found, **pair_record(a, b)})
        r = artifact.record
        log(
            f"{method}: L2 {r['distance_before']:.3f} -> {r['distance_after']:.3f} in "
            f"{r['seconds']:.2f} s{' (stored result reused)' if reused else ''}"
        )
        perms[method] = perm
    return perms


@contextlib.contextmanager
def locked_match_outputs(
    out: Path, aligned: Path | None, a: Checkpoint, b: Checkpoint
) -> Iterator[None]:
    """Hold the folder of the match file ``out`` (and the model folder ``aligned``, when
    given) for one writer, refusing outputs that are ``a``'s or ``b``'s files — before any
    lock file is made and again once the folders are held."""
    from lmckit.files import check_not_inputs, check_outputs, locked_output
    from lmckit.model_folder import output_names

    with contextlib.ExitStack() as stack:
        stack.enter_context(locked_output(out.parent, "--out's folder", guard=False))
        if aligned is not None:
            outputs = [aligned / n for n in output_names(b.layout)]
            check_not_inputs(outputs, [*a.files, *b.files], "--aligned")
            stack.enter_context(locked_output(aligned, "--aligned"))
            check_outputs(outputs, [*a.files, *b.files], "--aligned")
        yield


def write_aligned(
    folder: Path,
    a: Checkpoint,
    b: Checkpoint,
    result: MatchResult,
    *,
    log: Callable[[str], None] | None = None,
) -> None:
    """Write model folder B moved onto A by ``result`` into ``folder``, in B's layout (its
    architecture, tensor names and sharding): a permutation moves B's weights as they are;
    a transform moves the norm-folded weights and puts A's norm gains back (the same
    function as B; interpolating it with A is the folded path)."""
    from lmckit.model_folder import provenance, write_model_folder

    about: dict[str, Any] = {"method": result.method, "inputs": provenance({"a": a, "b": b})}
    if isinstance(result.alignment, Transform):
        from lmckit.transform import align, unfold_norms

        spec = result.alignment.spec
        gains = {k: a.params[k] for k in spec.folds}
        moved = unfold_norms(spec, align(result.alignment, b.params), gains)
        about["layout"] = (
            "B moved by the transform, with A's norm gains (the same function as B; "
            "interpolating it with A is the folded path)"
        )
        write_model_folder(folder, b, params=moved, about=about, log=log)
        return
    about["l2_distance"] = {"before": result.distance_before, "after": result.distance_after}
    write_model_folder(folder, b, perm=result.alignment, about=about, log=log)


def match_to_files(
    a: Checkpoint,
    b: Checkpoint,
    method: str,
    data: Dataset | None,
    out: Path,
    *,
    aligned: Path | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> MatchResult:
    """``lmckit match``'s work: :func:`match_checkpoints` (``options`` are its keywords),
    the result written to ``out`` — a permutation file, or a transform file for the methods
    of :data:`~lmckit.match.TRANSFORM_METHODS` — recording both inputs' digests, and with
    ``aligned`` B moved onto A as a model folder (:func:`write_aligned`); the outputs'
    folders are held for one writer throughout (:func:`locked_match_outputs`). An ``out``
    that is one of the inputs' files, or an existing file lmckit did not write, is refused
    before any work (:class:`~lmckit.errors.OutputPathError`)."""
    from lmckit.files import check_output_file

    out = Path(out)
    file_format = TRANSFORM_FORMAT if method in TRANSFORM_METHODS else PERMUTATION_FORMAT
    inputs = [*a.files, *b.files]
    check_output_file(out, "--out", inputs=inputs, file_format=file_format)
    if aligned is not None:
        if not b.folder:
            raise UsageError("--aligned writes a model folder; B is not one")
        from lmckit.model_folder import check_writable

        check_writable(b)  # before the match: its result is written in B's layout
    with locked_match_outputs(out, aligned, a, b):
        check_output_file(out, "--out", inputs=inputs, file_format=file_format)
        result = match_checkpoints(a, b, method, data, **options)
        save = save_transform if method in TRANSFORM_METHODS else save_match
        save(out, result, **pair_record(a, b))
        if aligned is not None:
            write_aligned(aligned, a, b, result, log=log)
    return result
