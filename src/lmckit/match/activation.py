"""Activation matching (Git Re-Basin §3.1): align units by how they respond to data.

One pass over the data runs both parameter sets through the same module (functionally)
and streams, per group, the sums needed for the cross-moment ``E[z_A z_Bᵀ]`` and for the
Pearson correlation of every unit pair — never storing activations. Conv activations
``(N, C, H, W)`` count every position as a sample. Each group then needs one LAP; groups
are independent.

Which activations belong to which group is the model's to say: ``taps`` maps a group to
the names of modules whose outputs carry its units on axis 1 (the zoo's CNNs and MLPs
provide ``model.activation_taps()``, marking post-ReLU features with ``nn.Identity`` taps).
Any other model — the zoo's transformers, a user's model — is read through its traced graph
(:class:`lmckit.tracing.GraphTaps`: outputs of activation functions, else norms, else linear
maps). A group with several taps — a residual stream — sums the per-tap gain matrices, so
every place the stream is materialised votes for its permutation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from itertools import islice
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from lmckit.data import DataSource, as_batches
from lmckit.errors import ParamsError, SpecError
from lmckit.functional import check_model_fits, forward, module_mode
from lmckit.lap import assign_groups
from lmckit.match.network import batches_per_pass, require_model_and_data
from lmckit.match.result import MatchResult, check_inputs
from lmckit.options import Count, checked
from lmckit.params import Params, params_distance
from lmckit.perm import (
    Permutation,
    PermutationSpec,
    copies_gains_of_units,
    copies_value,
    solve_copies,
)
from lmckit.progress import ProgressCallback, notify
from lmckit.tracing import GraphTaps
from lmckit.tracing.trace import EACH

ActivationStatistic = Literal["correlation", "cross_moment"]
STATISTICS: tuple[str, ...] = get_args(ActivationStatistic)


class _Moments:
    """Streaming sums for one tap: Σa, Σb, Σa², Σb², Σ a bᵀ and the count (float64)."""

    def __init__(self, n: int, device: torch.device) -> None:
        z = dict(dtype=torch.float64, device=device)
        self.sa, self.sb = torch.zeros(n, **z), torch.zeros(n, **z)
        self.saa, self.sbb = torch.zeros(n, **z), torch.zeros(n, **z)
        self.sab = torch.zeros(n, n, **z)
        self.count = 0

    def add(self, a: Tensor, b: Tensor) -> None:
        a = a.movedim(1, -1).reshape(-1, a.shape[1]).double()
        b = b.movedim(1, -1).reshape(-1, b.shape[1]).double()
        self.sa += a.sum(0)
        self.sb += b.sum(0)
        self.saa += (a * a).sum(0)
        self.sbb += (b * b).sum(0)
        self.sab += a.T @ b
        self.count += a.shape[0]

    def gains(self, statistic: str, eps: float = 1e-12) -> Tensor:
        cross = self.sab / self.count
        if statistic == "cross_moment":
            return cross
        mean_a, mean_b = self.sa / self.count, self.sb / self.count
        std_a = (self.saa / self.count - mean_a**2).clamp_min(0).sqrt()
        std_b = (self.sbb / self.count - mean_b**2).clamp_min(0).sqrt()
        cov = cross - mean_a[:, None] * mean_b[None, :]
        # Dead units (zero variance) correlate with nothing: gain 0 instead of 0/0.
        return cov / (std_a[:, None] * std_b[None, :]).clamp_min(eps)


class _ModuleTaps:
    """Activations from forward hooks on named modules (outputs ``(N, units, ...)``)."""

    def __init__(self, model: nn.Module, spec: PermutationSpec, taps) -> None:
        modules = dict(model.named_modules())
        missing_groups = sorted(set(spec.groups) - set(taps) - set(spec.copies))
        if missing_groups:
            raise ParamsError(f"no activation taps for groups {missing_groups}")
        for g, names in taps.items():
            for name in names:
                if name not in modules:
                    raise ParamsError(f"tap {name!r} of group {g!r} is not a module of the model")
        self.model, self.modules = model, modules
        self._taps = {g: list(taps[g]) for g in spec.groups if g not in spec.copies}

    def taps(self) -> dict[str, list[str]]:
        return self._taps

    def __call__(self, params: Params, x: Tensor) -> dict[str, Tensor]:
        captured: dict[str, Tensor] = {}
        handles = []
        for names in self._taps.values():
            for name in names:

                def hook(_module, _inputs, output, name=name):
                    if not isinstance(output, Tensor) or output.ndim < 2:
                        raise ParamsError(
                            f"activation tap {name!r} must output a tensor (N, units, ...), "
                            f"got {getattr(output, 'shape', type(output).__name__)}"
                        )
                    captured[name] = output.detach()

                handles.append(self.modules[name].register_forward_hook(hook))
        try:
            forward(self.model, params, x)
        finally:
            for h in handles:
                h.remove()
        silent = [n for names in self._taps.values() for n in names if n not in captured]
        if silent:
            raise ParamsError(
                f"activation taps {silent} produced no output: those modules are not called in "
                "the model's forward pass"
            )
        return captured


def _each_copies(site: str) -> int:
    """How many heads read a traced site's units as their own (``f"{node}{EACH}{h}:{axis}"``,
    a mixture's hidden activation read once per expert); 1 for any other site."""
    _, each, rest = site.partition(EACH)
    return int(rest.split(":")[0]) if each else 1


