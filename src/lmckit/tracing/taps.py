"""Activations of a model's permutation groups, read off its export graph.

Activation matching needs, for every group, tensors that hold the group's units on one
axis. The zoo's models mark them with ``nn.Identity`` modules (``activation_taps()``); any
other model gets them from its trace: :class:`GraphTaps` traces the model, takes each
group's *activation sites* (:attr:`~lmckit.tracing.TraceReport.activation_sites`: outputs of
activation functions, else of norms, else of linear maps) and runs the exported graph with
those intermediate results as extra outputs. Nothing is stored beyond one batch.

``torch.export`` specialises a graph to its input shapes, so one graph is exported per
input shape met (a last, smaller batch costs one more export); each is checked to hold
the sites with the shapes the trace saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, fx, nn

from lmckit.errors import SpecError
from lmckit.params import Params
from lmckit.perm import PermutationSpec
from lmckit.tracing.trace import EACH, FLAT, batched_experts, export_model, trace_report

__all__ = ["GraphTaps"]


class GraphTaps:
    """Per group, the model's activations that carry its units.

    Args:
        model: the module (left unchanged; run in eval mode).
        spec: the spec the activations are for; the model must trace to exactly this spec
            (a hand-written or edited spec has no sites to read).
        example_inputs: a small batch (at least 2) to trace with, as for
            :func:`~lmckit.tracing.trace`.

    Raises:
        SpecError: the model traces to another spec, or a group has no activation site.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: PermutationSpec,
        example_inputs: Tensor | Sequence[Any],
    ) -> None:
        report = trace_report(model, example_inputs)
        names = same_symmetry(report.spec, spec)
        if names is None:
            raise SpecError(
                f"{type(model).__name__} traces to another permutation spec than the one "
                "given; activations can be read from the graph only for the traced spec "
                "(lmckit.tracing.trace(model, inputs)) or one equal to it up to group names"
            )
        sites = {names[g]: found for g, found in report.activation_sites.items()}
        missing = sorted(set(spec.groups) - set(sites) - set(spec.copies))
        if missing:
            raise SpecError(f"no activation of the traced graph carries the groups {missing}")
        self.model = model
        self.sites: dict[str, tuple[tuple[str, int], ...]] = {
            g: tuple(sites[g]) for g in spec.groups if g not in spec.copies
        }
        # the copies groups' sites carry the weight axis they are laid out as
        self.copies_sites: dict[str, tuple[tuple[str, int, str, int], ...]] = {
            names[c]: found for c, found in report.copies_sites.items()
        }
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        self._sizes = {site: spec.groups[g] for g, sites in self.sites.items() for site in sites}
        self._sizes.update(
            {
                (node, axis): shapes[weight][weight_axis]
                for found in self.copies_sites.values()
                for node, axis, weight, weight_axis in found
            }
        )
        self._nodes = sorted({node for node, _ in self._sizes})
        self._runners: dict[tuple, tuple[nn.Module, dict[str, Any]]] = {}

    def taps(self) -> dict[str, list[str]]:
        """``{group: [site names]}``, a site named ``node:axis``."""
        return {g: [f"{node}:{axis}" for node, axis in s] for g, s in self.sites.items()}

    def copies_taps(self) -> dict[str, list[tuple[str, str, int]]]:
        """``{copies group: [(site name, weight, weight axis)]}``: activations laid out as
        the weight's head-repeated axis (the query heads inside their key/value group)."""
        return {
            c: [(f"{node}:{axis}", weight, weight_axis) for node, axis, weight, weight_axis in s]
            for c, s in self.copies_sites.items()
        }

    def __call__(self, params: Params, x: Tensor) -> dict[str, Tensor]:
        """The activations of ``model`` with ``params`` on the batch ``x``: ``{site name:
        tensor (N, units, ...)}`` (the units' axis moved to 1)."""
        runner, inputs = self._runner(x)
        names = {n for n, _ in runner.named_parameters(remove_duplicate=False)}
        names |= {n for n, _ in runner.named_buffers(remove_duplicate=False)}
        values = torch.func.functional_call(
            runner, {k: v for k, v in params.items() if k in names}, inputs, strict=False
        )
        found = dict(zip(self._nodes, values, strict=True))
        return {f"{node}:{axis}": found[node].movedim(axis, 1) for node, axis in self._sizes}

    def _runner(self, x: Tensor) -> tuple[nn.Module, tuple[Any, ...]]:
        """The graph that returns the sites, for inputs like ``x``, and its flat inputs for
        ``x`` (with the keywords the export added: a decoder's ``use_cache=False``)."""
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self._runners:
            try:  # as the trace exports it: a Hugging Face decoder without its cache, a
                # mixture's experts in their batched form
                with batched_experts(self.model):
                    exported, _, kwargs = export_model(self.model, (x,))
            except SpecError as exc:
                raise SpecError(f"{exc} (on inputs of shape {tuple(x.shape)})") from exc
            runner = _with_outputs(exported.module(), self._nodes, self._sizes)
            self._runners[key] = (runner.to(x.device), kwargs)
        runner, kwargs = self._runners[key]
        return runner, tuple(pytree.tree_leaves(((x,), kwargs)))


