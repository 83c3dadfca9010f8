"""The width study's flatness proxy (App. D, Fig. 12–13): move θ_A in a random direction as
far as θ_B is from it, and watch the loss, the accuracy and the hidden activations.

``θ(λ) = θ_A + λ · d · u / ‖u‖`` with ``d = ‖θ_A − θ_B‖`` and ``u`` a standard Gaussian
over the model's *parameters* (``named_parameters``; buffers such as BatchNorm running
statistics are θ_A's, or re-estimated on ``bn_reset_data``). ``d`` and ``u`` cover the
same tensors. At each λ the metrics of θ(λ) are reported with the per-layer activation
cosine ``cos(f_ℓ(x; θ_A), f_ℓ(x; θ(λ)))`` (per sample, averaged; conv positions as
samples, as in :mod:`lmckit.analysis.layerwise`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.analysis.layerwise import OUTPUT, Capture, Layer, cosines, model_layers
from lmckit.errors import ParamsError
from lmckit.evaluate.bn import bn_reset
from lmckit.functional import check_model_fits, module_mode, per_token
from lmckit.options import checked
from lmckit.params import Params, check_finite, check_params_compatible, has_batchnorm

__all__ = ["Flatness", "flatness", "random_direction"]


@dataclass(frozen=True)
class Flatness:
    """Metrics along ``θ_A + λ d u/‖u‖``.

    Attributes:
        lambdas: the λ grid.
        distance: ``d = ‖θ_A − θ_B‖`` over the parameters.
        loss, accuracy: per λ (mean cross-entropy; fraction correct).
        cosine: per layer name, ``cos(f_ℓ(θ_A), f_ℓ(θ(λ)))`` per λ.
        seed: the seed of ``u``.
    """

    lambdas: list[float]
    distance: float
    loss: list[float]
    accuracy: list[float]
    cosine: dict[str, list[float]]
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@checked
def random_direction(model: nn.Module, params: Params, *, seed: int = 0) -> dict[str, Tensor]:
    """A unit-norm standard Gaussian direction over ``model``'s parameters (not buffers),
    drawn on the CPU from ``seed`` (so every device gets the same direction)."""
    check_model_fits(model, params)
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(seed)
    u = {n: torch.randn(params[n].shape, generator=gen, dtype=torch.float64) for n in names}
    norm = torch.sqrt(sum((t * t).sum() for t in u.values()))
    return {n: (t / norm).to(params[n]) for n, t in u.items()}


@checked
def flatness(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    lambdas: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    seed: int = 0,
    layers: Sequence[Layer | Mapping] | None = None,
    bn_reset_data: Any = None,
) -> Flatness:
    """Loss, accuracy and per-layer activation cosine of ``θ_A + λ d u/‖u‖`` for each λ, in
    one pass over ``loader`` (θ_A runs once per batch, each perturbed model once).

    ``params_b`` only sets the distance ``d``. With ``bn_reset_data`` every perturbed
    BatchNorm model (λ ≠ 0) gets its statistics re-estimated; without it keeps θ_A's. At
    λ = 0 the model is θ_A itself.
    """
    for what, p in (("params_a", params_a), ("params_b", params_b)):
        check_model_fits(model, p, what)
        check_finite(p, what)
    check_params_compatible(params_a, params_b)
    lambdas = [float(lam) for lam in lambdas]
    if not lambdas:
        raise ParamsError("flatness needs at least one λ")
    resolved = [lay for lay in model_layers(model, layers) if lay.post is not None]
    direction = random_direction(model, params_a, seed=seed)
    distance = float(
        torch.sqrt(sum(((params_a[n] - params_b[n]).double() ** 2).sum() for n in direction))
    )
    perturbed = []
    for lam in lambdas:
        p = dict(params_a)
        for n, u in direction.items():
            p[n] = params_a[n] + (lam * distance) * u
        if bn_reset_data is not None and has_batchnorm(p) and lam != 0:
            p = bn_reset(model, p, bn_reset_data)
        perturbed.append(p)
    device = next(iter(params_a.values())).device
    loss = [0.0] * len(lambdas)
    correct = [0] * len(lambdas)
    cos_sum = {lay.name: [0.0] * len(lambdas) for lay in resolved}
    rows = {lay.name: [0] * len(lambdas) for lay in resolved}
    count = 0
    capture = Capture(model, resolved)
    try:
        with torch.no_grad(), module_mode(model, False):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                ref = {lay.name: capture.run(params_a, x)[("post", lay.post)] for lay in resolved}
                for i, p in enumerate(perturbed):
                    seen = capture.run(p, x)
                    logits, targets = per_token(seen[("post", OUTPUT)], y)
                    loss[i] += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
                    correct[i] += int((logits.argmax(1) == targets).sum())
                    for lay in resolved:
                        c = cosines(ref[lay.name], seen[("post", lay.post)])
                        cos_sum[lay.name][i] += float(c.sum(dtype=torch.float64))
                        rows[lay.name][i] += len(c)
                count += y.numel()  # tokens, for a language model's (N, L) targets
    finally:
        capture.close()
    if count == 0:
        raise ParamsError("flatness got an empty loader")
    return Flatness(
        lambdas=lambdas,
        distance=distance,
        loss=[v / count for v in loss],
        accuracy=[v / count for v in correct],
        cosine={k: [s / n for s, n in zip(v, rows[k], strict=True)] for k, v in cos_sum.items()},
        seed=seed,
    )
