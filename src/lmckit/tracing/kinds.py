"""Which groups of a traced spec admit orthogonal maps, read off the model's graph and
checked numerically.

A permutation commutes with every elementwise operation; a rotation commutes only with
linear ones. So a group of the permutation spec is orthogonal when nothing elementwise
acts on it between the layers that write into it and those that read it — true of a
transformer's residual stream (once each norm's gain is folded into the norm's readers)
and of each attention head's query/key and value/output dimensions; false of an MLP's
hidden units (its activation) and of head dimensions that rotary embeddings rotate.

:func:`symmetry_kinds` finds the norms on the exported graph — ``layer_norm`` (mean-free:
the map must fix the ones vector), ``rms_norm``, or a 1-D parameter multiplying a tensor
(an RMSNorm written by hand) — and the linear maps that read each norm's output; a norm
whose output reaches anything else (a residual add: post-LN) cannot be folded, and its
group stays a permutation group. Every other condition is left to the check: with the
gains folded, a random orthogonal map of the group alone (float64, eval mode, dropout off)
must leave the model's outputs unchanged, or the group stays a permutation group and the
report says why. A map the graph reading got wrong can shrink the symmetries found,
never make them wrong.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, fx, nn

from lmckit.budget import check_max_memory
from lmckit.errors import SpecError
from lmckit.kinds import KINDS, GroupFacts, tried_kinds
from lmckit.options import checked
from lmckit.perm import PermutationSpec, axis_groups
from lmckit.tracing.trace import (
    TwinRunError,
    batched_experts,
    export_model,
    logits_if_any,
    output_tolerance,
    outputs_close,
    run_outputs,
    to_double,
    vary_constants,
)
from lmckit.transform import (
    apply_group_map,
    fold_norms,
    random_group_map,
    random_map,
)

__all__ = ["SymmetryReport", "symmetry_kinds"]

aten = torch.ops.aten

# ops a norm's output may pass through on its way to a reader without changing what a
# fold means: casts, copies, reshapes that keep the last (feature) axis, dropout
_PASS_THROUGH = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.clone.default,
    aten.alias.default,
    aten.contiguous.default,
    aten.detach.default,
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    aten.type_as.default,
    aten.dropout.default,
}
_LAYER_NORMS = {aten.layer_norm.default, aten.native_layer_norm.default}
_RMS_NORMS = {getattr(aten, "rms_norm", None) and aten.rms_norm.default} - {None}


@dataclass(frozen=True)
class SymmetryReport:
    """What :func:`symmetry_kinds` found.

    Attributes:
        spec: the input spec with ``kinds`` (orthogonal groups) and ``folds`` (the gains of
            those groups' norms and their readers) set.
        reasons: group -> why it stays a permutation group (groups of size 1 are left out).
        norms: gain name -> ``"layer_norm"`` or ``"rms_norm"``.
        seconds: time taken.
        precision: the dtype the check computed in (``"float64"`` or ``"float32"``).
    """

    spec: PermutationSpec
    reasons: Mapping[str, str] = field(default_factory=dict)
    norms: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    precision: str = "float64"

    def counts(self) -> dict[str, int]:
        """Groups per kind."""
        return self.spec.kind_counts()

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.counts().items())
        lines = [f"symmetries: {counts} ({self.seconds:.1f} s)"]
        for g in self.spec.groups:
            kind = self.spec.kind(g)
            if KINDS[kind].matrix:
                lines.append(f"  {g} ({self.spec.groups[g]}): {kind}")
        for g, why in self.reasons.items():
            lines.append(f"  {g} ({self.spec.groups[g]}): permutation — {why}")
        return "\n".join(lines)


@checked
def symmetry_kinds(
    model: nn.Module,
    example_inputs: Tensor | Sequence[Any],
    spec: PermutationSpec,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    outputs: Callable[[Any], Any] | None = None,
    seed: int = 0,
    precision: str | None = None,
    max_memory: int | None = None,
) -> SymmetryReport:
    """The orthogonal symmetries of ``model`` beyond its permutation ``spec``.

    Args:
        model: the module ``spec`` was traced from (left unchanged).
        example_inputs, example_kwargs, outputs: as for :func:`~lmckit.tracing.trace`.
        spec: its permutation spec (:func:`~lmckit.tracing.trace`); groups keep their names.
        seed: seeds the random orthogonal maps of the check.
        precision: ``"float64"`` (a float64 twin of the model) or ``"float32"`` (a float32
            model runs the check itself, its outputs compared to float32's rounding).
            Default: float64 where its copies (:func:`kinds_check_bytes`) fit in 80 % of
            the memory available now and, with ``max_memory``, beside the model within
            it; else float32 — a 1.1 B-parameter model's float64 check holds about 26 GB.
            The float32 check is conservative: a deep model's rounding can make it refuse
            a kind that holds (the refusal says so: :data:`FLOAT32_CAVEAT`), never accept
            a map that changes the outputs beyond float32's tolerance.
        max_memory: bytes the caller allows in all (see ``precision``).

    Returns:
        a :class:`SymmetryReport` whose ``spec`` says each group's kind and which norm
        gains must be folded (:func:`lmckit.transform.fold_norms`) before a transform of
        those groups is applied.

    Raises:
        SpecError: the model cannot be exported, or ``spec`` does not fit its state.
    """
    if not isinstance(model, nn.Module):
        raise SpecError(f"symmetry_kinds() needs a torch.nn.Module, got {type(model).__name__}")
    if precision not in (None, "float64", "float32"):
        raise SpecError(f"precision must be 'float64' or 'float32', got {precision!r}")
    check_max_memory(max_memory, SpecError)
    with batched_experts(model):  # their batched form: followed by the tracer, float64
        start = time.perf_counter()
        state = {k: v.detach() for k, v in model.state_dict().items()}
        spec.validate(state, what=f"{type(model).__name__}'s state_dict")
        exported, args, kwargs = export_model(model, example_inputs, example_kwargs)
        found = _norms(exported, spec, _aliases(model))
        uses = _linear_uses(exported)
        select = outputs if outputs is not None else logits_if_any
        used = precision if precision is not None else kinds_check_precision(state, max_memory)

        def checked_params(twin: nn.Module) -> dict[str, Tensor]:
            # constant gains and biases (a fresh model's) would hide maps that move them
            return vary_constants({k: v.detach() for k, v in twin.state_dict().items()}, seed)

        def float32_twin() -> tuple[nn.Module, dict[str, Tensor]]:
            # a float32 model runs the check itself (its weights are passed in, its mode
            # restored): no copy of a model that float64 copies would not fit beside
            floats = [t for t in state.values() if t.is_floating_point()]
            twin = model if all(t.dtype == torch.float32 for t in floats) else None
            twin = twin if twin is not None else copy.deepcopy(model).float()
            return twin, checked_params(twin)

        if used == "float64":
            twin = copy.deepcopy(model).double()
            args64, kwargs64 = to_double((args, kwargs))
            params = checked_params(twin)
            rtol, dtype = output_tolerance(exported, "float64"), torch.float64
            try:
                reference = run_outputs(twin, params, args64, kwargs64, False, select, dtype)
            except TwinRunError:  # ops that take no float64: float32, as traced
                if precision is not None:
                    raise
                del twin, params
                used = "float32"
        if used == "float32":
            twin, params = float32_twin()
            args64, kwargs64 = args, kwargs
            rtol, dtype = output_tolerance(exported, "float32"), torch.float32
            reference = run_outputs(twin, params, args64, kwargs64, False, select, dtype)
        generator = torch.Generator().manual_seed(seed)
        probes = torch.Generator().manual_seed(seed + 1)  # leaves the full maps' draws alone

        def keeps(moved: dict[str, Tensor]) -> bool:
            out = run_outputs(twin, moved, args64, kwargs64, False, select, dtype)
            return outputs_close(reference, out, rtol)

        kinds: dict[str, str] = {}
        rotary: dict[str, tuple[str, int]] = {}
        cuts = _slice_bounds(exported)
        folds: dict[str, tuple[tuple[str, int], ...]] = {}
        biases: dict[str, str] = {}
        duals: set[tuple[str, int, int]] = set()
        reasons: dict[str, str] = {}
        norms: dict[str, str] = {}
        for g, n in spec.groups.items():
            if n < 2 or g in spec.copies:  # copies groups are permutations only
                continue
            gains = {gain: info for gain, info in found.items() if spec.axes[gain][0] == g}
            blocked = next((info.why for info in gains.values() if info.why), None)
            if blocked is not None:
                reasons[g] = blocked
                continue
            candidate_folds = {gain: info.readers for gain, info in gains.items()}
            candidate_biases = {gain: info.bias for gain, info in gains.items() if info.bias}
            layer_norm = any(info.kind == "layer_norm" for info in gains.values())
            candidate_duals = None if gains else _duals_of(spec, g, uses)
            facts = GroupFacts(
                size=n, heads=g in spec.heads, layer_norm=layer_norm,
                readers_dual=candidate_duals is not None, pinned=g in spec.pinned,
            )  # fmt: skip
            tries = tried_kinds(facts)
            why, chosen, layout = "no orthogonal map of it keeps the outputs", None, None
            head = n // spec.heads[g][1] if g in spec.heads else n
            trials = [
                (kind, candidate)
                for kind in tries
                for candidate in (_rotary_layouts(head, cuts) if KINDS[kind].layout else [None])
            ]
            for kind, candidate in trials:
                trial = replace(
                    spec,
                    kinds={**kinds, g: kind},
                    rotary={**rotary, **({g: candidate} if candidate else {})},
                    folds={**folds, **candidate_folds},
                    norm_biases={**biases, **candidate_biases},
                    duals=duals | (candidate_duals if KINDS[kind].dual else set()),
                )
                folded = fold_norms(trial, params)
                if not outputs_close(
                    reference,
                    run_outputs(twin, folded, args64, kwargs64, False, select, dtype),
                    rtol,
                ):
                    why = "folding its norm gains changes the outputs"
                    break
                probe = _probe_map(trial, g, kind, probes)
                if probe is None or keeps(apply_group_map(trial, folded, g, *probe)):
                    # the group's tensors moved, the rest shared: a layer's group copies
                    # that layer's tensors, not the model (Transform.apply would)
                    m = random_group_map(trial, g, kind, generator)
                    dual = torch.linalg.inv(m).T if KINDS[kind].dual else m
                    if keeps(apply_group_map(trial, folded, g, m, dual)):
                        chosen, layout = kind, candidate
                        break
                tried = ", ".join(tries[: tries.index(kind) + 1])
                why = (
                    f"a random map of every kind tried ({tried})"
                    " changes the outputs (an elementwise op acts on it: an activation, a gating "
                    "product, rotary embeddings, a router's top-k)"
                )
            if chosen is None:
                reasons[g] = why + (FLOAT32_CAVEAT if used == "float32" else "")
                continue
            kinds[g] = chosen
            if layout is not None:
                rotary[g] = layout
            if KINDS[chosen].dual:
                duals |= candidate_duals
            folds.update(candidate_folds)
            biases.update(candidate_biases)
            norms.update({gain: info.kind for gain, info in gains.items()})
        return SymmetryReport(
            spec=replace(
                spec, kinds=kinds, rotary=rotary, folds=folds, norm_biases=biases, duals=duals
            ),
            reasons=reasons,
            norms=norms,
            seconds=time.perf_counter() - start,
            precision=used,
        )


@checked
def kinds_check_bytes(state: Mapping[str, Tensor], precision: str) -> int:
    """Memory :func:`symmetry_kinds` adds to the model's, in bytes: in float64 a float64
    twin, its norm gains folded and one moved set of its weights; in float32 the folded
    and moved sets (plus a float32 twin where the model is in another dtype)."""
    if precision not in ("float64", "float32"):
        raise SpecError(f"precision must be 'float64' or 'float32', got {precision!r}")
    floats = [t for t in state.values() if t.is_floating_point()]
    n = sum(t.numel() for t in floats)
    if precision == "float64":
        return 3 * 8 * n
    twin = 0 if all(t.dtype == torch.float32 for t in floats) else 4 * n
    return 2 * 4 * n + twin


@checked
def kinds_check_precision(state: Mapping[str, Tensor], max_memory: int | None = None) -> str:
    """``"float64"`` where the float64 check's copies fit in 80 % of the memory available
    now and, with ``max_memory``, beside the model within it; else ``"float32"``."""
    from lmckit.budget import available_memory

    check_max_memory(max_memory, SpecError)
    need = kinds_check_bytes(state, "float64")
    model = sum(t.numel() * t.element_size() for t in state.values())
    fits = need <= 0.8 * available_memory() and (max_memory is None or model + need <= max_memory)
    return "float64" if fits else "float32"


FLOAT32_CAVEAT = (
    " — checked in float32, where a deep model's rounding alone can exceed the check's "
    "tolerance: precision='float64' (more memory) decides"
)
"""Appended to a refusal found in float32: there the check is conservative — rounding can
refuse a kind that holds (a 22-layer Llama of width 512: its stream found orthogonal-mean-
free instead of orthogonal; at 1.1 B parameters the stream's fold refused), never accept
one that changes the outputs beyond float32's tolerance."""

# units a probe mixes: enough that an elementwise op between them shows, few enough that
# drawing and applying the map costs nothing beside a forward pass; and the narrowest group
# probed — below it a full map costs less than the probe's extra forward pass
PROBE_UNITS = 8
PROBE_FROM = 256


def _probe_map(
    spec: PermutationSpec, group: str, kind: str, generator: torch.Generator
) -> tuple[Tensor, Tensor] | None:
    """A cheap element of ``kind`` for a wide group, tried before the full random one: the
    identity except a random map of the kind on :data:`PROBE_UNITS` random units (and, for
    the kinds whose readers move by ``M⁻ᵀ``, that dual), as ``(M, M⁻ᵀ)``. It lies in the
    kind's group (a block fixing the ones vector of its units fixes the whole ones vector),
    so a probe that changes the outputs rejects the kind as surely as a full map would —
    without drawing, checking and inverting an ``n × n`` one (on GPT-2 small its MLP's
    3,072 units cost most of the check). A probe that keeps the outputs proves nothing:
    the full map still decides. ``None`` for head-structured groups and groups narrower than
    :data:`PROBE_FROM`, whose maps are small anyway."""
    n = spec.groups[group]
    if group in spec.heads or n < PROBE_FROM or KINDS[kind].layout:
        return None
    units = torch.randperm(n, generator=generator)[:PROBE_UNITS]
    block = random_map(kind, PROBE_UNITS, generator)
    matrix, dual = torch.eye(n, dtype=torch.float64), torch.eye(n, dtype=torch.float64)
    matrix[units[:, None], units] = block
    dual[units[:, None], units] = torch.linalg.inv(block).T if KINDS[kind].dual else block
    return matrix, dual


def _slice_bounds(exported) -> set[int]:
    """Every start and end of a ``slice`` in the graph: where a rotary embedding may cut a
    head's dimensions (its rotated part, the halves it swaps)."""
    bounds: set[int] = set()
    for node in exported.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith("aten.slice"):
            bounds |= {a for a in node.args[2:4] if isinstance(a, int) and 0 < a < 2**31}
    return bounds


def _rotary_layouts(head: int, cuts: set[int]) -> list[tuple[str, int]]:
    """The layouts to try on a head of ``head`` dimensions, the narrowest first: the first
    ``r`` rotated for each even cut ``r`` the graph slices at, or all of it; rotate-half
    pairs before interleaved ones. The check decides which, if any, the model has. Narrow
    first, for the unrotated rest takes any map of the kind: a narrower layout the check
    passes is the larger group (Phi's 2 rotated dimensions of 4 also pass as 2 interleaved
    pairs, whose second pair's scaled rotations are a part of the rest's maps)."""
    widths = sorted({head, *(c for c in cuts if 2 <= c < head and c % 2 == 0)})
    return [(style, r) for r in widths if r % 2 == 0 for style in ("half", "interleaved")]


@dataclass
class _Gain:
    kind: str  # "layer_norm" or "rms_norm"
    bias: str | None = None  # the norm's bias, added after the gain
    readers: tuple[tuple[str, int], ...] = ()
    why: str | None = None  # why it cannot be folded


def _aliases(model: nn.Module) -> dict[str, list[str]]:
    """State names sharing one tensor (tied weights), each name -> all of its names."""
    by_id: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        by_id.setdefault(id(t), []).append(name)
    return {name: names for names in by_id.values() for name in names if len(names) > 1}


def _norms(exported, spec: PermutationSpec, aliases: Mapping[str, list[str]]) -> dict[str, _Gain]:
    """Every norm gain of the graph that lives on a group of ``spec``, with its readers
    (or why it cannot be folded)."""
    signature = exported.graph_signature
    names = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    out: dict[str, _Gain] = {}

    def state_name(node: Any) -> str | None:
        return _state_name(node, names)

    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        gain, kind, norm_out, bias = None, "", node, None
        if node.target in _LAYER_NORMS and len(node.args) > 2:
            gain, kind = state_name(node.args[2]), "layer_norm"
            bias = state_name(node.args[3]) if len(node.args) > 3 else None
            if node.target == aten.native_layer_norm.default:
                norm_out = next(
                    (u for u in node.users if u.target.__name__ == "getitem" and u.args[1] == 0),
                    node,
                )
        elif node.target in _RMS_NORMS and len(node.args) > 2:
            gain, kind = state_name(node.args[2]), "rms_norm"
        elif node.target == aten.mul.Tensor:
            for i, a in enumerate(node.args[:2]):
                name = state_name(a)
                other = node.args[1 - i]
                if name is not None and isinstance(other, fx.Node) and _is_gain(name, spec):
                    gain, kind = name, "rms_norm"
        if gain is None or not _is_gain(gain, spec):
            continue
        info = _Gain(kind, bias=bias if bias is not None and _is_gain(bias, spec) else None)
        if gain in out:
            info.why = f"the gain {gain!r} is used by two norms"
        else:
            readers, why = _readers(norm_out, names, spec, spec.axes[gain][0])
            info.readers, info.why = tuple(readers), why
            tied = [r for r, _ in readers if r in aliases]
            if why is None and tied:
                others = [a for a in aliases[tied[0]] if a != tied[0]]
                info.why = (
                    f"the gain {gain!r} is read by {tied[0]!r}, tied to {others[0]!r}: folding "
                    "it would untie them (untie the weights to rotate this group)"
                )
        out[gain] = info
    return out


def _state_name(node: Any, names: Mapping[str, str]) -> str | None:
    """The state tensor behind ``node`` (through casts and aliases), or None."""
    while isinstance(node, fx.Node) and node.target in (
        aten._to_copy.default,
        aten.to.dtype,
        aten.alias.default,
    ):
        node = node.args[0]
    if isinstance(node, fx.Node) and node.op == "placeholder":
        return names.get(node.name)
    return None


_CONVOLUTIONS = {
    getattr(aten, op).default
    for op in ("convolution", "conv1d", "conv2d", "conv3d")
    if hasattr(aten, op)
}


@dataclass(frozen=True)
class _LinearUse:
    """A linear layer of the graph: its weight, the axis the product contracts (the
    input's), the output axis, and its bias."""

    weight: str
    contracted: int
    out: int
    bias: str | None


def _linear_uses(exported) -> list[_LinearUse]:
    """Every linear map and convolution with a state weight, in graph order."""
    signature = exported.graph_signature
    names = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    uses = []
    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        target, args = node.target, node.args
        found, bias = None, None
        if target == aten.linear.default:
            found = _weight(args[1], names, contracted=1)
            bias = args[2] if len(args) > 2 else None
        elif target == aten.addmm.default and len(args) > 2:
            found, bias = _weight(args[2], names, contracted=0), args[0]
        elif target in (aten.mm.default, aten.matmul.default):
            found = _weight(args[1], names, contracted=0)
        elif target in _CONVOLUTIONS:
            name = _state_name(args[1], names)
            found = (name, 1) if name is not None else None
            bias = args[2] if len(args) > 2 else None
            if found is not None:
                uses.append(_LinearUse(name, 1, 0, _state_name(bias, names)))
            continue
        if found is not None:
            name, contracted = found
            uses.append(_LinearUse(name, contracted, 1 - contracted, _state_name(bias, names)))
    return uses


def _duals_of(spec: PermutationSpec, group: str, uses: list[_LinearUse]):
    """The places of ``group`` that move by ``M⁻ᵀ`` under an invertible map — the inputs of
    the linear layers that read it; for a group no layer reads (attention's queries and
    keys, met only by each other) the second of exactly two writers — or None when the
    graph does not say."""

    def places(name: str, axis: int) -> list[tuple[str, int, int]]:
        ax = spec.axes.get(name)
        if ax is None or axis >= len(ax) or group not in axis_groups(ax[axis]):
            return []
        segments = spec.segments(name, axis)
        return [(name, axis, i) for i, (g, _, _) in enumerate(segments) if g == group]

    readers = [p for use in uses for p in places(use.weight, use.contracted)]
    if readers:
        return frozenset(readers)
    sites = []
    for use in uses:
        for place in places(use.weight, use.out):
            site = {place}
            if use.bias is not None and places(use.bias, 0):
                site.add((use.bias, 0, place[2]))
            sites.append(site)
    if len(sites) == 2:
        return frozenset(sites[1])
    return None


def _is_gain(name: str, spec: PermutationSpec) -> bool:
    ax = spec.axes.get(name)
    return ax is not None and len(ax) == 1 and isinstance(ax[0], str)


def _readers(
    norm_out: fx.Node, names: Mapping[str, str], spec: PermutationSpec, group: str
) -> tuple[list[tuple[str, int]], str | None]:
    """The ``(tensor, axis)`` pairs of the linear maps that read ``norm_out`` (through
    casts and reshapes), or why it reaches something else."""
    readers: list[tuple[str, int]] = []
    todo, seen = [norm_out], set()
    while todo:
        node = todo.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            if str(user.target).startswith("aten._assert") or (
                user.target is aten.type_as.default and user.args[0] is not node
            ):
                continue  # reads the dtype or shape only (Cohere's asserts, GraniteMoe's casts)
            if (
                user.args
                and user.args[0] is node
                and (user.target in _PASS_THROUGH or _keeps_features(user))
            ):
                todo.append(user)
                continue
            reader = _reader_of(user, node, names)
            if reader is None:
                return [], (
                    f"its norm's output reaches {user.target} directly (not only linear "
                    "layers, e.g. post-LN), so the norm's gain cannot be folded"
                )
            name, axis = reader
            if (
                name not in spec.axes
                or spec.axes[name][axis] is None
                or group
                not in (
                    spec.axes[name][axis]
                    if isinstance(spec.axes[name][axis], tuple)
                    else (spec.axes[name][axis],)
                )
            ):
                return [], f"its norm is read by {name!r} on an axis outside the group"
            readers.append(reader)
    if not readers:
        return [], "its norm's output is read by no linear layer"
    return list(dict.fromkeys(readers)), None


def _keeps_features(node: fx.Node) -> bool:
    """Whether ``node`` selects, slices or averages over axes other than the last (the
    norm's features): a class token's row, a mean over tokens."""
    shape = getattr(node.args[0].meta.get("val"), "shape", None)
    if shape is None:
        return False
    last = len(shape) - 1
    if node.target in (aten.select.int, aten.slice.Tensor):
        dim = node.args[1] if len(node.args) > 1 else 0
        return dim % len(shape) != last
    if node.target in (aten.mean.dim, aten.sum.dim_IntList):
        dims = node.args[1] if len(node.args) > 1 else None
        return dims is not None and all(d % len(shape) != last for d in dims)
    if node.target == aten.repeat_interleave.self_int:  # each token once per expert it picks
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        return dim is not None and dim % len(shape) != last
    return False


def _reader_of(user: fx.Node, source: fx.Node, names: Mapping[str, str]):
    """``(weight name, contracted axis)`` if ``user`` is a linear map of ``source``."""
    target, args = user.target, user.args
    if target == aten.linear.default and args[0] is source:
        return _weight(args[1], names, contracted=1)
    if target == aten.addmm.default and len(args) > 2 and args[1] is source:
        return _weight(args[2], names, contracted=0)
    if target in (aten.mm.default, aten.matmul.default) and args[0] is source:
        return _weight(args[1], names, contracted=0)
    if target == aten.unsqueeze.default and args[0] is source and len(user.users) == 1:
        # a batched product of each token with its experts' weights (``w[idx] @ x[..., None]``
        # or ``x[:, None] @ w[idx]``): the features are contracted with the gathered weight
        (product,) = user.users
        ndim = len(getattr(source.meta.get("val"), "shape", ()))
        at = args[1] % (ndim + 1)
        if product.target == aten.bmm.default and ndim == 2:
            if at == 2 and product.args[1] is user:
                return _gathered_weight(product.args[0], names, contracted=2)
            if at == 1 and product.args[0] is user:
                return _gathered_weight(product.args[1], names, contracted=1)
    return None


def _gathered_weight(node: Any, names: Mapping[str, str], contracted: int):
    """The 3-D parameter behind ``param[idx]`` (one index tensor of one axis, on the first
    axis: the experts a router picked) and the axis of it a batched product contracts."""
    if not (isinstance(node, fx.Node) and node.target == aten.index.Tensor):
        return None
    param, indices = node.args[0], node.args[1]
    if len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return None
    ids = indices[0].meta.get("val")
    if not isinstance(ids, Tensor) or ids.ndim != 1:
        return None
    if not isinstance(param, fx.Node) or param.op != "placeholder" or param.name not in names:
        return None
    meta = param.meta.get("val")
    if not isinstance(meta, Tensor) or meta.ndim != 3:
        return None
    return names[param.name], contracted


def _weight(node: Any, names: Mapping[str, str], contracted: int):
    """The parameter behind a 2-D weight operand (through transposes and casts) and which
    of its axes the product contracts."""
    flips = 0
    while isinstance(node, fx.Node) and node.op == "call_function":
        flip = _flips_2d(node)
        if flip is None:
            return None
        flips += flip
        node = node.args[0]
    if not isinstance(node, fx.Node) or node.op != "placeholder" or node.name not in names:
        return None
    meta = node.meta.get("val")
    if not isinstance(meta, Tensor) or meta.ndim != 2:
        return None
    return names[node.name], contracted if flips % 2 == 0 else 1 - contracted


# every spelling of a 2-D weight's transpose: ``w.t()``, ``w.T``, ``w.mT``, ``w.mH`` and
# ``w.adjoint()`` (real weights), ``w.transpose(0, 1)``, ``w.permute(1, 0)``
_TRANSPOSES = (aten.t.default, aten.numpy_T.default, aten.mT.default, aten.mH.default,
               aten.adjoint.default)  # fmt: skip
_CASTS = (aten._to_copy.default, aten.to.dtype, aten.alias.default)


def _flips_2d(node: fx.Node) -> int | None:
    """1 if ``node`` transposes a 2-D operand, 0 if it only casts or aliases it, ``None``
    for anything else."""
    if node.target in _TRANSPOSES:
        return 1
    if node.target in _CASTS:
        return 0
    if node.target == aten.transpose.int:
        return int(node.args[1] % 2 != node.args[2] % 2)
    if node.target == aten.permute.default:
        dims = [d % 2 for d in node.args[1]]
        return {(1, 0): 1, (0, 1): 0}.get(tuple(dims))
    return None
