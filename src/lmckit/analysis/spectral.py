"""Singular values and singular-vector alignment of weight matrices (Ito et al. §4, App. A).

Every floating tensor with two or more axes is a *layer*: a linear weight ``(out, in)`` as
it is, a convolution kernel ``(out, in, kh, kw)`` reshaped to the matrix
``(out, in·kh·kw)``. Its thin SVD ``W = U diag(s) Vᵀ`` (float64 by default) is computed
once per model (:func:`layer_svds`) and reused for every permutation.

A permutation acts on the singular vectors and not on the singular values: with the spec's
group on the tensor's first axis giving ``P_ℓ`` and the groups on its other axes giving
``P_{ℓ−1}`` (expanded over the kernel positions of a convolution), the aligned model's
vectors are ``P_ℓ u_j`` and ``P_{ℓ−1} v_j`` — exactly the rows of the permuted matrix's
SVD, computed here by indexing ``U`` and ``V`` instead of another SVD.

The alignment of eq. 5,

    R(θ_a, π(θ_b)) = Σ_ℓ Σ_{i∈K_a, j∈K_b} (u_aiᵀ P_ℓ u_bj)(v_aiᵀ P_{ℓ−1} v_bj) / Σ_ℓ n_ℓ,

keeps in each model the singular vectors whose singular value is strictly greater than
``γ`` times the layer's largest (``K_a``, ``K_b``; at ``γ = 0`` every non-zero one) and
divides by ``n_ℓ = min(|K_a|, |K_b|)``, the largest value the layer's sum can take (von
Neumann's trace inequality), so ``|R| ≤ 1``, ``R(θ, θ) = 1`` at every ``γ``, and the sign
ambiguity of an SVD (``u, v → −u, −v``) cancels in each product.

The true singular values of a convolution as a linear operator on ``n×n`` inputs with
circular padding (Sedghi, Gupta & Long 2019) are the singular values of the ``out×in``
matrices of the kernel's 2-D DFT, zero-padded to ``n×n``, at each of the ``n²``
frequencies (:func:`conv_operator_singular_values`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmckit.errors import ParamsError, SpecError
from lmckit.functional import check_model_fits, forward, module_mode
from lmckit.options import checked
from lmckit.params import Params, check_finite, check_params_compatible
from lmckit.perm import Permutation, PermutationSpec, axis_index

__all__ = [
    "Alignment",
    "LayerSVD",
    "alignment",
    "conv_input_sizes",
    "conv_operator_singular_values",
    "dominant_share",
    "effective_rank",
    "layer_names",
    "layer_svds",
    "operator_spectra",
    "singular_values",
    "singular_vector_cosines",
]


@dataclass(frozen=True)
class LayerSVD:
    """Thin SVD of one layer's matrix: ``U (out, k)``, ``S (k,)`` descending, ``V (cols, k)``
    with ``k = min(out, cols)`` and ``matrix = U diag(S) Vᵀ``; ``shape`` is the tensor's."""

    shape: tuple[int, ...]
    U: Tensor
    S: Tensor
    V: Tensor


def layer_names(params: Params) -> list[str]:
    """Names of the layers: floating tensors with two or more axes, in dict order."""
    return [k for k, t in params.items() if t.dtype.is_floating_point and t.ndim >= 2]


def _select(params: Params, names: Sequence[str] | None) -> list[str]:
    layers = layer_names(params)
    if names is None:
        return layers
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ParamsError(
            f"not layers (floating tensors with ≥ 2 axes) of these parameters: {unknown}; "
            f"layers are {layers}"
        )
    return list(names)


@checked
def layer_svds(
    params: Params, names: Sequence[str] | None = None, *, dtype: torch.dtype = torch.float64
) -> dict[str, LayerSVD]:
    """Thin SVD of every layer (or of ``names``), each tensor reshaped to
    ``(shape[0], prod(shape[1:]))``, computed in ``dtype``.

    Raises:
        ParamsError: a layer holds NaN or infinity, or ``names`` names no layer.
    """
    out = {}
    for name in _select(params, names):
        t = params[name].detach()
        if not torch.isfinite(t).all():
            raise ParamsError(f"{name!r} holds NaN or infinite values; no SVD of it")
        U, S, Vh = torch.linalg.svd(t.reshape(t.shape[0], -1).to(dtype), full_matrices=False)
        out[name] = LayerSVD(tuple(t.shape), U, S, Vh.mT)
    return out


@checked
def singular_values(
    params: Params, names: Sequence[str] | None = None, *, normalized: bool = False
) -> dict[str, Tensor]:
    """Descending singular values of every layer (float64); ``normalized`` divides each
    layer's by its largest (Ito et al. Fig. 1 raw, App. D.3 Fig. 7 normalised)."""
    out = {}
    selected = _select(params, names)
    check_finite({k: params[k] for k in selected}, "singular_values")
    for name in selected:
        t = params[name].detach()
        s = torch.linalg.svdvals(t.reshape(t.shape[0], -1).double())
        out[name] = s / s[0] if normalized and s[0] > 0 else s
    return out


