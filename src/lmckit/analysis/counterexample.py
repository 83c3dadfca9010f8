"""Git Re-Basin's counterexample (Ainsworth et al. 2023, §4 and Appendix A.3, Figs. 6–7):
two networks that both fit the data perfectly and are not linearly mode connected under
*any* permutation of their hidden units — LMC is a property of SGD's solutions, not of the
architecture.

Data: ``x ~ Uniform([−1, 1]²)``, label ``y = 1[x₁ < 0 and x₂ > 0]``. Network: a 2-2-2-1 ReLU
MLP predicting the positive class when ``f(x) ≥ 0``; ``f_A`` (eq. 4) tests ``x₂ > 0`` in its
first hidden layer and ``x₁ < 0`` in its second, ``f_B`` (eq. 5) the other way round.

:func:`exhaustive_barriers` tries every permutation of any small network's hidden units (the
product of ``n_g!`` over the spec's groups) and is the brute force the counterexample needs:
here the four permutations of two groups of two units.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.evaluate.interpolation import barriers, lambda_grid
from lmckit.functional import check_model_fits
from lmckit.metrics import batch_mean, fixed_batches
from lmckit.models import build_model, permutation_spec
from lmckit.options import checked
from lmckit.params import Params, check_params_compatible, lerp_params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify

__all__ = [
    "ExhaustiveBarriers",
    "counterexample_data",
    "counterexample_error",
    "counterexample_networks",
    "exhaustive_barriers",
]

Metric = Callable[[Tensor, Tensor], Tensor]
"""``metric(outputs, targets)`` → the batch's mean (0-dim tensor); lower is better."""


@checked
def counterexample_data(n: int = 4000, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``(x (n, 2) float32, y (n,) int64)``: ``x ~ Uniform([−1, 1]²)`` and
    ``y = 1[x₁ < 0 ∧ x₂ > 0]``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParamsError(f"n must be a positive integer, got {n!r}")
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    y = ((x[:, 0] < 0) & (x[:, 1] > 0)).long()
    return x, y


@checked
def counterexample_networks() -> tuple[nn.Module, Params, Params, PermutationSpec]:
    """``(model, params_A, params_B, spec)``: the 2-2-2-1 ReLU MLP and the hand-set weights
    of eqs. 4 and 5 (the spec permutes the two units of each hidden layer)."""
    model = build_model("mlp", in_dim=2, hidden=[2, 2], out_dim=1)

    def params(w1, b1, w2, b2) -> dict[str, Tensor]:
        return {
            "layers.0.weight": torch.tensor(w1, dtype=torch.float32),
            "layers.0.bias": torch.tensor(b1, dtype=torch.float32),
            "layers.1.weight": torch.tensor(w2, dtype=torch.float32),
            "layers.1.bias": torch.tensor(b2, dtype=torch.float32),
            "layers.2.weight": torch.tensor([[-1.0, -1.0]]),
            "layers.2.bias": torch.zeros(1),
        }

    a = params([[-1.0, 0.0], [0.0, -1.0]], [1.0, 0.0], [[-1.0, 0.0], [0.0, 1.0]], [1.0, 0.0])
    b = params([[1.0, 0.0], [0.0, 1.0]], [0.0, 1.0], [[1.0, 0.0], [0.0, -1.0]], [0.0, 1.0])
    return model, a, b, permutation_spec(model)


@checked
def counterexample_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """0–1 error of the rule "positive when ``f(x) ≥ 0``" for outputs ``(N, 1)``."""
    return ((outputs.reshape(-1) >= 0).long() != targets).float().mean()


@dataclass(frozen=True)
class ExhaustiveBarriers:
    """Every permutation's path: ``values[k][i]`` is the metric of
    ``(1−λ_i)θ_A + λ_i π_k(θ_B)``; ``barriers[k]`` its barrier ``max_λ v − ½(v₀ + v₁)``
    (Git Re-Basin's definition; the convex one ``max_λ v − ((1−λ)v₀ + λv₁)`` in
    ``convex_barriers``)."""

    lambdas: tuple[float, ...]
    permutations: tuple[Permutation, ...]
    values: tuple[tuple[float, ...], ...]
    barriers: tuple[float, ...]
    convex_barriers: tuple[float, ...]

    @property
    def best(self) -> int:
        """Index of the permutation with the lowest barrier."""
        return min(range(len(self.barriers)), key=self.barriers.__getitem__)

    def to_dict(self) -> dict:
        """JSON-ready fields (permutations as ``{group: [indices]}``)."""
        return {
            "lambdas": list(self.lambdas),
            "permutations": [p.to_dict() for p in self.permutations],
            "values": [list(v) for v in self.values],
            "barriers": list(self.barriers),
            "convex_barriers": list(self.convex_barriers),
            "best": self.best,
        }


def number_of_permutations(spec: PermutationSpec) -> int:
    """``Π_g n_g!`` — every distinct permutation of the spec's groups."""
    return math.prod(math.factorial(n) for n in spec.groups.values())


def all_permutations(spec: PermutationSpec) -> Iterable[Permutation]:
    """Every permutation of the spec's groups, the identity first."""
    groups = list(spec.groups)
    for combo in itertools.product(
        *(itertools.permutations(range(spec.groups[g])) for g in groups)
    ):
        yield Permutation(spec, {g: torch.tensor(p) for g, p in zip(groups, combo, strict=True)})


@checked
def exhaustive_barriers(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    spec: PermutationSpec,
    *,
    metric: Metric = F.cross_entropy,
    lambdas: int | Sequence[float] = 25,
    max_permutations: int = 10_000,
    progress: ProgressCallback | None = None,
) -> ExhaustiveBarriers:
    """The path from A to π(B) for every permutation π of the spec's groups (eval mode).

    Args:
        metric: the batch mean to interpolate (lower is better): cross-entropy by default,
            :func:`counterexample_error` for the counterexample's sign rule.
        lambdas: a count of evenly spaced points of [0, 1] or the points (0 and 1 included).
        max_permutations: refuse when ``Π n_g!`` exceeds it (a 3×512 MLP has 10^3500).

    Raises:
        ParamsError: too many permutations, the models do not fit, or no data.
    """
    count = number_of_permutations(spec)
    if count > max_permutations:
        sizes = ", ".join(f"{g}: {n}" for g, n in spec.groups.items())
        raise ParamsError(
            f"{count:.3g} permutations ({sizes}) exceed max_permutations={max_permutations}; "
            "an exhaustive search is only for tiny networks"
        )
    check_model_fits(model, params_a, "params_a")
    check_params_compatible(params_a, params_b)
    spec.validate(params_b)
    lams = lambda_grid(lambdas)
    device = next(iter(params_a.values())).device
    batches = fixed_batches(loader, None, device, "the exhaustive search")
    perms, values, rebasin, convex = [], [], [], []
    for k, perm in enumerate(all_permutations(spec)):
        aligned = perm.apply(params_b)
        curve = [
            batch_mean(model, lerp_params(params_a, aligned, lam), batches, metric) for lam in lams
        ]
        b = barriers(lams, curve, higher_is_better=False)
        perms.append(perm)
        values.append(tuple(curve))
        rebasin.append(b["rebasin"])
        convex.append(b["convex"])
        notify(progress, k + 1, count, barrier=b["rebasin"])
    return ExhaustiveBarriers(
        tuple(lams), tuple(perms), tuple(values), tuple(rebasin), tuple(convex)
    )
