"""A model's permutation symmetries, read off its ``torch.export`` graph and then verified.

Every axis of every tensor in the exported ATen graph is a node of a union-find. Each op's
rule (:mod:`lmckit.tracing.rules`) joins the axes that must carry one permutation for the op
to commute with it, or freezes axes no permutation may touch; model inputs and outputs are
frozen, and so is every axis an op without a rule touches. Each class that is not frozen,
is longer than 1 and holds an axis of a ``state_dict`` tensor becomes a group.

Reshapes that merge axes (a convolution's ``C×H×W`` flattened into a linear layer's input;
attention heads ``H×E`` merged back into the model width) or split one (the width into
heads) make *block-structured* axes: the group acts on the outer axis and moves whole blocks
(``PermutationSpec.blocks``), so a head permutation is shared by the query, key, value and
output projections. ``cat``, ``split`` and ``chunk`` along an axis make it a *direct sum*
of the parts' axes (a tuple in ``PermutationSpec.axes``): each part may move by its own
permutation (a fused query/key/value projection: query and key under one group, value under
another); a class met by two sums joins their parts if they cut it alike and freezes
otherwise (:func:`_direct_sums`).

Inside blocks: a reshape that splits the width into heads × head dimensions (or merges
them back) leaves the head-dimension axis free, and a second union-find
(:func:`_inside_blocks`) follows which blocked axes must be permuted alike inside their
blocks. Where that is consistent — the query and key projections through the score
product, the value and output projections through the weighted sum — each becomes a
*head-structured* group (``PermutationSpec.heads``: one permutation of the heads shared by
all, one permutation per head inside each group), as Verma & Elbayad (2024) permute
attention. Under grouped-query attention the query heads that share a key/value head hold
its dimensions once each: the group's *head repeat* (``PermutationSpec.head_repeats``).
Where it is not consistent (a rotary embedding slices the head dimension, a parameter
indexes it, each head's rows are a fused ``[q | k | v]``), the blocks move whole and the
report says why.

Before the spec is returned it is *verified*: a random permutation of every group, applied
to a float64 copy of the model's ``state_dict``, must leave the outputs unchanged in eval
and in train mode (dropout off, functional dropout and attention's ``dropout_p`` included;
BatchNorm then normalises with batch statistics). A failing check is an error naming the
group, never a wrong spec.

Parameters are identified by object: ``state_dict`` keys that alias one tensor (a tied
embedding and output head) get the same axes, so they move together.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import operator
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from lmckit.errors import InputMisfitError, SpecError
from lmckit.functional import logits_of, module_mode
from lmckit.options import checked
from lmckit.params import check_finite
from lmckit.perm import Permutation, PermutationSpec, axis_groups, random_index_vectors
from lmckit.tracing.rules import IGNORED, PINNING, Axes, carry_values, freeze_values, rule_for

__all__ = ["TraceReport", "trace", "trace_report"]

AxisKey = tuple[str, int]

INSIDE = "inside a block (a reshape merged or split it); see the group's whole_blocks"
PINNED = (
    "each head's dimensions stay in place (rotary embeddings: the heads move whole, and "
    "maps inside a head only where a kind allows them)"
)
INSIDE_SUM = (
    "a direct sum inside each block (a per-head fused query/key/value projection): its "
    "parts cannot yet move apart inside the heads"
)


class _UnionFind:
    """Axes joined into classes; a class is frozen if any member was frozen (first reason
    kept)."""

    def __init__(self) -> None:
        self.parent: dict[AxisKey, AxisKey] = {}
        self.frozen: dict[AxisKey, str] = {}

    def find(self, x: AxisKey) -> AxisKey:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, x: AxisKey, y: AxisKey) -> bool:
        """Join the classes of ``x`` and ``y``; whether they were apart."""
        rx, ry = self.find(x), self.find(y)
        if rx == ry:
            return False
        self.parent[ry] = rx
        if ry in self.frozen and rx not in self.frozen:
            self.frozen[rx] = self.frozen[ry]
        return True

    def freeze(self, x: AxisKey, why: str) -> None:
        self.frozen.setdefault(self.find(x), why)

    def reason(self, x: AxisKey) -> str | None:
        return self.frozen.get(self.find(x))


@dataclass(frozen=True)
class TraceReport:
    """What :func:`trace` found.

    Attributes:
        spec: the verified :class:`~lmckit.perm.PermutationSpec`.
        frozen: ``{state_dict key: (reason or None per axis)}`` — why each axis of length
            > 1 that no group permutes is frozen (``None`` on permuted and length-1 axes).
        whole_blocks: ``{group: reason}`` for block-structured groups whose blocks could
            have been permuted inside (they come from a reshape, like heads) but are not.
        unknown_ops: operators without a rule met in the graph (each froze its axes).
        aliases: ``{key: key it aliases}`` for tied ``state_dict`` entries.
        checked_modes: the modes whose outputs were verified unchanged (``"eval"``, and
            ``"train"`` unless the model's train-mode output is random even with dropout
            off).
        activation_sites: ``{group: ((graph node, axis), ...)}`` — where the exported graph
            holds the group's units one per entry, for activation matching
            (:class:`lmckit.tracing.GraphTaps`): the outputs of activation functions if any
            carry the group, else of norms (a residual stream), else of linear maps and
            convolutions (attention's projections), else of any op.
        seconds: wall-clock time of export, tracing and verification.
        precision: the dtype the verification computed in: ``"float64"``, or ``"float32"``
            for a model whose float64 copies would not fit in memory or whose ops take no
            float64 (the check's tolerance is then float32's rounding, still far below
            what a wrong rule changes).
        batched_experts: the mixture-of-experts modules traced and checked in their
            batched form (:func:`batched_experts`: the same function, in ops the tracer
            follows); empty for a model without them.
        copies_sites: ``{copies group: ((graph node, axis, weight, weight axis), ...)}`` —
            activations laid out as one of the group's head-repeated weight axes (a
            linear map's result for its output axis, its input for its input axis), where
            activation matching chooses the query heads inside their key/value group.
    """

    spec: PermutationSpec
    frozen: Mapping[str, tuple[str | None, ...]]
    whole_blocks: Mapping[str, str]
    unknown_ops: tuple[str, ...]
    aliases: Mapping[str, str]
    checked_modes: tuple[str, ...]
    activation_sites: Mapping[str, tuple[tuple[str, int], ...]]
    seconds: float
    numels: Mapping[str, int] = field(repr=False)
    precision: str = "float64"
    batched_experts: tuple[str, ...] = ()
    copies_sites: Mapping[str, tuple[tuple[str, int, str, int], ...]] = field(default_factory=dict)

    @property
    def permuted_fraction(self) -> float:
        """Fraction of the state_dict's elements (tied tensors counted once) that sit in a
        tensor with at least one permuted axis."""
        total = permuted = 0
        for name, axes in self.spec.axes.items():
            if name in self.aliases:
                continue
            total += self.numels[name]
            if any(g is not None for g in axes):
                permuted += self.numels[name]
        return permuted / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: groups with sizes and members, axes, frozen axes with reasons."""
        return {
            "groups": {
                g: {"size": n, "members": [f"{k}[{i}]" for k, i in self.spec.group_axes(g)]}
                for g, n in self.spec.groups.items()
            },
            "axes": self.spec.to_dict()["axes"],
            "blocks": {k: list(v) for k, v in self.spec.blocks.items()},
            "repeats": {k: list(v) for k, v in self.spec.repeats.items()},
            "heads": {g: list(v) for g, v in self.spec.heads.items()},
            "head_repeats": {k: list(v) for k, v in self.spec.head_repeats.items()},
            "head_sums": {k: list(v) for k, v in self.spec.head_sums.items()},
            "pinned": sorted(self.spec.pinned),
            "copies": dict(self.spec.copies),
            "whole_blocks": dict(self.whole_blocks),
            "self_maps": sorted(self.spec.self_maps),
            "frozen": {
                f"{k}[{i}]": why
                for k, reasons in self.frozen.items()
                for i, why in enumerate(reasons)
                if why is not None
            },
            "unknown_ops": list(self.unknown_ops),
            "aliases": dict(self.aliases),
            "checked_modes": list(self.checked_modes),
            "permuted_fraction": self.permuted_fraction,
            "seconds": self.seconds,
            "precision": self.precision,
            "batched_experts": list(self.batched_experts),
        }

    def _layout(self, name: str, axis: int) -> str:
        parts = []
        if (b := self.spec.block(name, axis)) > 1:
            parts.append(f"blocks of {b}")
        if (r := self.spec.repeat(name, axis)) > 1:
            parts.append(f"{r} segments")
        if (r := self.spec.head_repeat(name, axis)) > 1:
            parts.append(f"each head {r} times")
        entry = self.spec.axes[name][axis]
        if isinstance(entry, tuple):
            terms = [p if isinstance(p, str) else f"{p} fixed" for p in entry]
            parts.append("direct sum " + " ⊕ ".join(terms))
            if (h := self.spec.head_sum(name, axis)) > 1:
                parts.append(f"laid out head by head, {h} heads")
        return f" ({', '.join(parts)})" if parts else ""

    def __str__(self) -> str:
        lines = [
            f"{len(self.spec.groups)} groups, {self.permuted_fraction:.1%} of the parameters "
            f"in permuted tensors (verified in {' and '.join(self.checked_modes)} mode"
            f"{'' if self.precision == 'float64' else ' at ' + self.precision}; "
            f"{self.seconds:.2f} s)"
        ]
        ties = self.spec.head_ties()
        for g, n in self.spec.groups.items():
            members = self.spec.group_axes(g)
            shown = ", ".join(f"{k}[{i}]{self._layout(k, i)}" for k, i in members[:4])
            more = f", … {len(members) - 4} more" if len(members) > 4 else ""
            if g in self.spec.copies:
                h, r = self.spec.copies_layout(g)
                shown = ", ".join(f"{k}[{i}]" for k, i in self.spec.copies_axes(g)[:4])
                more = ""
                size = (
                    f"{n} units = {h} key/value heads × {r} query heads, permuted inside "
                    f"each key/value group"
                )
            elif g in self.spec.heads:
                tie, h = self.spec.heads[g]
                others = [o for o in ties[tie] if o != g]
                shared = f", heads shared with {', '.join(others)}" if others else ""
                size = f"{n} units = {h} heads × {n // h}{shared}"
            else:
                size = f"{n} units"
            why = f" [whole blocks: {self.whole_blocks[g]}]" if g in self.whole_blocks else ""
            lines.append(f"  group {g}: {size} — {shown}{more}{why}")
        reasons: dict[str, list[str]] = {}
        for k, per_axis in self.frozen.items():
            for i, why in enumerate(per_axis):
                if why is not None:
                    reasons.setdefault(why, []).append(f"{k}[{i}]")
        if reasons:
            lines.append("frozen axes:")
            for why, where in reasons.items():
                more = f", … {len(where) - 3} more" if len(where) > 3 else ""
                lines.append(f"  {why}: {', '.join(where[:3])}{more}")
        if self.batched_experts:
            shown = self.batched_experts
            more = f", … {len(shown) - 3} more" if len(shown) > 3 else ""
            lines.append(
                "experts traced and checked in their batched form (the same function): "
                f"{', '.join(shown[:3])}{more}"
            )
        if self.unknown_ops:
            lines.append(f"operators without a rule: {', '.join(self.unknown_ops)}")
        return "\n".join(lines)


@checked
def trace(
    model: nn.Module,
    example_inputs: Tensor | Sequence[Any],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    strict: bool = False,
    seed: int = 0,
    inside_blocks: bool = True,
    outputs: Callable[[Any], Any] | None = None,
    precision: str | None = None,
) -> PermutationSpec:
    """The :class:`~lmckit.perm.PermutationSpec` of ``model``, traced and verified.

    Args:
        model: any module ``torch.export`` can export (left unchanged: mode and weights).
        example_inputs: a tensor or a tuple of positional inputs; shapes are taken from
            them (batch of at least 2, so that BatchNorm can run in train mode).
        example_kwargs: keyword inputs, if the model takes some. A model whose forward
            takes ``use_cache`` (Hugging Face decoders) is traced with ``use_cache=False``
            unless given: the key/value cache is an inference-time buffer, not part of the
            function, and its cache objects are no tensors ``torch.export`` can return.
        strict: raise instead of freezing when an operator has no rule.
        seed: seeds the verification's random permutations.
        inside_blocks: permute inside heads where the trace proves it (head-structured
            groups); ``False`` moves heads only as whole blocks.
        outputs: which of the model's outputs are its function, as a function of the
            output (``lambda out: out[0]``): only these must stay unchanged, other outputs
            are representations a permutation changes by design. By default every output,
            except that a Hugging Face output holding ``logits`` is read as its logits (T5
            and BART also return the encoder's last hidden state).
        precision: ``"float64"`` or ``"float32"``: the dtype of the verification. By
            default float64, unless its copies of the model (a twin and a permuted set, in
            float64: :func:`verification_bytes`) would not fit in the memory available: a
            billion-parameter model is then verified in float32 on its own weights, with
            one permuted copy.

    Raises:
        SpecError: the model cannot be exported; ``strict`` and an operator has no rule;
            or the verification fails (naming the group).
    """
    return trace_report(
        model,
        example_inputs,
        example_kwargs=example_kwargs,
        strict=strict,
        seed=seed,
        inside_blocks=inside_blocks,
        outputs=outputs,
        precision=precision,
    ).spec


@checked
def trace_report(
    model: nn.Module,
    example_inputs: Tensor | Sequence[Any],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    strict: bool = False,
    seed: int = 0,
    inside_blocks: bool = True,
    outputs: Callable[[Any], Any] | None = None,
    precision: str | None = None,
) -> TraceReport:
    """:func:`trace` with its coverage report (:class:`TraceReport`)."""
    if not isinstance(model, nn.Module):
        raise SpecError(f"trace() needs a torch.nn.Module, got {type(model).__name__}")
    if outputs is not None and not callable(outputs):
        raise SpecError(
            f"outputs must be a function of the model's output (lambda out: out[0]), "
            f"got {type(outputs).__name__}"
        )
    if precision not in (None, "float64", "float32"):
        raise SpecError(f"precision must be 'float64' or 'float32', got {precision!r}")
    start = time.perf_counter()
    with batched_experts(model) as experts:
        return _trace_report(
            model, example_inputs, example_kwargs, strict, seed, inside_blocks, outputs,
            precision, start, experts,
        )  # fmt: skip


@contextlib.contextmanager
def batched_experts(model: nn.Module) -> Iterator[tuple[str, ...]]:
    """Mixture-of-experts layers of ``transformers`` (those whose experts forward through its
    experts interface) switched, for the block, to their ``batched_mm`` form: the same
    function, each token's experts gathered by the router's indices (``weight[idx]``), which
    the tracer follows from ``topk`` to the expert weights. Their default grouped form sorts
    the tokens by expert and multiplies by offsets (``sort``, ``histc``, a grouped product)
    that no rule follows — and takes no float64. Yields the names of the modules switched
    (empty: nothing changed); restores each setting on exit."""
    switched: list[tuple[Any, Any]] = []
    names: list[str] = []
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if not (hasattr(module, "_is_expert_parallel") and hasattr(module, "has_gate")):
            continue
        if config is None or not hasattr(config, "_experts_implementation"):
            continue
        if getattr(module, "_is_expert_parallel", False):
            continue  # sharded experts: sentinels clamp the indices; left as they are
        names.append(name)
        if all(c is not config for c, _ in switched):
            switched.append((config, config._experts_implementation))
    try:
        for config, _ in switched:
            config._experts_implementation = "batched_mm"
        yield tuple(names)
    finally:
        for config, before in switched:
            config._experts_implementation = before


def _trace_report(
    model, example_inputs, example_kwargs, strict, seed, inside_blocks, outputs, precision,
    start, experts,
) -> TraceReport:  # fmt: skip
    exported, args, kwargs = export_model(model, example_inputs, example_kwargs)
    select = outputs if outputs is not None else logits_if_any
    uf, unknown, found = _relate(exported, _output_names(exported, select))
    state = model.state_dict(keep_vars=True)
    aliases, placeholder_of = _state_placeholders(exported, state, uf)
    if strict and unknown:
        raise SpecError(
            f"operators without a rule in {type(model).__name__}: {', '.join(unknown)} "
            "(strict=True; without it their axes are frozen)"
        )
    spec, frozen, inside, sites = _build_spec(
        exported, state, aliases, placeholder_of, uf, found, inner=inside_blocks
    )
    fixed = _heads_frozen_later(uf, found)
    if fixed:
        # heads that cannot move (BLOOM's ALiBi gives each head its own slope) freeze where
        # the graph reads them, after the reshape that nested them: a second pass knows it
        # there, and each head's dimensions may move by permutations of their own
        uf_fixed, _, found_fixed = _relate(
            exported, _output_names(exported, select), fixed_heads=fixed
        )
        aliases_fixed, placeholder_fixed = _state_placeholders(exported, state, uf_fixed)
        built = _build_spec(
            exported, state, aliases_fixed, placeholder_fixed, uf_fixed, found_fixed,
            inner=inside_blocks,
        )  # fmt: skip
        if _moves_all_of(built[0], spec) and built[0].groups != spec.groups:
            uf, found = uf_fixed, found_fixed
            aliases, placeholder_of = aliases_fixed, placeholder_fixed
            spec, frozen, inside, sites = built
    if found.one_heads:
        # multi-query attention read as one key/value head gives its heads' insides — where
        # the rest of the graph lets them move; where it does not (Qwen3's QK-norm keeps
        # one head's dimensions whole), the heads of the plain reading are kept instead
        uf_plain, _, found_plain = _relate(exported, _output_names(exported, select), False)
        aliases_plain, placeholder_plain = _state_placeholders(exported, state, uf_plain)
        plain = _build_spec(
            exported, state, aliases_plain, placeholder_plain, uf_plain, found_plain,
            inner=inside_blocks,
        )  # fmt: skip
        if not _moves_all_of(spec, plain[0]):
            uf, found, aliases, placeholder_of = (
                uf_plain,
                found_plain,
                aliases_plain,
                placeholder_plain,
            )
            spec, frozen, inside, sites = plain
    chosen = precision is not None
    precision = precision or _precision_that_fits(state)

    def verify(spec: PermutationSpec) -> tuple[str, ...]:
        nonlocal precision
        try:
            rtol = output_tolerance(exported, precision)
            return _verify(model, spec, args, kwargs, seed, rtol, select, precision)
        except TwinRunError:
            # a model whose ops take no float64 (grouped expert matmuls) is checked at
            # float32, as one too large for float64 copies is; the report says which
            if chosen or precision != "float64":
                raise
            precision = "float32"
            rtol = output_tolerance(exported, precision)
            return _verify(model, spec, args, kwargs, seed, rtol, select, precision)

    if not inside_blocks:
        inside = dict.fromkeys(_blocked_groups(spec), "inside_blocks=False")
    try:
        modes = verify(spec)
    except TwinRunError:
        raise
    except SpecError as exc:
        if not spec.heads:
            raise
        # Permutations inside heads rest on more rules than whole heads do; if they fail
        # the check, whole heads may still hold — the report then says so.
        spec, frozen, inside, sites = _build_spec(
            exported, state, aliases, placeholder_of, uf, found, inner=False
        )
        modes = verify(spec)
        why = f"permutations inside its blocks failed the equivalence check ({exc})"
        inside = dict.fromkeys(_blocked_groups(spec), why)
    gathered = {uf.find(key) for key in found.indexed}
    indexed = {
        entry
        for key, entries in spec.axes.items()
        if (ph := placeholder_of.get(key)) is not None
        for i, entry in enumerate(entries)
        if isinstance(entry, str) and uf.find((ph, i)) in gathered
    }
    apart = experts_apart(spec, indexed)
    if apart is not None:
        try:
            modes = verify(apart[0])
        except SpecError as exc:
            for g in apart[1]:
                inside[g] = (
                    "a permutation of its units per unit of the gathered axis beside it "
                    f"(each expert's own) failed the equivalence check ({exc}): one "
                    "permutation moves them in every expert alike"
                )
        else:
            spec = apart[0]
            sites = {g: s for g, s in sites.items() if g in spec.groups}
            for g in apart[1]:
                # an activation carries the units of whichever expert each token chose:
                # read once per expert (see EACH)
                h = spec.heads[g][1]
                sites[g] = tuple((f"{node}{EACH}{h}", i) for node, i in sites.get(g, ()))
    return TraceReport(
        spec=spec,
        frozen=frozen,
        whole_blocks=inside,
        unknown_ops=tuple(unknown),
        aliases=aliases,
        checked_modes=modes,
        activation_sites={g: s for g, s in sites.items() if g not in spec.copies},
        copies_sites={g: s for g, s in sites.items() if g in spec.copies},
        seconds=time.perf_counter() - start,
        numels={k: v.numel() for k, v in state.items()},
        precision=precision,
        batched_experts=experts,
    )


def export_model(
    model: nn.Module, example_inputs: Tensor | Sequence[Any], example_kwargs=None
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``torch.export`` of ``model`` in eval mode on the checked example inputs (a Hugging
    Face decoder without its cache: see :func:`trace`), with those inputs.

    Raises:
        SpecError: the inputs do not fit, or the model cannot be exported.
    """
    args = (example_inputs,) if isinstance(example_inputs, Tensor) else tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    if "use_cache" not in kwargs and _takes_keyword(model, "use_cache"):
        kwargs["use_cache"] = False  # see trace(): the cache is no part of the function
    args, kwargs = _check_trace_inputs(model, args, kwargs)
    with module_mode(model, False), torch.no_grad(), _quiet_torch_logs():
        try:
            exported = torch.export.export(model, args, kwargs, strict=False)
        except Exception as exc:  # export raises many types; all mean "cannot trace"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise SpecError(
                f"torch.export could not trace {type(model).__name__}: "
                f"{type(exc).__name__}: {first}"
            ) from exc
    return exported, args, kwargs


def logits_if_any(output: Any) -> Any:
    """The default of ``outputs``: a mapping output (Hugging Face's ``ModelOutput``) that
    holds ``logits`` is read as them; anything else is the function whole (the reading of
    :func:`lmckit.functional.logits_of`, which every data-driven method uses)."""
    return logits_of(output)


def _output_names(exported, select: Callable[[Any], Any]) -> set[str]:
    """The names of the output nodes ``select`` picks, found by applying it to the
    output's structure filled with the leaves' positions."""
    names = list(exported.graph_signature.user_outputs)
    spec = exported.call_spec.out_spec
    try:
        chosen = select(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))
    except Exception as exc:  # the user's selector on the output's structure
        raise SpecError(f"outputs= could not select from the model's output: {exc}") from exc
    picked = [i for i in pytree.tree_leaves(chosen) if isinstance(i, int)]
    if not picked:
        raise SpecError("outputs= selected none of the model's outputs")
    return {names[i] for i in picked if i < len(names) and names[i] is not None}


def _unread(node: fx.Node) -> bool:
    """A value nothing reads (BART selects a channel of its embeddings for the shape alone,
    which export has already fixed) constrains no axis; ops that write into their inputs
    are never skipped."""
    if node.users:
        return False
    schema = getattr(node.target, "_schema", None)
    return schema is not None and not schema.is_mutable


def _takes_keyword(model: nn.Module, name: str) -> bool:
    """``model.forward`` names the keyword, or takes ``**kwargs`` beside a config that has
    that setting (GraniteMoe's forward reads ``use_cache`` from its ``**kwargs``)."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    if name in parameters:
        return True
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return var_keyword and hasattr(getattr(model, "config", None), name)


def _check_trace_inputs(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs, with floating tensors cast to the model's floating dtype (a
    float64 model traces from float32 examples), after checking that the model's tensors
    and the examples are finite and that one eager forward pass runs — so a misfit input
    is reported as such, not as torch.export's internal log."""
    state = model.state_dict()
    empty = [f"{k} {tuple(t.shape)}" for k, t in state.items() if t.numel() == 0]
    if empty:
        raise SpecError(
            f"{type(model).__name__} has {len(empty)} tensor(s) without elements ("
            f"{', '.join(empty[:3])}): a layer of width 0 has no units to permute or match"
        )
    check_finite(state, f"{type(model).__name__}'s weights", error=SpecError)
    dtypes = {t.dtype for t in state.values() if t.dtype.is_floating_point}
    target = dtypes.pop() if len(dtypes) == 1 else None

    def fit(x: Any) -> Any:
        if isinstance(x, Tensor) and x.dtype.is_floating_point:
            if not torch.isfinite(x).all():
                raise InputMisfitError("the example inputs hold NaN or infinite values")
            if target is not None and x.dtype != target:
                return x.to(target)
        return x

    args = tuple(pytree.tree_map(fit, list(args)))
    kwargs = pytree.tree_map(fit, kwargs)
    with module_mode(model, False), torch.no_grad():
        try:
            model(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # the user's forward: any error means "does not fit"
            shapes = [
                tuple(a.shape) for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, Tensor)
            ]
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise InputMisfitError(
                f"example input(s) of shape {', '.join(map(str, shapes))} do not fit "
                f"{type(model).__name__}: {type(exc).__name__}: {first}"
            ) from None
    return args, kwargs


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence torch's own loggers (fake-tensor tracebacks that torch.export prints before
    raising) for the block; the error itself is reported once, by lmckit."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name == "torch" or name.startswith("torch.")
    ]
    saved = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, saved, strict=True):
            lg.disabled = was


@dataclass
class _Found:
    """What the rules said besides the union-find: the rules' own unit axes, every join
    (for the classes inside blocks), reshape nests and fixed blocks (see :class:`Axes`)."""

    extra: dict[AxisKey, int]
    joins: list[tuple[AxisKey, AxisKey]]
    nests: list[tuple[AxisKey, AxisKey, AxisKey]]
    fixed_blocks: list[AxisKey]
    inner_reasons: dict[AxisKey, str | None]  # why a nest's inner axis froze, if it did
    sums: list[tuple[AxisKey, list[tuple[AxisKey, int]]]]  # cat and split: whole, parts
    one_heads: int = 0  # reshapes nested as one key/value head (Axes.single_head)
    indexed: tuple[AxisKey, ...] = ()  # axes indexed by followed values (experts)


def _heads_frozen_later(uf: _UnionFind, found: _Found) -> dict[AxisKey, str]:
    """The head axes of a fused projection laid out head by head (``Axes.unit`` ``#heads``
    of :func:`~lmckit.tracing.rules._head_fused_parts`) that froze while the dimensions
    inside them did not: their reasons, by axis."""
    return {
        outer: why
        for _, outer, inner in found.nests
        if outer[0].endswith("#heads")
        and (why := uf.reason(outer)) is not None
        and why != INSIDE
        and found.inner_reasons.get(inner) is None
    }


def _moves_all_of(spec: PermutationSpec, other: PermutationSpec) -> bool:
    """Whether ``spec`` has a group on every parameter axis that ``other`` has one on."""
    return all(
        spec.axes[name][i] is not None
        for name, entries in other.axes.items()
        for i, entry in enumerate(entries)
        if entry is not None
    )


def _blocked_groups(spec: PermutationSpec) -> list[str]:
    """The groups acting on at least one block-structured axis."""
    return [g for g in spec.groups if any(spec.block(k, i) > 1 for k, i in spec.group_axes(g))]


def _relate(
    exported,
    function_outputs: set[str],
    one_heads: bool = True,
    fixed_heads: Mapping[AxisKey, str] | None = None,
) -> tuple[_UnionFind, list[str], _Found]:
    """Run every op's rule over the graph; ``function_outputs``: the output nodes that are
    the model's function (their axes are frozen); ``one_heads``: whether multi-query
    attention's key/value head is read as one head (:meth:`Axes.single_head`);
    ``fixed_heads``: head axes known (from an earlier pass) to freeze later in the graph,
    frozen from the start with their reason, so that a reshape nesting them makes each
    head's dimensions a part of their own (:meth:`Axes.nest`)."""
    uf = _UnionFind()
    for key, why in (fixed_heads or {}).items():
        uf.freeze(key, why)
    unknown: list[str] = []
    joins: list[tuple[AxisKey, AxisKey]] = []

    def join(x: AxisKey, y: AxisKey) -> None:
        joins.append((x, y))
        uf.union(x, y)

    ax = Axes(join, uf.freeze, lambda key: uf.reason(key) is not None, uf.find)
    ax.hold_one_heads = one_heads
    graph: fx.Graph = exported.graph
    sig = exported.graph_signature
    constants = set(sig.inputs_to_lifted_tensor_constants) | set(
        getattr(sig, "inputs_to_lifted_custom_objs", {})
    )
    for node in graph.nodes:
        shape = ax.shape(node)
        if shape is not None:
            for i in range(len(shape)):
                uf.find((node.name, i))
        if node.op == "placeholder":
            if node.name in sig.user_inputs:
                ax.freeze_all(node, "model input")
            elif node.name in constants:
                ax.freeze_all(node, "a constant tensor of the model (not in its state_dict)")
        elif node.op == "output":
            for out in pytree.tree_leaves(node.args):
                if isinstance(out, fx.Node) and out.name in function_outputs:
                    ax.freeze_all(out, "model output")
                    freeze_values(out, ax, "the model's output")
        elif node.op == "call_function":
            if _unread(node):
                continue
            rule = rule_for(node.target)
            if rule is not None:
                ax.op = str(node.target)
                rule(node, ax)
                carry_values(node, ax)
            elif IGNORED.match(str(node.target)) or (shape is None and not _tensor_inputs(node)):
                continue
            else:
                name = str(node.target)
                if name not in unknown:
                    unknown.append(name)
                why = f"operator {name} has no rule"
                for x in _tensor_inputs(node):
                    ax.freeze_all(x, why)
                    freeze_values(x, ax, name)
                ax.freeze_all(node, why)
                for user in node.users:  # multi-output ops hand their results to getitem
                    if user.target is operator.getitem:
                        ax.freeze_all(user, why)
        elif node.op in ("call_module", "call_method", "get_attr"):
            ax.freeze_all(node, f"{node.op} {node.target} has no rule")
    ax.settle_single_heads()
    extra = {(u.name, i): n for u in ax.units for i, n in enumerate(u.shape)}
    # An inner axis of a nest cannot carry a permutation of its own (it would move the same
    # positions in every block): as a whole axis it freezes. Whether it may move per block is
    # _inside_blocks' question, which needs the reasons it had before this freeze.
    inner_reasons = {inner: uf.reason(inner) for _, _, inner in ax.nests}
    for inner in inner_reasons:
        uf.freeze(inner, INSIDE)
    return (
        uf,
        unknown,
        _Found(
            extra,
            joins,
            ax.nests,
            ax.fixed_blocks,
            inner_reasons,
            ax.sums,
            ax.one_heads_nested,
            tuple(ax.indexed),
        ),
    )


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in pytree.tree_leaves((node.args, node.kwargs)) if Axes.shape(a) is not None]


