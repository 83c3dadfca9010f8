"""Layer-by-layer diagnostics of a merged pair (the width study, §4–§5 and App. C, F.6–F.8).

For two parameter sets θ_A, θ_B of one model and the merged ``θ_C = (1 − λ)θ_A + λθ_B``
(lmckit's λ convention: λ is B's weight; the paper writes ``λθ_a + (1 − λ)θ_b``), one pass
over a loader measures per layer ℓ (depth ``ℓ`` counted in weight layers from the input):

* **LEWC** (Def. 4.1, Fig. 3): ``cos(f_ℓ(θ_C), (1−λ)^ℓ f_ℓ(θ_A) + λ^ℓ f_ℓ(θ_B))`` — and the
  LLFC counterpart ``cos(f_ℓ(θ_C), (1−λ) f_ℓ(θ_A) + λ f_ℓ(θ_B))`` (equal at λ = ½);
* **activation norms** (Fig. 20): ``E‖f_ℓ(θ_C)‖ / E‖f_ℓ(θ_A) + f_ℓ(θ_B)‖`` (LEWC predicts
  ``(½)^ℓ`` at λ = ½), and the **activation cosine** ``cos(f_ℓ(θ_A), f_ℓ(θ_B))`` (Fig. 14);
* **weak additivity** of ReLU (Def. 5.1, Fig. 4): ``cos(σ((1−λ)z̃_A + λz̃_B),
  (1−λ)σ(z̃_A) + λσ(z̃_B))`` on the two models' pre-activations;
* **second moments** of the ReLU inputs (Fig. 5, 6, 21, 22): per unit ``√E[z̃²]``, the
  fraction of units whose second moment ``E[z̃²]`` is below ``small`` × the layer's largest
  (Fig. 6: "smaller than one hundredth of the maximum second moment", ``small = 0.01``: a
  root below 1/10 of the largest root), and the non-overlap of the two models'
  large-moment units, ``1 − |L_A ∩ L_B| / |L_A ∪ L_B|``;
* **reciprocal orthogonality** (Def. 5.2, Fig. 7, 8): ``E‖W_A z_B‖ / E‖W_A z_A‖`` (and B's
  mirror image) on the layer's inputs ``z_{ℓ−1}``, and ``cos(W_A z_C, W_A z_A)``;
* **commutativity** (Def. C.1, Fig. 11): ``dist(vec(W_A z_A + W_B z_B), vec(W_A z_B + W_B
  z_A))`` with ``dist(x, y) = ‖x − y‖² / (‖x‖ ‖y‖)`` over the whole loader.

``W z`` is the layer's weight applied without its bias (the paper's bias-free setting).
Cosines and norms are per sample and averaged; a convolution's channels are the units and
every spatial position counts as a sample (a ``(N, C, H, W)`` output gives ``N·H·W``
vectors of length ``C``). Two all-zero vectors have cosine 1 (they are equal), a zero and a
non-zero vector cosine 0. Nothing is stored across batches: every statistic is a running
sum, accumulated in float64 from per-sample values computed in the models' dtype.

Which modules hold a layer's output, ReLU input and weight is the model's to say: the zoo's
models list their :class:`Layer` s (``model.layerwise_layers()``); for other models pass
``layers=[Layer(...), ...]`` with module names, as for activation matching. Compare models
aligned by a permutation by passing ``π(θ_B)`` as ``params_b``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.evaluate.bn import bn_reset
from lmckit.functional import check_model_fits, forward, module_mode
from lmckit.options import checked
from lmckit.params import Params, check_finite, check_params_compatible, has_batchnorm, lerp_params

__all__ = [
    "GAUSSIAN_ADDITIVITY_LIMIT",
    "Layer",
    "Layerwise",
    "gaussian_weak_additivity",
    "layerwise",
    "model_layers",
]

GAUSSIAN_ADDITIVITY_LIMIT = (0.75 + 1 / math.pi) / math.sqrt(1 + 1 / math.pi)
"""Thm. 5.4's limit of ``cos(σ(u) + σ(v), σ(u + v))`` for Gaussian ``u, v`` as d → ∞ (≈ 0.930)."""