@checked
def effective_rank(values: Tensor) -> float:
    """Roy & Vetterli's effective rank of a matrix from its singular values ``values``:
    ``exp(H(p))`` with ``p = σ / Σσ`` and ``H`` the Shannon entropy (0·log 0 = 0). It is
    ``k`` for ``k`` equal non-zero values and 1 for a single one; 0 for a zero matrix."""
    values = values.detach().double().abs()
    total = values.sum()
    if total <= 0:
        return 0.0
    p = values[values > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def _row_and_column_perms(
    spec: PermutationSpec, perm: Permutation | None, name: str, shape: tuple[int, ...]
) -> tuple[Tensor | None, Tensor | None]:
    """Index vectors ``(rows, cols)`` with ``permuted_matrix = matrix[rows][:, cols]``."""
    if perm is None:
        return None, None
    if name not in spec.axes:
        raise SpecError(f"{name!r} is not in the permutation spec")
    if name in spec.head_axes:
        raise SpecError(
            f"{name!r} carries a group permuted apart along another of its axes (a mixture's "
            "experts, PermutationSpec.head_axes): no row and column permutation of the "
            "matricised tensor expresses it; leave it out (names=)"
        )
    axes = spec.axes[name]
    rows = axis_index(spec, name, 0, perm)
    cols = None
    if any(g is not None for g in axes[1:]):
        index = torch.arange(math.prod(shape[1:])).reshape(shape[1:])
        for axis in range(1, len(axes)):
            moved = axis_index(spec, name, axis, perm)
            if moved is not None:
                index = index.index_select(axis - 1, moved)
        cols = index.reshape(-1)
    return rows, cols


def _permuted(svd: LayerSVD, rows: Tensor | None, cols: Tensor | None) -> tuple[Tensor, Tensor]:
    U = svd.U if rows is None else svd.U.index_select(0, rows.to(svd.U.device))
    V = svd.V if cols is None else svd.V.index_select(0, cols.to(svd.V.device))
    return U, V


@dataclass(frozen=True)
class Alignment:
    """Singular-vector alignment ``R`` (eq. 5) at threshold ``gamma``.

    ``total`` is ``Σ_ℓ sum_ℓ / Σ_ℓ n_ℓ``; ``per_layer[name] = sum_ℓ / n_ℓ``; ``kept[name] =
    (|K_a|, |K_b|)`` singular vectors kept in each model.
    """

    gamma: float
    total: float
    per_layer: dict[str, float]
    kept: dict[str, tuple[int, int]]

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return {
            "gamma": self.gamma,
            "total": self.total,
            "per_layer": dict(self.per_layer),
            "kept": {k: list(v) for k, v in self.kept.items()},
        }


def _check_gamma(gamma: float) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 <= gamma < 1:
        raise ParamsError(f"gamma must be a number in [0, 1), got {gamma!r}")
    return float(gamma)


def _kept(singular: Tensor, gamma: float) -> Tensor:
    """Mask of the singular values whose ratio to the largest exceeds ``gamma``."""
    if singular[0] == 0:
        return torch.zeros_like(singular, dtype=torch.bool)
    return singular / singular[0] > gamma


@checked
def dominant_share(values: Tensor, gamma: float = 0.3) -> float:
    """The share of singular values ``values`` (descending, ``(k,)``) whose ratio to the
    largest exceeds ``gamma`` — the directions ``R(γ)`` keeps (Ito et al. App. D.3: wider
    models have fewer dominant directions). 0 for a zero matrix.

    Raises:
        ParamsError: ``gamma`` is not in [0, 1).
    """
    gamma = _check_gamma(gamma)
    values = values.detach().double()
    if values.numel() == 0:
        return 0.0
    return float(_kept(values, gamma).double().mean())


@checked
def alignment(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Permutation | None = None,
    *,
    gamma: float = 0.0,
    names: Sequence[str] | None = None,
    svds_a: Mapping[str, LayerSVD] | None = None,
    svds_b: Mapping[str, LayerSVD] | None = None,
) -> Alignment:
    """``R(θ_a, π(θ_b))`` of eq. 5 over every layer (or ``names``), ``perm`` applied to B
    (``None``: no permutation).

    ``svds_a`` / ``svds_b`` reuse SVDs from :func:`layer_svds` of the *unpermuted* models,
    so R for several permutations or thresholds costs one SVD per model.

    Raises:
        ParamsError: the models do not fit each other, hold NaN, or ``gamma`` ∉ [0, 1).
        SpecError: ``perm`` does not belong to ``spec`` or a layer is not in the spec.
    """
    gamma = _check_gamma(gamma)
    check_params_compatible(params_a, params_b)
    if perm is not None:
        if perm.spec.groups != spec.groups:
            raise SpecError("the permutation belongs to another spec (its groups differ)")
        spec.validate(params_b)
    layers = _select(params_a, names)
    svds_a = svds_a if svds_a is not None else layer_svds(params_a, layers)
    svds_b = svds_b if svds_b is not None else layer_svds(params_b, layers)
    per_layer: dict[str, float] = {}
    kept: dict[str, tuple[int, int]] = {}
    numerator = 0.0
    denominator = 0
    for name in layers:
        a, b = svds_a[name], svds_b[name]
        rows, cols = _row_and_column_perms(spec, perm, name, b.shape)
        Ub, Vb = _permuted(b, rows, cols)
        ka = _kept(a.S, gamma)
        kb = _kept(b.S, gamma)
        n = min(int(ka.sum()), int(kb.sum()))
        kept[name] = (int(ka.sum()), int(kb.sum()))
        if n == 0:  # an all-zero layer has no singular vectors to align
            per_layer[name] = math.nan
            continue
        left = a.U[:, ka].mT @ Ub[:, kb]
        right = a.V[:, ka].mT @ Vb[:, kb]
        layer_sum = float((left * right).sum())
        per_layer[name] = layer_sum / n
        numerator += layer_sum
        denominator += n
    total = numerator / denominator if denominator else math.nan
    return Alignment(gamma, total, per_layer, kept)


@checked
def singular_vector_cosines(
    spec: PermutationSpec,
    params_a: Params,
    params_b: Params,
    perm: Permutation | None = None,
    *,
    k: int = 32,
    names: Sequence[str] | None = None,
    svds_a: Mapping[str, LayerSVD] | None = None,
    svds_b: Mapping[str, LayerSVD] | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """``|cos|`` between the top-``k`` singular vectors of A and of π(B), per layer:
    ``(left, right)`` float64 matrices ``(k', k')`` with ``left[i, j] = |u_aiᵀ P_ℓ u_bj|``
    and ``right[i, j] = |v_aiᵀ P_{ℓ−1} v_bj|``, ``k' = min(k, rank)`` — for heat maps, where
    an aligned pair shows as a bright diagonal."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ParamsError(f"k must be a positive integer, got {k!r}")
    check_params_compatible(params_a, params_b)
    layers = _select(params_a, names)
    svds_a = svds_a if svds_a is not None else layer_svds(params_a, layers)
    svds_b = svds_b if svds_b is not None else layer_svds(params_b, layers)
    out = {}
    for name in layers:
        a, b = svds_a[name], svds_b[name]
        Ub, Vb = _permuted(b, *_row_and_column_perms(spec, perm, name, b.shape))
        m = min(k, a.S.numel())
        out[name] = ((a.U[:, :m].mT @ Ub[:, :m]).abs(), (a.V[:, :m].mT @ Vb[:, :m]).abs())
    return out


@checked
def conv_operator_singular_values(kernel: Tensor, input_size: int | tuple[int, int]) -> Tensor:
    """Singular values of the stride-1 convolution with ``kernel (out, in, kh, kw)`` as a
    linear map on ``in × n × m`` inputs with circular padding (Sedghi et al. 2019).

    Returns a float64 tensor ``(n, m, min(out, in))``: the singular values at each of the
    ``n·m`` spatial frequencies (sort its flattening for the operator's spectrum). The
    kernel must fit the input (``kh ≤ n``, ``kw ≤ m``).
    """
    if not isinstance(kernel, Tensor) or kernel.ndim != 4 or not kernel.dtype.is_floating_point:
        got = tuple(kernel.shape) if isinstance(kernel, Tensor) else type(kernel).__name__
        raise ParamsError(f"expected a floating kernel of shape (out, in, kh, kw), got {got}")
    n, m = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
    kh, kw = kernel.shape[-2:]
    if n < kh or m < kw:
        raise ParamsError(f"a {kh}×{kw} kernel does not fit a {n}×{m} input")
    check_finite({"kernel": kernel}, "kernel")
    freq = torch.fft.fft2(kernel.detach().double(), s=(n, m))  # (out, in, n, m) complex
    return torch.linalg.svdvals(freq.permute(2, 3, 0, 1))


def conv_input_sizes(
    model: nn.Module, example_input: Tensor
) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """For every ``nn.Conv2d`` of ``model``: ``{weight name: ((h, w) of its input, stride)}``,
    found by one forward pass of ``example_input`` in eval mode (modes restored)."""
    sizes: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
    hooks = []
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.Conv2d):
            key = f"{mod_name}.weight" if mod_name else "weight"

            def hook(module, inputs, _output, key=key):
                sizes[key] = (tuple(inputs[0].shape[-2:]), tuple(module.stride))

            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad(), module_mode(model, False):
            forward(model, None, example_input)
    finally:
        for h in hooks:
            h.remove()
    return sizes


@checked
def operator_spectra(
    model: nn.Module, params: Params, example_input: Tensor
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Descending operator singular values of every stride-1 ``Conv2d`` of ``model`` with
    ``params``, at the layer's input resolution found by one forward pass.

    Returns ``(spectra, skipped)``: ``skipped`` names the convolutions left out and why
    (a strided convolution is not the circulant operator this method diagonalises)."""
    check_model_fits(model, params)
    spectra, skipped = {}, {}
    for name, (size, stride) in conv_input_sizes(model, example_input).items():
        if stride != (1, 1):
            skipped[name] = f"stride {stride}: only stride-1 convolutions are circulant"
            continue
        s = conv_operator_singular_values(params[name], size).reshape(-1)
        spectra[name] = torch.sort(s, descending=True).values
    return spectra, skipped