def _state_placeholders(exported, state: Mapping[str, Tensor], uf: _UnionFind):
    """``aliases`` (tied key → the first key holding the same tensor) and ``placeholder_of``
    (state key → graph placeholder). Export may give tied tensors one placeholder or one
    each; either way their axes are joined here, so they move together."""
    sig = exported.graph_signature
    by_fqn = {fqn: ph for ph, fqn in sig.inputs_to_parameters.items()}
    by_fqn.update({fqn: ph for ph, fqn in sig.inputs_to_buffers.items()})
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    placeholder_of: dict[str, str] = {}
    for key, tensor in state.items():
        owner = first.setdefault(id(tensor), key)
        if owner != key:
            aliases[key] = owner
        if key in by_fqn:
            placeholder_of[key] = by_fqn[key]
    used = {n.name for n in exported.graph.nodes if n.op == "placeholder" and n.users}
    for key, ph in placeholder_of.items():
        owner = aliases.get(key, key)
        tied = [
            placeholder_of.get(k) for k in (owner, *[k for k, o in aliases.items() if o == owner])
        ]
        if not any(t in used for t in tied):
            for i in range(state[key].ndim):
                uf.freeze((ph, i), "not used in forward")
    for key, owner in aliases.items():
        mine, theirs = placeholder_of.get(key), placeholder_of.get(owner)
        if mine is None or theirs is None:
            if mine or theirs:
                placeholder_of[key] = placeholder_of[owner] = mine or theirs  # type: ignore[assignment]
            continue
        for i in range(state[key].ndim):
            uf.union((theirs, i), (mine, i))
    return aliases, placeholder_of