OUTPUT = ""
"""``Layer.post`` naming the model's own output (the logits)."""


@dataclass(frozen=True)
class Layer:
    """Where one layer's quantities live in a model, by module name.

    Attributes:
        name: label in results and plots.
        depth: ``ℓ`` in LEWC's ``λ^ℓ`` — weight layers from the input to this one.
        post: module whose output is ``f_ℓ`` (``""``: the model's output, the logits).
        pre: module whose output is the ReLU input ``z̃_ℓ`` (None: no ReLU here).
        linear: the ``nn.Linear``/``nn.Conv*d`` whose input is ``z_{ℓ−1}`` and whose weight
            is ``W_ℓ`` (None: no weight diagnostics).
    """

    name: str
    depth: int
    post: str | None = None
    pre: str | None = None
    linear: str | None = None


@checked
def model_layers(model: nn.Module, layers: Sequence[Layer | Mapping] | None = None) -> list[Layer]:
    """``layers`` (or the model's ``layerwise_layers()``), checked against the model: each
    named module exists and each ``linear`` is a Linear or Conv layer."""
    if layers is None:
        provider = getattr(model, "layerwise_layers", None)
        if provider is None:
            raise ParamsError(
                f"{type(model).__name__} has no layerwise_layers(); pass layers=[Layer(name, "
                "depth, post=module, pre=module, linear=module), ...]"
            )
        layers = provider()
    resolved = [lay if isinstance(lay, Layer) else Layer(**lay) for lay in layers]
    if not resolved:
        raise ParamsError("layerwise analysis needs at least one layer")
    modules = dict(model.named_modules())
    names = [lay.name for lay in resolved]
    if len(set(names)) != len(names):
        raise ParamsError(f"layer names must be unique, got {names}")
    for lay in resolved:
        for what in ("post", "pre", "linear"):
            module = getattr(lay, what)
            if module is None or (what == "post" and module == OUTPUT):
                continue
            if module not in modules:
                raise ParamsError(
                    f"layer {lay.name!r}: {what}={module!r} is not a module of "
                    f"{type(model).__name__}"
                )
        if lay.linear is not None and not isinstance(
            modules[lay.linear], nn.Linear | nn.modules.conv._ConvNd
        ):
            raise ParamsError(
                f"layer {lay.name!r}: linear={lay.linear!r} is a "
                f"{type(modules[lay.linear]).__name__}, not a Linear or Conv layer"
            )
        if lay.depth < 1:
            raise ParamsError(f"layer {lay.name!r}: depth must be ≥ 1, got {lay.depth}")
    return resolved


def _unit_dot(x: Tensor, y: Tensor) -> Tensor:
    """Per-sample inner products over the unit axis (1): ``(N, C, *spatial)`` → ``(N,
    *spatial)``, every spatial position its own sample. Kept in the inputs' layout (no
    transposed copy of a feature map)."""
    return (x * y).sum(1) if x.ndim > 1 else x * y


def _cosine_from(dot: Tensor, sq_x: Tensor, sq_y: Tensor) -> Tensor:
    """Cosines from inner products and squared norms; two zero vectors give 1, one zero
    vector 0."""
    sq_x, sq_y = sq_x.clamp_min(0), sq_y.clamp_min(0)
    both_zero = (sq_x == 0) & (sq_y == 0)
    cos = dot / (sq_x * sq_y).sqrt().clamp_min(torch.finfo(dot.dtype).tiny)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def cosines(x: Tensor, y: Tensor) -> Tensor:
    """Per-sample cosine over the unit axis (see :func:`_unit_dot`)."""
    return _cosine_from(_unit_dot(x, y), _unit_dot(x, x), _unit_dot(y, y))


def _squared_norm(x: Tensor) -> Tensor:
    """``‖x‖²`` over all elements as a float64 scalar (reduced in ``x``'s dtype)."""
    return torch.linalg.vector_norm(x).to(torch.float64).square()