def same_symmetry(traced: PermutationSpec, given: PermutationSpec) -> dict[str, str] | None:
    """``{traced group: given group}`` if the two specs say the same up to group names (the
    same tensors, axes, segments, sizes, blocks, heads and self maps), else None."""

    def signatures(spec: PermutationSpec) -> dict[frozenset, str]:
        found: dict[str, set] = {g: set() for g in spec.groups}
        for name, axes in spec.axes.items():
            for i, entry in enumerate(axes):
                if entry is not None:
                    for g, start, _ in spec.segments(name, i):
                        if g is not None:
                            found[g].add((name, i, start, spec.block(name, i)))
        for c in spec.copies:
            found[c] = {("copies", name, i) for name, i in spec.copies_axes(c)}
        return {frozenset(v): g for g, v in found.items()}

    mine, theirs = signatures(traced), signatures(given)
    if set(mine) != set(theirs) or traced.self_maps != given.self_maps:
        return None
    names = {mine[sig]: theirs[sig] for sig in mine}
    if any(traced.groups[t] != given.groups[g] for t, g in names.items()):
        return None
    if set(traced.axes) != set(given.axes) or any(
        traced.repeats.get(k) != given.repeats.get(k)
        or traced.head_sums.get(k) != given.head_sums.get(k)
        or traced.head_axes.get(k) != given.head_axes.get(k)
        or traced.segment_head_repeats.get(k) != given.segment_head_repeats.get(k)
        for k in traced.axes
    ):
        return None
    ties = {names[g]: (tie, h) for g, (tie, h) in traced.heads.items()}
    if set(ties) != set(given.heads) or any(ties[g][1] != given.heads[g][1] for g in ties):
        return None
    tie_names = {ties[g][0]: given.heads[g][0] for g in ties}
    if any(tie_names[ties[g][0]] != given.heads[g][0] for g in ties) or len(
        set(tie_names.values())
    ) != len(tie_names):
        return None
    return names


def _with_outputs(
    module: fx.GraphModule, names: Sequence[str], sizes: Mapping[tuple[str, int], int]
) -> fx.GraphModule:
    """A copy of an exported program's module that returns the nodes ``names`` (flat
    inputs in, a tuple out), each checked to have its sites' axes of the groups' sizes."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in module.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
    by_name = {node.name: env[node] for node in module.graph.nodes if node in env}
    wrong = []
    for (name, axis), size in sizes.items():
        base, each, copies = name.partition(EACH)
        base, flat, pair = base.partition(FLAT)
        val = by_name[base].meta.get("val") if base in by_name else None
        heads, dims = (int(k) for k in pair.split(".")) if flat else (axis, axis)
        size //= int(copies) if each else 1
        if (
            not isinstance(val, Tensor)
            or val.ndim <= max(axis, heads, dims)
            or (val.shape[heads] * val.shape[dims] if flat else val.shape[axis]) != size
        ):
            wrong.append(f"{name}:{axis}")
            continue
        if flat and base + flat + pair not in by_name:  # a heads axis and its dimensions as one
            moved = graph.call_function(torch.movedim, (by_name[base], (heads, dims), (-2, -1)))
            by_name[base + flat + pair] = graph.call_function(torch.flatten, (moved, -2, -1))
        if each and name not in by_name:  # one copy of the units per head (see EACH)
            one = by_name[base + flat + pair]
            by_name[name] = graph.call_function(torch.cat, ([one] * int(copies), axis))
    if wrong:
        raise SpecError(
            f"the graph exported for this input shape lacks the traced activations {wrong} "
            "(or they have other shapes): the model's graph depends on the input shape"
        )
    graph.output(tuple(by_name[n] for n in names))
    return fx.GraphModule(module, graph)