def _axis_lengths(exported, extra: Mapping[AxisKey, int]) -> dict[AxisKey, int]:
    """The length of every axis of the graph (``extra``: the rules' own axes)."""
    lengths = {
        (node.name, i): n
        for node in exported.graph.nodes
        for i, n in enumerate(Axes.shape(node) or ())
    }
    lengths.update(extra)
    return lengths


Sum = tuple[int, list[tuple[AxisKey, int]]]  # (length of the whole, its parts and lengths)


def _direct_sums(uf: _UnionFind, sums, lengths: Mapping[AxisKey, int]) -> dict[AxisKey, Sum]:
    """The classes that are direct sums (a ``cat`` or ``split`` axis and what it is joined
    to), each with its reference decomposition (the shortest whole's).

    Two sums met in one class must cut it at the same places (scaled by their block
    lengths): their parts are then joined pairwise (``cat(a, b) + cat(c, d)`` moves ``a``
    with ``c``); otherwise the class freezes. So does a class with a member not made of
    whole blocks of the reference, and a frozen sum freezes its parts — it cannot move, so
    neither can they. Runs to a fixed point: joining parts can bring more sums together."""
    while True:
        changed = False
        by_root: dict[AxisKey, list[Sum]] = {}
        for whole, parts in sums:
            by_root.setdefault(uf.find(whole), []).append((lengths[whole], parts))
        members: dict[AxisKey, list[int]] = {}
        for key, n in lengths.items():
            root = uf.find(key)
            if root in by_root:
                members.setdefault(root, []).append(n)
        for root, found in by_root.items():
            found.sort(key=lambda f: f[0])
            ref_length, ref_parts = found[0]
            if uf.reason(root) is None:
                cuts = _cuts(ref_parts)
                for length, parts in found[1:]:
                    scale = length // ref_length
                    if length % ref_length or _cuts(parts) != [c * scale for c in cuts]:
                        uf.freeze(root, "direct sums (cat/split) with different parts meet")
                        break
                    for (x, _), (y, _) in zip(ref_parts, parts, strict=True):
                        changed |= uf.union(x, y)
                if any(n % ref_length for n in members[root]):
                    uf.freeze(root, "a direct sum (cat/split) is not whole blocks of this axis")
            if (why := uf.reason(root)) is not None:
                if not why.startswith(_PART_OF):
                    why = f"{_PART_OF} ({why})"
                for _, parts in found:
                    for key, _ in parts:
                        if uf.reason(key) is None:
                            uf.freeze(key, why)
                            changed = True
        if not changed:
            return {root: found[0] for root, found in by_root.items() if uf.reason(root) is None}