def _same_memory(x: Tensor, y: Tensor) -> bool:
    """Whether ``x`` and ``y`` view the same elements (so are equal without a look at them)."""
    return (
        x.data_ptr() == y.data_ptr()
        and x.shape == y.shape
        and x.stride() == y.stride()
        and x.dtype == y.dtype
    )


def _weight_times(module: nn.Module, weight: Tensor, z: Tensor) -> Tensor:
    """``W z`` for ``module``'s operation with ``weight`` and no bias."""
    if isinstance(module, nn.Linear):
        return F.linear(z, weight)
    return module._conv_forward(z, weight, None)


class _Sums:
    """Running float64 sums keyed by name: ``add(key, tensor)`` adds its sum and element
    count (kept on the tensors' device until the end: no host sync per batch)."""

    def __init__(self) -> None:
        self.total: dict[str, Tensor] = {}
        self.count: dict[str, int] = {}

    def add(self, key: str, values: Tensor) -> None:
        # One batch is summed in its own dtype (torch's reductions are blocked, so float32
        # keeps ~1e-7 relative over a batch) and only the running sum is float64: a float64
        # reduction would first copy the whole batch, and that copy cost more than the sum.
        total = values.sum().to(torch.float64)
        self.total[key] = self.total[key] + total if key in self.total else total
        self.count[key] = self.count.get(key, 0) + values.numel()

    def mean(self, key: str) -> float | None:
        return float(self.total[key]) / self.count[key] if self.count.get(key) else None


class Capture:
    """Forward hooks recording each layer's post/pre outputs and its linear's input and
    output for every forward pass run through :meth:`run`."""

    def __init__(self, model: nn.Module, layers: Sequence[Layer]) -> None:
        self.model = model
        modules = dict(model.named_modules())
        self.handles = []
        self.seen: dict[tuple[str, str], Tensor] = {}
        for what in ("post", "pre"):
            for name in {getattr(lay, what) for lay in layers} - {None, OUTPUT}:
                self.handles.append(modules[name].register_forward_hook(self._hook(what, name)))
        for name in {lay.linear for lay in layers} - {None}:
            self.handles.append(modules[name].register_forward_hook(self._hook("linear", name)))

    def _hook(self, what: str, name: str):
        def record(_module, inputs, output):
            if what == "linear":
                self.seen[("in", name)] = inputs[0].detach()
            self.seen[(what, name)] = output.detach()

        return record

    def run(self, params: Params, x: Tensor) -> dict[tuple[str, str], Tensor]:
        self.seen = {}
        self.seen[("post", OUTPUT)] = forward(self.model, params, x).detach()
        return self.seen

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@dataclass(frozen=True)
class Layerwise:
    """One pair's layer-by-layer diagnostics at one λ.

    Attributes:
        lam: B's weight in the merged model ``(1 − λ)θ_A + λθ_B``.
        layers: per layer, ``{"name", "depth", <metric>: value or None}`` — None where the
            layer lacks what the metric needs (e.g. no ReLU at the logits). Metrics:
            ``lewc``, ``llfc``, ``activation_cosine``, ``norm_merged``, ``norm_a``,
            ``norm_b``, ``norm_sum`` (E‖f_A + f_B‖), ``norm_ratio`` (norm_merged / norm_sum),
            ``lewc_norm_ratio`` (LEWC's prediction of it), ``weak_additivity``,
            ``small_fraction_a/_b``, ``non_overlap``, ``reciprocal_ab`` (E‖W_A z_B‖ /
            E‖W_A z_A‖), ``reciprocal_ba``, ``merged_cosine`` (cos(W_A z_C, W_A z_A)),
            ``commutativity``.
        moments: per layer with a ReLU input, ``{"a": [√E z̃²] per unit, "b": [...]}``.
        small: the threshold of ``small_fraction``, relative to the layer's largest second
            moment ``E z̃²`` (the roots in ``moments`` compare with ``√small``).
        count: examples seen.
    """

    lam: float
    layers: list[dict[str, Any]]
    moments: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    small: float = 0.01
    count: int = 0

    def column(self, metric: str) -> list[float | None]:
        """One metric for every layer, in layer order."""
        return [row.get(metric) for row in self.layers]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "lambda": self.lam,
            "layers": self.layers,
            "moments": self.moments,
            "small": self.small,
            "count": self.count,
        }