def taps_for(model: nn.Module, spec: PermutationSpec, taps, x: Tensor):
    """What reads the activations: the given module names, a :class:`GraphTaps`, the
    model's ``activation_taps()``, or else the sites of the model's traced graph."""
    if isinstance(taps, GraphTaps):
        return taps
    if taps is None and getattr(model, "activation_taps", None) is not None:
        taps = model.activation_taps()
    if taps is not None:
        return _ModuleTaps(model, spec, taps)
    try:
        return GraphTaps(model, spec, x[: min(len(x), 4)])
    except SpecError as exc:
        raise ParamsError(
            f"{type(model).__name__} has no activation_taps() and its graph gives none ({exc}); "
            "pass taps={group: [module names whose outputs carry the group's units on axis 1]}"
        ) from None


@torch.no_grad()
@checked
def activation_matching(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    init: Permutation | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    statistic: ActivationStatistic = "correlation",
    n_batches: Count | None = None,
    taps: Mapping[str, list[str]] | GraphTaps | None = None,
    batch_size: Count = 1000,
) -> MatchResult:
    """Match B's units to A's by the statistics of their activations on ``data``.

    Args:
        spec, params_a, params_b: as for every matcher.
        model: a module that both parameter dicts fit (run with
            ``torch.func.functional_call``, in eval mode; its own mode is restored).
        data: an lmckit ``Dataset`` (its training split, in order, in batches of
            ``batch_size``) or an iterable of ``(x, y)`` batches (labels unused).
        init, seed: accepted for the matchers' common signature and unused: each group's
            LAP is solved exactly and independently, with no randomness.
        progress: a :class:`~lmckit.progress.Progress` after every batch.
        statistic: ``"correlation"`` (Pearson correlation of unit pairs, Git Re-Basin's
            code) or ``"cross_moment"`` (``E[z_A z_Bᵀ]``: the least-squares criterion its
            §3.1 eq. 1 states). Measured side by side (``experiments/width-fmnist.toml``,
            3×(128…2048)-unit MLPs on Fashion-MNIST, three pairs per width): correlation
            gives the lower midpoint test loss at every width — 0.448 vs 0.465 at ¼ × 512
            units, 0.353 vs 0.360 at ×1, 0.335 vs 0.343 at ×4 — so it stays the default.
        n_batches: use only the first ``n_batches`` batches (all by default).
        taps: group -> module names whose outputs carry the group's units on axis 1, or a
            :class:`~lmckit.tracing.GraphTaps`. Default: ``model.activation_taps()`` (the
            zoo's CNNs and MLPs), else the activation sites of the model's traced graph
            (the model must trace to ``spec``; traced on the first batch's first rows).

    Returns:
        :class:`MatchResult`; ``history`` holds the total matched gain, ``iterations`` the
        batches used, ``info["examples"]`` the number of examples and
        ``info["copies_in_place"]`` the copies groups (query heads inside their key/value
        group) left in place because no activation of the graph is laid out as their
        weights. The others are chosen after the heads and their dimensions, by the
        correlations of the query projection's outputs and the output projection's inputs
        (every other group applied to B's), one assignment of copies per head.
    """
    start = time.perf_counter()
    if statistic not in STATISTICS:
        raise ParamsError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if n_batches is not None and (isinstance(n_batches, bool) or n_batches < 1):
        raise ParamsError(f"n_batches must be ≥ 1 or None, got {n_batches!r}")
    model = require_model_and_data("activation_matching", model, data)
    check_inputs(spec, params_a, params_b, init, seed)
    check_model_fits(model, params_a, "params_a")
    batches = as_batches(data, batch_size=batch_size, shuffle=False, seed=seed)
    total = n_batches if n_batches is not None else batches_per_pass(batches)
    device = next(iter(params_a.values())).device
    reader = None
    moments: dict[str, _Moments] = {}
    used = examples = 0
    with module_mode(model, False):
        for x, _ in islice(batches, n_batches):
            x = x.to(device)
            if reader is None:
                reader = taps_for(model, spec, taps, x)
            acts_a = reader(params_a, x)
            acts_b = reader(params_b, x)
            for name, act_a in acts_a.items():
                act_b = acts_b[name]
                copies = _each_copies(name)
                if copies > 1:  # one expert's copy is every expert's (see EACH)
                    act_a = act_a.narrow(1, 0, act_a.shape[1] // copies)
                    act_b = act_b.narrow(1, 0, act_b.shape[1] // copies)
                if name not in moments:
                    moments[name] = _Moments(act_a.shape[1], device)
                moments[name].add(act_a, act_b)
            used += 1
            examples += len(x)
            notify(progress, used, total)
    if used == 0:
        raise ParamsError("activation_matching got no batches")
    all_gains = {}
    shared = set()  # groups whose gains are one block for every pair of heads
    assert reader is not None
    for g, names in reader.taps().items():
        gains = sum(moments[name].gains(statistic) for name in names)
        n = spec.groups[g]
        if any(_each_copies(name) > 1 for name in names):
            shared.add(g)
            n //= _each_copies(names[0])
        if gains.shape != (n, n):
            raise ParamsError(
                f"taps of group {g!r} produce {gains.shape[0]} channels, the group has {n}"
            )
        all_gains[g] = gains
    perms = assign_groups(all_gains, spec.heads, spec.pinned, shared)
    gain = 0.0
    for g, c in all_gains.items():
        p = perms[g].to(c.device)
        rows = torch.arange(len(p), device=c.device)
        if g in shared:  # every head's block is the one block
            rows, p = rows % len(c), p % len(c)
        gain += float(c[rows, p].sum())
    # the query heads inside their key/value group, once the heads and their dimensions
    # are chosen: where the graph holds no activation laid out as their weights, in place
    copies_taps = reader.copies_taps() if isinstance(reader, GraphTaps) else {}
    unmatched = sorted(set(spec.copies) - set(copies_taps))
    for c in spec.copies:
        if c in copies_taps:
            gains = sum(
                copies_gains_of_units(spec, c, weight, axis, moments[site].gains(statistic), perms)
                for site, weight, axis in copies_taps[c]
            )
            perms[c] = solve_copies(gains)
            gain += copies_value(gains, perms[c])
        else:
            perms[c] = torch.arange(spec.groups[c])
    perm = Permutation(spec, perms)
    return MatchResult(
        alignment=perm,
        method=f"activation_matching[{statistic}]",
        history=(gain,),
        iterations=used,
        seconds=time.perf_counter() - start,
        distance_before=params_distance(params_a, params_b),
        distance_after=params_distance(params_a, perm.apply(params_b)),
        info={"examples": examples, "statistic": statistic, "copies_in_place": unmatched},
    )