_PART_OF = "part of a frozen direct sum"

FLAT = "@flat"
"""An activation site ``f"{node}{FLAT}{i}.{j}"``: node ``node`` with its axes ``i`` (heads)
and ``j`` (their dimensions) moved last and flattened into one, head-major."""

EACH = "@each"
"""An activation site ``f"{node}{EACH}{h}"``: node ``node``'s units, one copy per head of
a group whose heads lie on another axis of its tensors (``PermutationSpec.head_axes``): a
mixture's hidden units, in an activation that holds whichever expert each token chose —
each expert's unit ``s`` read as that activation's unit ``s``, which makes activation
matching choose one permutation of the hidden units for all experts (the experts then
match by their own sites)."""


def _cuts(parts: list[tuple[AxisKey, int]]) -> list[int]:
    out, at = [], 0
    for _, n in parts:
        at += n
        out.append(at)
    return out


def _layouts(uf: _UnionFind, lengths: Mapping[AxisKey, int], sums: Mapping[AxisKey, Sum]):
    """Per class that is not a direct sum, its number of units ``n`` (its shortest member)
    and a function giving each member axis its block length (``length = n · block``). A
    class whose members are not whole blocks of its units is frozen."""
    members: dict[AxisKey, list[int]] = {}
    for key, n in lengths.items():
        members.setdefault(uf.find(key), []).append(n)
    units: dict[AxisKey, int] = {}
    for root, sizes in members.items():
        if root in sums:
            continue
        unit = min(sizes)
        if unit == 0 or any(n % unit for n in sizes):
            uf.freeze(root, "axes of this class are not whole blocks of its units")
            continue
        units[root] = unit

    def layout(key: AxisKey, n: int) -> int:
        return n // units[uf.find(key)]

    return units, layout


def _leaves(
    uf: _UnionFind, sums: Mapping[AxisKey, Sum], root: AxisKey, length: int, depth: int = 0
) -> list[tuple[AxisKey, int]]:
    """The consecutive parts of an axis of ``length`` in the direct-sum class ``root``,
    nested sums expanded: ``(an axis of the part's class, length on this axis)``."""
    if depth > 64:
        raise SpecError("direct sums nested more than 64 deep; please report this model")
    ref_length, parts = sums[root]
    scale = length // ref_length
    out = []
    for key, n in parts:
        part_root = uf.find(key)
        if part_root in sums:
            out += _leaves(uf, sums, part_root, n * scale, depth + 1)
        else:
            out.append((key, n * scale))
    return out