def large_moment_overlap(rms_a: Tensor, rms_b: Tensor, small: float) -> dict[str, float]:
    """Small-moment fractions of each model and the non-overlap of their large-moment units
    (units with ``E z̃² ≥ small × max E z̃²``, from the roots ``rms = √E z̃²``):
    ``1 − |L_A ∩ L_B| / |L_A ∪ L_B|``."""
    large_a = rms_a.square() >= small * rms_a.square().max()
    large_b = rms_b.square() >= small * rms_b.square().max()
    union = int((large_a | large_b).sum())
    inter = int((large_a & large_b).sum())
    return {
        "small_fraction_a": 1.0 - float(large_a.double().mean()),
        "small_fraction_b": 1.0 - float(large_b.double().mean()),
        "non_overlap": 1.0 - inter / union if union else 0.0,
    }


@checked
def layerwise(
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    lam: float = 0.5,
    layers: Sequence[Layer | Mapping] | None = None,
    merged: Params | None = None,
    bn_reset_data: Any = None,
    small: float = 0.01,
) -> Layerwise:
    """LEWC, weak additivity, second moments, reciprocal orthogonality, commutativity and
    activation norms/cosines of ``θ_A``, ``θ_B`` and their merge, in one pass over ``loader``
    (see the module docstring for each definition).

    Args:
        model: the architecture; run functionally in eval mode (its modes are restored).
        params_a, params_b: parameter dicts of ``model`` (pass ``π(θ_B)`` for an aligned pair).
        loader: ``(x, y)`` batches (labels are ignored); moved to the parameters' device.
        lam: B's weight in the merged model.
        layers: where each layer's tensors are (default ``model.layerwise_layers()``).
        merged: the merged parameters to use instead of ``lerp(θ_A, θ_B, λ)`` — e.g. after
            REPAIR.
        bn_reset_data: data to re-estimate the merged model's BatchNorm statistics (needed
            for BatchNorm models unless ``merged`` is given).
        small: threshold of the small-moment fraction, a share of the layer's largest second
            moment (the width study's 1/100).
    """
    for what, p in (("params_a", params_a), ("params_b", params_b)):
        check_model_fits(model, p, what)
        check_finite(p, what)
    check_params_compatible(params_a, params_b)
    if not 0.0 < small < 1.0:
        raise ParamsError(f"small must be in (0, 1), got {small}")
    resolved = model_layers(model, layers)
    if merged is None:
        merged = lerp_params(params_a, params_b, lam)
        if has_batchnorm(merged):
            if bn_reset_data is None:
                raise ParamsError(
                    "the merged model has BatchNorm layers whose statistics must be "
                    "re-estimated: pass bn_reset_data (training batches) or merged="
                )
            merged = bn_reset(model, merged, bn_reset_data)
    else:
        check_model_fits(model, merged, "merged")
    lam = float(lam)
    device = next(iter(params_a.values())).device
    modules = dict(model.named_modules())
    sums, moments = _Sums(), {}
    commute: dict[str, list[float]] = {}
    count = 0
    capture = Capture(model, resolved)
    try:
        with torch.no_grad(), module_mode(model, False):
            for x, _ in loader:
                x = x.to(device)
                seen_a = capture.run(params_a, x)
                seen_b = capture.run(params_b, x)
                seen_c = capture.run(merged, x)
                count += len(x)
                for lay in resolved:
                    _accumulate(
                        lay,
                        lam,
                        seen_a,
                        seen_b,
                        seen_c,
                        sums,
                        moments,
                        commute,
                        modules,
                        params_a,
                        params_b,
                    )
    finally:
        capture.close()
    if count == 0:
        raise ParamsError("layerwise analysis got an empty loader")
    return _result(resolved, lam, sums, moments, commute, small, count)


