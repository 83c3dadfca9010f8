"""Spectra and singular-vector alignment against independent statements: a fresh SVD of the
permuted matrix, the paper's double sum written out, and the dense matrix of a convolution."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from lmckit.analysis.spectral import (
    alignment,
    conv_input_sizes,
    conv_operator_singular_values,
    layer_names,
    layer_svds,
    operator_spectra,
    singular_values,
    singular_vector_cosines,
)
from lmckit.errors import ParamsError, SpecError
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation
from tests.zoo import nontrivial

GAMMAS = [0.0, 0.1, 0.3, 0.6]


def zoo_pair(name, config, seeds=(0, 1)):
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(nontrivial(build_model(name, **config), seed=s))
    return models[0], permutation_spec(models[0]), [m.state_dict() for m in models]


MODELS = [
    ("mlp", {"in_dim": 20, "hidden": [16, 12, 8], "out_dim": 5}),
    ("resnet20", {"width_multiplier": 1, "in_channels": 1}),
    ("vgg", {"depth": 11, "width_multiplier": 0.25, "in_channels": 1, "norm": "batch"}),
]


def r_from_the_definition(params_a, aligned_b, gamma):
    """Eq. 5 written out as the paper's double sum over singular-vector pairs, from fresh
    SVDs of A's and of the already-permuted B's matrices."""
    num, den = 0.0, 0
    for name in layer_names(params_a):
        wa = params_a[name].reshape(params_a[name].shape[0], -1).double()
        wb = aligned_b[name].reshape(wa.shape).double()
        ua, sa, vha = torch.linalg.svd(wa, full_matrices=False)
        ub, sb, vhb = torch.linalg.svd(wb, full_matrices=False)
        ka = [i for i in range(len(sa)) if sa[i] > gamma * sa[0]]
        kb = [j for j in range(len(sb)) if sb[j] > gamma * sb[0]]
        for i, j in itertools.product(ka, kb):
            num += float((ua[:, i] @ ub[:, j]) * (vha[i] @ vhb[j]))
        den += min(len(ka), len(kb))
    return num / den


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize(("name", "config"), MODELS[:2], ids=["mlp", "resnet20"])
def test_r_of_a_model_with_itself_is_one(name, config, gamma):
    _, spec, (a, _) = zoo_pair(name, config)
    assert alignment(spec, a, a, gamma=gamma).total == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize(("name", "config"), MODELS, ids=["mlp", "resnet20", "vgg"])
def test_r_is_one_for_the_planted_permutation_and_below_one_for_the_identity(name, config):
    _, spec, (a, _) = zoo_pair(name, config)
    planted = Permutation.random(spec, 3)
    b = planted.apply(a)  # B[i] = A[q[i]]: A's units shuffled
    undo = planted.inverse()
    for gamma in (0.0, 0.3):
        assert alignment(spec, a, b, undo, gamma=gamma).total == pytest.approx(1.0, abs=1e-9)
        assert alignment(spec, a, b, gamma=gamma).total < 0.9
        assert alignment(spec, a, b, planted, gamma=gamma).total < 0.9  # the wrong way round


# The double sum over every singular pair is O(n²) Python products: all pairs (γ = 0) only
# for the MLP, the conv nets at γ = 0.3.
@pytest.mark.parametrize(
    ("name", "config", "gamma"),
    [(*MODELS[0], 0.0), (*MODELS[0], 0.3), (*MODELS[1], 0.3), (*MODELS[2], 0.3)],
    ids=["mlp-0", "mlp-0.3", "resnet20-0.3", "vgg-0.3"],
)
def test_r_equals_the_papers_double_sum_on_the_permuted_model(name, config, gamma):
    _, spec, (a, b) = zoo_pair(name, config)
    perm = Permutation.random(spec, 5)
    expected = r_from_the_definition(a, perm.apply(b), gamma)
    got = alignment(spec, a, b, perm, gamma=gamma)
    assert got.total == pytest.approx(expected, abs=1e-9)
    assert abs(got.total) <= 1.0


def test_cached_svds_give_the_same_r_and_layers_report_kept_counts():
    _, spec, (a, b) = zoo_pair(*MODELS[0])
    perm = Permutation.random(spec, 1)
    sa, sb = layer_svds(a), layer_svds(b)
    fresh = alignment(spec, a, b, perm, gamma=0.3)
    cached = alignment(spec, a, b, perm, gamma=0.3, svds_a=sa, svds_b=sb)
    assert cached == fresh
    assert set(fresh.per_layer) == set(layer_names(a)) and len(layer_names(a)) == 4
    for name, (ka, kb) in fresh.kept.items():
        s = singular_values(a, [name])[name]
        assert ka == int((s > 0.3 * s[0]).sum())
        assert 1 <= kb <= min(a[name].shape[0], a[name][0].numel())


def test_singular_values_do_not_change_under_a_permutation():
    _, spec, (a, _) = zoo_pair(*MODELS[1])
    perm = Permutation.random(spec, 2)
    before, after = singular_values(a), singular_values(perm.apply(a))
    for name in before:
        torch.testing.assert_close(before[name], after[name], rtol=1e-10, atol=1e-12)
    norm = singular_values(a, normalized=True)
    assert all(float(s[0]) == 1.0 and float(s.min()) >= 0 for s in norm.values())


def test_cosines_of_the_planted_permutation_are_the_identity():
    _, spec, (a, _) = zoo_pair(*MODELS[0])
    planted = Permutation.random(spec, 4)
    cos = singular_vector_cosines(spec, a, planted.apply(a), planted.inverse(), k=6)
    for left, right in cos.values():
        torch.testing.assert_close(
            left, torch.eye(left.shape[0], dtype=torch.float64), atol=1e-8, rtol=0
        )
        torch.testing.assert_close(
            right, torch.eye(right.shape[0], dtype=torch.float64), atol=1e-8, rtol=0
        )


def dense_circular_conv(kernel, n, m):
    """The ``(out·n·m, in·n·m)`` matrix of the circularly padded stride-1 convolution, one
    column per input basis image."""
    cin = kernel.shape[1]
    kh, kw = kernel.shape[-2:]
    basis = torch.eye(cin * n * m, dtype=torch.float64).reshape(-1, cin, n, m)
    padded = F.pad(basis, (kw // 2, kw - 1 - kw // 2, kh // 2, kh - 1 - kh // 2), mode="circular")
    return F.conv2d(padded, kernel).reshape(cin * n * m, -1).T


@pytest.mark.parametrize(
    ("shape", "size"),
    [
        ((3, 2, 3, 3), (5, 5)),
        ((2, 4, 3, 3), (4, 6)),
        ((3, 3, 1, 1), (4, 4)),
        ((2, 2, 2, 2), (5, 3)),
    ],
)
def test_operator_spectrum_equals_the_dense_operators_singular_values(shape, size):
    torch.manual_seed(0)
    kernel = torch.randn(shape, dtype=torch.float64)
    dense = torch.linalg.svdvals(dense_circular_conv(kernel, *size))
    ours = conv_operator_singular_values(kernel, size).reshape(-1).sort(descending=True).values
    assert ours.shape == dense.shape  # min(out, in) values at each of the n·m frequencies
    torch.testing.assert_close(ours, dense, atol=1e-6, rtol=0)


def test_operator_spectra_find_each_convolutions_input_size_and_skip_strided_ones():
    model, _, (a, _) = zoo_pair(*MODELS[1])
    x = torch.randn(2, 1, 16, 16)
    sizes = conv_input_sizes(model, x)
    assert sizes["conv1.weight"] == ((16, 16), (1, 1))
    assert sizes["stages.2.0.conv1.weight"] == ((8, 8), (2, 2))
    spectra, skipped = operator_spectra(model, a, x)
    assert "stages.2.0.conv1.weight" in skipped and "stages.2.0.conv1.weight" not in spectra
    k = a["conv1.weight"]
    assert spectra["conv1.weight"].numel() == 16 * 16 * min(k.shape[:2])
    assert model.training  # the caller's mode is left alone


def test_bad_inputs_are_clear_errors():
    _, spec, (a, b) = zoo_pair(*MODELS[0])
    with pytest.raises(ParamsError, match="gamma"):
        alignment(spec, a, b, gamma=1.0)
    bad = dict(b)
    bad["layers.1.weight"] = torch.full_like(b["layers.1.weight"], math.nan)
    with pytest.raises(ParamsError, match=r"layers\.1\.weight"):
        alignment(spec, a, bad)
    other = permutation_spec(build_model("mlp", in_dim=20, hidden=[16, 12, 9], out_dim=5))
    with pytest.raises(SpecError, match="another spec"):
        alignment(spec, a, b, Permutation.identity(other))
    with pytest.raises(ParamsError, match="not layers"):
        alignment(spec, a, b, names=["layers.0.bias"])
    with pytest.raises(ParamsError, match="kernel"):
        conv_operator_singular_values(torch.zeros(3, 3), 4)
    with pytest.raises(ParamsError, match="does not fit"):
        conv_operator_singular_values(torch.zeros(1, 1, 5, 5), 3)


def test_effective_rank_closed_forms():
    from lmckit.analysis.spectral import effective_rank

    assert effective_rank(torch.tensor([3.0, 3.0, 3.0, 0.0])) == pytest.approx(3.0)
    assert effective_rank(torch.tensor([5.0, 0.0])) == pytest.approx(1.0)
    assert effective_rank(torch.zeros(4)) == 0.0
    # p = (½, ¼, ¼): H = 1.5 ln 2, exp(H) = 2^1.5
    assert effective_rank(torch.tensor([2.0, 1.0, 1.0])) == pytest.approx(2**1.5)
    # a rank-2 matrix of unequal singular values: strictly between 1 and 2
    u, _ = torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64))
    m = u @ torch.diag(torch.tensor([4.0, 1.0], dtype=torch.float64)) @ u.T
    r = effective_rank(torch.linalg.svdvals(m))
    assert 1 < r < 2


def test_the_dominant_share_counts_the_values_above_gamma_times_the_largest():
    """σ = (4, 2, 1, 0.5): ratios 1, ½, ¼, ⅛ — above 0.3 two of four, above 0.2 three; a
    value exactly at the cut is not counted (R(γ) keeps ratios *above* γ); a zero matrix
    has none."""
    from lmckit.analysis import dominant_share
    from lmckit.errors import ParamsError

    values = torch.tensor([4.0, 2.0, 1.0, 0.5])
    assert dominant_share(values, 0.3) == 0.5
    assert dominant_share(values, 0.2) == 0.75
    assert dominant_share(values, 0.25) == 0.5
    assert dominant_share(torch.zeros(3)) == 0.0
    with pytest.raises(ParamsError, match="gamma"):
        dominant_share(values, 1.0)