def _inside_blocks(
    uf: _UnionFind, units, layout, lengths, found: _Found, param_axes, parts, extra=()
):
    """Which block-structured axes may be permuted inside their blocks, and alike with
    which others: ``({axis: label}, {root: reason}, {label: inner length})`` for the
    parameters' axes and
    ``parts`` (the parts of direct sums that parameters' axes are made of); ``extra`` axes
    (activation sites) get labels too but no say in the reasons.

    A second union-find over the axes that are blocks of their class: a reshape nest joins
    the merged axis to the class of its inner axis (a head's dimensions), every join
    between two blocked axes joins their insides (an elementwise op, a linear layer's
    units), and the insides of a class freeze when its inner axis is frozen (a rotary
    embedding slices it), when a parameter has the inner axis (it would need one
    permutation for every head) or when another op fixed the blocks (a grouped
    convolution). A nest whose outer axis is itself blocked (grouped-query attention: the
    query heads that share a key/value head) holds its unit's inner axis several times per
    block: the group's head repeat (``PermutationSpec.head_repeats``), the block's length
    over the inner axis's. Axes whose insides meet no nest stay whole blocks."""

    def blocked(key: AxisKey) -> bool:
        root = uf.find(key)
        if uf.reason(key) is not None or root not in units or key not in lengths:
            return False
        return layout(key, lengths[key]) > 1

    inside = _UnionFind()
    inner_nodes = []
    pinned_nodes: dict[AxisKey, str] = {}
    summed = {uf.find(whole): parts for whole, parts in found.sums}
    # GPT-NeoX: each head's dimensions are [query | key | value], a direct sum inside the
    # block — merged axis -> the parts' nodes, each part moving inside its heads by its own
    # label (the axis is laid out head by head: PermutationSpec.head_sums)
    sum_parts: dict[AxisKey, list[tuple[AxisKey, int]]] = {}
    for merged, _, inner in found.nests:
        if not blocked(merged):
            continue
        node = ("#inside", uf.find(inner))
        why = found.inner_reasons[inner]
        if why is None and uf.find(inner) in summed:
            parts = summed[uf.find(inner)]
            sum_parts[merged] = [(("#inside", uf.find(part)), n) for part, n in parts]
            for (part_node, _n), (part, _) in zip(sum_parts[merged], parts, strict=True):
                inner_nodes.append(part_node)
                inside.find(part_node)
                part_why = _own_reason(uf.reason(part))
                if part_why in PINNING:
                    pinned_nodes[part_node] = part_why
                elif part_why is not None:
                    inside.freeze(part_node, part_why)
            continue
        inner_nodes.append(node)
        inside.union(merged, node)
        if why in PINNING:
            # rotary embeddings slice and re-join a head's dimensions: they cannot be
            # permuted, but the heads can, and a kind may find maps inside each head
            pinned_nodes[node] = why
        elif why is not None:
            inside.freeze(merged, why)
    for key in found.fixed_blocks:
        if blocked(key):
            inside.freeze(key, "blocks fixed by a grouped operator")
    # a merged axis and its nest's outer axis are one class apart from their blocks: where
    # the outer is blocked too (query heads grouped by key/value head) its blocks are heads,
    # the merged axis's are heads' dimensions, and their insides are not alike
    levels = {frozenset((merged, outer)) for merged, outer, _ in found.nests}
    for x, y in found.joins:
        if blocked(x) and blocked(y) and frozenset((x, y)) not in levels:
            inside.union(x, y)
    roots_with_params = {uf.find(k) for k in [*param_axes, *parts]}
    part_nodes = {node for found_parts in sum_parts.values() for node, _ in found_parts}
    for node in inner_nodes:
        if node[1] not in roots_with_params:
            continue
        if node in part_nodes and inside.reason(node) is None:
            # one part of a head-by-head sum read through a parameter of its own length
            # (Persimmon's query/key LayerNorm over each head's dimensions, one gain for
            # every head): its dimensions stay, the heads move whole, and the other parts
            # (the values) may still move inside them
            pinned_nodes.setdefault(node, SHARED_INSIDE)
        else:
            inside.freeze(node, "a parameter indexes the dimensions inside each block")
    nested = {inside.find(node) for node in inner_nodes}
    inner_length: dict[AxisKey, int] = {}
    for merged, _, inner in found.nests:
        if blocked(merged) and merged in inside.parent and merged not in sum_parts:
            known = inner_length.setdefault(inside.find(merged), lengths[inner])
            if known != lengths[inner]:  # pragma: no cover - a reshape rule would disagree
                inside.freeze(merged, "inner axes of different lengths")
    for found_parts in sum_parts.values():
        for part_node, n in found_parts:
            if inner_length.setdefault(inside.find(part_node), n) != n:
                inside.freeze(part_node, "inner axes of different lengths")
    # a parameter axis in the class of a merged axis whose inside is a sum takes one label
    # per part, where every part may move inside its heads
    sum_of = {inside.find(merged): found_parts for merged, found_parts in sum_parts.items()}
    head_sums: dict[AxisKey, tuple[AxisKey, ...]] = {}
    labels, reasons = {}, {}
    extra = set(extra)
    for key in [*param_axes, *parts, *extra]:
        if not blocked(key) or key not in inside.parent:
            continue
        label = inside.find(key)
        if label in sum_of:
            found_parts = sum_of[label]
            why = next(
                (inside.reason(node) for node, _ in found_parts if inside.reason(node)), None
            )
            if why is None and key not in extra and key in param_axes:
                head_sums[key] = tuple(inside.find(node) for node, _ in found_parts)
            elif why is None:
                why = INSIDE_SUM
            if why is not None and key not in extra:
                reasons[uf.find(key)] = why
            continue
        if label not in nested:
            continue
        if (why := inside.reason(key)) is None and layout(key, lengths[key]) % inner_length.get(
            label, 1
        ):
            why = "blocks that are no whole number of the heads inside them"
        if why is None:
            labels[key] = label
        elif key not in extra:
            reasons[uf.find(key)] = why
    # a pinned class that one projection alone holds (Phi's queries apart from its keys:
    # its partial rotary cuts them apart) could move no map either: its blocks stay whole
    nests_in: dict[AxisKey, set[Any]] = {}
    for merged, _, _ in found.nests:
        if merged in inside.parent and merged not in sum_parts:
            nests_in.setdefault(inside.find(merged), set()).add(merged)
    for merged, found_parts in sum_parts.items():  # each segment of a sum holds its part
        for k, (node, _) in enumerate(found_parts):
            nests_in.setdefault(inside.find(node), set()).add((merged, k))
    pinned, alone = {}, {}
    for node, why in pinned_nodes.items():
        root = inside.find(node)
        if inside.reason(node) is None:
            (pinned if len(nests_in.get(root, ())) > 1 else alone)[root] = why
    for key, label in list(labels.items()):
        if label in alone:
            del labels[key]
            if key not in extra:
                reasons[uf.find(key)] = alone[label]
    for key, part_labels in list(head_sums.items()):
        if lone := [alone[label] for label in part_labels if label in alone]:
            del head_sums[key]
            reasons[uf.find(key)] = lone[0]
    # the label of each inner class (a head's dimensions), for activation sites that hold
    # heads and their dimensions on two axes
    inner_labels = {node[1]: inside.find(node) for node in inner_nodes}
    return labels, reasons, inner_length, pinned, head_sums, inner_labels


SHARED_INSIDE = "a parameter shared by every head indexes its dimensions"


def _own_reason(why: str | None) -> str | None:
    """A part's freeze reason, None where it is only its whole's freeze inside a block
    (an inner axis freezes as a whole axis; its parts may still move inside each head)."""
    if why == INSIDE or (why is not None and why.startswith(_PART_OF) and INSIDE in why):
        return None
    return why


class _Refreeze(Exception):
    """A direct sum whose groups need different block lengths on one axis: its class must
    freeze and the spec be built again."""

    def __init__(self, root: AxisKey) -> None:
        self.root = root


def _build_spec(
    exported, state, aliases, placeholder_of, uf: _UnionFind, found: _Found, inner: bool = True
):
    """The spec (with per-axis freeze reasons and whole-block reasons) from the classes;
    a direct sum that cannot be laid out freezes and the build starts again."""
    while True:
        try:
            return _build_spec_once(exported, state, aliases, placeholder_of, uf, found, inner)
        except _Refreeze as again:
            uf.freeze(again.root, "a direct sum of groups with different block lengths")