def _accumulate(lay, lam, seen_a, seen_b, seen_c, sums, moments, commute, modules, pa, pb):
    key = lay.name
    if lay.post is not None:
        fa, fb, fc = (s[("post", lay.post)] for s in (seen_a, seen_b, seen_c))
        # Six reductions give every cosine and norm: the mixtures are never materialised.
        aa, bb, cc = _unit_dot(fa, fa), _unit_dot(fb, fb), _unit_dot(fc, fc)
        ab, ca, cb = _unit_dot(fa, fb), _unit_dot(fc, fa), _unit_dot(fc, fb)
        for name, (wa, wb) in (
            ("lewc", ((1 - lam) ** lay.depth, lam**lay.depth)),
            ("llfc", (1 - lam, lam)),
        ):
            mix_sq = wa * wa * aa + 2 * wa * wb * ab + wb * wb * bb
            sums.add(f"{key}.{name}", _cosine_from(wa * ca + wb * cb, cc, mix_sq))
            if name == "lewc":
                sums.add(f"{key}.norm_lewc", mix_sq.clamp_min(0).sqrt())
        sums.add(f"{key}.activation_cosine", _cosine_from(ab, aa, bb))
        sums.add(f"{key}.norm_merged", cc.sqrt())
        sums.add(f"{key}.norm_a", aa.sqrt())
        sums.add(f"{key}.norm_b", bb.sqrt())
        sums.add(f"{key}.norm_sum", (aa + 2 * ab + bb).clamp_min(0).sqrt())
    if lay.pre is not None:
        za, zb = seen_a[("pre", lay.pre)], seen_b[("pre", lay.pre)]
        relu_mix = torch.lerp(za, zb, lam).relu_()
        mix_relu = torch.lerp(F.relu(za), F.relu(zb), lam)
        sums.add(f"{key}.weak_additivity", cosines(relu_mix, mix_relu))
        over = [d for d in range(za.ndim) if d != 1]  # samples and positions
        m = moments.setdefault(key, {"a": 0.0, "b": 0.0, "n": 0})
        m["a"] = m["a"] + za.square().sum(over).to(torch.float64)
        m["b"] = m["b"] + zb.square().sum(over).to(torch.float64)
        m["n"] += za.numel() // za.shape[1]
    if lay.linear is not None:
        module = modules[lay.linear]
        wa, wb = pa[f"{lay.linear}.weight"], pb[f"{lay.linear}.weight"]
        in_a, in_b, in_c = (s[("in", lay.linear)] for s in (seen_a, seen_b, seen_c))

        def bias_free(seen, params):
            out = seen[("linear", lay.linear)]
            bias = params.get(f"{lay.linear}.bias")
            if bias is None:
                return out
            return out - bias.view(1, -1, *([1] * (out.ndim - 2)))

        wa_za, wb_zb = bias_free(seen_a, pa), bias_free(seen_b, pb)
        # The input layer sees the same x in every model: W_A z_B = W_A z_A exactly, and
        # the products need not be formed. Same memory, not equal values, decides it: a
        # comparison of values would wait for the GPU once per layer and batch.
        same_ab, same_ac = _same_memory(in_a, in_b), _same_memory(in_a, in_c)
        wa_zb = wa_za if same_ab else _weight_times(module, wa, in_b)
        wb_za = wb_zb if same_ab else _weight_times(module, wb, in_a)
        wa_zc = wa_za if same_ac else _weight_times(module, wa, in_c)
        sq_wa_za, sq_wb_zb = _unit_dot(wa_za, wa_za), _unit_dot(wb_zb, wb_zb)
        sq_wa_zb = sq_wa_za if same_ab else _unit_dot(wa_zb, wa_zb)
        sq_wb_za = sq_wb_zb if same_ab else _unit_dot(wb_za, wb_za)
        sums.add(f"{key}.norm_wa_za", sq_wa_za.sqrt())
        sums.add(f"{key}.norm_wb_zb", sq_wb_zb.sqrt())
        sums.add(f"{key}.norm_wa_zb", sq_wa_zb.sqrt())
        sums.add(f"{key}.norm_wb_za", sq_wb_za.sqrt())
        if same_ac:
            sums.add(f"{key}.merged_cosine", _cosine_from(sq_wa_za, sq_wa_za, sq_wa_za))
        else:
            sq_wa_zc = _unit_dot(wa_zc, wa_zc)
            cos = _cosine_from(_unit_dot(wa_zc, wa_za), sq_wa_zc, sq_wa_za)
            sums.add(f"{key}.merged_cosine", cos)
        left, right = wa_za + wb_zb, wa_zb + wb_za
        c = commute.setdefault(key, [0.0, 0.0, 0.0])
        c[1] = c[1] + _squared_norm(left)
        c[2] = c[2] + _squared_norm(right)
        # In place: one more feature-map-sized tensor would cost its page faults.
        c[0] = c[0] + _squared_norm(left.sub_(right))


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None:
        return None
    return num / den if den > 0 else math.nan


def _result(layers, lam, sums, moments, commute, small, count) -> Layerwise:
    rows, rms = [], {}
    for lay in layers:
        k = lay.name
        row: dict[str, Any] = {"name": k, "depth": lay.depth}
        for metric in ("lewc", "llfc", "activation_cosine", "weak_additivity", "merged_cosine"):
            row[metric] = sums.mean(f"{k}.{metric}")
        for part in ("merged", "a", "b", "sum", "lewc"):
            row[f"norm_{part}"] = sums.mean(f"{k}.norm_{part}")
        row["norm_ratio"] = _ratio(row["norm_merged"], row["norm_sum"])
        row["lewc_norm_ratio"] = _ratio(row["norm_lewc"], row["norm_sum"])
        row["reciprocal_ab"] = _ratio(sums.mean(f"{k}.norm_wa_zb"), sums.mean(f"{k}.norm_wa_za"))
        row["reciprocal_ba"] = _ratio(sums.mean(f"{k}.norm_wb_za"), sums.mean(f"{k}.norm_wb_zb"))
        if k in commute:
            diff, left, right = (float(v) for v in commute[k])
            row["commutativity"] = diff / math.sqrt(left * right) if left * right > 0 else math.nan
        else:
            row["commutativity"] = None
        if k in moments:
            m = moments[k]
            ra, rb = (m["a"] / m["n"]).sqrt(), (m["b"] / m["n"]).sqrt()
            rms[k] = {"a": ra.tolist(), "b": rb.tolist()}
            row.update(large_moment_overlap(ra, rb, small))
        else:
            row.update(small_fraction_a=None, small_fraction_b=None, non_overlap=None)
        rows.append(row)
    return Layerwise(lam=lam, layers=rows, moments=rms, small=small, count=count)


@checked
def gaussian_weak_additivity(
    dims: Sequence[int], *, samples: int = 100, seed: int = 0
) -> dict[int, tuple[float, float]]:
    """Thm. 5.4 by simulation: for ``u, v ~ N(0, I_d)``, the mean and standard deviation
    over ``samples`` draws of ``cos(σ(u) + σ(v), σ(u + v))`` per dimension ``d`` — which
    concentrates at :data:`GAUSSIAN_ADDITIVITY_LIMIT` as ``d`` grows."""
    if samples < 1 or any(int(d) < 1 for d in dims):
        raise ParamsError(f"need samples ≥ 1 and dimensions ≥ 1, got {samples}, {list(dims)}")
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for d in dims:
        u = torch.randn(samples, int(d), generator=gen, dtype=torch.float64)
        v = torch.randn(samples, int(d), generator=gen, dtype=torch.float64)
        cos = cosines(F.relu(u) + F.relu(v), F.relu(u + v))
        out[int(d)] = (float(cos.mean()), float(cos.std()) if samples > 1 else 0.0)
    return out