def _build_spec_once(exported, state, aliases, placeholder_of, uf, found: _Found, inner: bool):
    lengths = _axis_lengths(exported, found.extra)
    sums = _direct_sums(uf, found.sums, lengths)
    units, layout = _layouts(uf, lengths, sums)
    param_axes = [(ph, i) for key, ph in placeholder_of.items() for i in range(state[key].ndim)]
    leaves = {
        (ph, i): _leaves(uf, sums, uf.find((ph, i)), lengths[(ph, i)])
        for ph, i in param_axes
        if uf.find((ph, i)) in sums
    }
    parts = [key for found_leaves in leaves.values() for key, _ in found_leaves]
    candidates = _site_candidates(exported)
    labels, inside_reasons, inner_length, pinned_labels, sum_labels, inner_labels = (
        _inside_blocks(uf, units, layout, lengths, found, param_axes, parts, candidates)
        if inner
        else ({}, {}, {}, {}, {}, {})
    )
    groups: dict[str, int] = {}
    names: dict[tuple[AxisKey, Any], str] = {}
    tie: dict[AxisKey, str] = {}

    def group_of(
        key: AxisKey, n: int, owner: str, i: int, start: int = 0, in_sum: bool = False
    ) -> tuple[str | None, int, str | None]:
        """``(group, block, None)`` for a permuted axis of length ``n`` (or a part of one,
        from entry ``start``), ``(None, 1, reason)`` for a frozen one. A new group is named
        after the first axis it is met on: ``owner[i]``, or ``owner[i]@start`` for a part
        of a direct sum after the first. A head repeat is left in ``head_repeat_of``."""
        why = uf.reason(key)
        root = uf.find(key)
        unit = units.get(root, n)
        # a part longer than its own axis is blocks of it: whole units of the class
        label = labels.get(key) if n == lengths.get(key, n) else None
        # one head (multi-query attention's key/value head) is a class of one unit whose
        # blocks are head-structured: its group permutes inside the head
        if why is not None or (unit == 1 and label is None):
            return None, 1, why
        block = layout(key, n)
        repeat = block // inner_length.get(label, block) if label is not None else 1
        if (root, label) not in names:
            name = f"{owner}[{i}]" + (f"@{start}" if start else "")
            while name in groups:
                name += "'"
            names[(root, label)] = name
            groups[name] = unit * (block // repeat if label is not None else 1)
            tie.setdefault(root, name)
        head_repeat_of[key] = repeat
        # a head-structured group's units are the block entries themselves
        return names[(root, label)], 1 if label is not None else block, None

    head_repeat_of: dict[AxisKey, int] = {}

    def head_sum_of(key: AxisKey, n: int, owner: str, i: int):
        """``(entry, heads, None)`` for a parameter axis laid out head by head (a fused
        per-head query/key/value projection): one group per part of each head, in the
        tie of the axis's heads; ``(None, 1, reason)`` where it cannot be laid out."""
        why = uf.reason(key)
        root = uf.find(key)
        unit = units.get(root, n)
        part_labels = sum_labels[key]
        if why is None and n != unit * sum(inner_length[label] for label in part_labels):
            why = INSIDE_SUM
        if why is not None:
            return None, 1, why
        entry = []
        for k, label in enumerate(part_labels):
            if (root, label) not in names:
                name = f"{owner}[{i}]" + (f"@{k}" if k else "")
                while name in groups:
                    name += "'"
                names[(root, label)] = name
                groups[name] = unit * inner_length[label]
                tie.setdefault(root, name)
            entry.append(names[(root, label)])
        return tuple(entry), unit, None

    axes: dict[str, tuple] = {}
    blocks: dict[str, tuple[int, ...]] = {}
    head_repeats: dict[str, tuple[int, ...]] = {}
    head_sums: dict[str, tuple[int, ...]] = {}
    segment_head_repeats: dict[str, dict[int, tuple[int, ...]]] = {}
    frozen: dict[str, tuple[str | None, ...]] = {}
    self_maps: set[str] = set()
    for key, tensor in state.items():
        ph = placeholder_of.get(key)
        owner = aliases.get(key, key)
        per_axis: list = []
        per_block: list[int] = []
        per_head_repeat: list[int] = []
        per_head_sum: list[int] = []
        reasons: list[str | None] = []
        for i, n in enumerate(tensor.shape):
            entry, block, why, sum_heads = None, 1, None, 1
            if ph is None:
                why = "not seen by the exported graph"
            elif not tensor.dtype.is_floating_point:
                why = uf.reason((ph, i))
            elif (ph, i) in sum_labels:
                entry, sum_heads, why = head_sum_of((ph, i), int(n), owner, i)
            elif (ph, i) in leaves:
                counts: list[int] = []
                entry, block, why = _sum_entry(
                    leaves[(ph, i)], group_of, owner, i, lambda k: head_repeat_of.get(k, 1), counts
                )
                if entry is _REFREEZE:
                    raise _Refreeze(uf.find((ph, i)))
                if isinstance(entry, tuple) and any(r > 1 for r in counts):
                    segment_head_repeats.setdefault(key, {})[i] = tuple(counts)
                elif isinstance(entry, str) and counts and counts[0] > 1:
                    head_repeat_of[(ph, i)] = counts[0]  # one part: a plain head-repeated axis
            else:
                entry, block, why = group_of((ph, i), int(n), owner, i)
            per_axis.append(entry)
            per_block.append(block)
            per_head_repeat.append(head_repeat_of.get((ph, i), 1) if isinstance(entry, str) else 1)
            per_head_sum.append(sum_heads if entry is not None else 1)
            reasons.append(why if n > 1 and entry is None else None)
        named = [g for e in per_axis for g in axis_groups(e)]
        if len(set(named)) < sum(e is not None for e in per_axis):
            self_maps.add(key)
        axes[key] = tuple(per_axis)
        if any(b > 1 for b in per_block):
            blocks[key] = tuple(per_block)
        if any(r > 1 for r in per_head_repeat):
            head_repeats[key] = tuple(per_head_repeat)
        if any(h > 1 for h in per_head_sum):
            head_sums[key] = tuple(per_head_sum)
        frozen[key] = tuple(reasons)
    tied_roots = {root for root, label in names if label is not None}
    heads = {
        name: (tie[root], units[root]) for (root, _), name in names.items() if root in tied_roots
    }
    inside = {
        name: inside_reasons[root]
        for (root, label), name in names.items()
        if label is None and root in inside_reasons
    }
    pinned = {name for (_, label), name in names.items() if label in pinned_labels}
    for (_, label), name in names.items():
        if label in pinned_labels:
            inside[name] = f"{pinned_labels[label]}: {PINNED}"
    # grouped-query attention: the query heads sharing a key/value head (the copies of a
    # head repeat) may be permuted among themselves, their query rows and output columns alike
    # — where every group of the tie holds the query heads apart: Qwen3's QK-norm gain keeps
    # its queries' heads whole blocks of r·d (no head repeat on them), and copies that moved
    # the output columns alone would change the function — and where the tie repeats its
    # heads one way (Falcon's fused query/key/value rows repeat each head 4 times, q q k v,
    # beside 2 output copies: no one permutation of r copies acts on both)
    repeated: dict[str, set[int]] = {}
    for key, counts in head_repeats.items():
        for i, r in enumerate(counts):
            g = axes[key][i]
            if r > 1 and isinstance(g, str) and g in heads:
                repeated.setdefault(g, set()).add(r)
    for key, per_axis in segment_head_repeats.items():  # a direct sum's query segment
        for i, per_segment in per_axis.items():
            for g, r in zip(axes[key][i], per_segment, strict=True):
                if r > 1 and isinstance(g, str) and g in heads:
                    repeated.setdefault(g, set()).add(r)
    copies: dict[str, str] = {}
    for g in repeated:
        tie, h = heads[g]
        name = f"{tie}:copies"
        tied = [other for other, (t, _) in heads.items() if t == tie]
        counts = set().union(*(repeated.get(other, set()) for other in tied))
        if len(counts) != 1:
            continue
        if all(other in repeated for other in tied) and name not in copies | groups:
            copies[name] = tie
            groups[name] = h * counts.pop()
    try:
        spec = PermutationSpec(
            groups=groups,
            axes=axes,
            self_maps=frozenset(self_maps),
            blocks=blocks,
            heads=heads,
            head_repeats=head_repeats,
            head_sums=head_sums,
            segment_head_repeats=segment_head_repeats,
            pinned=frozenset(pinned),
            copies=copies,
        )
    except SpecError as exc:  # pragma: no cover - the rules guarantee a valid spec
        raise SpecError(f"the traced spec is invalid: {exc}") from None
    found_sites: dict[str, list[tuple[int, str, int]]] = {}
    for (node, i), rank in candidates.items():
        name = names.get((uf.find((node, i)), labels.get((node, i))))
        if name is not None and uf.reason((node, i)) is None and lengths[(node, i)] == groups[name]:
            found_sites.setdefault(name, []).append((rank, node, i))
    # a head-structured group that no axis carries whole may be carried by a heads axis
    # and a dimensions axis of one activation (GPT-NeoX's queries, [b, h, t, d] after the
    # per-head split of its fused projection): that site is the two axes moved last and
    # flattened, head-major (see FLAT)
    ndims: dict[str, int] = {}
    for node, i in candidates:
        ndims[node] = max(ndims.get(node, 0), i + 1)
    for (node, i), rank in candidates.items():
        root = uf.find((node, i))
        if uf.reason((node, i)) is not None or lengths[(node, i)] != units.get(root):
            continue
        for j in range(ndims[node]):
            label = inner_labels.get(uf.find((node, j))) if j != i else None
            name = names.get((root, label)) if label is not None else None
            if (
                name is not None
                and name not in found_sites
                and (node, j) in candidates
                and lengths[(node, i)] * lengths[(node, j)] == groups[name]
            ):
                site = (rank, f"{node}{FLAT}{i}.{j}", ndims[node] - 2)
                found_sites.setdefault(f"#{name}", []).append(site)
    for name in [n for n in found_sites if n.startswith("#")]:
        found_sites.setdefault(name[1:], found_sites.pop(name))
    sites = {}
    for name, found_at in found_sites.items():
        best = min(rank for rank, _, _ in found_at)
        sites[name] = tuple((node, i) for rank, node, i in found_at if rank == best)
    sites.update(_copies_sites(exported, spec, state, placeholder_of))
    return spec, frozen, inside, sites


def _copies_sites(
    exported, spec: PermutationSpec, state: Mapping[str, Tensor], placeholder_of: Mapping[str, str]
) -> dict[str, tuple[tuple[str, int, str, int], ...]]:
    """Per copies group, the activations laid out as one of its weights' head-repeated
    axes: a linear map's result for an output axis (the queries), its input for an input
    axis (the output projection's, each query head's attention output) — unit ``k`` of the
    activation is entry ``k`` of the weight's axis, so activation matching reads the copies
    there with the weight's own layout. A copies group none of whose weights enters a
    linear map directly has no site (activation matching leaves it in place). Each site is
    ``(graph node, axis, weight name, weight axis)``."""
    linear = torch.ops.aten.linear.default
    users: dict[str, list[fx.Node]] = {}
    for node in exported.graph.nodes:
        if node.op == "call_function" and node.target == linear and len(node.args) > 1:
            weight = node.args[1]
            if isinstance(weight, fx.Node):
                users.setdefault(weight.name, []).append(node)
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for group in spec.copies:
        found: list[tuple[str, int, str, int]] = []
        for name, axis in spec.copies_axes(group):
            if spec.head_axis(name, axis) is not None or spec.block(name, axis) != 1:
                continue
            for node in users.get(placeholder_of.get(name, ""), ()):
                site = node if axis == 0 else node.args[0]
                shape = Axes.shape(site) if isinstance(site, fx.Node) else None
                if shape and state[name].ndim == 2 and shape[-1] == state[name].shape[axis]:
                    found.append((site.name, len(shape) - 1, name, axis))
        if found:
            out[group] = tuple(dict.fromkeys(found))
    return out


_SITE_RANKS = (
    re.compile(
        r"aten\.(relu|relu6|gelu|silu|tanh|sigmoid|elu|selu|celu|leaky_relu|hardtanh|"
        r"hardswish|hardsigmoid|mish|softplus)_?\."
    ),
    re.compile(r"aten\.(layer_norm|batch_norm|group_norm|rms_norm|native_|_native_)"),
    re.compile(r"aten\.(linear|addmm|mm|bmm|matmul|conv|convolution|einsum)"),
)


def _site_candidates(exported) -> dict[AxisKey, int]:
    """Every axis of every op's result, ranked as an activation site: 0 for activation
    functions, 1 for norms, 2 for linear maps and convolutions, 3 for anything else (a
    multi-output op's results ranked by the op) — if it depends on the model's inputs (a
    transposed weight is no activation)."""
    inputs = set(exported.graph_signature.user_inputs)
    on_data: set[str] = set()
    out = {}
    for node in exported.graph.nodes:
        if node.op == "placeholder" and node.name in inputs:
            on_data.add(node.name)
        if node.op != "call_function":
            continue
        sources = pytree.tree_leaves((node.args, node.kwargs))
        if not any(isinstance(a, fx.Node) and a.name in on_data for a in sources):
            continue
        on_data.add(node.name)
        if (shape := Axes.shape(node)) is None:
            continue
        op = node.args[0] if node.target is operator.getitem else node
        target = str(getattr(op, "target", ""))
        rank = next((r for r, pattern in enumerate(_SITE_RANKS) if pattern.match(target)), 3)
        for i in range(len(shape)):
            out[(node.name, i)] = rank
    return out


_REFREEZE = object()


def _sum_entry(leaves, group_of, owner: str, i: int, repeat_of=None, repeats=None):
    """The ``axes`` entry of a parameter axis made of ``leaves``: a direct sum of its
    parts' groups with fixed lengths between them — or a single group, None when every
    part is frozen, ``_REFREEZE`` when the groups would need different blocks. ``repeats``
    (a list) receives each segment's head repeat (``repeat_of(leaf)`` for a group's)."""
    entry: list[str | int] = []
    block_of: set[int] = set()
    reasons = []
    counts: list[int] = []
    start = 0
    for key, n in leaves:
        group, block, why = group_of(key, n, owner, i, start, in_sum=True)
        start += n
        if group is None:
            reasons.append(why)
            if entry and isinstance(entry[-1], int):
                entry[-1] += n
            else:
                entry.append(n)
                counts.append(1)
        else:
            entry.append(group)
            counts.append(repeat_of(key) if repeat_of is not None else 1)
            block_of.add(block)
    if repeats is not None:
        repeats[:] = counts
    if not block_of:
        return None, 1, next((r for r in reasons if r), "every part of its direct sum is frozen")
    if len(block_of) > 1:
        return _REFREEZE, 1, None
    (block,) = block_of
    if len(entry) == 1:
        return entry[0], block, None
    return tuple(entry), block, None


def verification_bytes(state: Mapping[str, Tensor], precision: str) -> int:
    """Memory the verification adds to the model's: in float64 a float64 twin and one
    permuted set of its weights; in float32 one permuted set of the model's own."""
    floats = sum(t.numel() for t in state.values() if t.is_floating_point())
    return 2 * 8 * floats if precision == "float64" else 4 * floats


def _precision_that_fits(state: Mapping[str, Tensor]) -> str:
    """``"float64"`` if the float64 verification's copies fit in the memory available now,
    else ``"float32"``."""
    from lmckit.budget import available_memory

    fits = verification_bytes(state, "float64") < 0.8 * available_memory()
    return "float64" if fits else "float32"


def output_tolerance(exported, precision: str = "float64") -> float:
    """The relative tolerance of the check: 1e-7 in float64 (the twin keeps float64
    through the model's own casts: :class:`_KeepFloat64`); in float32, or where the model
    casts to a lower precision in ops the float64 twin cannot keep, a permutation's
    reordered sums differ at that precision's rounding — 1000 machine epsilons of it."""
    if precision == "float64":
        return 1e-7
    lowest = torch.finfo(getattr(torch, precision)).eps
    for node in exported.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith(("aten.to", "aten._to")):
            continue
        for a in [*node.args, *node.kwargs.values()]:
            if isinstance(a, torch.dtype) and a.is_floating_point:
                lowest = max(lowest, torch.finfo(a).eps)
    return max(1e-7, 1000 * lowest) if lowest > torch.finfo(torch.float64).eps else 1e-7


def experts_apart(
    spec: PermutationSpec, indexed: Collection[str]
) -> tuple[PermutationSpec, tuple[str, ...]] | None:
    """The spec with each group ``Y`` whose every tensor also carries one group ``X`` of
    ``indexed`` — groups whose axes a model gathers by index values, as a mixture gathers
    its experts' slices of the fused expert tensors (``[E, 2I, H]``, ``[E, H, I]``) by the
    router's picks — made head-structured with ``X``'s units as its heads: ``Y`` permuted
    apart in every expert, ``X`` the tie's head permutation (``PermutationSpec.head_axes``);
    and the groups so changed. None where no group qualifies. A structural candidate only:
    the caller checks it numerically (experts mixed along the hidden units before their
    down projection would fail)."""
    pairs: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {}
    for y in spec.groups:
        if y in spec.heads or y in spec.copies or y in spec.kinds:
            continue
        found: dict[str, tuple[int, int]] = {}
        outer: set[str] = set()
        for name, b in spec.group_axes(y):
            entry = spec.axes[name][b]
            others = [
                (a, e)
                for a, e in enumerate(spec.axes[name])
                if a != b and isinstance(e, str) and e in indexed
            ]
            counts = [
                c.get(name) for c in (spec.blocks, spec.repeats, spec.head_repeats, spec.head_sums)
            ]
            if (
                name in spec.self_maps
                or name in found
                or not (entry == y or (isinstance(entry, tuple) and set(entry) == {y}))
                or len(others) != 1
                or others[0][1] in spec.heads
                or any(c is not None and (c[b] > 1 or c[others[0][0]] > 1) for c in counts)
            ):
                break
            found[name] = (others[0][0], b)
            outer.add(others[0][1])
        else:
            if len(outer) == 1 and found:
                pairs[y] = (outer.pop(), found)
    used = {name for _, found in pairs.values() for name in found}
    if not pairs or len(used) != sum(len(found) for _, found in pairs.values()):
        return None  # a tensor with two such pairs: left as it is
    groups, axes, heads = dict(spec.groups), dict(spec.axes), dict(spec.heads)
    head_axes = dict(spec.head_axes)
    for y, (x, found) in pairs.items():
        h = spec.groups[x]
        groups[y] = h * spec.groups[y]
        heads[y] = (x, h)
        heads.setdefault(x, (x, h))
        for name, (a, b) in found.items():
            axes[name] = tuple(None if i == a else e for i, e in enumerate(axes[name]))
            head_axes[name] = (a, b)
    carried = {g for ax in axes.values() for e in ax for g in axis_groups(e)}
    for x, _ in pairs.values():
        if x not in carried:  # the experts move only as the heads of their hidden units
            groups.pop(x, None)
            heads.pop(x, None)
    try:
        apart = replace(spec, groups=groups, axes=axes, heads=heads, head_axes=head_axes)
    except SpecError:
        return None
    return apart, tuple(pairs)


def _verify(
    model: nn.Module,
    spec: PermutationSpec,
    args,
    kwargs,
    seed: int,
    rtol: float = 1e-7,
    select: Callable[[Any], Any] = logits_if_any,
    precision: str = "float64",
) -> tuple[str, ...]:
    """Check that random permutations leave the outputs unchanged (to ``rtol`` of the
    outputs' scale); name the culprit. In float64 on a float64 twin of the model; in
    float32 on the model itself, its weights uncopied."""
    if not spec.groups:
        return ("eval", "train")
    if precision == "float64":
        twin = copy.deepcopy(model).double()
        args64, kwargs64 = to_double((args, kwargs))
        params = {k: v.detach() for k, v in twin.state_dict().items()}  # run_outputs copies buffers
    else:
        twin, args64, kwargs64 = model, args, kwargs
        params = {k: v.detach() for k, v in model.state_dict().items()}
    params = vary_constants(params, seed)
    dtype = getattr(torch, precision)
    # float32 sums over thousands of terms leave near-zero outputs with absolute errors of
    # the large ones' rounding: the floor is the tolerance itself there
    floor = 1e-2 if precision == "float64" else 1.0

    def close(x: list[Tensor], y: list[Tensor]) -> bool:
        return outputs_close(x, y, rtol, floor)

    modes: list[str] = []
    for mode in ("eval", "train"):
        reference = run_outputs(twin, params, args64, kwargs64, mode == "train", select, dtype)
        if mode == "train":
            again = run_outputs(twin, params, args64, kwargs64, True, select, dtype)
            if not close(reference, again):
                continue  # random in train mode even with dropout modules off
        perm = _moving_permutation(spec, seed)
        permuted = run_outputs(
            twin, perm.apply(params), args64, kwargs64, mode == "train", select, dtype
        )
        if close(reference, permuted):
            modes.append(mode)
            continue
        # groups tied by one head permutation move together; a copies group alone
        for unit in [*spec.update_units(), *((c,) for c in spec.copies)]:
            one = Permutation.identity(spec).replace(**{g: perm[g] for g in unit})
            out = run_outputs(
                twin, one.apply(params), args64, kwargs64, mode == "train", select, dtype
            )
            if not close(reference, out):
                g = unit[0]
                tied = f" (with {', '.join(map(repr, unit[1:]))}, one head permutation)"
                small = _small_batchnorms(twin, params, args64, kwargs64, dtype)
                if mode == "train" and "eval" in modes and small:
                    name, count = small[0]
                    raise SpecError(
                        f"the traced spec keeps the outputs in eval mode but not in train "
                        f"mode, where BatchNorm {name!r} normalises each channel over only "
                        f"{count} value(s) of the example batch ({len(small)} such layer(s)): "
                        "statistics that small amplify rounding past the check's tolerance, "
                        "so the check cannot tell a wrong rule from rounding — trace with "
                        f"more or larger examples (at least {MIN_BATCHNORM_VALUES} values per "
                        "channel at every BatchNorm)"
                    )
                raise SpecError(
                    f"traced group {g!r}{tied if len(unit) > 1 else ''} ({spec.groups[g]} "
                    f"units: {', '.join(f'{k}[{i}]' for k, i in _members(spec, g)[:4])}) "
                    f"changes the model's outputs in {mode} mode when permuted — an op rule "
                    "is wrong for this model; please report it"
                )
        raise SpecError(
            f"the traced spec changes the outputs in {mode} mode only when groups are "
            "permuted together"
        )
    return tuple(modes)


MIN_BATCHNORM_VALUES = 16  # fewer values per channel: train-mode statistics amplify rounding


def _small_batchnorms(
    model: nn.Module, params, args, kwargs, dtype: torch.dtype
) -> list[tuple[str, int]]:
    """The BatchNorm layers that normalise each channel over fewer than
    :data:`MIN_BATCHNORM_VALUES` values in a train-mode run on the example (batch × spatial
    positions), with that count, smallest first."""
    seen: dict[str, int] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):

            def count(mod, inputs, name=name) -> None:
                x = inputs[0]
                seen[name] = min(seen.get(name, x.numel()), x.numel() // max(x.shape[1], 1))

            hooks.append(module.register_forward_pre_hook(count))
    try:
        run_outputs(model, params, args, kwargs, True, lambda out: out, dtype)
    except SpecError:
        return []
    finally:
        for hook in hooks:
            hook.remove()
    return sorted(
        ((n, c) for n, c in seen.items() if c < MIN_BATCHNORM_VALUES), key=lambda nc: nc[1]
    )


def vary_constants(params: Mapping[str, Tensor], seed: int) -> dict[str, Tensor]:
    """``params`` with every floating tensor whose entries are all equal (more than one)
    replaced by a seeded random one near it — ``c·(1 + u/2)`` for ``c ≠ 0`` (signs kept:
    BatchNorm's variances stay positive), ``u/10`` for ``c = 0``, ``u`` uniform in
    ``[−1, 1]`` — and the other tensors as they are (not copied).

    A freshly initialised model's norm gains (ones; Gemma's zeros under ``1 + w``) and
    biases (zeros) are constant, and a map that moves only such a tensor's entries keeps
    the outputs however wrong it is: Cohere's per-head QK-norm gains, ``(heads, d)``, let a
    spec permute query heads in the gains alone pass the check at initialisation. The
    checks run on the varied weights, which a symmetry of the architecture keeps too."""
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name, t in params.items():
        if not t.is_floating_point() or t.numel() < 2:
            out[name] = t
            continue
        flat = t.reshape(-1)
        if not bool((flat == flat[0]).all()):
            out[name] = t
            continue
        u = torch.rand(t.shape, generator=generator, dtype=torch.float64).to(t) * 2 - 1
        c = flat[0]
        out[name] = c * (1 + u / 2) if bool(c != 0) else u / 10
    return out


def _members(spec: PermutationSpec, group: str) -> tuple[tuple[str, int], ...]:
    return spec.copies_axes(group) if group in spec.copies else spec.group_axes(group)


def _moving_permutation(spec: PermutationSpec, seed: int) -> Permutation:
    """A seeded random permutation that moves every group (a group of 2 units would stay
    put half the time, and a check of it would then test nothing)."""
    generator = torch.Generator().manual_seed(seed)
    return Permutation(spec, random_index_vectors(spec, generator, moving=True))


def to_double(tree):
    return pytree.tree_map(
        lambda t: t.double() if isinstance(t, Tensor) and t.is_floating_point() else t, tree
    )


class _NoDropout(TorchFunctionMode):
    """Dropout off, in modules and in functional calls alike (``F.dropout``, attention's
    ``dropout_p``): its masks are drawn per position, so a permuted model would be masked
    differently although it computes the same function."""

    DROPOUTS = frozenset(
        {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout}
        | {F.feature_alpha_dropout, torch.dropout, torch.alpha_dropout}
    )
    DROPOUT_ARGUMENT = ((F.scaled_dot_product_attention, 4), (F.multi_head_attention_forward, 10))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.DROPOUTS:
            return args[0] if args else kwargs["input"]
        # (the calls inside a function this mode handles do not come back to the mode:
        # nn.MultiheadAttention's functional form gets its dropout switched off here)
        for fn, position in self.DROPOUT_ARGUMENT:
            if func is fn:
                if len(args) > position:
                    args = (*args[:position], 0.0, *args[position + 1 :])
                else:
                    kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


class _KeepFloat64(TorchFunctionMode):
    """Casts of float64 tensors to a lower float precision left out (``x.to(torch.float32)``,
    ``x.float()``, ``softmax(x, dtype=torch.float32)``): the float64 twin then computes the
    model's function in float64 throughout — Llama's RMSNorm and attention softmax cast to
    float32 whatever the weights — so the check's tolerance can be float64's, tight enough
    to refuse a map that a near-linear random model almost keeps (mixing attention heads
    whose scores are still small changed outputs by 3e-6, within float32's tolerance)."""

    LOW = frozenset({torch.float32, torch.float16, torch.bfloat16})
    NARROWING = frozenset({Tensor.float, Tensor.half, Tensor.bfloat16})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        first = args[0] if args else None
        if isinstance(first, Tensor) and first.dtype == torch.float64:
            if func in self.NARROWING:
                return first
            other = args[1] if len(args) > 1 else None
            like_narrow = isinstance(other, Tensor) and other.dtype in self.LOW
            if func is Tensor.type_as and like_narrow:
                return first
            if func is Tensor.to and like_narrow:
                args = (first, other.device, *args[2:])
            args = tuple(
                torch.float64 if isinstance(a, torch.dtype) and a in self.LOW else a for a in args
            )
            if kwargs.get("dtype") in self.LOW:
                kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


class TwinRunError(SpecError):
    """The copy of the model the check runs failed to run at all (not a wrong spec)."""


def run_outputs(
    model: nn.Module,
    params,
    args,
    kwargs,
    training: bool,
    select=logits_if_any,
    dtype: torch.dtype = torch.float64,
) -> list[Tensor]:
    """The twin's outputs. Tensors the model makes in forward at the default dtype
    (``torch.zeros(shape)``) are made in ``dtype`` too, as they would be in float32 beside
    float32 weights; a failure of the run is a :class:`SpecError`, not a raw exception."""
    buffers = {name for name, _ in model.named_buffers()}
    # train-mode BatchNorm updates its buffers; the parameters are only read
    params = {k: v.clone() if k in buffers else v for k, v in params.items()}
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        keep = _KeepFloat64() if dtype == torch.float64 else contextlib.nullcontext()
        with module_mode(model, training), torch.no_grad(), keep, _NoDropout():
            torch.manual_seed(0)
            out = torch.func.functional_call(model, params, args, kwargs, tie_weights=False)
    except Exception as exc:  # the model's own code: any error type
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TwinRunError(
            f"the {str(dtype).removeprefix('torch.')} copy of {type(model).__name__} used to "
            "verify the spec fails "
            f"({'train' if training else 'eval'} mode): {type(exc).__name__}: {first}"
        ) from exc
    finally:
        torch.set_default_dtype(default)
    return [t for t in pytree.tree_leaves(select(out)) if isinstance(t, Tensor)]


def outputs_close(
    x: list[Tensor], y: list[Tensor], rtol: float = 1e-7, floor: float = 1e-2
) -> bool:
    """Whether outputs agree to ``rtol`` relative, with an absolute floor of ``floor ×
    rtol`` of their largest magnitude (entries near zero carry the rounding of the large
    ones they were summed from)."""
    if len(x) != len(y):
        return False
    for a, b in zip(x, y, strict=True):
        if a.shape != b.shape:
            return False
        if a.is_floating_point():
            scale = a.abs().max().item() if a.numel() else 0.0
            if not torch.allclose(a, b, rtol=rtol, atol=rtol * floor * max(scale, 1.0)):
                return False
        elif not torch.equal(a, b):
            return False
    return True
